"""Static tree shapes as ``choices``: lists of rank paths (rank k = the k-th child of the parent).

``[0]`` is the first child of the root, ``[0, 1]`` the second child of that node, and so on.
"""
from __future__ import annotations

import itertools
import numbers
import re

__all__ = ["MC_SIM_7B_63", "balanced", "chain", "resolve_tree"]

#: EAGLE-1's default tree (25 nodes below the root, depth 5).
MC_SIM_7B_63: list[list[int]] = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]


def balanced(k: int, d: int) -> list[list[int]]:
    """Full tree with ``k`` children per node and depth ``d`` ("2x5" = 62 nodes, "3x3" = 39 nodes).

    Raises:
        ValueError: if ``k < 1`` or ``d < 1``.
    """
    if k < 1 or d < 1:
        raise ValueError(f"balanced tree needs k >= 1 and d >= 1, got k={k}, d={d}")
    return [list(p) for depth in range(1, d + 1) for p in itertools.product(range(k), repeat=depth)]


def chain(d: int) -> list[list[int]]:
    """A single path of ``d`` draft tokens (``balanced(1, d)``)."""
    return balanced(1, d)


def resolve_tree(spec) -> list[list[int]]:
    """Turn a tree spec into choices.

    Accepts a choices list, ``"mc_sim_7b_63"`` (case-insensitive), ``"KxD"`` (balanced, e.g.
    ``"2x5"``) or ``"chainD"``.

    Raises:
        ValueError: for an unknown spec string, an empty choices list or a non-integer rank.
    """
    if not isinstance(spec, str):
        paths = []
        for p in spec:
            if isinstance(p, (str, bytes)) or not hasattr(p, "__iter__"):
                raise ValueError(f"each choice must be a list of integer ranks, got {p!r}")
            p = list(p)
            for r in p:
                if isinstance(r, bool) or not isinstance(r, numbers.Integral):
                    raise ValueError(f"rank {r!r} in path {p} is not an integer")
            paths.append([int(r) for r in p])
        if not paths:
            raise ValueError("choices is empty: a tree needs at least one draft node")
        return paths
    s = spec.strip().lower()
    if s in ("mc_sim_7b_63", "eagle", "mc_sim_7b"):
        return [list(p) for p in MC_SIM_7B_63]
    m = re.fullmatch(r"(\d+)x(\d+)", s)
    if m:
        return balanced(int(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"chain(\d+)", s)
    if m:
        return chain(int(m.group(1)))
    raise ValueError(f"unknown tree {spec!r}: use 'mc_sim_7b_63', 'KxD' (e.g. '2x5') or 'chainD'")
