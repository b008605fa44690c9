"""UniVer (Weng, Hu, Yairi, 2026): allocation top-down, decision in one post-order pass.

Children by ``topk_residual``. Notation of the paper, at node v with p~ = p~(v), B = M_b(.|v),
Q = M_s^neg(.|v) (the draft law off the top-(m-1) children, renormalised: Q = c q there, c =
1 / (the draft mass off the top tokens, summed directly), Q = 0 on the top tokens) and sampled child u_m:

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

from dataclasses import dataclass, fields, replace
from functools import lru_cache

import torch

from eagle.rules import BLOCK_ELEMENTS, LAMBDA_CAP, positive_part, remaining_masses
from eagle.sampling import draw_with_uniforms
from eagle.tree.structure import TreeStructure, device_tables, tree_structure
from eagle.verify.registry import Verifier, register_verifier

__all__ = ["Allocation", "allocate", "positive_part_sums", "decide", "univer_kernel", "allocation_row", "univer_law",
           "VERIFIER"]


@dataclass
class Allocation:
    """UniVer's allocation of one tree (float64 tensors, all ``[N]``).

    Attributes:
        p_tilde: p~(v); 1 at the root.
        p_edge: p_v(u) of node u at its parent (Eqs. 4-6); 0 at the root.
        p_not: p_v(not v) (Eq. 7); 0 at leaves.
        weight: (1 - p_v(u_m)) / Z of each inner node (0 where p_v(u_m) = 1); 0 at leaves.
        scale: c = 1 / (draft mass off the top-(m-1) tokens) of each inner node (Q = c q off them).
        threshold: p~(v) at leaves, p~res(v) at inner nodes.
    """

    p_tilde: torch.Tensor
    p_edge: torch.Tensor
    p_not: torch.Tensor
    weight: torch.Tensor
    scale: torch.Tensor
    threshold: torch.Tensor




@dataclass(frozen=True)
class _Level:
    """One depth's inner nodes: rows ``start:stop`` of the :class:`_Shape` arrays."""

    start: int
    stop: int
    nodes: torch.Tensor  # [k] inner nodes of this depth
    first: int  # nodes[0] when the nodes are consecutive (a row view), else -1
    valid_flat: torch.Tensor  # positions of the real children in the flattened [k, mmax] block
    vc: torch.Tensor  # the real child nodes, row-major


@dataclass(frozen=True)
class _Shape:
    """Structure-only tensors of one tree shape (computed once, cached). Inner nodes are ordered
    by depth (the order of :attr:`TreeStructure.inner_levels`), so every depth is a row slice."""

    inner: torch.Tensor  # [I] inner nodes
    inner_first: int  # inner[0] when the inner nodes are consecutive (a row view), else -1
    inner_col: torch.Tensor  # [I, 1] the same, for 2-D indexing
    cnode: torch.Tensor  # [I, mmax] child nodes, padding -> 0
    top: torch.Tensor  # [I, mmax] bool: the top-(m-1) children
    is_top: torch.Tensor  # [I, mmax] float64: the same as 1 / 0
    last_col: torch.Tensor  # [I, 1] column of the sampled child u_m
    vc: torch.Tensor  # real child nodes, row-major
    valid_flat: torch.Tensor  # their positions in the flattened [I, mmax]
    levels: tuple  # of _Level


def _first_row(nodes: torch.Tensor) -> int:
    """``nodes[0]`` when the (sorted) nodes are consecutive, so their rows are a view; else -1."""
    k = nodes.numel()
    return int(nodes[0]) if k and int(nodes[-1]) - int(nodes[0]) == k - 1 else -1


def _take(x: torch.Tensor, first: int, nodes: torch.Tensor) -> torch.Tensor:
    """Rows ``nodes`` of ``x``: a view when ``first >= 0`` (see :func:`_first_row`), else a gather."""
    return x.narrow(0, first, nodes.numel()) if first >= 0 else x.index_select(0, nodes)


def _moved(obj, device: str):
    """A copy of a frozen dataclass with every tensor field on ``device``."""
    return replace(obj, **{f.name: getattr(obj, f.name).to(device) for f in fields(obj)
                           if isinstance(getattr(obj, f.name), torch.Tensor)})


@lru_cache(maxsize=256)
def _shape_of(parents: tuple, device: str = "cpu") -> _Shape:
    """The :class:`_Shape` of a parents tuple on ``device`` (cached per tree shape and device)."""
    if device != "cpu":
        sh = _shape_of(parents)
        return replace(_moved(sh, device), levels=tuple(_moved(lv, device) for lv in sh.levels))
    st = tree_structure(parents)
    mmax = max((cn.shape[1] for _, cn, _ in st.inner_levels), default=1)
    nodes_l, cn_l, m_l, levels = [], [], [], []
    start = 0
    for nodes, child_nodes, m in st.inner_levels:
        k = nodes.numel()
        cn = torch.full((k, mmax), -1, dtype=torch.long, device="cpu")
        cn[:, : child_nodes.shape[1]] = child_nodes
        valid = cn >= 0
        levels.append(_Level(start=start, stop=start + k, nodes=nodes, first=_first_row(nodes),
                             valid_flat=valid.flatten().nonzero().flatten(), vc=cn[valid]))
        nodes_l.append(nodes), cn_l.append(cn), m_l.append(m)
        start += k
    if not levels:
        empty = torch.zeros(0, dtype=torch.long, device="cpu")
        inner, cn, m = empty, torch.zeros(0, 1, dtype=torch.long, device="cpu"), empty
    else:
        inner, cn, m = torch.cat(nodes_l), torch.cat(cn_l), torch.cat(m_l)
    valid = cn >= 0
    col = torch.arange(cn.shape[1], device="cpu")
    top = valid & (col[None, :] < (m - 1)[:, None])
    return _Shape(inner=inner, inner_first=_first_row(inner), inner_col=inner[:, None], cnode=cn.clamp(min=0),
                  top=top, is_top=top.double(), last_col=(m - 1)[:, None],
                  vc=cn[valid], valid_flat=valid.flatten().nonzero().flatten(), levels=tuple(levels))


def positive_part_sums(B: torch.Tensor, q: torch.Tensor, lam: torch.Tensor, zero: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """Row sums of max(B - lam q, 0): the dense part of UniVer's Eq. 3.

    Args:
        B, q: float ``[k, V]`` (same dtype and device); lam: ``[k, 1]``, >= 0, of that dtype or
            float64 (up to :data:`LAMBDA_CAP`); zero: optional LongTensor ``[k, r]`` of tokens left
            out of the sums (their terms are set to 0 before summing; repeats are fine).

    Returns:
        ``[k]`` in the dtype of ``B``. A float64 ``lam`` with float32 rows is applied as two
        float32 factors sqrt(lam) (:func:`~eagle.rules.positive_part`). Computed in row blocks of about :data:`BLOCK_ELEMENTS`
        through one reused scratch buffer: a fresh ``[k, V]`` temporary costs page faults and
        memory traffic (on CPU, k = 127, V = 152064: 95 ms at once against 15 ms blocked).
        Other devices take one pass.
    """
    k, V = B.shape
    rows = max(1, BLOCK_ELEMENTS // max(V, 1))
    if k <= rows or B.device.type != "cpu":  # one fused pass suits a GPU
        blk = positive_part(B, q, lam)
        return (blk if zero is None else blk.scatter_(1, zero, 0.0)).sum(1)
    out = torch.empty(k, dtype=B.dtype, device=B.device)
    buf = torch.empty(rows, V, dtype=B.dtype, device=B.device)
    for r0 in range(0, k, rows):
        r1 = min(k, r0 + rows)
        blk = positive_part(B[r0:r1], q[r0:r1], lam[r0:r1], out=buf[: r1 - r0])
        if zero is not None:
            blk.scatter_(1, zero[r0:r1], 0.0)
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
    dev = target_probs.device
    sh = _shape_of(st.parents, str(dev))
    tokens = tokens.to(dev)
    p_tilde = torch.zeros(n, dtype=f64, device=dev)
    p_tilde[0] = 1.0
    p_edge = torch.zeros(n, dtype=f64, device=dev)
    p_not = torch.zeros(n, dtype=f64, device=dev)
    weight = torch.zeros(n, dtype=f64, device=dev)
    scale = torch.zeros(n, dtype=f64, device=dev)
    if not sh.levels:
        return Allocation(p_tilde, p_edge, p_not, weight, scale, p_tilde.clone())
    # everything that does not depend on p~, for all inner nodes at once
    ctok = tokens[sh.cnode]  # [I, mmax] children tokens
    Bc_raw, qc_raw = target_probs[sh.inner_col, ctok], draft_probs[sh.inner_col, ctok]  # B, q at the children
    Bc, qc = Bc_raw.to(f64), qc_raw.to(f64)
    # Q = c q off the top tokens, c = 1 / (the draft mass off them), summed directly (no cancellation)
    c = 1.0 / remaining_masses(_take(draft_probs, sh.inner_first, sh.inner), ctok, sh.top).clamp_min(1e-300)
    B_last = Bc.gather(1, sh.last_col).squeeze(1)
    Q_last = (c * qc.gather(1, sh.last_col).squeeze(1)).clamp_min(1e-300)  # > 0: children have draft mass
    Bc_top = Bc * sh.is_top
    inner_pt = torch.empty_like(c)  # p~ of the inner nodes
    inner_w = torch.empty_like(c)  # (1 - p_v(u_m)) / Z
    inner_pe = torch.empty_like(Bc)  # p_v at the children slots
    for lv in sh.levels:
        r = slice(lv.start, lv.stop)
        pt = _take(p_tilde, lv.first, lv.nodes)  # p~(v) [k]
        # Eq. 4: p_v(u_m) = min(1, p~ B(u_m) / Q(u_m))
        a = (pt * B_last[r] / Q_last[r]).clamp_(max=1.0)
        # Eq. 3: Z = 1 - p~ + S, S = sum_x max(p~ B(x) - Q(x), 0) = p~ sum_x max(B - lam q, 0) with
        # lam = c / p~ (float64, capped at LAMBDA_CAP; products like p~ B would be subnormal floats
        # for tiny p~, 10-100x slower on CPU). Rows with a = 1 or p~ = 0 get w = 0.
        lam = (c[r] / pt.clamp_min(1e-300)).clamp_(max=LAMBDA_CAP).unsqueeze(1)  # float64 [k, 1]
        B, q = _take(target_probs, lv.first, lv.nodes), _take(draft_probs, lv.first, lv.nodes)  # [k, V]
        if _broken == "softmax_residual":
            lam_t = lam.clamp(max=1e30).to(target_probs.dtype)
            D = torch.softmax(B - lam_t * q, dim=-1)
            dense, Dt = D.sum(1), D.gather(1, ctok[r])
        else:
            dense = positive_part_sums(B, q, lam)  # sum_x max(B - lam q, 0) over all x
            Dt = torch.addcmul(Bc[r], qc[r], lam, value=-1.0).clamp_(min=0)  # float64 at the children
        # on the top tokens Q = 0: max(B - lam q, 0) is replaced by B there
        S = pt * (dense.to(f64) + Bc_top[r].sum(1) - (Dt.to(f64) * sh.is_top[r]).sum(1))
        Z = 1.0 - pt + S
        w = torch.where((a < 1) & (Z > 0), (1.0 - a) / Z.clamp_min(1e-300), 0.0)  # S = 0 when p~ = 0
        # Eqs. 5-6 at the top children (Q = 0 there), Eq. 4 at the sampled child
        pe = (pt * w).unsqueeze(1) * Bc_top[r]
        pe.scatter_(1, sh.last_col[r], a.unsqueeze(1))
        # conditional normalisation in traversal (rank) order
        den = 1.0 - (torch.cumsum(pe, 1) - pe)
        pt_child = torch.where(den > 0, pe / den.clamp_min(1e-300), 0.0).clamp_(0.0, 1.0)
        p_tilde.index_copy_(0, lv.vc, pt_child.view(-1).index_select(0, lv.valid_flat))
        inner_pt[r], inner_w[r], inner_pe[r] = pt, w, pe
    # what no later depth needs, for all inner nodes at once
    pn = inner_w * (1.0 - inner_pt)  # Eq. 7
    den_res = 1.0 - inner_pe.sum(1)
    thr = torch.where(pn > 0, 1.0 - pn / den_res.clamp_min(1e-300), 1.0).clamp_(0.0, 1.0)
    p_edge.index_copy_(0, sh.vc, inner_pe.view(-1).index_select(0, sh.valid_flat))
    p_not.index_copy_(0, sh.inner, pn)
    weight.index_copy_(0, sh.inner, inner_w)
    scale.index_copy_(0, sh.inner, c)
    threshold = p_tilde.clone()  # p~ at leaves
    threshold.index_copy_(0, sh.inner, thr)
    return Allocation(p_tilde, p_edge, p_not, weight, scale, threshold)


def allocation_row(alloc: Allocation, st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor,
                   draft_probs: torch.Tensor, v, *, children_zeroed: bool = True) -> torch.Tensor:
    """p_v(x) over the vocabulary for inner node v (Eqs. 4-6), in the dtype of ``target_probs``,
    with no host read.

    Args:
        v: the node, an int or a 0-d LongTensor on the laws' device.
        children_zeroed: the children tokens are 0 (the unnormalised law of y at v); otherwise
            the row also holds p_v at the children (Eq. 4 at u_m), and sum + p_v(not v) = 1.

    Returns:
        float ``[V]``: w p~ max(B - lam q, 0) off the top-(m-1) children with lam = c / p~
        (= w max(p~ B - Q, 0), computed without subnormal products p~ B), w p~ B on them.
    """
    dev = target_probs.device
    tab = device_tables(st.parents, str(dev))
    v = (v.to(dev) if isinstance(v, torch.Tensor) else torch.tensor(v, device=dev)).view(1).long()
    ch = tab.children.index_select(0, v)  # [1, mmax], -1 = none
    m = tab.num_children.index_select(0, v)  # [1]
    valid = ch >= 0
    ctok = tokens.to(dev)[tab.children_safe.index_select(0, v)]  # [1, mmax]; padding repeats the first child
    top = valid & (tab.rank < m - 1)
    last = valid & (tab.rank == m - 1)
    pt, c, w = (x.index_select(0, v) for x in (alloc.p_tilde, alloc.scale, alloc.weight))  # [1] float64
    lam = torch.where(pt > 0, c / pt.clamp_min(1e-300), LAMBDA_CAP).clamp(max=LAMBDA_CAP)
    B, q = target_probs.index_select(0, v), draft_probs.index_select(0, v)  # [1, V]
    row = positive_part(B, q, lam.view(1, 1))
    # the children's columns: B on the top children (Q = 0 there), then the scale, then 0 or p_v(u_m)
    vals = torch.where(top, B.gather(1, ctok), row.gather(1, ctok))
    row.mul_((w * pt).to(row.dtype).view(1, 1))
    vals = vals * (w * pt).to(row.dtype).view(1, 1)
    vals = vals.masked_fill(valid if children_zeroed else last, 0.0)
    if not children_zeroed:
        p_last = alloc.p_edge[ch.clamp(min=0)].masked_fill(~last, 0.0).sum(1).to(row.dtype)  # p_v(u_m)
        vals = vals + last.to(row.dtype) * p_last.view(1, 1)
    # padding slots name the first child's column: they write its value (an exact scatter)
    row.scatter_(1, ctok, vals.gather(1, torch.where(valid, tab.rank, 0)))
    return row[0]


def decide(st: TreeStructure, threshold: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
    """The accepted node: the first node in post-order with ``eta[v] < threshold[v]``.

    Args:
        threshold: float ``[N]`` (p~ at leaves, p~res at inner nodes; 1 at the root).
        eta: float ``[N]`` uniforms in [0, 1).

    Returns:
        0-d LongTensor on ``threshold``'s device (no host read). The root, last in post-order, has
        threshold 1 and always passes.
    """
    post = device_tables(st.parents, str(threshold.device)).postorder
    passed = (eta.to(threshold.device) < threshold).index_select(0, post)
    passed[-1] = True  # the root
    return post[passed.to(torch.uint8).argmax()]


def _y_row(alloc, st, tokens, target_probs, draft_probs, v: torch.Tensor) -> torch.Tensor:
    """The (unnormalised) law of y at the accepted node v (0-d LongTensor): M_b(.|v) at a leaf, p_v
    restricted to the non-children at an inner node; with fallbacks for probability-0 events (v
    reached while its non-children mass is 0: any law is lossless there). ``[V]``, no host read."""
    dev = target_probs.device
    tab = device_tables(st.parents, str(dev))
    v1 = v.view(1)
    B = target_probs.index_select(0, v1)[0]
    if not tab.width[0]:  # a tree of the root alone
        return B
    row = allocation_row(alloc, st, tokens, target_probs, draft_probs, v).to(B.dtype)
    off = B.clone().scatter_(0, tokens.to(dev)[tab.children_safe.index_select(0, v1)[0]], 0.0)  # zero writes: exact (unused at a leaf)
    leaf = tab.num_children.index_select(0, v1)[0] == 0
    use = torch.where(leaf | ~(row.sum() > 0), torch.where(leaf | ~(off.sum() > 0), 0, 1), 2)
    return torch.where(use == 2, row, torch.where(use == 1, off, B))


def univer_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One UniVer decision as a pure function of ``uniforms``, on the laws' device with no host read.

    Args:
        tokens: LongTensor ``[N]``; target_probs, draft_probs: float ``[N, V]``; uniforms: float64
            ``[N, 2]``: column 0 = eta_v, column 1 draws y at the accepted node.

    Returns:
        ``(node, y)``: 0-d LongTensors. Allocation (Eqs. 3-7, :func:`allocate`), the post-order
        decision (:func:`decide`), y ~ the law of :func:`_y_row` by inverse CDF.
    """
    alloc = allocate(st, tokens, target_probs, draft_probs)
    v = decide(st, alloc.threshold, uniforms[:, 0])
    row = _y_row(alloc, st, tokens, target_probs, draft_probs, v)
    return v, draw_with_uniforms(row, uniforms[:, 1].index_select(0, v.view(1))[0])


def univer_law(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
               *, _broken: str = "") -> torch.Tensor:
    """Exact law ``[N, V]`` of UniVer's outcome (node i ends the path, next token y); float64 rows
    normalised to sum 1 (see :class:`~eagle.verify.registry.Verifier`).

    P(node v accepted) = threshold(v) * prod over earlier post-order nodes w of (1 - threshold(w));
    the y law at v is as in :func:`univer_kernel`. ``_broken``: see :func:`allocate`; also
    ``"inner_ptilde"`` uses p~(v) instead of p~res(v) as the threshold of inner nodes.
    """
    alloc = allocate(st, tokens, target_probs, draft_probs, _broken=_broken)
    thr_all = alloc.threshold
    if _broken == "inner_ptilde":
        thr_all = alloc.p_tilde
    thr = thr_all.cpu()[st.postorder_t]
    fail_before = torch.cumprod(torch.cat([torch.ones(1, dtype=thr.dtype, device="cpu"), 1.0 - thr[:-1]]), 0)
    p_node = torch.zeros(st.num_nodes, dtype=torch.float64, device="cpu")
    p_node[st.postorder_t] = thr * fail_before
    out = torch.zeros_like(target_probs)
    dev = target_probs.device
    for v in range(st.num_nodes):
        if p_node[v] <= 0:
            continue
        row = _y_row(alloc, st, tokens, target_probs, draft_probs, torch.tensor(v, device=dev))
        out[v] = float(p_node[v]) * row / row.sum()
    return out


VERIFIER = register_verifier(Verifier(
    name="univer", drafting="topk_residual", kernel=univer_kernel, outcome_law=univer_law,
    description="UniVer (Weng, Hu, Yairi 2026): layer-wise allocation, one post-order decision",
))
