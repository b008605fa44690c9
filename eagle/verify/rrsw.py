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

from ..rules import remaining_mass, scaled_residual
from ..sampling import sample_with_uniform
from ..tree.structure import TreeStructure
from .registry import Verifier, register_verifier

__all__ = ["rrsw_kernel", "rrsw_law", "VERIFIER"]


def rrsw_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                uniforms: torch.Tensor) -> tuple[int, int]:
    """One RRSw decision as a pure function of the uniforms.

    Args:
        st: the tree's :class:`~eagle.tree.structure.TreeStructure`.
        tokens: LongTensor ``[N]``; target_probs / draft_probs: float ``[N, V]`` (validated).
        uniforms: float ``[N, 2]`` in [0, 1) (see the module docstring).

    Returns:
        ``(node_index, next_token)``: the last accepted node and y.
    """
    tok = tokens.tolist()
    u = uniforms.tolist()
    v = 0
    while True:
        ch = st.children[v]
        p = target_probs[v]  # unnormalised running residual; true law = p / p_mass
        if not ch:
            return v, sample_with_uniform(p, u[v][1])
        q = draft_probs[v]  # never modified: removed tokens are handled through q_mass and p(t) = 0
        ctok = [tok[c] for c in ch]
        q_child = q[ctok].tolist()
        p_mass, q_mass = 1.0, 1.0
        removed: list[int] = []
        moved = False
        for c, t, qt_raw in zip(ch, ctok, q_child):
            qt = qt_raw / q_mass if q_mass > 0 else 0.0
            pt = float(p[t]) / p_mass
            a = min(1.0, pt / qt) if qt > 0 else 0.0
            if u[c][0] < a:
                v, moved = c, True
                break
            # rejection: p <- norm(max(p - q_cur, 0)); q_cur = q (removed tokens, where p = 0, aside) / q_mass
            r = scaled_residual(p, q, p_mass / q_mass)
            r[t] = 0.0
            s = float(r.sum())
            if s > 0:  # s = 0 has probability 0 (a < 1 implies p(t) < q(t)); keep p then
                p, p_mass = r, s
            removed.append(t)
            q_mass = remaining_mass(q, removed)  # summed directly: q_mass - q(t) cancels for a confident draft
        if not moved:
            return v, sample_with_uniform(p, u[v][1])


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
