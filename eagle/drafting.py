"""Drafting: the EAGLE-1 head expands a static tree level by level.

A drafter turns "committed context" into candidates: the tree's tokens plus, for every expanded
node, the full processed draft law its children were drawn from (what the verifier must use).
Another drafter (a dynamic tree, an independent small model) can plug in by returning the same
:class:`Draft`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .model.kv_cache import cache_length, truncate_cache
from .sampling import SamplingConfig, check_logits, logits_to_probs
from .tree import TreeBuffers
from .verify.rules import draw_children

__all__ = ["Draft", "EagleTreeDrafter"]


@dataclass
class Draft:
    """One drafted tree (static shape, possibly pruned).

    Attributes:
        tokens: LongTensor ``[N]`` over the static tree's nodes; ``tokens[0]`` is the root,
            -1 marks nodes that could not be drafted (draft support exhausted) and are pruned.
        draft_probs: float32 ``[N, V]``: row i = processed draft law node i's children were drawn
            from (zeros for leaves and pruned nodes). At temperature 0 it is the softmax of the
            draft logits (only its ranking is used).
        keep: LongTensor ``[n]``: indices of the drafted (not pruned) nodes, increasing, with 0.
    """

    tokens: torch.Tensor
    draft_probs: torch.Tensor
    keep: torch.Tensor


class EagleTreeDrafter:
    """EAGLE-1 drafting over a static tree with an :class:`~eagle.model.head.EagleHead`.

    Args:
        head: the draft head (its ``embed_tokens`` set).
        lm_head: the target's output projection (``[H] -> [V]``), shared with the target.
    """

    def __init__(self, head, lm_head):
        self.head = head
        self.lm_head = lm_head

    @torch.no_grad()
    def consume(self, head_cache, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Append committed (token_{t+1}, feature_t) pairs to the head cache.

        Args:
            head_cache: the head's ``DynamicCache`` (committed positions only).
            tokens: LongTensor ``[1, k]``; features: float ``[1, k, H]`` (target features).

        Returns:
            float ``[H]``: the head's output at the last pair, whose ``lm_head`` gives the draft law
            of the root's children.
        """
        past = cache_length(head_cache)
        pos = torch.arange(past, past + tokens.shape[1], device=tokens.device)[None]
        out = self.head(tokens, features.to(self.head.fc.weight.dtype), position_ids=pos, cache=head_cache)
        return out[0, -1]

    @torch.no_grad()
    def draft(self, head_cache, root_token: int, root_hidden: torch.Tensor, tree: TreeBuffers, rule: str,
              cfg: SamplingConfig, generator: torch.Generator | None = None) -> Draft:
        """Expand ``tree`` below ``root_token`` level by level with the head.

        The head cache holds the committed positions (C of them); node v at depth d >= 1 is fed
        ``(embed(token_v), head output at parent(v))`` at position ``C - 1 + d`` and attends to the
        committed positions, its tree ancestors and itself. The cache is restored to C positions
        before returning.

        Args:
            root_token: the last committed token (node 0).
            root_hidden: float ``[H]`` from :meth:`consume`.
            tree: static tree buffers.
            rule: drafting rule ("wor", "topk_residual" or "topk"; REFERENCE section 1).
            cfg: sampling processing applied to the draft logits (same as the target's).
        """
        device = root_hidden.device
        n = tree.num_nodes
        committed = cache_length(head_cache)
        tokens = torch.full((n,), -1, dtype=torch.long, device=device)
        tokens[0] = int(root_token)
        hidden = torch.zeros(n, root_hidden.shape[-1], dtype=root_hidden.dtype, device=device)
        hidden[0] = root_hidden
        vocab = self.lm_head.weight.shape[0]
        draft_probs = torch.zeros(n, vocab, dtype=torch.float32, device=device)
        parents = tree.parents.to(device)
        depth = tree.depth.to(device)
        num_children = tree.num_children
        cached_nodes: list[torch.Tensor] = []  # tree nodes appended to the head cache, in order
        ancestor = tree.ancestor_mask.to(device)
        try:
            for d, level in enumerate(tree.levels):
                level = level.to(device)
                expand = level[(num_children[level.cpu()] > 0).to(device) & (tokens[level] >= 0)]
                if expand.numel() == 0:
                    break
                if d > 0:
                    cached = torch.cat(cached_nodes) if cached_nodes else expand[:0]
                    cols = torch.cat([cached, expand])
                    visible = torch.cat([torch.ones(expand.numel(), committed, dtype=torch.bool, device=device),
                                         ancestor[expand][:, cols]], dim=1)
                    dt = self.head.fc.weight.dtype
                    mask = torch.zeros(visible.shape, dtype=dt, device=device)
                    mask.masked_fill_(~visible, torch.finfo(dt).min)
                    out = self.head(tokens[expand][None], hidden[parents[expand]][None],
                                    position_ids=(committed - 1 + depth[expand])[None],
                                    attention_mask=mask[None, None], cache=head_cache)
                    hidden[expand] = out[0]
                    cached_nodes.append(expand)
                logits = self.lm_head(hidden[expand]).float()
                check_logits(logits, "draft logits (head output)")
                if cfg.greedy:
                    q = torch.softmax(logits, dim=-1)  # topk ranks by the raw draft logits
                else:
                    q = logits_to_probs(logits, cfg)
                draft_probs[expand] = q
                m_per_node = num_children[expand.cpu()]
                for m in torch.unique(m_per_node).tolist():
                    sel = (m_per_node == m).to(device)
                    nodes = expand[sel]
                    kids = draw_children(q[sel], min(int(m), vocab), rule, generator)  # [g, min(m, V)]
                    if kids.shape[1] < m:  # more children than tokens: the extra ones are pruned
                        kids = torch.cat([kids, kids.new_full((kids.shape[0], int(m) - kids.shape[1]), -1)], 1)
                    child_idx = torch.tensor([tree.children[int(v)] for v in nodes.tolist()],
                                             dtype=torch.long, device=device)
                    tokens[child_idx.flatten()] = kids.flatten().to(device)
        finally:
            truncate_cache(head_cache, committed)
        # a node survives only if it and all its ancestors were drafted
        drafted = tokens >= 0
        alive = ~(ancestor & ~drafted[None, :]).any(dim=1)
        keep = torch.nonzero(alive).flatten()
        return Draft(tokens=tokens, draft_probs=draft_probs, keep=keep)
