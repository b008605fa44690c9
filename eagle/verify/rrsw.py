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

from ..rules import positive_part
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
        p <- norm(max(p - q, 0)), q(u_j) <- 0, q <- norm(q). p is kept unnormalised with its mass
        p_mass, q as the draft row with the rejected tokens zeroed and its mass q_mass (summed
        directly). A node where the walk stopped stays (later steps are computed and discarded).
    """
    dev = target_probs.device
    tab = device_tables(st.parents, str(dev))
    tokens, u0, u1 = tokens.to(dev), uniforms[:, 0], uniforms[:, 1]
    f64 = torch.float64
    v = torch.zeros(1, dtype=torch.long, device=dev)
    stopped = torch.zeros(1, dtype=torch.bool, device=dev)
    y_row = None
    for w in tab.width:
        p = target_probs.index_select(0, v)  # [1, V] unnormalised running residual; law p / p_mass
        q = draft_probs.index_select(0, v)  # [1, V] rejected tokens zeroed; law q / q_mass
        p_mass = torch.ones(1, 1, dtype=f64, device=dev)
        q_mass = q.sum(1, keepdim=True, dtype=f64)
        moved = torch.zeros(1, dtype=torch.bool, device=dev)
        nxt = v
        ch = tab.children.index_select(0, v)[:, :w]  # [1, w], -1 = none
        for j in range(w):
            c = ch[:, j]
            live = (c >= 0) & ~moved
            t = tokens[c.clamp(min=0)].view(1, 1)
            qt = q.gather(1, t).to(f64) / q_mass.clamp_min(1e-300)
            pt = p.gather(1, t).to(f64) / p_mass
            a = torch.where(qt > 0, pt / qt.clamp_min(1e-300), 0.0).clamp(max=1.0)[:, 0]
            accept = live & (u0.index_select(0, c.clamp(min=0)) < a)
            nxt = torch.where(accept, c, nxt)
            moved = moved | accept
            reject = (live & ~accept).view(1, 1)
            # p <- max(p - (p_mass / q_mass) q, 0) with u_j's token exactly 0 (a < 1: p(t) < q(t))
            r = positive_part(p, q, p_mass / q_mass.clamp_min(1e-300)).scatter_(1, t, 0.0)
            r_mass = r.sum(1, keepdim=True, dtype=f64)
            keep_p = reject & (r_mass > 0)  # r_mass = 0 has probability 0; keep p then
            p, p_mass = torch.where(keep_p, r.to(p.dtype), p), torch.where(keep_p, r_mass, p_mass)
            q = torch.where(reject, q.scatter(1, t, 0.0), q)
            q_mass = torch.where(reject, q.sum(1, keepdim=True, dtype=f64), q_mass)
        ends = ~stopped & ~moved  # every child rejected (or a leaf): y ~ p
        y_row = p if y_row is None else torch.where(ends.view(1, 1), p, y_row)
        stopped = stopped | ends
        v = torch.where(stopped, v, nxt)
    return v[0], draw_with_uniforms(y_row, u1.index_select(0, v))[0]


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
