"""The Greedy method (Hu et al., ICLR 2025), applied node by node, top-down.

Children by ``topk_residual``: u_1..u_{m-1} = top-(m-1) of M_s(.|v), u_m ~ M_s^neg(.|v) (M_s on the
other tokens, renormalised). At node v with B = M_b(.|v) and Q = M_s^neg(.|v): accept u_m with
a_m = min(1, B(u_m)/Q(u_m)) and move there; otherwise draw x ~ norm(max(B - Q, 0)) (Q is 0 on
the top-(m-1) tokens, so they keep their whole target mass); if x is a child move to it, else
y = x. At a leaf y ~ M_b(.|leaf). The single-step plan is the optimum for this drafting rule.

Uniforms (pure kernel): ``uniforms[i, 0]`` is the acceptance coin of node i as the sampled child,
``uniforms[i, 1]`` draws the residual token x at node i (or y at a leaf), by inverse CDF over the
top children first, then the other tokens (see :func:`greedy_kernel`).
"""
from __future__ import annotations

from functools import lru_cache

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


@lru_cache(maxsize=256)
def _slot_tables(parents: tuple, device: str):
    """Static per-node slot tables of one tree shape on ``device`` (cached): ``(top [N, mmax]`` bool,
    the top-(m-1) slots; ``last [N, 1]`` long, the slot of u_m (0 at a leaf); ``inner [N]`` bool)."""
    tab = device_tables(parents, device)
    m = tab.num_children.view(-1, 1)
    top = (tab.children >= 0) & (tab.rank.view(1, -1) < m - 1)
    return top, (m - 1).clamp(min=0), tab.num_children > 0


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

    The draw of x is an inverse CDF over the top children first (in rank order, masses B(u_i)),
    then the other tokens: with R = sum_i B(u_i) + G, G = sum over the non-children of
    max(B - Q, 0) (one dense pass per depth), s = uniforms[v, 1] R hits top child i when it is
    below the running sum of B(u_i); otherwise y is drawn at the end, once, from max(B - Q, 0) on
    the non-children with the uniform (s - sum_i B(u_i)) / G. Fallbacks (probability 0): where
    R = 0 (a < 1 but the residual below rounding) y ~ M_b off the children, or M_b itself.
    """
    dev = target_probs.device
    f64 = torch.float64
    V = target_probs.shape[1]
    tab = device_tables(st.parents, str(dev))
    top, last_col, inner = _slot_tables(st.parents, str(dev))
    tokens = tokens.to(dev)
    u0, u1 = uniforms[:, 0], uniforms[:, 1]
    # per node, at its children (static over the walk): tokens, B and q there, the top masses
    ctok = tokens[tab.children_safe]  # [N, mmax]; padding slots repeat the first child
    rows = torch.arange(st.num_nodes, device=dev).view(-1, 1)
    Bc = target_probs[rows, ctok].to(f64).masked_fill_(~top, 0.0)  # B(u_i) on the top slots
    last_tok = ctok.gather(1, last_col)  # [N, 1]
    B_last = target_probs[rows, last_tok].to(f64)[:, 0]
    q_last = draft_probs[rows, last_tok].to(f64)[:, 0]
    cum = Bc.cumsum(1)  # [N, mmax] running sums over the top slots
    u0_last = u0[tab.children_safe.gather(1, last_col)[:, 0]]  # the acceptance coin of u_m
    v = torch.zeros(1, dtype=torch.long, device=dev)
    stopped = torch.zeros(1, dtype=torch.bool, device=dev)
    lam_end = torch.zeros(1, dtype=f64, device=dev)  # c where y ~ max(B - Q, 0), 0 for M_b
    zero_end = torch.zeros(1, dtype=torch.bool, device=dev)  # zero the children in y's row
    u_end = torch.zeros(1, dtype=f64, device=dev)  # the uniform of y's draw
    Bo = torch.empty(1, V, dtype=target_probs.dtype, device=dev)  # B off the children
    qo = torch.empty(1, V, dtype=draft_probs.dtype, device=dev)  # q off the children
    buf = torch.empty(1, V, dtype=target_probs.dtype, device=dev)
    for w in tab.width:
        if w == 0:
            break
        ct = ctok.index_select(0, v)  # [1, mmax]
        torch.index_select(target_probs, 0, v, out=Bo).scatter_(1, ct, 0.0)
        torch.index_select(draft_probs, 0, v, out=qo).scatter_(1, ct, 0.0)
        is_inner = inner.index_select(0, v)
        # c = 1 / (the draft mass off the top tokens) = 1 / (mass off the children + q(u_m)), summed directly
        ql = q_last.index_select(0, v)
        c = 1.0 / (qo.sum(1).to(f64) + ql).clamp_min(1e-300)  # [1]
        Q_last = c * ql
        a = torch.where(Q_last > 0, B_last.index_select(0, v) / Q_last.clamp_min(1e-300), 0.0)
        accept = is_inner & (u0_last.index_select(0, v) < a)
        G = positive_part(Bo, qo, c.view(1, 1), out=buf).sum(1).to(f64)  # [1]
        cv = cum.index_select(0, v)  # [1, mmax]
        top_mass = cv[:, -1]
        R = G + top_mass
        has_r = is_inner & (R > 0)
        has_g = has_r & (G > 0)
        s = u1.index_select(0, v) * R
        hit = top.index_select(0, v) & (s.view(1, 1) < cv) & has_r.view(1, 1)
        moves = accept | hit.any(1)
        nxt = torch.where(accept, tab.children.index_select(0, v).gather(1, last_col.index_select(0, v))[:, 0],
                          tab.children.index_select(0, v).gather(1, hit.to(torch.uint8).argmax(1, keepdim=True))[:, 0])
        ends = ~stopped & ~moves
        u_here = torch.where(has_g, ((s - top_mass) / G.clamp_min(1e-300)).clamp_(0.0, 1.0), u1.index_select(0, v))
        lam_end = torch.where(ends, torch.where(has_g, c, 0.0), lam_end)
        zero_end = torch.where(ends, has_g | (is_inner & (Bo.sum(1) > 0)), zero_end)
        u_end = torch.where(ends, u_here, u_end)
        stopped = stopped | ends
        v = torch.where(stopped, v, nxt)
    # a walk that never stopped ends at a leaf of the deepest depth: y ~ M_b there
    lam_end, zero_end = lam_end.masked_fill(~stopped, 0.0), zero_end & stopped
    u_end = torch.where(stopped, u_end, u1.index_select(0, v))
    row = positive_part(target_probs.index_select(0, v), draft_probs.index_select(0, v), lam_end.view(1, 1))
    ct = ctok.index_select(0, v)
    row.scatter_(1, ct, row.gather(1, ct).masked_fill_(zero_end.view(1, 1), 0.0))  # padding repeats slot 0
    return v[0], draw_with_uniforms(row, u_end)[0]


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
