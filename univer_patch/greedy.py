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

from eagle.rules import positive_part, remaining_mass, remaining_masses, removed_mask
from eagle.sampling import draw_with_uniforms
from eagle.tree.structure import TreeStructure, device_tables
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
                  uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One Greedy-method decision as a pure function of ``uniforms``, on the laws' device with no host read.

    Args:
        tokens: LongTensor ``[N]``; target_probs, draft_probs: float ``[N, V]``; uniforms: float64
            ``[N, 2]`` (see the module docstring).

    Returns:
        ``(node, y)``: 0-d LongTensors. One step per depth at the current node v (a device scalar):
        c = 1 / M_s mass off the top-(m-1) tokens, Q = c M_s there; accept u_m with
        a_m = min(1, B(u_m) / Q(u_m)); else x ~ norm(max(B - Q, 0)) with B kept on the top tokens
        (the single-step plan, :func:`single_step_plan`); move to x if it is a top child. A node
        where the walk stopped stays (its later steps are computed and discarded).
    """
    dev = target_probs.device
    tab = device_tables(st.parents, str(dev))
    tokens, u0, u1 = tokens.to(dev), uniforms[:, 0], uniforms[:, 1]
    v = torch.zeros(1, dtype=torch.long, device=dev)
    stopped = torch.zeros(1, dtype=torch.bool, device=dev)
    y = torch.zeros(1, dtype=torch.long, device=dev)
    for w in tab.width:
        B = target_probs.index_select(0, v)  # [1, V]
        if w == 0:  # only leaves at this depth: y ~ M_b(.|leaf)
            y = torch.where(stopped, y, draw_with_uniforms(B, u1.index_select(0, v)))
            break
        ch = tab.children.index_select(0, v)[:, :w]  # [1, w], -1 = none
        m = tab.num_children.index_select(0, v)  # [1]
        cols = torch.arange(w, device=dev)
        valid = ch >= 0
        ctok = tokens[ch.clamp(min=0)]
        top, is_last = valid & (cols < m - 1), valid & (cols == m - 1)
        q = draft_probs.index_select(0, v)
        c = 1.0 / remaining_masses(q, ctok, top).clamp_min(1e-300)  # [1] float64
        last_c = torch.where(is_last, ch, 0).sum(1)  # u_m (0 at a leaf)
        last_t = tokens[last_c]
        Q_last = c * q.gather(1, last_t.view(1, 1))[:, 0].double()
        a = torch.where(Q_last > 0, B.gather(1, last_t.view(1, 1))[:, 0].double() / Q_last.clamp_min(1e-300), 0.0)
        accept = (m > 0) & (u0.index_select(0, last_c) < a.clamp(max=1.0))
        # x ~ norm(max(B - Q, 0)) (Q = 0 on the top tokens, B(u_m) < Q(u_m) after a rejection)
        r = positive_part(B, q, c.view(1, 1))
        r = torch.where(removed_mask(r, ctok, top), B, r).masked_fill(removed_mask(r, ctok, is_last), 0.0)
        off = B.masked_fill(removed_mask(B, ctok, valid), 0.0)  # the residual is below rounding (B ~ Q)
        has_r, has_off = (m > 0) & (r.sum(1) > 0), (m > 0) & (off.sum(1) > 0)  # a leaf: y ~ B
        x = draw_with_uniforms(torch.where(has_r[:, None], r, torch.where(has_off[:, None], off, B)),
                               u1.index_select(0, v))
        hit = top & (ctok == x[:, None]) & (has_r | has_off)[:, None]
        moves = (m > 0) & (accept | hit.any(1))
        nxt = torch.where(accept, last_c, torch.where(hit, ch, 0).sum(1))
        ends = ~stopped & ~moves
        y = torch.where(ends, x, y)
        stopped = stopped | ends
        v = torch.where(stopped, v, nxt)
    return v[0], y[0]


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
