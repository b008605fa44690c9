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

from ..tree.structure import TreeStructure
from .registry import Verifier, register_verifier

__all__ = ["argmax_kernel", "argmax_law", "VERIFIER"]


def _walk(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor) -> tuple[int, int]:
    tok = tokens.tolist()
    if target_probs.device.type == "cpu":  # read only the rows on the path (all N rows: ~10x the work)
        def best(v: int) -> int:
            return int(torch.argmax(target_probs[v]))
    else:  # an accelerator: one vectorised argmax, one host sync
        rows = torch.argmax(target_probs, dim=-1).tolist()

        def best(v: int) -> int:
            return rows[v]
    v = 0
    while True:
        b = best(v)
        nxt = next((c for c in st.children[v] if tok[c] == b), None)
        if nxt is None:
            return v, b
        v = nxt


def argmax_kernel(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  uniforms: torch.Tensor) -> tuple[int, int]:
    """The longest greedy match: ``(node_index, next_token)``; ``draft_probs`` and ``uniforms`` unused."""
    return _walk(st, tokens, target_probs)


def argmax_law(st: TreeStructure, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor
               ) -> torch.Tensor:
    """Exact law ``[N, V]``: a point mass on the longest greedy match and the argmax after it."""
    node, y = _walk(st, tokens, target_probs)
    out = torch.zeros_like(target_probs)
    out[node, y] = 1.0
    return out


VERIFIER = register_verifier(Verifier(
    name="argmax", drafting="topk", kernel=argmax_kernel, outcome_law=argmax_law,
    description="temperature 0: longest greedy match on the top-k tree (plain greedy decoding token for token)",
    temperature_zero_only=True,
))
