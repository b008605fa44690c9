"""Traversal Verification (Weng et al., 2025): post-order over the tree, drafting ``wor``.

State per node: alpha(v), the current P(v) = M_b(.|v) and Q(v) = M_s(.|v). alpha(root) = 1 and
alpha(u) = min(1, alpha(parent) P(parent)(x_u) / Q(parent)(x_u)), recomputed below a node whenever
its state changes. Repeatedly take u = the first node in post-order (descend through the first
remaining child). With probability alpha(u) accept the path root..u and draw y ~ P(u). Otherwise,
at its parent v with S = sum_x max(alpha(v) P(v)(x) - Q(v)(x), 0):
P(v) <- norm(max(alpha(v) P(v) - Q(v), 0)); Q(v) <- Q(v) without x_u, renormalised;
alpha(v) <- S / (S + 1 - alpha(v)); delete u. On a chain this is Block Verification.

Uniforms (pure kernel): ``uniforms[i, 0]`` is node i's acceptance coin (each node is tested once,
when it is first in post-order), ``uniforms[i, 1]`` draws y if node i is accepted.
"""
from __future__ import annotations

import torch

from eagle.rules import LAMBDA_CAP, positive_part
from eagle.sampling import draw_with_uniforms
from eagle.tree.structure import TreeStructure
from eagle.verify.registry import Verifier, register_verifier

__all__ = ["traversal_kernel", "traversal_law", "VERIFIER"]


def _tests(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
           broken: str = ""):
    """The tests of one traversal, in order: yields ``(u, alpha(u), P(u))`` per node u in post-order.

    Every rejection leads to the same next state, so the tested nodes are the post-order itself (a
    rejected node is deleted and the next remaining node in post-order is first) and the states are
    those after rejecting every earlier node, whatever the coins: a static sequence of device
    operations, with no host read. alpha(u) (float64 ``[1]``) is computed when u's subtree is
    entered (its parent's state does not change while the subtree is processed, so this is the value
    of every recomputation below the parent), then updated by the rejections of u's children:
    with S = sum_x max(alpha(v) P(v)(x) - Q(v)(x), 0) at the parent v of a rejected u,
    P(v) <- norm(max(alpha(v) P(v) - Q(v), 0)), Q(v) <- Q(v) without x_u renormalised,
    alpha(v) <- S / (S + 1 - alpha(v)). P(u) (``[1, V]``, unnormalised) is the law of y if u is
    accepted; the root comes last with alpha 1.

    Rows are kept unnormalised with their masses (P = P_raw / Pm, Q = Q_raw / Qm, Qm summed directly):
    max(al P - Q, 0) = (al / Pm) max(P_raw - lam Q_raw, 0) with lam = Pm / (al Qm), capped at
    :data:`~eagle.rules.LAMBDA_CAP` (exact there: P_raw <= 1, see :func:`~eagle.rules.positive_part`).
    ``broken`` (test-only): ``"no_alpha_update"`` keeps alpha(v) after a child's rejection.
    """
    dev = target_probs.device
    f64 = torch.float64
    tokens = tokens.to(dev)
    one = torch.ones(1, 1, dtype=f64, device=dev)
    P = {v: target_probs[v:v + 1] for v in range(st.num_nodes)}  # views until a rejection replaces them
    Q = {v: draft_probs[v:v + 1] for v in range(st.num_nodes)}
    Pm, Qm = {}, {}
    alpha = {0: one[0]}

    def visit(u: int):
        if u:  # enter u: alpha(u) = min(1, alpha(v) P(v)(x_u) / Q(v)(x_u)) with v's current state
            v, t = st.parents[u], tokens[u:u + 1].view(1, 1)
            pt = P[v].gather(1, t).to(f64) / Pm.get(v, one)
            qt = Q[v].gather(1, t).to(f64) / Qm.get(v, one)
            alpha[u] = torch.where(qt > 0, alpha[v] * pt / qt.clamp_min(1e-300), 0.0).clamp(max=1.0)[0]
        for c in st.children[u]:
            yield from visit(c)
        yield u, alpha[u], P[u]
        if u:  # u rejected: update its parent v (used only when u was rejected)
            v, t = st.parents[u], tokens[u:u + 1].view(1, 1)
            al, pm, qm = alpha[v].view(1, 1), Pm.get(v, one), Qm.get(v, one)
            lam = (pm / (al * qm).clamp_min(1e-300)).clamp(max=LAMBDA_CAP)
            r = positive_part(P[v], Q[v], lam)
            r_mass = r.sum(1, keepdim=True, dtype=f64)
            S = al / pm * r_mass
            keep = S > 0  # S = 0: alpha(v) = 0 (v can no longer be accepted), keep the row (never sampled)
            P[v], Pm[v] = torch.where(keep, r.to(P[v].dtype), P[v]), torch.where(keep, r_mass, pm)
            Q[v] = Q[v].scatter(1, t, 0.0)
            Qm[v] = Q[v].sum(1, keepdim=True, dtype=f64)  # summed directly: qm - q(t) cancels for a confident draft
            if broken != "no_alpha_update":
                den = S + (1.0 - al)  # not (S + 1) - al: that rounds S away when S << 1 and al == 1
                alpha[v] = torch.where(den > 0, S / den.clamp_min(1e-300), 0.0).clamp(max=1.0)[0]

    yield from visit(0)


def traversal_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                     uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One Traversal Verification decision as a pure function of ``uniforms``, on the laws' device
    with no host read.

    Args:
        tokens: LongTensor ``[N]``; target_probs, draft_probs: float ``[N, V]``; uniforms: float64
            ``[N, 2]`` (see the module docstring).

    Returns:
        ``(node, y)``: 0-d LongTensors. The first node u of :func:`_tests` with
        ``uniforms[u, 0] < alpha(u)`` (the root passes), y ~ P(u) with ``uniforms[u, 1]``.
    """
    dev = target_probs.device
    u0 = uniforms[:, 0]
    done = torch.zeros(1, dtype=torch.bool, device=dev)
    node = torch.zeros(1, dtype=torch.long, device=dev)
    y_row = None
    for u, a, row in _tests(st, tokens, target_probs, draft_probs):
        accept = ~done & ((u0[u:u + 1] < a) | (u == 0))
        node = torch.where(accept, u, node)
        y_row = row if y_row is None else torch.where(accept.view(1, 1), row, y_row)
        done = done | accept
    return node[0], draw_with_uniforms(y_row, uniforms[:, 1].index_select(0, node))[0]


def traversal_law(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  *, _broken: str = "") -> torch.Tensor:
    """Exact law ``[N, V]`` of Traversal Verification's outcome (float64 rows normalised to sum 1;
    see :class:`~eagle.verify.registry.Verifier`): node u is accepted with probability
    alpha(u) prod over the earlier tests (1 - alpha), then y ~ norm(P(u)) (:func:`_tests`), O(N V).

    ``_broken`` (test-only negative control): ``"no_alpha_update"`` keeps alpha(v) after a child's
    rejection (not lossless).
    """
    out = torch.zeros_like(target_probs)
    mass = 1.0
    for u, a, row in _tests(st, tokens, target_probs, draft_probs, _broken):
        a = 1.0 if u == 0 else float(a)
        tot = row.sum()
        if tot > 0:
            out[u] += (mass * a) * (row[0] / tot)
        mass *= 1.0 - a
        if mass <= 0:
            break
    return out


VERIFIER = register_verifier(Verifier(
    name="traversal", drafting="wor", kernel=traversal_kernel, outcome_law=traversal_law,
    description="Traversal Verification (Weng et al. 2025): post-order, alpha updates bottom-up",
))
