"""Tree topology derived from ``parents``, in one place (cached per tree shape).

Everything that needs the children, depths, levels or post-order of a tree reads a
:class:`TreeStructure`: the static tree buffers (:mod:`eagle.tree.buffers`), the verifiers' input
checks and kernels (:mod:`eagle.verify`, ``univer_patch``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = ["TreeStructure", "tree_structure", "structure_of", "DeviceTables", "device_tables"]


@dataclass(frozen=True)
class TreeStructure:
    """Topology of one tree, derived from ``parents`` once and cached.

    Attributes:
        num_nodes: N.
        parents: tuple of N ints (-1 for the root).
        children: tuple of N tuples of child node indices in rank (= index) order.
        depth: tuple of N ints.
        postorder: tuple of node indices in post-order (children in rank order, then the node).
        postorder_t: LongTensor ``[N]`` of the same (host).
        inner_levels: per depth with inner nodes: ``(nodes [k], child_nodes [k, mmax] padded -1,
            m [k])`` LongTensors (host); ``nodes`` are the nodes of that depth that have children.
        is_chain: every node has at most one child.
    """

    num_nodes: int
    parents: tuple
    children: tuple
    depth: tuple
    postorder: tuple
    postorder_t: torch.Tensor
    inner_levels: tuple
    is_chain: bool


@lru_cache(maxsize=256)
def tree_structure(parents: tuple) -> TreeStructure:
    """Build (and cache) the :class:`TreeStructure` of a parents tuple.

    Raises:
        ValueError: if the tree is empty, ``parents[0] != -1`` or ``parents[i]`` is not in ``[0, i)``.
    """
    n = len(parents)
    if n == 0:
        raise ValueError("empty tree: need at least the root (node 0)")
    if parents[0] != -1:
        raise ValueError(f"node 0 (the root) must have parent -1, got {parents[0]}")
    children: list[list[int]] = [[] for _ in range(n)]
    depth = [0] * n
    for i in range(1, n):
        p = parents[i]
        if not 0 <= p < i:
            raise ValueError(f"node {i}: parent {p} must satisfy 0 <= parent < {i}")
        children[p].append(i)
        depth[i] = depth[p] + 1
    post: list[int] = []
    stack = [(0, False)]
    while stack:
        v, done = stack.pop()
        if done:
            post.append(v)
            continue
        stack.append((v, True))
        for c in reversed(children[v]):
            stack.append((c, False))
    cpu = torch.device("cpu")  # explicit: host tensors whatever the default device
    levels = []
    for d in range(max(depth) + 1):
        nodes = [v for v in range(n) if depth[v] == d and children[v]]
        if not nodes:
            continue
        mmax = max(len(children[v]) for v in nodes)
        pad = [list(children[v]) + [-1] * (mmax - len(children[v])) for v in nodes]
        levels.append((torch.tensor(nodes, dtype=torch.long, device=cpu), torch.tensor(pad, dtype=torch.long, device=cpu),
                       torch.tensor([len(children[v]) for v in nodes], dtype=torch.long, device=cpu)))
    return TreeStructure(
        num_nodes=n, parents=tuple(parents), children=tuple(tuple(c) for c in children), depth=tuple(depth),
        postorder=tuple(post), postorder_t=torch.tensor(post, dtype=torch.long, device=cpu), inner_levels=tuple(levels),
        is_chain=all(len(c) <= 1 for c in children),
    )


def structure_of(parents: torch.Tensor) -> TreeStructure:
    """:func:`tree_structure` of a LongTensor ``[N]`` (one host sync)."""
    return tree_structure(tuple(int(p) for p in parents.tolist()))


@dataclass(frozen=True)
class DeviceTables:
    """Structure-only tensors of one tree on one device, for kernels that walk the tree without
    reading the device (built once per shape and device, see :func:`device_tables`).

    Attributes:
        children: LongTensor ``[N, mmax]``: children in rank order, padded with -1 (mmax >= 1).
        num_children: LongTensor ``[N]``.
        width: tuple of ints, per depth d: the most children a node of depth d has (0 at the deepest
            depth), so a walk at depth d looks at ``children[v, :width[d]]`` only.
        postorder: LongTensor ``[N]``, the post-order of :class:`TreeStructure`.
        children_safe: LongTensor ``[N, mmax]``: ``children`` with every padding slot replaced by
            the first child (by the node itself at a leaf). A scatter through these slots writes
            each padding slot's column with the value of a real slot (or leaves a leaf's own
            token's column to the caller), so it never races with a real child's write.
        parent: LongTensor ``[N]``: the parents, the root's replaced by 0 (a valid row index).
        rank: LongTensor ``[mmax]``: 0..mmax-1, the child ranks of a row of ``children``.
    """

    children: torch.Tensor
    num_children: torch.Tensor
    width: tuple
    postorder: torch.Tensor
    children_safe: torch.Tensor
    parent: torch.Tensor
    rank: torch.Tensor


@lru_cache(maxsize=256)
def device_tables(parents: tuple, device: str = "cpu") -> DeviceTables:
    """The :class:`DeviceTables` of a parents tuple on ``device`` (cached per shape and device)."""
    st = tree_structure(parents)
    mmax = max(1, max(len(c) for c in st.children))
    pad = [list(c) + [-1] * (mmax - len(c)) for c in st.children]
    width = [0] * (max(st.depth) + 1)
    for v, c in enumerate(st.children):
        width[st.depth[v]] = max(width[st.depth[v]], len(c))
    safe = [list(c) + [c[0] if c else v] * (mmax - len(c)) for v, c in enumerate(st.children)]
    dev = torch.device(device)
    return DeviceTables(children=torch.tensor(pad, dtype=torch.long, device=dev),
                        num_children=torch.tensor([len(c) for c in st.children], dtype=torch.long, device=dev),
                        width=tuple(width), postorder=st.postorder_t.to(dev),
                        children_safe=torch.tensor(safe, dtype=torch.long, device=dev),
                        parent=torch.tensor([max(p, 0) for p in st.parents], dtype=torch.long, device=dev),
                        rank=torch.arange(mmax, dtype=torch.long, device=dev))
