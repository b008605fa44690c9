"""EAGLE's ``evaluate_posterior``: pick the accepted path and the next token of one cycle.

Temperature 0: the longest path whose every token is the target's argmax at its parent, then the
argmax after it (token for token the greedy output). Temperature > 0: the registered verifier
(RRSw for EAGLE-1; ``univer_patch`` adds Traversal, Greedy and UniVer).
"""
from __future__ import annotations

import torch

from ..sampling import SamplingConfig, greedy_token
from .registry import Verifier

__all__ = ["evaluate_posterior", "greedy_longest_match", "path_to_root"]


def greedy_longest_match(parents: torch.Tensor, tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Temperature-0 verification.

    Args:
        parents: LongTensor ``[N]`` (common tree form); tokens: LongTensor ``[N]``.
        target_logits: float ``[N, V]``, the target's logits after every node.

    Returns:
        ``(node_index, next_token)``: deepest node on the greedy path and the target's argmax after it.
        Children of a node are distinct, so at most one child matches.
    """
    best = greedy_token(target_logits).tolist()  # [N]
    par = parents.tolist()
    tok = tokens.tolist()
    children: dict[int, list[int]] = {}
    for i in range(1, len(par)):
        children.setdefault(par[i], []).append(i)
    node = 0
    while True:
        nxt = next((c for c in children.get(node, ()) if tok[c] == best[node]), None)
        if nxt is None:
            return node, best[node]
        node = nxt


def path_to_root(parents: torch.Tensor, node: int) -> list[int]:
    """Node indices from the root (0) down to ``node``."""
    par = parents.tolist()
    path = [node]
    while par[path[-1]] >= 0:
        path.append(par[path[-1]])
    return path[::-1]


def evaluate_posterior(verifier: Verifier, cfg: SamplingConfig, parents: torch.Tensor, tokens: torch.Tensor,
                       target_logits: torch.Tensor, target_probs: torch.Tensor | None, draft_probs: torch.Tensor,
                       generator: torch.Generator | None = None) -> tuple[int, int]:
    """Dispatch one verification step.

    Args:
        verifier: the registered method (used when ``cfg.temperature > 0``).
        cfg: sampling processing; temperature 0 means greedy longest match.
        parents, tokens: LongTensor ``[N]`` (common tree form, node 0 = root).
        target_logits: float ``[N, V]`` raw target logits (used at temperature 0).
        target_probs: float32 ``[N, V]`` processed target laws M_b (temperature > 0).
        draft_probs: float32 ``[N, V]`` processed draft laws M_s.

    Returns:
        ``(node_index, next_token)`` ints.
    """
    if cfg.greedy:
        return greedy_longest_match(parents, tokens, target_logits)
    node, y = verifier.verify(parents, tokens, target_probs, draft_probs, generator=generator)
    return int(node), int(y)
