"""Tree buffers derived from ``choices`` (topology via :func:`eagle.tree.structure.tree_structure`).

Node 0 is the root (the last committed token); nodes 1..N-1 are the choices sorted by
(depth, path), so every parent precedes its children and siblings appear in rank order
with increasing index. Every other module reads these buffers; none recomputes them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .choices import resolve_tree
from .structure import TreeStructure, tree_structure

__all__ = ["TreeBuffers", "TreePlan", "build_tree", "subtree_parents", "additive_mask", "path_to_root"]


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
        if nodes is None:
            anc = self.ancestor_mask
        else:
            nodes = nodes.to("cpu")
            anc = self.ancestor_mask[nodes][:, nodes]
        return additive_mask(anc, prefix_len, dtype)

    def on(self, device) -> "TreePlan":
        """The per-device drafting / verification plan of this tree (built once per device, cached)."""
        return _plan(self.choices, str(torch.device(device)))


def additive_mask(visible: torch.Tensor, prefix_len: int, dtype=torch.float32) -> torch.Tensor:
    """THE tree attention mask (the drafter and the target forward both use it).

    Args:
        visible: BoolTensor ``[n, k]``: query i may attend to tree key j (its ancestors and itself).
        prefix_len: committed positions before the tree keys; every query sees all of them.
        dtype: float dtype of the mask (the model's).

    Returns:
        float ``[1, 1, n, prefix_len + k]`` on ``visible.device``: 0 where visible, ``finfo(dtype).min``
        elsewhere.
    """
    n, k = visible.shape
    mask = torch.zeros(n, prefix_len + k, dtype=dtype, device=visible.device)
    mask[:, prefix_len:].masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def path_to_root(parents, node: int) -> list[int]:
    """Node indices from the root (0) down to ``node``, from ``parents`` (list of ints or LongTensor ``[N]``)."""
    par = parents.tolist() if isinstance(parents, torch.Tensor) else parents
    path = [int(node)]
    while par[path[-1]] >= 0:
        path.append(par[path[-1]])
    return path[::-1]


@dataclass(frozen=True)
class LevelPlan:
    """Drafting plan of one depth: which nodes are expanded and where their children go.

    Attributes:
        expand: LongTensor ``[e]`` (device): nodes of this depth that have children.
        visible: BoolTensor ``[e, c + e]`` (device) or None at depth 0: tree keys visible to ``expand`` in
            the head's forward, the keys being the expanded nodes of depths 1..d-1 (in order, as cached)
            then ``expand`` itself.
        groups: tuple of ``(m, rows, child_idx)``: ``rows`` LongTensor ``[g]`` indexes ``expand`` (its
            nodes with m children), ``child_idx`` LongTensor ``[g, m]`` their children in rank order.
    """

    expand: torch.Tensor
    visible: torch.Tensor | None
    groups: tuple


@dataclass(frozen=True)
class TreePlan:
    """A :class:`TreeBuffers` moved to one device once, plus host lists (no per-cycle transfers).

    Attributes:
        parents, depth: LongTensor ``[N]`` on the device; ancestor: BoolTensor ``[N, N]`` on the device.
        parents_list, depth_list: the same on the host (lists of ints).
        levels: tuple of :class:`LevelPlan`, depth 0..max_depth-1 (levels that have children).
        path_index: tuple of N LongTensors on the device: root-to-node node indices.
        structure: the tree's :class:`~eagle.tree.structure.TreeStructure`.
    """

    device: torch.device
    parents: torch.Tensor
    depth: torch.Tensor
    ancestor: torch.Tensor
    parents_list: tuple
    depth_list: tuple
    levels: tuple
    path_index: tuple
    structure: TreeStructure


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
    par_tuple = (-1,) + tuple(index[t[:-1]] for t in paths)
    st = tree_structure(par_tuple)  # the one topology derivation (children, depth)
    n = st.num_nodes
    cpu = torch.device("cpu")  # explicit: the buffers live on the host whatever the default device
    parents = torch.tensor(par_tuple, dtype=torch.long, device=cpu)
    depth = torch.tensor(st.depth, dtype=torch.long, device=cpu)
    rank = torch.tensor((0,) + tuple(t[-1] for t in paths), dtype=torch.long, device=cpu)
    anc = torch.zeros(n, n, dtype=torch.bool, device=cpu)
    paths_to_root = [path_to_root(par_tuple, i) for i in range(n)]
    for i, path in enumerate(paths_to_root):
        anc[i, path] = True
    max_depth = max(st.depth)
    levels = tuple(torch.tensor([v for v in range(n) if st.depth[v] == d], dtype=torch.long, device=cpu)
                   for d in range(max_depth + 1))
    leaves = [i for i in range(n) if not st.children[i]]
    rp = torch.full((len(leaves), max_depth + 1), -1, dtype=torch.long, device=cpu)
    for r, leaf in enumerate(leaves):
        path = paths_to_root[leaf]
        rp[r, : len(path)] = torch.tensor(path, dtype=torch.long, device=cpu)
    return TreeBuffers(
        choices=tuple(paths), parents=parents, depth=depth, rank=rank,
        num_children=torch.tensor([len(c) for c in st.children], dtype=torch.long, device=cpu),
        children=st.children, ancestor_mask=anc, levels=levels, retrieve_paths=rp,
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


@lru_cache(maxsize=64)
def _plan(key: tuple, device: str) -> TreePlan:
    t = _build(key)
    dev = torch.device(device)
    levels = []
    cached: list[int] = []
    for d, level in enumerate(t.levels):
        expand = [int(v) for v in level if t.children[int(v)]]
        if not expand:
            break
        visible = None
        if d > 0:
            cols = cached + expand
            rows_t = torch.tensor(expand, dtype=torch.long, device="cpu")
            cols_t = torch.tensor(cols, dtype=torch.long, device="cpu")
            visible = t.ancestor_mask[rows_t][:, cols_t].to(dev)
            cached = cols
        by_m: dict[int, list[int]] = {}
        for r, v in enumerate(expand):
            by_m.setdefault(len(t.children[v]), []).append(r)
        groups = tuple((m, torch.tensor(rows, dtype=torch.long, device=dev),
                        torch.tensor([t.children[expand[r]] for r in rows], dtype=torch.long, device=dev))
                       for m, rows in sorted(by_m.items()))
        levels.append(LevelPlan(torch.tensor(expand, dtype=torch.long, device=dev), visible, groups))
    parents_list = tuple(int(p) for p in t.parents)
    return TreePlan(
        device=dev, parents=t.parents.to(dev), depth=t.depth.to(dev), ancestor=t.ancestor_mask.to(dev),
        parents_list=parents_list, depth_list=tuple(int(x) for x in t.depth), levels=tuple(levels),
        path_index=tuple(torch.tensor(path_to_root(parents_list, i), dtype=torch.long, device=dev)
                         for i in range(t.num_nodes)),
        structure=tree_structure(parents_list),
    )


def subtree_parents(parents: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Re-index ``parents`` (LongTensor ``[N]``) to the kept nodes ``keep`` (sorted LongTensor ``[n]``,
    closed under ancestors, containing 0). Returns LongTensor ``[n]`` with -1 for the root, on
    ``parents.device``.

    Raises:
        ValueError: ``keep`` is not closed under ancestors.
    """
    keep = keep.to(parents.device)
    remap = torch.full((parents.numel(),), -1, dtype=torch.long, device=parents.device)
    remap[keep] = torch.arange(keep.numel(), device=parents.device)
    p = parents[keep]
    out = torch.where(p >= 0, remap[p.clamp(min=0)], p)
    if (out[1:] < 0).any():
        raise ValueError("kept nodes are not closed under ancestors")
    return out
