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
    # B and q of every node's own token at its parent (the root's entries are unused)
    Bt = target_probs[tab.parent, tokens].to(f64)  # [N]
    qt = draft_probs[tab.parent, tokens].to(f64)  # [N]
    v = torch.zeros(1, dtype=torch.long, device=dev)
    stopped = torch.zeros(1, dtype=torch.bool, device=dev)
    lam_end = torch.zeros(1, dtype=f64, device=dev)  # L_J at the node where the walk stops
    rej_end = torch.zeros(1, dtype=torch.long, device=dev)  # J, its rejected children
    Bo = torch.empty(1, V, dtype=target_probs.dtype, device=dev)  # B off the children
    qo = torch.empty(1, V, dtype=draft_probs.dtype, device=dev)  # q off the children
    buf = torch.empty(1, V, dtype=target_probs.dtype, device=dev)
    for w in tab.width:
        if w == 0:
            break
        ch = tab.children.index_select(0, v)[:, :w]  # [1, w], -1 = none
        safe = tab.children_safe.index_select(0, v)[:, :w]
        valid = ch >= 0
        ctok = tokens[safe]  # [1, w]; padding slots repeat the first child
        b, qc = Bt[safe].masked_fill(~valid, 0.0), qt[safe].masked_fill(~valid, 0.0)  # [1, w] float64
        torch.index_select(target_probs, 0, v, out=Bo).scatter_(1, ctok, 0.0)
        torch.index_select(draft_probs, 0, v, out=qo).scatter_(1, ctok, 0.0)
        q_off = qo.sum(1, keepdim=True).to(f64)  # [1, 1]
        # qm_j = q_off + sum_{i >= j} q(u_i): the draft mass before testing u_j
        qm = q_off + qc.flip(1).cumsum(1).flip(1)  # [1, w]
        lam = torch.zeros(1, 1, dtype=f64, device=dev)  # L_0
        pm = torch.ones(1, 1, dtype=f64, device=dev)  # pm_0
        lams, accs = [lam], []
        for j in range(w):
            bj, qj, qmj = b[:, j:j + 1], qc[:, j:j + 1], qm[:, j:j + 1]
            pt = (bj - lam * qj).clamp_(min=0.0) / pm
            qn = qj / qmj.clamp_min(1e-300)
            accs.append(torch.where(qn > 0, pt / qn.clamp_min(1e-300), 0.0))
            # rejection of u_j: L <- L + pm / qm; pm <- G(L) + the children after u_j
            nlam = (lam + pm / qmj.clamp_min(1e-300)).clamp_(max=LAMBDA_CAP)
            nlam = torch.where(valid[:, j:j + 1], nlam, lam)
            if j + 1 < w:
                dense = positive_part(Bo, qo, nlam, out=buf).sum(1, keepdim=True).to(f64)
                rest = ((b[:, j + 1:] - nlam * qc[:, j + 1:]).clamp_(min=0.0)).sum(1, keepdim=True)
                npm = dense + rest
                keep = npm > 0  # 0 only where u_j is accepted surely; keep p then
                lam, pm = torch.where(keep, nlam, lam), torch.where(keep, npm, pm)
            else:
                lam = nlam
            lams.append(lam)
        a = torch.cat(accs, 1)  # [1, w] acceptance probabilities of u_1..u_w (each after the earlier rejections)
        accept = valid & (u0[safe] < a)
        moved = accept.any(1)
        first = accept.to(torch.uint8).argmax(1)  # the first accepted rank
        nrej = torch.where(moved, first, valid.sum(1))  # rejected children at v
        ends = ~stopped & ~moved
        lam_end = torch.where(ends, torch.cat(lams, 1).gather(1, nrej.view(1, 1))[:, 0], lam_end)
        rej_end = torch.where(ends, nrej, rej_end)
        stopped = stopped | ends
        v = torch.where(stopped, v, ch.gather(1, first.view(1, 1))[:, 0])
    # y ~ p_J = max(B - L_J q, 0) with the J rejected children zeroed (B itself at a leaf: L_0 = 0)
    row = positive_part(target_probs.index_select(0, v), draft_probs.index_select(0, v), lam_end.view(1, 1))
    safe = tab.children_safe.index_select(0, v)
    ctok = tokens[safe]
    removed = (tab.rank < rej_end) & (tab.children.index_select(0, v) >= 0)
    vals = row.gather(1, ctok).masked_fill_(removed, 0.0)
    vals = vals.gather(1, torch.zeros_like(safe)).where(~(tab.children.index_select(0, v) >= 0), vals)  # padding = slot 0
    row.scatter_(1, ctok, vals)
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
