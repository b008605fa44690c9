"""The Greedy method (Hu et al., ICLR 2025), applied node by node, top-down.

Children by ``topk_residual``: u_1..u_{m-1} = top-(m-1) of M_s(.|v), u_m ~ M_s^neg(.|v) (M_s on the
other tokens, renormalised). At node v with B = M_b(.|v) and Q = M_s^neg(.|v): accept u_m with
a_m = min(1, B(u_m)/Q(u_m)) and move there; otherwise draw x ~ norm(max(B - Q, 0)) (Q is 0 on
the top-(m-1) tokens, so they keep their whole target mass); if x is a child move to it, else
y = x. At a leaf y ~ M_b(.|leaf). The single-step plan is the optimum for this drafting rule.

Uniforms (pure kernel): ``uniforms[i, 0]`` is the acceptance coin of node i as the sampled child,
``uniforms[i, 1]`` draws the residual token x at node i (or y at a leaf).
"""
from __future__ import annotations

import torch

from eagle.rules import remaining_mass, scaled_residual
from eagle.sampling import sample_with_uniform
from eagle.tree.structure import TreeStructure
from eagle.verify.registry import Verifier, register_verifier

__all__ = ["greedy_kernel", "greedy_law", "single_step_plan", "VERIFIER"]


def _residual_parts(B: torch.Tensor, q: torch.Tensor, top_tokens: list[int], last_token: int):
    """Q = M_s^neg scale c, acceptance a_m and the unnormalised residual r = max(B - Q, 0)."""
    rest = remaining_mass(q, top_tokens)  # summed directly: 1 - q(top) cancels for a confident draft
    c = 1.0 / rest if rest > 0 else 0.0
    Q_last = c * float(q[last_token])
    a = min(1.0, float(B[last_token]) / Q_last) if Q_last > 0 else 0.0
    return c, a


def single_step_plan(B: torch.Tensor, q: torch.Tensor, child_tokens: list[int]) -> torch.Tensor:
    """Greedy's single-step plan at one node, in float64.

    Args:
        B: ``[V]`` target law M_b(.|v); q: ``[V]`` full draft law M_s(.|v).
        child_tokens: the m children tokens (top-(m-1) first, the sampled one last).

    Returns:
        float64 ``[V]``: P(the token after v is x), i.e. a_m on u_m plus (1 - a_m) norm(max(B - Q, 0)).
        Float64 because c = 1 / (the draft mass off the top tokens) can exceed float32's range
        (a denormal residual mass, as at low temperatures).
    """
    top, last = list(child_tokens[:-1]), child_tokens[-1]
    B, q = B.double(), q.double()
    c, a = _residual_parts(B, q, top, last)
    Q = c * q
    if top:
        Q[top] = 0.0
    r = (B - Q).clamp(min=0)
    r[last] = 0.0  # a < 1 means B(u_m) < Q(u_m); exact zero against rounding
    if not float(r.sum()) > 0 and a < 1:  # the residual is below rounding (B ~ Q): as greedy_kernel
        r = B.clone()
        r[list(child_tokens)] = 0.0
        if not float(r.sum()) > 0:
            r = B.clone()
    s = r.sum()
    plan = (1.0 - a) * (r / s) if s > 0 else torch.zeros_like(B)
    plan[last] += a
    return plan


def greedy_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  uniforms: torch.Tensor) -> tuple[int, int]:
    """One Greedy-method decision as a pure function of ``uniforms`` (float ``[N, 2]``).

    Returns ``(node_index, next_token)``.
    """
    tok = tokens.tolist()
    u = uniforms.tolist()
    v = 0
    while True:
        ch = st.children[v]
        B = target_probs[v]
        if not ch:
            return v, sample_with_uniform(B, u[v][1])
        q = draft_probs[v]
        ctok = [tok[c] for c in ch]
        top, last = ctok[:-1], ctok[-1]
        c, a = _residual_parts(B, q, top, last)
        if u[ch[-1]][0] < a:
            v = ch[-1]
            continue
        r = scaled_residual(B, q, c)  # max(B - Q, 0) off the top tokens
        if top:
            r[top] = B[top].to(r.dtype)  # Q = 0 there
        r[last] = 0.0  # a < 1 means B(u_m) < Q(u_m)
        if not float(r.sum()) > 0:  # the residual is below rounding (B ~ Q); as single_step_plan
            r = B.clone()
            r[ctok] = 0.0
            if not float(r.sum()) > 0:
                return v, sample_with_uniform(B, u[v][1])
        x = sample_with_uniform(r, u[v][1])
        if x in top:
            v = ch[top.index(x)]
            continue
        return v, x


def greedy_law(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
               *, _broken: str = "") -> torch.Tensor:
    """Exact law ``[N, V]`` of the Greedy method's outcome (node i ends the path, next token y);
    float64 rows normalised to sum 1 (see :class:`~eagle.verify.registry.Verifier`).

    ``_broken`` (test-only negative control): ``"full_draft"`` accepts u_m against the full draft
    law M_s instead of the residual M_s^neg (not lossless).
    """
    tok = tokens.tolist()
    out = torch.zeros_like(target_probs, dtype=torch.float64)
    reach = [0.0] * st.num_nodes
    reach[0] = 1.0
    for v in range(st.num_nodes):
        ch = st.children[v]
        if not ch:
            out[v] = reach[v] * target_probs[v].double()
            continue
        ctok = [tok[c] for c in ch]
        B, q = target_probs[v], draft_probs[v]
        if _broken == "full_draft":
            plan = single_step_plan(B, q, [ctok[-1]])  # ignores the top-(m-1) removal
        else:
            plan = single_step_plan(B, q, ctok)
        for c, t in zip(ch, ctok):
            reach[c] = reach[v] * float(plan[t])
        row = reach[v] * plan
        row[ctok] = 0.0
        out[v] = row
    return out


VERIFIER = register_verifier(Verifier(
    name="greedy", drafting="topk_residual", kernel=greedy_kernel, outcome_law=greedy_law,
    description="Greedy method (Hu et al. 2025): per-node optimal single-step plan, top-down",
))
