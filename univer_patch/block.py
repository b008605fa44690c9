"""Block Verification (Sun et al.) on a chain: the reference UniVer and Traversal reduce to.

Chain x_1..x_K below the root with B_i = M_b(.|x_<=i), q_i = M_s(.|x_<=i). Prefix weights
p_0 = 1, p_k = min(1, p_{k-1} B_{k-1}(x_k) / q_{k-1}(x_k)) (multiply, then truncate). With
S_i = sum_x max(p_i B_i(x) - q_i(x), 0): h_K = p_K, h_i = S_i / (S_i + 1 - p_i) for i < K
(h_0 = 1). Going from i = K down to 0, the first i with eta_i < h_i is accepted; y ~ B_K at
i = K, else y ~ norm(max(p_i B_i - q_i, 0)). Optimal for single chains. Not registered (chains only).
"""
from __future__ import annotations

import torch

from eagle.verify.checks import prepare_step

__all__ = ["outcome_probs", "prefix_weights"]


def prefix_weights(tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> list[float]:
    """p_0..p_K of a chain (node i = position i). Returns K + 1 floats."""
    p = [1.0]
    for k in range(1, tokens.numel()):
        t = int(tokens[k])
        q = float(draft_probs[k - 1, t])
        p.append(min(1.0, p[-1] * float(target_probs[k - 1, t]) / q) if q > 0 else 0.0)
    return p


def outcome_probs(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  *, check: bool = True) -> torch.Tensor:
    """Exact law ``[N, V]`` of Block Verification's outcome on a chain (node i = i draft tokens).

    Raises:
        ValueError: if the tree is not a chain (``parents[i] != i - 1``) or inputs are invalid.
    """
    st, tokens, target_probs, draft_probs = prepare_step(parents, tokens, target_probs, draft_probs, "wor", check)
    if any(st.parents[i] != i - 1 for i in range(1, st.num_nodes)):
        raise ValueError("Block Verification needs a chain: parents[i] == i - 1 for every node i > 0")
    K = st.num_nodes - 1
    p = prefix_weights(tokens, target_probs, draft_probs)
    out = torch.zeros_like(target_probs)
    mass = 1.0
    for i in range(K, -1, -1):
        if i == K:
            h, row = p[K], target_probs[K]
        else:
            r = (p[i] * target_probs[i] - draft_probs[i]).clamp(min=0)
            S = float(r.sum())
            den = S + (1.0 - p[i])  # not (S + 1.0) - p[i]: that rounds S away when S << 1
            h = 1.0 if i == 0 else (min(1.0, S / den) if den > 0 else 0.0)
            row = r / S if S > 0 else torch.zeros_like(r)
        out[i] = mass * h * row
        mass *= 1.0 - h
    return out
