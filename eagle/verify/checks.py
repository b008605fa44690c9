"""Input validation shared by every verifier (the tree structure itself lives in :mod:`eagle.tree.structure`).

Every verifier takes the common tree form (see :mod:`eagle.verify.registry`); the registry's one
door (:func:`prepare_step`) calls :func:`check_tree_inputs` once; a bad input raises ``ValueError``
naming the node, never a silent wrong answer.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from ..rules import DRAFTING_RULES
from ..tree.structure import TreeStructure, structure_of, tree_structure

__all__ = ["TreeStructure", "tree_structure", "structure_of", "check_tree_inputs", "prepare_step", "sum_tolerance",
           "compute_dtype", "SUM_TOL", "RENORMALISE_ABOVE"]

#: Tolerance on |row sum - 1| for target rows and (inner-node) draft rows in float32 / float64.
SUM_TOL = 1e-4

#: float32 / float64 rows further than this from summing to 1 are divided by their sums at the door
#: (validated calls), so the law used is that of the normalised rows; closer rows are used as they
#: are. float32: 1e-5, ten times the rounding of a float32 softmax over V = 152064 (up to 1.8e-6
#: measured), so softmax rows pass without a copy.
RENORMALISE_ABOVE = {torch.float32: 1e-5, torch.float64: 1e-12}

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def sum_tolerance(dtype: torch.dtype) -> float:
    """|row sum - 1| allowed for laws of ``dtype``: :data:`SUM_TOL`, or the machine epsilon of a
    16-bit float (float16 9.8e-4, bfloat16 7.8e-3), whose rounding alone moves a row sum that far."""
    return max(SUM_TOL, torch.finfo(dtype).eps) if dtype in _LOW_PRECISION else SUM_TOL


def compute_dtype(target_dtype: torch.dtype, draft_dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute in: float16 / bfloat16 become float32, then the two are promoted."""
    up = [torch.float32 if d in _LOW_PRECISION else d for d in (target_dtype, draft_dtype)]
    return torch.promote_types(*up)


@lru_cache(maxsize=256)
def _inner_nodes(parents: tuple) -> torch.Tensor:
    """LongTensor of the nodes with children, increasing (host)."""
    st = tree_structure(parents)
    return torch.tensor([v for v in range(st.num_nodes) if st.children[v]], dtype=torch.long, device="cpu")


def _rows(x: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """Rows ``nodes`` (sorted LongTensor) of ``x``: a view when consecutive, else a gather."""
    k = nodes.numel()
    if k and int(nodes[-1]) - int(nodes[0]) == k - 1:
        return x.narrow(0, int(nodes[0]), k)
    return x.index_select(0, nodes.to(x.device))


def _first(mask: torch.Tensor) -> int:
    return int(mask.nonzero()[0, 0])


def _check_rows(probs: torch.Tensor, nodes: torch.Tensor, what: str) -> torch.Tensor | None:
    """Rows ``probs`` (``[k, V]``) belong to ``nodes`` (``[k]``): finite, >= 0, sum to 1.
    Returns the row sums ``[k]`` (None for no rows).

    Two row reductions: the sum and the minimum (NaN propagates through both; +inf makes the sum
    inf, -inf the minimum). ``torch.amin`` rather than ``torch.aminmax(dim=-1)``: the latter is
    ~20x slower on CPU (torch 2.13, measured in ``evaluation.bench_verify``'s setting).
    """
    if probs.shape[0] == 0:
        return None
    s = probs.sum(-1, dtype=torch.float32) if probs.dtype in (torch.float16, torch.bfloat16) else probs.sum(-1)
    mn = probs.amin(-1)
    bad = ~torch.isfinite(s) | ~torch.isfinite(mn)
    if bool(bad.any()):
        raise ValueError(f"node {int(nodes[_first(bad)])}: {what} row contains NaN or inf")
    if bool((mn < 0).any()):
        raise ValueError(f"node {int(nodes[_first(mn < 0)])}: {what} row has a negative probability")
    tol = sum_tolerance(probs.dtype)
    off = (s - 1.0).abs() > tol
    if bool(off.any()):
        i = _first(off)
        raise ValueError(f"node {int(nodes[i])}: {what} row sums to {float(s[i]):.6g}, not 1 (tol {tol:g})")
    return s


def check_tree_inputs(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
                      draft_probs: torch.Tensor, drafting: str | None = None) -> TreeStructure:
    """Validate one verification step's inputs (the common tree form) and return its structure.

    Args:
        parents: LongTensor ``[N]``; ``parents[0] == -1``, ``0 <= parents[i] < i``.
        tokens: LongTensor ``[N]``, every entry in ``[0, V)``.
        target_probs: float ``[N, V]``; every row finite, >= 0, summing to 1 within
            :func:`sum_tolerance` of its dtype (:data:`SUM_TOL` for float32 / float64).
        draft_probs: float ``[N, V]``; rows of nodes with children as target rows (leaf rows unused).
        drafting: the rule the children were drawn with (``"wor"``, ``"topk_residual"``, ``"topk"``)
            or ``None`` to skip the rule checks. ``wor``: children of a node are distinct tokens.
            ``topk_residual``: distinct, and the first m-1 children are m-1 most probable tokens of
            the parent's draft law (any order among equal probabilities); so the last child is not
            one of them. ``topk``: distinct and all m children are m most probable tokens.

    Returns:
        The :class:`TreeStructure` of ``parents``.

    Raises:
        ValueError: naming the node, on shape / dtype disagreements, a malformed ``parents``,
            NaN / inf / negative probabilities, rows not summing to 1, out-of-vocabulary tokens,
            a child whose token has zero draft probability at its parent, or a tree inconsistent
            with ``drafting``.
    """
    return _validate(parents, tokens, target_probs, draft_probs, drafting)[0]


def _validate(parents, tokens, target_probs, draft_probs, drafting):
    """:func:`check_tree_inputs`, also returning the row sums: ``(st, target sums [N], draft sums of
    the inner nodes [I] or None)``."""
    for name, t in (("parents", parents), ("tokens", tokens), ("target_probs", target_probs),
                    ("draft_probs", draft_probs)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if parents.dim() != 1 or tokens.dim() != 1:
        raise ValueError(f"parents and tokens must be 1-D, got shapes {tuple(parents.shape)} and {tuple(tokens.shape)}")
    for name, t in (("parents", parents), ("tokens", tokens)):
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    n = parents.shape[0]
    if tokens.shape[0] != n:
        raise ValueError(f"tokens has {tokens.shape[0]} nodes, parents has {n}")
    if target_probs.dim() != 2 or target_probs.shape[0] != n:
        raise ValueError(f"target_probs must be [N={n}, V], got {tuple(target_probs.shape)}")
    if draft_probs.shape != target_probs.shape:
        raise ValueError(f"draft_probs shape {tuple(draft_probs.shape)} != target_probs shape {tuple(target_probs.shape)}")
    if not (target_probs.dtype.is_floating_point and draft_probs.dtype.is_floating_point):
        raise ValueError("target_probs and draft_probs must be floating-point tensors")
    if target_probs.device != draft_probs.device:
        raise ValueError(f"target_probs is on {target_probs.device}, draft_probs on {draft_probs.device}: use one device")
    if target_probs.device.type == "meta":
        raise ValueError("target_probs and draft_probs are on the meta device (no values): verification needs real laws")
    if drafting is not None and drafting not in DRAFTING_RULES:
        raise ValueError(f"unknown drafting rule {drafting!r}; use one of {DRAFTING_RULES}")
    st = structure_of(parents)
    V = target_probs.shape[1]
    bad_tok = (tokens < 0) | (tokens >= V)
    if bool(bad_tok.any()):
        i = _first(bad_tok)
        raise ValueError(f"node {i}: token {int(tokens[i])} is outside the vocabulary [0, {V})")
    ts = _check_rows(target_probs, torch.arange(n, device="cpu"), "target_probs")
    inner = _inner_nodes(st.parents)
    if inner.numel() == 0:
        return st, ts, None
    ds = _check_rows(_rows(draft_probs, inner), inner, "draft_probs")
    dev = draft_probs.device  # structure tensors are built on the host; move what meets the laws
    par = parents[1:].to(dev, torch.long)
    tok = tokens.to(dev, torch.long)
    q_child = draft_probs[par, tok[1:]]
    zero = q_child <= 0
    if bool(zero.any()):
        i = _first(zero) + 1
        raise ValueError(f"node {i}: token {int(tok[i])} has zero draft probability at its parent {st.parents[i]}")
    if drafting is None:
        return st, ts, ds
    # distinct children: (parent, token) pairs are unique
    key = par * V + tok[1:]
    if torch.unique(key).numel() != key.numel():
        seen: dict[int, int] = {}
        for i, k in enumerate(key.tolist(), start=1):
            if k in seen:
                raise ValueError(f"node {i}: token {int(tok[i])} repeats sibling node {seen[k]} "
                                 f"(drafting {drafting!r} draws distinct children)")
            seen[k] = i
    if drafting == "wor":
        return st, ts, ds
    for nodes, child_nodes, m in st.inner_levels:
        ntop = m - 1 if drafting == "topk_residual" else m
        kmax = int(ntop.max())
        if kmax == 0:
            continue
        ctok = tok[child_nodes[:, :kmax].clamp(min=0).to(dev)]  # [k, kmax]
        nodes_d, ntop_d = nodes.to(dev), ntop.to(dev)
        if kmax == 1:  # one top child: it must hold the row maximum
            row_max = _rows(draft_probs, nodes).amax(-1)
            cval = draft_probs[nodes_d, ctok[:, 0]]
            bad_row = (ntop_d == 1) & (cval != row_max.to(cval.dtype))
        else:
            # the ntop children are ntop most probable tokens iff no other token has a probability
            # above their minimum: the row maximum with those children masked out (a copy, a
            # scatter and one float reduction: ~8x cheaper on CPU than counting with a bool mask)
            q = _rows(draft_probs, nodes)  # [k, V]
            cols = torch.arange(kmax, device=dev)
            use = cols[None, :] < ntop_d[:, None]  # [k, kmax]
            cvals = q.gather(1, ctok)
            lowest = torch.where(use, cvals, torch.full_like(cvals, float("inf"))).amin(1)  # [k]
            masked = torch.where(use, ctok, ctok[:, :1])  # unused slots repeat the first child
            rest_max = q.clone().scatter_(1, masked, float("-inf")).amax(1)
            bad_row = (ntop_d > 0) & (rest_max > lowest)
        if bool(bad_row.any()):
            r = _first(bad_row)
            v = int(nodes[r])
            what = f"first {int(ntop[r])}" if drafting == "topk_residual" else f"all {int(ntop[r])}"
            raise ValueError(f"node {v}: its {what} children are not the most probable tokens of its draft law "
                             f"(drafting {drafting!r})")
    return st, ts, ds


def _renormalise(x: torch.Tensor, sums: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor:
    """``x`` (``[N, V]``, float32 / float64) with the rows ``rows`` (all if None) whose sums ``sums``
    are more than :data:`RENORMALISE_ABOVE` away from 1 divided by their sums (a copy only then)."""
    if sums is None:
        return x
    off = (sums.to(torch.float64) - 1.0).abs() > RENORMALISE_ABOVE[x.dtype]
    if not bool(off.any()):
        return x
    scale = torch.where(off, sums.to(x.dtype), torch.ones_like(sums, dtype=x.dtype))
    if rows is not None:  # a scale for every row, 1 outside ``rows``: one pass over x
        scale = torch.ones(x.shape[0], dtype=x.dtype, device=x.device).index_copy_(0, rows.to(x.device), scale)
    return x / scale.unsqueeze(1)


def prepare_step(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                 drafting: str | None, check: bool = True, exact: bool = False,
                 structure: TreeStructure | None = None):
    """The door of every verifier: validate (unless ``check`` is False) and bring the laws to the
    dtype the kernels compute in, as normalised rows.

    Returns:
        ``(st, tokens, target_probs, draft_probs)``: the :class:`TreeStructure`, tokens as a
        LongTensor, and the laws in :func:`compute_dtype`. float16 / bfloat16 rows are upcast to
        float32 and divided by their sums (always, also with ``check=False``). float32 / float64
        rows that sum to 1 only within the tolerance (more than :data:`RENORMALISE_ABOVE` away
        from 1) are divided by their sums when ``check`` is True, so the law used is that of the
        normalised rows; with ``check=False`` such rows are trusted as normalised (a softmax is,
        to float rounding) and pass through without a copy. ``exact`` (for exact laws): both laws
        in float64, every row divided by its sum. ``structure``: the tree's :class:`TreeStructure`
        when the caller has it (saves the host copy of ``parents``; used only with ``check=False``).

    Raises:
        ValueError: as :func:`check_tree_inputs`.
    """
    if check:
        st, tsum, dsum = _validate(parents, tokens, target_probs, draft_probs, drafting)
    else:
        st, tsum, dsum = (structure if structure is not None else structure_of(parents)), None, None
    if exact:
        def norm64(x: torch.Tensor) -> torch.Tensor:
            x = x.to(torch.float64)
            return x / x.sum(-1, keepdim=True).clamp_min(1e-300)  # leaf draft rows may be 0
        return st, tokens.long(), norm64(target_probs), norm64(draft_probs)
    dt = compute_dtype(target_probs.dtype, draft_probs.dtype)

    def bring(x: torch.Tensor, sums, rows) -> torch.Tensor:
        if x.dtype in _LOW_PRECISION:
            x = x.to(dt)
            return x / x.sum(-1, keepdim=True).clamp_min(torch.finfo(dt).tiny)
        if x.dtype != dt and sums is not None:  # float32 promoted to float64: sums in float64
            x = x.to(dt)
            sums = (x if rows is None else x[rows.to(x.device)]).sum(-1)
        return _renormalise(x.to(dt), sums, rows)

    return (st, tokens.long(), bring(target_probs, tsum, None),
            bring(draft_probs, dsum, _inner_nodes(st.parents) if dsum is not None else None))
