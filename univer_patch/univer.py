"""UniVer (Weng, Hu, Yairi, 2026): allocation top-down, decision in one post-order pass.

Children by ``topk_residual``. Notation of the paper, at node v with p~ = p~(v), B = M_b(.|v),
Q = M_s^neg(.|v) (the draft law off the top-(m-1) children, renormalised: Q = c q there, c =
1 / (1 - q(top)), Q = 0 on the top tokens) and sampled child u_m:

- Eq. 3: Z = 1 - p~ + sum_x max(p~ B(x) - Q(x), 0)
- Eq. 4: p_v(u_m) = min(1, p~ B(u_m) / Q(u_m))
- Eqs. 5-6: p_v(x) = max(p~ B(x) - Q(x), 0) (1 - p_v(u_m)) / Z for every other token x (the
  top-(m-1) children, where Q = 0, and all non-children)
- Eq. 7: p_v(not v) = (1 - p_v(u_m)) (1 - p~) / Z

Conditional normalisation in traversal order: p~(u_j) = p_v(u_j) / (1 - sum_{i<j} p_v(u_i)) and
the fallback threshold p~res(v) = 1 - p_v(not v) / (1 - sum_{i<=m} p_v(u_i)). p~(root) = 1.

Decision: eta_v ~ U(0,1) for every node, all drawn up front; the accepted node is the first node
in post-order with eta_v < p~(v) (leaf) or eta_v < p~res(v) (inner node). Then y ~ M_b(.|v) at a
leaf, y ~ p_v restricted to the non-children, renormalised, at an inner node.

Lossless fallbacks (never NaN): if p_v(u_m) = 1 then (1 - p_v(u_m)) / Z is taken as 0 (Z may
be 0 then); a conditional normalisation with denominator 0 gives p~ = 0 (that child is
unreachable); p~res(v) = 1 where p_v(not v) = 0 (v is never rejected).

Allocation is layer by layer, all inner nodes of a layer at once (tensor ops over [nodes, V]);
only the one dense reduction S = sum_x max(p~ B(x) - Q(x), 0) per inner node touches the
vocabulary, and only for "live" nodes (0 < p~ and p_v(u_m) < 1: otherwise p_v needs no Z).

Cost: O(inner nodes x V) per step, against O(visited path x V) for top-down RRSw / Greedy. A
lazy post-order evaluation does not help: on the bench trees it needs ~98% of the inner nodes'
Z before it stops, because the top-(m-1) subtrees (small p~) come first in post-order.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from eagle.verify.checks import TreeStructure, check_tree_inputs, structure_of, tree_structure
from eagle.verify.registry import Verifier, register_verifier
from eagle.verify.rules import sample_with_uniform

__all__ = ["Allocation", "allocate", "positive_part_sums", "decide", "univer_kernel", "allocation_row", "verify", "outcome_probs"]


@dataclass
class Allocation:
    """UniVer's allocation of one tree (float64 tensors, all ``[N]``).

    Attributes:
        p_tilde: p~(v); 1 at the root.
        p_edge: p_v(u) of node u at its parent (Eqs. 4-6); 0 at the root.
        p_not: p_v(not v) (Eq. 7); 0 at leaves.
        weight: (1 - p_v(u_m)) / Z of each inner node (0 where p_v(u_m) = 1); 0 at leaves.
        scale: c = 1 / (1 - q(top-(m-1))) of each inner node (Q = c q off the top tokens).
        threshold: p~(v) at leaves, p~res(v) at inner nodes.
    """

    p_tilde: torch.Tensor
    p_edge: torch.Tensor
    p_not: torch.Tensor
    weight: torch.Tensor
    scale: torch.Tensor
    threshold: torch.Tensor


#: cap on c / p~ in the dense reduction (see :func:`allocate`)
LAMBDA_CAP = 1e30


@dataclass(frozen=True)
class _Level:
    """Structure-only tensors of one depth's inner nodes (computed once per tree shape)."""

    nodes: torch.Tensor  # [k] inner nodes of this depth
    first: int  # nodes[0] when the nodes are consecutive (a row view), else -1
    cnode: torch.Tensor  # [k, mmax] child nodes, padding -> 0
    valid: torch.Tensor  # [k, mmax] bool: a real child
    is_top: torch.Tensor  # [k, mmax] bool: one of the top-(m-1) children
    last_col: torch.Tensor  # [k, 1] column of the sampled child u_m
    vc: torch.Tensor  # real child nodes, row-major ([valid.sum()])


@lru_cache(maxsize=256)
def _shape_of(parents: tuple) -> tuple[tuple, torch.Tensor]:
    """Per tree shape (cached): the :class:`_Level` of every depth with inner nodes, and the leaf mask ``[N]``."""
    st = tree_structure(parents)
    levels = []
    for nodes, child_nodes, m in st.inner_levels:
        k, mmax = child_nodes.shape
        valid = child_nodes >= 0
        col = torch.arange(mmax)
        consecutive = int(nodes[-1]) - int(nodes[0]) == k - 1
        levels.append(_Level(nodes=nodes, first=int(nodes[0]) if consecutive else -1, cnode=child_nodes.clamp(min=0),
                             valid=valid, is_top=valid & (col[None, :] < (m - 1)[:, None]),
                             last_col=(m - 1)[:, None], vc=child_nodes[valid]))
    leaves = torch.tensor([not ch for ch in st.children], dtype=torch.bool)
    return tuple(levels), leaves


#: elements of the scratch block in :func:`positive_part_sums` (4 MiB in float32: stays in cache)
BLOCK_ELEMENTS = 1 << 20


def positive_part_sums(B: torch.Tensor, q: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Row sums of max(B - lam q, 0): the dense part of UniVer's Eq. 3.

    Args:
        B, q: float ``[k, V]`` (same dtype and device); lam: ``[k, 1]`` of that dtype.

    Returns:
        ``[k]`` in the dtype of ``B``. Computed in row blocks of about :data:`BLOCK_ELEMENTS`
        through one reused scratch buffer: a fresh ``[k, V]`` temporary costs page faults and
        memory traffic (on CPU, k = 127, V = 152064: 95 ms at once against 15 ms blocked).
        Other devices take one pass.
    """
    k, V = B.shape
    rows = max(1, BLOCK_ELEMENTS // max(V, 1))
    if k <= rows or B.device.type != "cpu":  # one fused pass suits a GPU
        return torch.addcmul(B, q, lam, value=-1.0).clamp_(min=0).sum(1)
    out = torch.empty(k, dtype=B.dtype, device=B.device)
    buf = torch.empty(rows, V, dtype=B.dtype, device=B.device)
    for r0 in range(0, k, rows):
        r1 = min(k, r0 + rows)
        blk = torch.addcmul(B[r0:r1], q[r0:r1], lam[r0:r1], value=-1.0, out=buf[: r1 - r0]).clamp_(min=0)
        torch.sum(blk, 1, out=out[r0:r1])
    return out


def allocate(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
             *, _broken: str = "") -> Allocation:
    """UniVer's allocation, layer by layer (all inner nodes of a depth at once).

    Args:
        st: tree structure; tokens: LongTensor ``[N]``; target_probs / draft_probs: float ``[N, V]``
            (validated, drafting ``topk_residual``).

    Returns:
        :class:`Allocation`. ``_broken`` (test-only negative control): ``"softmax_residual"``
        normalises the residual max(p~B - Q, 0) with a softmax instead of Z (not lossless).
    """
    n = st.num_nodes
    f64 = torch.float64
    p_tilde = torch.zeros(n, dtype=f64)
    p_tilde[0] = 1.0
    p_edge = torch.zeros(n, dtype=f64)
    p_not = torch.zeros(n, dtype=f64)
    weight = torch.zeros(n, dtype=f64)
    scale = torch.zeros(n, dtype=f64)
    threshold = torch.zeros(n, dtype=f64)
    levels, leaves = _shape_of(st.parents)
    for lv in levels:
        nodes, is_top, last_col = lv.nodes, lv.is_top, lv.last_col
        ctok = tokens[lv.cnode]  # [k, mmax]
        if lv.first >= 0:
            B = target_probs.narrow(0, lv.first, nodes.numel())  # [k, V]
            q = draft_probs.narrow(0, lv.first, nodes.numel())
        else:
            B, q = target_probs.index_select(0, nodes), draft_probs.index_select(0, nodes)
        Bc_raw, qc_raw = B.gather(1, ctok), q.gather(1, ctok)  # B, q at the children [k, mmax]
        Bc, qc = Bc_raw.to(f64), qc_raw.to(f64)
        top_mass = (qc * is_top).sum(1)
        c = 1.0 / (1.0 - top_mass).clamp_min(1e-300)  # Q = c q off the top tokens (top_mass < 1: validated)
        pt = p_tilde[nodes]  # p~(v) [k]
        B_last = Bc.gather(1, last_col).squeeze(1)
        Q_last = c * qc.gather(1, last_col).squeeze(1)  # > 0: a child has nonzero draft probability
        # Eq. 4: p_v(u_m) = min(1, p~ B(u_m) / Q(u_m))
        a = (pt * B_last / Q_last.clamp_min(1e-300)).clamp(max=1.0)
        # Eq. 3: Z = 1 - p~ + S, S = sum_x max(p~ B(x) - Q(x), 0) = p~ sum_x max(B - lam q, 0) with
        # lam = c / p~ (capped: products like p~ B would be subnormal floats for tiny p~, 10-100x
        # slower on CPU; the cap changes S by < 1e-30). Rows with a = 1 or p~ = 0 need no S (w = 0).
        lam = (c / pt.clamp_min(1e-300)).clamp(max=LAMBDA_CAP).to(B.dtype)[:, None]
        if _broken == "softmax_residual":
            D = torch.softmax(B - lam * q, dim=-1)
            dense, Dt = D.sum(1), D.gather(1, ctok)
        else:
            dense = positive_part_sums(B, q, lam)  # sum_x max(B - lam q, 0) over all x
            Dt = torch.addcmul(Bc_raw, qc_raw, lam, value=-1.0).clamp_(min=0)
        # on the top tokens Q = 0: replace max(B - lam q, 0) by B there
        S = pt * (dense.to(f64) + ((Bc - Dt.to(f64)) * is_top).sum(1))
        Z = 1.0 - pt + S
        live = (a < 1) & (Z > 0)
        w = torch.where(live, (1.0 - a) / Z.clamp_min(1e-300), torch.zeros_like(Z))  # S = 0 when p~ = 0
        # Eqs. 5-6 at the top children (Q = 0 there), Eq. 4 at the sampled child
        pe = (pt * w)[:, None] * Bc * is_top
        pe.scatter_(1, last_col, a[:, None])
        pn = w * (1.0 - pt)  # Eq. 7
        # conditional normalisation in traversal (rank) order
        den = 1.0 - (torch.cumsum(pe, 1) - pe)
        pt_child = torch.where(den > 0, pe / den.clamp_min(1e-300), torch.zeros_like(pe)).clamp(0.0, 1.0)
        den_res = 1.0 - pe.sum(1)
        thr = torch.where(pn > 0, 1.0 - pn / den_res.clamp_min(1e-300), torch.ones_like(pn)).clamp(0.0, 1.0)
        p_tilde[lv.vc] = pt_child[lv.valid]
        p_edge[lv.vc] = pe[lv.valid]
        p_not[nodes], weight[nodes], scale[nodes], threshold[nodes] = pn, w, c, thr
    threshold = torch.where(leaves, p_tilde, threshold)
    return Allocation(p_tilde, p_edge, p_not, weight, scale, threshold)


def allocation_row(alloc: Allocation, st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor,
                   draft_probs: torch.Tensor, v: int, *, children_zeroed: bool = True) -> torch.Tensor:
    """p_v(x) over the vocabulary for inner node v (Eqs. 4-6), dtype of ``target_probs``.

    With ``children_zeroed`` the children tokens are 0: the (unnormalised) law of y at v.
    Otherwise the row also holds p_v at the children (Eq. 4 at u_m); sum + p_v(not v) = 1.
    """
    ctok = [int(t) for t in tokens[list(st.children[v])].tolist()]
    pt, c, w = float(alloc.p_tilde[v]), float(alloc.scale[v]), float(alloc.weight[v])
    B, q = target_probs[v], draft_probs[v]
    lam = min(c / pt, LAMBDA_CAP) if pt > 0 else LAMBDA_CAP
    row = torch.add(B, q, alpha=-lam).clamp_(min=0)  # max(p~B - Q, 0) / p~, no subnormal products
    if len(ctok) > 1:
        row[ctok[:-1]] = B[ctok[:-1]]
    row.mul_(w * pt)
    row[ctok[-1]] = 0.0
    if children_zeroed:
        row[ctok] = 0.0
    else:
        row[ctok[-1]] = float(alloc.p_edge[st.children[v][-1]])
    return row


def decide(st: TreeStructure, threshold: torch.Tensor, eta: torch.Tensor) -> int:
    """The accepted node: the first node in post-order with ``eta[v] < threshold[v]``.

    Args:
        threshold: float ``[N]`` (p~ at leaves, p~res at inner nodes; 1 at the root).
        eta: float ``[N]`` uniforms in [0, 1).
    """
    passed = (eta < threshold)[st.postorder_t]
    k = int(torch.argmax(passed.to(torch.uint8)))  # first True; the root (last) always passes
    return st.postorder[k] if bool(passed[k]) else 0


def _y_row(alloc, st, tokens, target_probs, draft_probs, v: int) -> torch.Tensor:
    if not st.children[v]:
        return target_probs[v]
    row = allocation_row(alloc, st, tokens, target_probs, draft_probs, v)
    if float(row.sum()) > 0:
        return row
    # probability-0 event (v reached while its non-children mass is 0): any law is lossless here
    row = target_probs[v].clone()
    row[tokens[list(st.children[v])]] = 0.0
    return row if float(row.sum()) > 0 else target_probs[v]


def univer_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  uniforms: torch.Tensor) -> tuple[int, int]:
    """One UniVer decision as a pure function of ``uniforms`` (float ``[N, 2]``: column 0 = eta_v,
    column 1 draws y at the accepted node). Returns ``(node_index, next_token)``."""
    alloc = allocate(st, tokens, target_probs, draft_probs)
    v = decide(st, alloc.threshold, uniforms[:, 0])
    return v, sample_with_uniform(_y_row(alloc, st, tokens, target_probs, draft_probs, v), float(uniforms[v, 1]))


def verify(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
           generator: torch.Generator | None = None, *, check: bool = True) -> tuple[int, int]:
    """Sample one UniVer outcome (common tree form, drafting ``topk_residual``).

    Returns ``(node_index, next_token)``. Raises ``ValueError`` on invalid inputs.
    """
    st = check_tree_inputs(parents, tokens, target_probs, draft_probs, "topk_residual") if check else structure_of(parents)
    tokens = tokens.long()
    uniforms = torch.rand(st.num_nodes, 2, generator=generator, dtype=torch.float64)
    return univer_kernel(st, tokens, target_probs, draft_probs, uniforms)


def outcome_probs(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  *, check: bool = True, _broken: str = "") -> torch.Tensor:
    """Exact law ``[N, V]`` of UniVer's outcome (node i ends the path, next token y).

    P(node v accepted) = threshold(v) * prod over earlier post-order nodes w of (1 - threshold(w));
    the y law at v is as in :func:`univer_kernel`. ``_broken``: see :func:`allocate`; also
    ``"inner_ptilde"`` uses p~(v) instead of p~res(v) as the threshold of inner nodes.
    """
    st = check_tree_inputs(parents, tokens, target_probs, draft_probs, "topk_residual") if check else structure_of(parents)
    tokens = tokens.long()
    alloc = allocate(st, tokens, target_probs, draft_probs, _broken=_broken)
    thr_all = alloc.threshold
    if _broken == "inner_ptilde":
        thr_all = alloc.p_tilde
    thr = thr_all[st.postorder_t]
    fail_before = torch.cumprod(torch.cat([torch.ones(1, dtype=thr.dtype), 1.0 - thr[:-1]]), 0)
    p_node = torch.zeros(st.num_nodes, dtype=torch.float64)
    p_node[st.postorder_t] = thr * fail_before
    out = torch.zeros_like(target_probs)
    for v in range(st.num_nodes):
        if p_node[v] <= 0:
            continue
        row = _y_row(alloc, st, tokens, target_probs, draft_probs, v)
        out[v] = float(p_node[v]) * row / row.sum()
    return out


VERIFIER = register_verifier(Verifier(
    name="univer", drafting="topk_residual", verify=verify, outcome_probs=outcome_probs,
    description="UniVer (Weng, Hu, Yairi 2026): layer-wise allocation, one post-order decision",
))
