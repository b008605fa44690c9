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

from functools import lru_cache

import torch

from eagle.rules import LAMBDA_CAP, positive_part, remaining_masses
from eagle.sampling import draw_with_uniforms
from eagle.tree.structure import TreeStructure, device_tables, tree_structure
from eagle.verify.registry import Verifier, register_verifier

from .univer import _first_row, _take, positive_part_sums

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


@lru_cache(maxsize=256)
def _levels(parents: tuple, device: str) -> tuple:
    """Per depth with inner nodes, top-down: ``(nodes [k], first, children [k, w] (-1 = none),
    children_safe [k, w], valid [k, w])`` on ``device`` (cached per tree shape and device);
    ``first`` = nodes[0] when the nodes are consecutive (their rows are a view), else -1."""
    tab = device_tables(parents, device)
    st = tree_structure(parents)
    out = []
    for nodes, _, _ in st.inner_levels:
        w = max(len(st.children[v]) for v in nodes.tolist())
        first = _first_row(nodes)  # host tensor: no read of the device
        nodes = nodes.to(device)
        ch = tab.children.index_select(0, nodes)[:, :w]
        out.append((nodes, first, ch, tab.children_safe.index_select(0, nodes)[:, :w], ch >= 0))
    return tuple(out)


def traversal_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                     uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One Traversal Verification decision as a pure function of ``uniforms``, on the laws' device
    with no host read.

    Args:
        tokens: LongTensor ``[N]``; target_probs, draft_probs: float ``[N, V]``; uniforms: float64
            ``[N, 2]`` (see the module docstring).

    Returns:
        ``(node, y)``: 0-d LongTensors. The first node u in post-order with
        ``uniforms[u, 0] < alpha(u)`` (the root passes), y ~ P(u) with ``uniforms[u, 1]``, where
        alpha(u) and P(u) are the state when u is tested (after its children's rejections), as in
        :func:`_tests`.

    Computed depth by depth, all inner nodes of a depth at once: a node's updates (the rejections
    of its children) depend only on its own rows and alpha, and its alpha when entered only on its
    parent's state after the rejections of its earlier siblings. A node's rows need no copy per
    update: with B = M_b(.|v), q = M_s(.|v), P_raw = max(B - L q, 0) off the removed children
    (max(max(B - L q, 0) - l q, 0) = max(B - (L + l) q, 0)), so an update is
    L <- L + lam, lam = Pm / (alpha Qm) (capped at :data:`~eagle.rules.LAMBDA_CAP`), with one
    dense pass sum_x max(B(x) - L q(x), 0) over the non-children x; at a removed child u_i P_raw
    keeps the value it had when u_i was removed, and Qm = the draft mass off the children plus
    q(u_j) for the children not removed (summed directly). Only the y row of the accepted node
    is built.
    """
    dev = target_probs.device
    f64 = torch.float64
    n = st.num_nodes
    tab = device_tables(st.parents, str(dev))
    tokens = tokens.to(dev)
    alpha = torch.ones(n, dtype=f64, device=dev)  # alpha when entered, then when tested
    lam_end = torch.zeros(n, dtype=f64, device=dev)  # L of each node when tested (0 at leaves)
    frozen = torch.zeros(n, dtype=f64, device=dev)  # P_raw at a node's token at its parent, once removed
    for nodes, first, ch, safe, valid in _levels(st.parents, str(dev)):
        k, w = ch.shape
        ct = tokens[safe]  # [k, w], padding repeats the first child
        col = nodes.view(-1, 1)
        b = target_probs[col, ct].to(f64).masked_fill_(~valid, 0.0)  # B(u_j)
        qc = draft_probs[col, ct].to(f64).masked_fill_(~valid, 0.0)  # q(u_j)
        Bk, qk = _take(target_probs, first, nodes), _take(draft_probs, first, nodes)  # [k, V] (views if consecutive)
        q_off = remaining_masses(qk, ct, valid)  # the draft mass off the children, summed directly
        qsuf = qc.flip(1).cumsum(1).flip(1)  # sum over the children from u_j on
        al = alpha.index_select(0, nodes)
        L = torch.zeros(k, dtype=f64, device=dev)
        Pm = torch.ones(k, dtype=f64, device=dev)
        Qm = torch.ones(k, dtype=f64, device=dev)
        fz = torch.zeros(k, w, dtype=f64, device=dev)
        for j in range(w):
            vj, bj, qj = valid[:, j], b[:, j], qc[:, j]
            # u_j entered: alpha(u_j) = min(1, alpha(v) P(v)(x_u) / Q(v)(x_u))
            pt = (bj - L * qj).clamp_(min=0.0) / Pm
            qt = qj / Qm
            alpha.index_copy_(0, safe[:, j], torch.where(vj & (qt > 0), al * pt / qt.clamp_min(1e-300), 0.0)
                              .clamp_(max=1.0).where(vj, alpha.index_select(0, safe[:, j])))
            # u_j rejected: P <- norm(max(alpha P - Q, 0)), Q <- Q without x_u, alpha <- S / (S + 1 - alpha)
            lam = (Pm / (al * Qm).clamp_min(1e-300)).clamp_(max=LAMBDA_CAP)
            nL = (L + lam).clamp_(max=LAMBDA_CAP)
            dense = positive_part_sums(Bk, qk, nL.view(-1, 1), zero=ct).to(f64)  # off the children
            after = torch.addcmul(b, nL.view(-1, 1), qc, value=-1.0).clamp_(min=0.0)  # at the children not removed
            fj = after[:, j]
            r_mass = dense + after[:, j:].sum(1) + fz[:, :j].sum(1)
            S = al / Pm * r_mass
            keep = vj & (S > 0)  # S = 0: alpha(v) = 0, the row is kept (never sampled)
            fz[:, j] = torch.where(keep, fj, (bj - L * qj).clamp_(min=0.0))
            L, Pm = torch.where(keep, nL, L), torch.where(keep, r_mass, Pm)
            Qm = torch.where(vj, q_off + (qsuf[:, j + 1] if j + 1 < w else 0.0), Qm)
            den = S + (1.0 - al)  # not (S + 1) - al: that rounds S away when S << 1 and al == 1
            al = torch.where(vj, torch.where(den > 0, S / den.clamp_min(1e-300), 0.0).clamp_(max=1.0), al)
        alpha.index_copy_(0, nodes, al)
        lam_end.index_copy_(0, nodes, L)
        frozen.index_put_((safe,), fz.where(valid, fz[:, :1].expand_as(fz)))  # padding repeats slot 0
    # the first node in post-order whose coin passes (the root always does)
    passed = (uniforms[:, 0] < alpha).index_select(0, tab.postorder)
    passed[-1] = True
    v = tab.postorder[passed.to(torch.uint8).argmax()].view(1)
    # y ~ P(v): max(B - L q, 0) off the children, their values when removed (B itself at a leaf)
    row = positive_part(target_probs.index_select(0, v), draft_probs.index_select(0, v), lam_end.index_select(0, v).view(1, 1))
    sv = tab.children_safe.index_select(0, v)
    ct = tokens[sv]
    inner = tab.num_children.index_select(0, v).view(1, 1) > 0
    row.scatter_(1, ct, torch.where(inner, frozen[sv].to(row.dtype), row.gather(1, ct)))
    return v[0], draw_with_uniforms(row, uniforms[:, 1].index_select(0, v))[0]


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
