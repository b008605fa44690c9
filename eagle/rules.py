"""The drafting rules, in one place (REFERENCE section 1): the layer between sampling and the verifiers.

- ``wor``: u_1..u_m drawn one after another without replacement from M_s (Gumbel-top-k / the
  exponential race: the m largest ``q(x) / E_x``, ``E_x ~ Exp(1)``, in decreasing order, have
  exactly the law of sequential sampling without replacement).
- ``topk_residual``: u_1..u_{m-1} = the m-1 most probable tokens of M_s (ties to the lowest id),
  u_m one draw from the residual M_s^neg (M_s restricted to the other tokens, renormalised).
  With m = 1 this is one draw from M_s.
- ``topk``: the m most probable tokens (ties to the lowest id).

The verifiers use exactly these laws; :func:`children_law` enumerates them for the exact tests.
"""
from __future__ import annotations

import itertools
import math

import torch


__all__ = ["DRAFTING_RULES", "draw_children", "stable_topk", "residual_draft", "remaining_mass", "remaining_masses",
           "children_law", "positive_part", "removed_mask", "zero_tokens_", "BLOCK_ELEMENTS",
           "LAMBDA_CAP"]

#: elements per row block of the batched passes (4 MiB in float32: stays in cache on CPU)
BLOCK_ELEMENTS = 1 << 20

#: Drafting rules (REFERENCE section 1): "wor" = without replacement from M_s;
#: "topk_residual" = top-(m-1) of M_s plus one draw from the residual; "topk" = top-m (temperature 0).
DRAFTING_RULES = ("wor", "topk_residual", "topk")


def stable_topk(q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row of ``q`` (``[n, V]``), ties to the lowest index.

    Returns ``(values [n, k], indices LongTensor [n, k])`` in decreasing value order (equal
    values in increasing index order). ``k`` must be in ``[0, V]``.
    """
    n, V = q.shape
    if k == 0:
        return q.new_zeros(n, 0), torch.zeros(n, 0, dtype=torch.long, device=q.device)
    thr = torch.topk(q, k, dim=-1).values[:, -1:]  # [n, 1] the k-th largest value
    gt = q > thr
    eq = q == thr
    need = k - gt.sum(-1, keepdim=True)
    sel = gt | (eq & (eq.cumsum(-1) <= need))  # exactly k per row, lowest ids among ties
    # their indices in increasing order without a host sync (no nonzero): the k largest of V - index
    rank = torch.arange(V, 0, -1, device=q.device)
    idx = torch.topk(torch.where(sel, rank, torch.zeros_like(rank)), k, dim=-1).indices
    vals = q.gather(1, idx)
    order = torch.sort(vals, dim=-1, descending=True, stable=True).indices
    return vals.gather(1, order), idx.gather(1, order)


def residual_draft(q: torch.Tensor, top_tokens: torch.Tensor) -> torch.Tensor:
    """M_s^neg: ``q`` (``[..., V]``) with ``top_tokens`` (LongTensor ``[..., k]``, -1 = none)
    set to 0 and renormalised. Rows with no mass left come back all zero (never NaN)."""
    r = q.clone()
    if top_tokens.numel():
        r.masked_fill_(removed_mask(r, top_tokens.clamp(min=0), top_tokens >= 0), 0.0)
    s = r.sum(-1, keepdim=True)
    return torch.where(s > 0, r / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(r))


def remaining_mass(q: torch.Tensor, removed) -> float:
    """Mass of the row ``q`` (``[V]``) outside the distinct tokens ``removed`` (ints or a LongTensor).

    Summed over the remaining entries themselves, never as ``1 - q(removed)`` or
    ``sum(q) - q(removed)``: rows sum to 1 only within the tolerance of :mod:`eagle.verify.checks`, and
    when the removed tokens hold nearly all the mass either shortcut cancels catastrophically
    (a draft row 0.99995 / 0.00005 summing to 1.00002 gives 0.00003 instead of 0.00005).
    """
    idx = removed if isinstance(removed, torch.Tensor) else torch.tensor(list(removed), dtype=torch.long, device=q.device)
    if idx.numel() == 0:
        return float(q.sum())
    idx = idx.to(q.device).view(1, -1)
    return float(remaining_masses(q.view(1, -1), idx, torch.ones_like(idx, dtype=torch.bool))[0])


def remaining_masses(q: torch.Tensor, tokens: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    """Batched :func:`remaining_mass`: row ``i`` of ``q`` without the tokens ``tokens[i, j]`` where ``remove[i, j]``.

    Args:
        q: float ``[k, V]``; tokens: LongTensor ``[k, r]`` in ``[0, V)``, the removed ones distinct
            within a row; remove: bool ``[k, r]``.

    Returns:
        float64 ``[k]``: the remaining entries summed directly (a masked copy; on CPU in cache-sized
        row blocks through one reused buffer). No host synchronisation on any device.
    """
    k, V = q.shape
    per = max(1, BLOCK_ELEMENTS // max(V, 1))  # rows per block
    if q.device.type != "cpu" or k <= per:  # one masked copy of every row
        return _masked_sums(q.clone(), tokens, remove)
    out = torch.empty(k, dtype=torch.float64, device=q.device)
    buf = torch.empty(per, V, dtype=q.dtype, device=q.device)
    for r0 in range(0, k, per):
        r1 = min(k, r0 + per)
        sub = buf[: r1 - r0]
        sub.copy_(q[r0:r1])
        out[r0:r1] = _masked_sums(sub, tokens[r0:r1], remove[r0:r1])
    return out


def removed_mask(like: torch.Tensor, tokens: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    """Bool ``[..., V]`` (shape of ``like``): True at ``tokens[..., j]`` where ``remove[..., j]``.

    Built with an additive scatter, which is exact whatever the order of the writes. A plain
    ``scatter_`` of "0 where removed, the old value where kept" is not: when a kept slot (e.g. a
    padding slot) names the same token as a removed one, the two writes to one column race and the
    removed entry can come back (the cause of UniVer's loss of losslessness on trees with a node
    narrower than the widest one, issue 52).
    """
    cnt = torch.zeros(like.shape, dtype=torch.int32, device=like.device)
    cnt.scatter_add_(-1, tokens, remove.to(torch.int32))
    return cnt > 0


def zero_tokens_(x: torch.Tensor, tokens: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    """``x`` (``[k, V]``, in place) with ``tokens[i, j]`` set to 0 where ``remove[i, j]``; returns ``x``.

    One scatter of ``r`` values per row, no ``[k, V]`` mask: a kept slot that names the same token as
    a removed one writes 0 as well (a slot-by-slot comparison, ``[k, r, r]``), so every write to
    one column carries the same value and the scatter is exact whatever the order of the writes
    (the race of issue 52 cannot occur).
    """
    same = tokens.unsqueeze(2) == tokens.unsqueeze(1)  # [k, r, r]
    gone = (same & remove.unsqueeze(1)).any(2)  # slot j names a removed token
    return x.scatter_(1, tokens, x.gather(1, tokens).masked_fill_(gone, 0.0))


def _masked_sums(sub: torch.Tensor, tokens: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    """Row sums of ``sub`` (a copy, modified in place) with the removed tokens zeroed (float64)."""
    return zero_tokens_(sub, tokens, remove).sum(1).to(torch.float64)


def _race(q: torch.Tensor, k: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Exponential race: the k largest ``q / E`` (E ~ Exp(1)), decreasing. Returns (keys, idx)."""
    e = torch.empty(q.shape, dtype=torch.float32, device=q.device).exponential_(generator=generator)
    keys = q.float() / e.clamp_min(torch.finfo(torch.float32).tiny)
    return torch.topk(keys, k, dim=-1)


def draw_children(draft_probs: torch.Tensor, m: int, rule: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw the children tokens of ``n`` nodes with a drafting rule, vectorised over nodes.

    Args:
        draft_probs: float ``[n, V]``, rows = M_s(. | node) (summing to 1).
        m: children per node, ``1 <= m <= V``.
        rule: ``"wor"``, ``"topk_residual"`` or ``"topk"``.
        generator: optional ``torch.Generator`` for the random draws.

    Returns:
        LongTensor ``[n, m]`` of tokens in child (rank) order. Where the law's support is too
        small to give m distinct children, the missing slots are -1 (the engine prunes them).

    Raises:
        ValueError: on an unknown rule, a non-2-D input or ``m`` outside ``[1, V]``.
    """
    if rule not in DRAFTING_RULES:
        raise ValueError(f"unknown drafting rule {rule!r}; use one of {DRAFTING_RULES}")
    if draft_probs.dim() != 2:
        raise ValueError(f"draft_probs must be [n, V], got {tuple(draft_probs.shape)}")
    n, V = draft_probs.shape
    if not 1 <= m <= V:
        raise ValueError(f"m must be in [1, {V}], got {m}")
    q = draft_probs
    if rule == "topk":
        vals, idx = stable_topk(q, m)
        return torch.where(vals > 0, idx, -1)
    if rule == "wor":
        keys, idx = _race(q, m, generator)
        return torch.where(keys > 0, idx, -1)
    # topk_residual
    vals, top = stable_topk(q, m - 1)
    top = torch.where(vals > 0, top, -1)
    res = q.float().clone()
    if m > 1:
        res.scatter_(1, top.clamp(min=0), 0.0)  # a -1 slot only occurs where vals <= 0, harmless
    keys, last = _race(res, 1, generator)
    last = torch.where(keys > 0, last, -1)
    return torch.cat([top, last], dim=1)


def children_law(q: torch.Tensor, m: int, rule: str) -> list[tuple[tuple[int, ...], float]]:
    """Exact law of the children tuple of one node (for tests; small V only).

    Args:
        q: float ``[V]`` draft law M_s(. | node).
        m: number of children requested.
        rule: a drafting rule.

    Returns:
        ``[(tokens, prob), ...]`` over all possible children tuples with positive probability.
        Tuples are shorter than ``m`` where the support is too small (the pruned -1 slots).
    """
    if rule not in DRAFTING_RULES:
        raise ValueError(f"unknown drafting rule {rule!r}")
    qv = [float(x) for x in q.tolist()]
    support = sorted((x for x in range(len(qv)) if qv[x] > 0), key=lambda x: (-qv[x], x))
    if rule == "topk":
        return [(tuple(support[:m]), 1.0)]
    if rule == "wor":
        k = min(m, len(support))
        out = []
        for perm in itertools.permutations(support, k):
            p, used = 1.0, set()
            for x in perm:  # the mass left is summed, never 1 - q(x...): that cancels for peaked laws
                p *= qv[x] / math.fsum(qv[z] for z in support if z not in used)
                used.add(x)
            out.append((perm, p))
        return out
    top = tuple(support[: m - 1])
    rest = support[m - 1:]
    if not rest:
        return [(top, 1.0)]
    mass = math.fsum(qv[x] for x in rest)
    return [(top + (x,), qv[x] / mass) for x in rest]


#: cap on the factor lam of :func:`positive_part` where it is the inverse of a small probability mass
#: (UniVer's c / p~, Traversal's Pm / (alpha Qm)). A nonzero float32 draft entry is at least 1.4e-45, so
#: lam > 1e60 makes lam q(x) > 1e15 wherever q(x) > 0: max(B - lam q, 0) with B <= 1 is then exactly B
#: where q = 0 and 0 elsewhere, as with any larger lam (float64 laws: UniVer's S = p~ sum max(B - lam q, 0)
#: changes by less than p~ < 1e-15 there)
LAMBDA_CAP = 1e60


def positive_part(B: torch.Tensor, q: torch.Tensor, lam: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``max(B - lam q, 0)`` row by row, in the dtype of ``B``, with no host synchronisation.

    Args:
        B, q: float ``[..., V]`` (same dtype and device); lam: ``[..., 1]`` tensor, >= 0, of that
            dtype or float64 (up to :data:`LAMBDA_CAP`); out: optional buffer shaped as ``B``.

    A float64 ``lam`` with float32 rows is applied as two float32 factors sqrt(lam) (q times the
    first, then the second), each <= 1e30: lam beyond float32's range (the inverse of a denormal
    residual mass, as at low temperatures) stays exact, never inf * 0.
    """
    if lam.dtype == B.dtype:
        return torch.addcmul(B, q, lam, value=-1.0, out=out).clamp_(min=0)
    lam = lam.to(torch.float64)
    lam1 = lam.sqrt()
    lam2 = (lam / lam1.clamp_min(1e-300)).to(B.dtype)
    qb = torch.mul(q, lam2, out=out)
    return torch.addcmul(B, qb, lam1.to(B.dtype), value=-1.0, out=out).clamp_(min=0)
