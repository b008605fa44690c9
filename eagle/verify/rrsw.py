"""RRSw: EAGLE-1's recursive rejection sampling without replacement (top-down).

At node v (start at the root) with p = M_b(.|v), q = M_s(.|v) and children u_1..u_m drawn
without replacement from q: for j = 1..m accept u_j with probability min(1, p(u_j)/q(u_j)) and
move there; on rejection p <- norm(max(p - q, 0)), q(u_j) <- 0, q <- norm(q). If every child is
rejected, y ~ p (the current residual); at a leaf y ~ M_b(.|leaf). Lossless for drafting ``wor``.

Uniforms (pure kernel): ``uniforms[i, 0]`` is the acceptance coin of node i (each node is tested
at most once, as a child of its parent), ``uniforms[i, 1]`` draws y when the path ends at node i.
"""
from __future__ import annotations

import torch

from ..rules import LAMBDA_CAP, positive_part
from ..sampling import draw_with_uniforms
from ..tree.structure import TreeStructure, device_tables
from .registry import Verifier, register_verifier

__all__ = ["rrsw_kernel", "rrsw_law", "VERIFIER"]


def rrsw_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One RRSw decision as a pure function of the uniforms, on the laws' device with no host read.

    Args:
        st: the tree's :class:`~eagle.tree.structure.TreeStructure`.
        tokens: LongTensor ``[N]``; target_probs / draft_probs: float ``[N, V]`` (validated).
        uniforms: float64 ``[N, 2]`` in [0, 1) (see the module docstring).

    Returns:
        ``(node, y)``: 0-d LongTensors, the last accepted node and y. One step per depth at the
        current node v (a device scalar), one sub-step per child rank j: accept u_j with
        min(1, p(u_j) / q(u_j)) (p, q the current normalised laws); on rejection
        p <- norm(max(p - q, 0)), q(u_j) <- 0, q <- norm(q). A node where the walk stopped stays
        (later steps are computed and discarded).

    The residuals need no row of their own: with B = M_b(.|v), q = M_s(.|v) and p_j the
    unnormalised residual after rejecting u_1..u_j (mass pm_j, pm_0 = 1; q without them has mass
    qm_j), max(max(B - L q, 0) - l q, 0) = max(B - (L + l) q, 0) for q >= 0, so
    p_j = max(B - L_j q, 0) with u_1..u_j zeroed and L_{j+1} = L_j + pm_j / qm_j (the u_i are
    distinct, so q at u_{j+1} is untouched by the removals). Per rank, one dense pass gives
    G(L) = sum over the non-children x of max(B(x) - L q(x), 0), and
    pm_j = G(L_j) + sum over i > j of max(B(u_i) - L_j q(u_i), 0) (no cancellation), qm_j = the
    draft mass off the children plus q(u_i) for i > j (the remaining entries, summed directly).
    Only the y row of the node where the walk stops is built, once, at the end.
    """
    dev = target_probs.device
    tab = device_tables(st.parents, str(dev))
    tokens, u0, u1 = tokens.to(dev), uniforms[:, 0], uniforms[:, 1]
    f64 = torch.float64
    V = target_probs.shape[1]
    # per node, at its children (padding slots repeat the first child, their values zeroed):
    # B(u_i), q(u_i), the suffix sums sum_{i' >= i} q(u_i') and the coins, packed for one gather per depth
    ctok = tokens[tab.children_safe]  # [N, mmax]
    valid = tab.children >= 0
    rows = torch.arange(st.num_nodes, device=dev).view(-1, 1)
    b_all = target_probs[rows, ctok].to(f64).masked_fill_(~valid, 0.0)
    q_all = draft_probs[rows, ctok].to(f64).masked_fill_(~valid, 0.0)
    pack = torch.stack([b_all, q_all, q_all.flip(1).cumsum(1).flip(1), u0[tab.children_safe]], 1)  # [N, 4, mmax]
    zero = torch.zeros(1, 1, dtype=f64, device=dev)
    one = torch.ones(1, 1, dtype=f64, device=dev)
    v = torch.zeros(1, dtype=torch.long, device=dev)
    stopped = torch.zeros(1, dtype=torch.bool, device=dev)
    lam_end = torch.zeros(1, 1, dtype=f64, device=dev)  # L_J at the node where the walk stops
    rej_end = torch.zeros(1, 1, dtype=torch.long, device=dev)  # J, its rejected children
    row32 = torch.empty(1, V, dtype=target_probs.dtype, device=dev)
    Bo = torch.empty(1, V, dtype=f64, device=dev)  # B off the children (float64: L up to LAMBDA_CAP)
    qo = torch.empty(1, V, dtype=f64, device=dev)  # q off the children
    buf = torch.empty(1, V, dtype=f64, device=dev)
    for w in tab.width:
        if w == 0:
            break
        pk = pack.index_select(0, v)[0, :, :w]  # [4, w]
        b, qc, qsuf, coin = pk[0:1], pk[1:2], pk[2:3], pk[3:4]  # [1, w] each
        ct = ctok.index_select(0, v)
        Bo.copy_(torch.index_select(target_probs, 0, v, out=row32)).scatter_(1, ct, 0.0)
        qo.copy_(torch.index_select(draft_probs, 0, v, out=row32)).scatter_(1, ct, 0.0)
        qm = qo.sum(1, keepdim=True) + qsuf  # [1, w]: qm_j, the draft mass before testing u_j
        lam, pm = zero, one
        lams, pms = [lam], [pm]
        for j in range(w):  # slots past the last child give values that are never read
            # rejection of u_j: L <- L + pm / qm_j; pm <- G(L) + the children after u_j
            lam = (lam + pm / qm[:, j:j + 1].clamp_min(1e-300)).clamp_(max=LAMBDA_CAP)
            if j + 1 < w:
                dense = torch.addcmul(Bo, qo, lam, value=-1.0, out=buf).clamp_(min=0.0).sum(1, keepdim=True)
                npm = dense + torch.addcmul(b[:, j + 1:], qc[:, j + 1:], lam, value=-1.0).clamp_(min=0.0).sum(1, keepdim=True)
                keep = npm > 0  # 0 only where u_j is accepted surely; keep p then
                lam, pm = torch.where(keep, lam, lams[-1]), torch.where(keep, npm, pm)
                pms.append(pm)
            lams.append(lam)
        L, P = torch.cat(lams[:w], 1), torch.cat(pms, 1)  # [1, w]: L_j, pm_j before testing u_j
        # a_j = min(1, p(u_j) / q(u_j)) with p(u_j) = max(B(u_j) - L_j q(u_j), 0) / pm_j, q(u_j) = q(u_j) / qm_j
        a = torch.where(qc > 0, torch.addcmul(b, L, qc, value=-1.0).clamp_(min=0.0) * qm / (P * qc.clamp_min(1e-300)), 0.0)
        vl = valid.index_select(0, v)[:, :w]
        accept = vl & (coin < a)
        moved = accept.any(1, keepdim=True)
        first = accept.to(torch.uint8).argmax(1, keepdim=True)  # the first accepted rank
        nrej = torch.where(moved, first, vl.sum(1, keepdim=True))  # rejected children at v
        ends = ~stopped & ~moved
        lam_end = torch.where(ends, torch.cat(lams, 1).gather(1, nrej), lam_end)
        rej_end = torch.where(ends, nrej, rej_end)
        stopped = stopped | ends
        v = torch.where(stopped[:, 0], v, tab.children.index_select(0, v).gather(1, first)[:, 0])
    # y ~ p_J = max(B - L_J q, 0) with the J rejected children zeroed (B itself at a leaf: L_0 = 0)
    row = positive_part(target_probs.index_select(0, v), draft_probs.index_select(0, v), lam_end)
    ct = ctok.index_select(0, v)
    vl = valid.index_select(0, v)
    removed = ((tab.rank < rej_end) & vl).gather(1, torch.where(vl, tab.rank, 0))  # padding: slot 0's flag
    row.scatter_(1, ct, row.gather(1, ct).masked_fill_(removed, 0.0))
    return v[0], draw_with_uniforms(row, u1.index_select(0, v))[0]


def rrsw_law(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
             *, _broken: str = "") -> torch.Tensor:
    """Exact law of RRSw's outcome (float64 rows normalised to sum 1; see :class:`Verifier`).

    Returns:
        ``[N, V]``: entry ``[i, y]`` = P(node i ends the accepted path and the next token is y).

    ``_broken`` is a test-only negative control: ``"full_draft"`` accepts every child against the
    full draft law (no removal / renormalisation of q), which is not lossless.
    """
    tok = tokens.tolist()
    T, D = target_probs, draft_probs
    out = torch.zeros_like(T)
    reach = [0.0] * st.num_nodes
    reach[0] = 1.0
    for v in range(st.num_nodes):
        ch = st.children[v]
        if not ch:
            out[v] = reach[v] * T[v]
            continue
        p, q = T[v].clone(), D[v].clone()
        stay = reach[v]
        for c in ch:
            t = tok[c]
            a = min(1.0, float(p[t] / q[t])) if q[t] > 0 else 0.0
            reach[c] = stay * a
            stay *= 1.0 - a
            r = (p - q).clamp(min=0)
            r[t] = 0.0  # a < 1 means p(t) < q(t); exact zero against rounding
            s = r.sum()
            if s > 0:  # s = 0 only where a = 1 (nothing stays); keep p then
                p = r / s
            if _broken != "full_draft":
                q[t] = 0.0
                qs = q.sum()
                q = q / qs if qs > 0 else q
        out[v] = stay * p
    return out


VERIFIER = register_verifier(Verifier(
    name="rrsw", drafting="wor", kernel=rrsw_kernel, outcome_law=rrsw_law,
    description="EAGLE-1 recursive rejection sampling without replacement (top-down)",
))
