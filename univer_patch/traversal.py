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

from eagle.rules import SCALE_CAP_F32, scaled_residual
from eagle.sampling import sample_with_uniform
from eagle.tree.structure import TreeStructure
from eagle.verify.registry import Verifier, register_verifier

__all__ = ["traversal_kernel", "traversal_law", "VERIFIER"]


class _State:
    """Mutable per-node state of one traversal (only nodes whose laws changed hold copies)."""

    __slots__ = ("st", "tok", "P", "Pm", "Q", "Qm", "alpha", "remaining", "target", "draft", "broken")

    def __init__(self, st: TreeStructure, tok: list[int], target: torch.Tensor, draft: torch.Tensor, broken: str = ""):
        self.st, self.tok, self.target, self.draft, self.broken = st, tok, target, draft, broken
        self.P: dict[int, torch.Tensor] = {}  # node -> unnormalised current target row
        self.Pm: dict[int, float] = {}  # its mass
        self.Q: dict[int, torch.Tensor] = {}  # node -> draft row with removed tokens zeroed
        self.Qm: dict[int, float] = {}  # its mass
        self.alpha = [0.0] * st.num_nodes
        self.remaining = [list(c) for c in st.children]
        self.alpha[0] = 1.0
        n = st.num_nodes
        if n > 1:  # initial alphas: one gather per tensor, then a top-down pass over the tree
            par = torch.tensor(st.parents[1:], dtype=torch.long, device=target.device)
            tt = torch.tensor(tok[1:], dtype=torch.long, device=target.device)
            ratio = (target[par, tt] / draft[par, tt]).tolist()
            for i in range(1, n):
                self.alpha[i] = min(1.0, self.alpha[st.parents[i]] * ratio[i - 1])

    def p_of(self, v: int, x: int) -> float:
        return float(self.P[v][x]) / self.Pm[v] if v in self.P else float(self.target[v, x])

    def q_of(self, v: int, x: int) -> float:
        if v in self.Q:
            return float(self.Q[v][x]) / self.Qm[v] if self.Qm[v] > 0 else 0.0
        return float(self.draft[v, x])

    def refresh_below(self, v: int) -> None:
        """Recompute alpha for the remaining subtree below v."""
        stack = [v]
        while stack:
            w = stack.pop()
            for c in self.remaining[w]:
                qc = self.q_of(w, self.tok[c])
                self.alpha[c] = min(1.0, self.alpha[w] * self.p_of(w, self.tok[c]) / qc) if qc > 0 else 0.0
                stack.append(c)

    def reject(self, u: int) -> None:
        """Node u (no remaining children) was rejected: update its parent v and delete u."""
        v = self.st.parents[u]
        t = self.tok[u]
        al = self.alpha[v]
        # unnormalised rows and their masses: P = P_raw / Pm, Q = Q_raw / Qm. Then
        # max(al P - Q, 0) = (al / Pm) max(P_raw - coef Q_raw, 0) with coef = Pm / (al Qm): one pass
        # and no normalised copies. A coef beyond float32's safe range (tiny alpha or a denormal
        # draft mass) is applied in float64 as k max(P_raw - coef Q_raw, 0) = max(k P_raw - Q_raw, 0)
        # with k = al Qm / Pm (exact; k P_raw underflows only when S < 1e-300).
        P_raw, Pm = (self.P[v], self.Pm[v]) if v in self.P else (self.target[v], 1.0)
        Q_raw, Qm = (self.Q[v], self.Qm[v]) if v in self.Q else (self.draft[v], 1.0)
        k = al * Qm / Pm
        if k * SCALE_CAP_F32 >= 1.0:
            r = scaled_residual(P_raw, Q_raw, 1.0 / k)
            r_mass = float(r.sum())
            S = al / Pm * r_mass
        else:
            r = (P_raw.double() * k - Q_raw.double()).clamp_(min=0)
            r_mass = float(r.sum())
            S = r_mass / Qm if Qm > 0 else 0.0
        if S > 0:
            self.P[v], self.Pm[v] = r, r_mass
        else:  # alpha(v) = 0 (v can no longer be accepted): keep the row, never sampled
            self.P[v], self.Pm[v] = P_raw, Pm
        if v not in self.Q:
            self.Q[v] = self.draft[v].clone()
        self.Q[v][t] = 0.0
        self.Qm[v] = float(self.Q[v].sum())  # summed directly: subtracting q(t) cancels for a confident draft
        if self.broken != "no_alpha_update":
            den = S + (1.0 - al)  # not (S + 1.0) - al: that rounds S away when S << 1 and al == 1
            self.alpha[v] = min(1.0, S / den) if den > 0 else 0.0
        self.remaining[v].remove(u)
        self.refresh_below(v)

    def first(self) -> int:
        u = 0
        while self.remaining[u]:
            u = self.remaining[u][0]
        return u

    def y_row(self, u: int) -> torch.Tensor:
        return self.P[u] if u in self.P else self.target[u]


def traversal_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                     uniforms: torch.Tensor) -> tuple[int, int]:
    """One Traversal Verification decision as a pure function of ``uniforms`` (float ``[N, 2]``).

    Returns ``(node_index, next_token)``.
    """
    u = uniforms.tolist()
    s = _State(st, tokens.tolist(), target_probs, draft_probs)
    while True:
        node = s.first()
        if node == 0 or u[node][0] < s.alpha[node]:
            return node, sample_with_uniform(s.y_row(node), u[node][1])
        s.reject(node)


def traversal_law(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  *, _broken: str = "") -> torch.Tensor:
    """Exact law ``[N, V]`` of Traversal Verification's outcome, by branching on every test
    (float64 rows normalised to sum 1; see :class:`~eagle.verify.registry.Verifier`).

    Every rejection leads to the same next state, so the tests form one sequence of at most N
    nodes: the law is a single walk, O(N V).
    ``_broken`` (test-only negative control): ``"no_alpha_update"`` keeps alpha(v) after a child's
    rejection (not lossless).
    """
    out = torch.zeros_like(target_probs)
    s = _State(st, tokens.tolist(), target_probs, draft_probs, _broken)
    mass = 1.0
    while mass > 0:
        node = s.first()
        a = 1.0 if node == 0 else s.alpha[node]
        row = s.y_row(node)
        tot = row.sum()
        if tot > 0:
            out[node] += (mass * a) * (row / tot)
        mass *= 1.0 - a
        if node == 0:
            break
        s.reject(node)
    return out


VERIFIER = register_verifier(Verifier(
    name="traversal", drafting="wor", kernel=traversal_kernel, outcome_law=traversal_law,
    description="Traversal Verification (Weng et al. 2025): post-order, alpha updates bottom-up",
))
