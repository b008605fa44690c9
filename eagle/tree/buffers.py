"""Tree buffers derived from ``choices``, in one place.

Node 0 is the root (the last committed token); nodes 1..N-1 are the choices sorted by
(depth, path), so every parent precedes its children and siblings appear in rank order
with increasing index. Every other module reads these buffers; none recomputes them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .choices import resolve_tree

__all__ = ["TreeBuffers", "build_tree", "subtree_parents"]


@dataclass(frozen=True)
class TreeBuffers:
    """Static tree buffers (all on CPU; move with :meth:`to`).

    Attributes:
        choices: the sorted rank paths (tuple of tuples), node i+1 = choices[i].
        parents: LongTensor ``[N]``, parent node index, -1 for the root.
        depth: LongTensor ``[N]``, 0 for the root; also the position offset from the root.
        rank: LongTensor ``[N]``, rank among siblings (0 for the root).
        num_children: LongTensor ``[N]``.
        children: tuple of N tuples, children node indices in rank order.
        ancestor_mask: BoolTensor ``[N, N]``, ``[i, j]`` True iff j is i or an ancestor of i.
        levels: tuple of LongTensors, node indices of each depth 0..max_depth.
        retrieve_paths: LongTensor ``[num_leaves, max_depth + 1]``, root-to-leaf node indices,
            padded with -1.
    """

    choices: tuple
    parents: torch.Tensor
    depth: torch.Tensor
    rank: torch.Tensor
    num_children: torch.Tensor
    children: tuple
    ancestor_mask: torch.Tensor
    levels: tuple
    retrieve_paths: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.parents.numel())

    @property
    def max_depth(self) -> int:
        return len(self.levels) - 1

    def additive_mask(self, prefix_len: int, dtype=torch.float32, nodes: torch.Tensor | None = None) -> torch.Tensor:
        """4D additive attention mask ``[1, 1, n, prefix_len + n]`` for a forward over tree nodes.

        Each node sees the whole prefix (``prefix_len`` cached positions), its ancestors and
        itself; other entries are ``finfo(dtype).min``. ``nodes`` (LongTensor ``[n]``) restricts
        the queries and keys to a subset of nodes (closed under ancestors).
        """
        anc = self.ancestor_mask if nodes is None else self.ancestor_mask[nodes][:, nodes]
        n = anc.shape[0]
        visible = torch.cat([torch.ones(n, prefix_len, dtype=torch.bool), anc], dim=1)
        mask = torch.zeros(n, prefix_len + n, dtype=dtype)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        return mask[None, None]


def _validate(choices: list[list[int]]) -> list[tuple[int, ...]]:
    seen = set()
    for p in choices:
        t = tuple(p)
        if len(t) == 0:
            raise ValueError("empty path in choices (the root is implicit)")
        if any((not isinstance(r, int)) or r < 0 for r in t):
            raise ValueError(f"negative or non-integer rank in path {list(t)}")
        if t in seen:
            raise ValueError(f"duplicate path {list(t)} in choices")
        seen.add(t)
    for t in seen:
        if len(t) > 1 and t[:-1] not in seen:
            raise ValueError(f"path {list(t)} has no parent {list(t[:-1])} in choices")
        if t[-1] > 0 and t[:-1] + (t[-1] - 1,) not in seen:
            raise ValueError(f"path {list(t)} skips rank {t[-1] - 1} (siblings must be ranks 0..m-1)")
    return sorted(seen, key=lambda t: (len(t), t))


@lru_cache(maxsize=64)
def _build(key: tuple) -> TreeBuffers:
    paths = _validate([list(p) for p in key])
    index = {(): 0}
    for i, t in enumerate(paths):
        index[t] = i + 1
    n = len(paths) + 1
    parents = torch.full((n,), -1, dtype=torch.long)
    depth = torch.zeros(n, dtype=torch.long)
    rank = torch.zeros(n, dtype=torch.long)
    children = [[] for _ in range(n)]
    for t in paths:
        i, par = index[t], index[t[:-1]]
        parents[i], depth[i], rank[i] = par, len(t), t[-1]
        children[par].append(i)  # paths are sorted, so ranks come in order
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = int(parents[j])
    max_depth = int(depth.max())
    levels = tuple(torch.nonzero(depth == d).flatten() for d in range(max_depth + 1))
    leaves = [i for i in range(n) if not children[i]]
    rp = torch.full((len(leaves), max_depth + 1), -1, dtype=torch.long)
    for r, leaf in enumerate(leaves):
        path = torch.nonzero(anc[leaf]).flatten()  # ancestors have smaller index: already root-first
        rp[r, : path.numel()] = path
    return TreeBuffers(
        choices=tuple(paths), parents=parents, depth=depth, rank=rank,
        num_children=torch.tensor([len(c) for c in children], dtype=torch.long),
        children=tuple(tuple(c) for c in children), ancestor_mask=anc, levels=levels, retrieve_paths=rp,
    )


def build_tree(spec) -> TreeBuffers:
    """Build (and cache) the buffers of a tree.

    Args:
        spec: choices (list of rank paths) or a name accepted by :func:`resolve_tree`.

    Raises:
        ValueError: invalid choices (missing parent, duplicate path, negative rank, rank gap).
    """
    choices = resolve_tree(spec)
    for p in choices:
        if any(r < 0 for r in p):
            raise ValueError(f"negative rank in path {p}")
    return _build(tuple(tuple(p) for p in choices))


def subtree_parents(parents: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Re-index ``parents`` (LongTensor ``[N]``) to the kept nodes ``keep`` (sorted LongTensor ``[n]``,
    closed under ancestors, containing 0). Returns LongTensor ``[n]`` with -1 for the root."""
    remap = torch.full((parents.numel(),), -1, dtype=torch.long)
    remap[keep] = torch.arange(keep.numel())
    p = parents[keep]
    out = torch.where(p >= 0, remap[p.clamp(min=0)], p)
    if (out[1:] < 0).any():
        raise ValueError("kept nodes are not closed under ancestors")
    return out
