"""Temperature 0: the longest greedy match (drafting ``topk``).

At temperature 0 the target law after every node is one-hot on its argmax (ties to the lowest
token id, as :func:`eagle.sampling.greedy_token`). From the root, move to the child whose token is
the argmax at its parent while there is one (children are distinct, so at most one matches); the
next token is the argmax after the last matched node. The output is plain greedy decoding token
for token. Lossless only for one-hot target laws, hence registered as temperature-0-only.
The uniforms are not used.
"""
from __future__ import annotations

import torch

from ..tree.structure import TreeStructure, device_tables
from .registry import Verifier, register_verifier

__all__ = ["argmax_kernel", "argmax_law", "VERIFIER"]


def argmax_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The longest greedy match, computed on the laws' device with no host read.

    Args:
        st: the tree's structure; tokens: LongTensor ``[N]``; target_probs: float ``[N, V]`` (one-hot
            at temperature 0); draft_probs, uniforms: unused.

    Returns:
        ``(node, y)``: 0-d LongTensors on the laws' device. A walk of one step per depth: at node v
        (a device scalar) b = argmax M_b(.|v); move to the child whose token is b if there is one
        (children are distinct, so at most one), else stay (a node that stayed stays).
    """
    dev = target_probs.device
    tab = device_tables(st.parents, str(dev))
    tokens = tokens.to(dev)
    v = torch.zeros((), dtype=torch.long, device=dev)
    for w in tab.width:
        if w == 0:
            break
        b = target_probs.index_select(0, v.view(1)).argmax(-1)  # [1]
        ch = tab.children.index_select(0, v.view(1))[0, :w]  # [w], -1 = none
        hit = (ch >= 0) & (tokens[ch.clamp(min=0)] == b)
        v = torch.where(hit.any(), ch.gather(0, hit.to(torch.uint8).argmax().view(1))[0], v)
    return v, target_probs.index_select(0, v.view(1)).argmax(-1)[0]


def argmax_law(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor
               ) -> torch.Tensor:
    """Exact law ``[N, V]``: a point mass on the longest greedy match and the argmax after it."""
    node, y = argmax_kernel(st, tokens, target_probs, draft_probs, None)
    out = torch.zeros_like(target_probs)
    out[node, y] = 1.0
    return out


VERIFIER = register_verifier(Verifier(
    name="argmax", drafting="topk", kernel=argmax_kernel, outcome_law=argmax_law,
    description="temperature 0: longest greedy match on the top-k tree (plain greedy decoding token for token)",
    temperature_zero_only=True,
))
