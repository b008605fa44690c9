"""A static tree fitted to the machine: maximise expected tokens per second (Sequoia-style).

Model (Sequoia, Chen et al. 2024, "positional acceptance"): the rank-r child of a node at depth
d - 1 is accepted, given its parent was, with probability ``acceptance[d - 1, r]`` (measured,
see :mod:`eagle.autotree`). A tree T of n draft nodes (plus the root) then yields per cycle

    E[tokens | T] = 1 + sum_{v in T, v != root} prod_{u on the path root -> v, u != root} acceptance[depth(u) - 1, rank(u)]

(accepted draft tokens + the bonus token), and costs (:class:`CycleCost`)

    cycle_s(T) = target_s(n + 1) + draft_level_s * depth(T) + draft_node_s * n + fixed_s:

every drafted level runs the head and the draft lm_head once over its expanded nodes (a fixed
part per level plus a part growing with the level's width; the width part is charged per draft
node, fitted by least squares on measured trees, because a cost per expanded node would not
decompose over subtrees). :func:`fit_tree` returns the tree maximising ``E / cycle_s`` over all
trees with at most ``max_nodes`` draft nodes, depth <= the table's depth and ranks < the
table's width, exactly: for fixed (n, depth) the cost is fixed and E is maximised by dynamic
programming over (depth, rank, node budget).

Pure functions on numpy arrays (no model here); cached choices live in JSON files under
``cache_dir()/auto_tree/`` (:func:`load_cached`, :func:`store_cached`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["CycleCost", "FittedTree", "expected_tokens", "tree_stats", "fit_tree", "cache_path", "load_cached",
           "store_cached"]

_NEG = -math.inf


@dataclass(frozen=True)
class CycleCost:
    """Seconds of one speculative cycle as a function of the tree's shape.

    Attributes:
        target_tokens: increasing token counts (root + draft nodes) at which the target forward
            was timed, e.g. ``(1, 2, 4, 8, 16, 32, 64)``; the first must be 1 (= one decode step).
        target_s: seconds of one target forward over that many tree tokens on top of the cache;
            linear interpolation between points, linear extrapolation beyond the last two.
        draft_level_s: seconds per drafted level (one head forward + lm_head + sampling).
        draft_node_s: extra drafting seconds per draft node (the level-width part).
        fixed_s: seconds per cycle independent of the tree (verification, cache update, the head
            consuming the accepted tokens, bookkeeping).

    Raises:
        ValueError: empty / unsorted / non-positive points, a first point other than 1, or a
            negative or non-finite constant.
    """

    target_tokens: tuple
    target_s: tuple
    draft_level_s: float = 0.0
    draft_node_s: float = 0.0
    fixed_s: float = 0.0

    def __post_init__(self):
        tok = [int(t) for t in self.target_tokens]
        sec = [float(s) for s in self.target_s]
        if not tok or len(tok) != len(sec):
            raise ValueError(f"target_tokens and target_s must be non-empty and of equal length, got {len(tok)} "
                             f"and {len(sec)}")
        if tok[0] != 1 or any(b <= a for a, b in zip(tok, tok[1:])):
            raise ValueError(f"target_tokens must start at 1 and increase strictly, got {tok}")
        if any(not (math.isfinite(s) and s > 0) for s in sec):
            raise ValueError(f"target_s must be finite and > 0, got {sec}")
        for name in ("draft_level_s", "draft_node_s", "fixed_s"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        object.__setattr__(self, "target_tokens", tuple(tok))
        object.__setattr__(self, "target_s", tuple(sec))

    @property
    def decode_s(self) -> float:
        """Seconds of one plain decode step (the target forward over 1 token)."""
        return self.target_s[0]

    def target(self, tokens) -> np.ndarray:
        """Target forward seconds over ``tokens`` tree tokens (int or int array, >= 1)."""
        x = np.asarray(tokens, dtype=np.float64)
        xp, fp = np.asarray(self.target_tokens, float), np.asarray(self.target_s, float)
        y = np.interp(x, xp, fp)
        if len(xp) >= 2:
            slope = max((fp[-1] - fp[-2]) / (xp[-1] - xp[-2]), 0.0)
            y = np.where(x > xp[-1], fp[-1] + slope * (x - xp[-1]), y)
        return y

    def draft_s(self, num_nodes: int, depth: int) -> float:
        """Drafting seconds of a tree of ``num_nodes`` draft nodes and max depth ``depth``."""
        return self.draft_level_s * depth + self.draft_node_s * num_nodes

    def cycle_s(self, num_nodes: int, depth: int) -> float:
        """Seconds of one cycle for a tree of ``num_nodes`` draft nodes and max depth ``depth``."""
        return float(self.target(num_nodes + 1)) + self.draft_s(num_nodes, depth) + self.fixed_s

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass
class FittedTree:
    """The chosen tree and why.

    Attributes:
        choices: rank paths (``tree_choices`` format), sorted by (depth, path).
        expected_tokens: E[tokens per cycle] under the acceptance table (the predicted tau).
        cycle_s: predicted seconds per cycle; ``tokens_per_s = expected_tokens / cycle_s``.
        speedup: ``tokens_per_s * decode_s`` (predicted, against plain decoding).
        num_nodes, depth: shape of the tree.
        best_by_size: for each node count n, ``[n, E, cycle_s, tokens_per_s]`` of the best tree with
            exactly n draft nodes (how flat the optimum is).
        best_tokens_per_s: predicted tokens/s of the exact optimum; ``tolerance``: the margin within
            which the largest tree was preferred (see :func:`fit_tree`).
    """

    choices: list
    expected_tokens: float
    cycle_s: float
    tokens_per_s: float
    speedup: float
    num_nodes: int
    depth: int
    best_by_size: list = field(default_factory=list)
    best_tokens_per_s: float = 0.0
    tolerance: float = 0.0

    def explain(self, cost: CycleCost) -> str:
        """A few lines: the choice, its predicted tau and cycle breakdown, and the runners-up by size."""
        t = float(cost.target(self.num_nodes + 1))
        lines = [
            f"auto tree: {self.num_nodes} draft nodes, depth {self.depth}",
            f"  predicted tau {self.expected_tokens:.3f} tokens/cycle; cycle {1e3 * self.cycle_s:.1f} ms = target "
            f"forward {1e3 * t:.1f} + drafting {1e3 * cost.draft_s(self.num_nodes, self.depth):.1f}"
            f" + fixed {1e3 * cost.fixed_s:.1f} ms",
            f"  the largest tree within {100 * self.tolerance:.0f}% of the best predicted tokens/s "
            f"({self.best_tokens_per_s:.2f}); load shifts costs by more than that" if self.tolerance > 0 else
            "  the exact optimum of predicted tokens/s",
            f"  {self.tokens_per_s:.2f} tokens/s vs plain decoding {1 / cost.decode_s:.2f} tokens/s "
            f"(decode step {1e3 * cost.decode_s:.1f} ms): predicted speedup {self.speedup:.2f}x",
            "  best tree per size (n: tau, ms/cycle, tokens/s): " + ", ".join(
                f"{int(n)}: {e:.2f}, {1e3 * c:.0f}, {r:.2f}" for n, e, c, r in self.best_by_size
                if int(n) in _shown_sizes(self.num_nodes, len(self.best_by_size))),
            f"  choices: {self.choices}",
        ]
        return "\n".join(lines)


def _shown_sizes(chosen: int, n_max: int) -> set:
    return {n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if n <= n_max} | {chosen}


def _check_acceptance(acceptance) -> np.ndarray:
    a = np.asarray(acceptance, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"acceptance must be a [depth, rank] table with at least one entry, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
        raise ValueError("acceptance entries must be probabilities in [0, 1]")
    return a


def tree_stats(choices) -> tuple[int, int]:
    """``(num_nodes, depth)`` of a choices list (root excluded from the count)."""
    paths = {tuple(p) for p in choices}
    return len(paths), max((len(p) for p in paths), default=0)


def expected_tokens(choices, acceptance) -> float:
    """E[tokens per cycle] of a tree under the positional acceptance table (formula in the module doc).

    Args:
        choices: rank paths; acceptance: float ``[D, R]``, ``acceptance[d-1, r]``.

    Raises:
        ValueError: a path deeper than D or a rank >= R.
    """
    a = _check_acceptance(acceptance)
    total = 1.0
    for p in choices:
        if len(p) > a.shape[0] or max(p) >= a.shape[1]:
            raise ValueError(f"path {list(p)} is outside the acceptance table of shape {a.shape}")
        total += float(np.prod([a[d, r] for d, r in enumerate(p)]))
    return total


def _dp(a: np.ndarray, n_max: int, d_max: int):
    """Best value ``E = 1 + sum of path products`` of trees with exactly n draft
    nodes (n = 0..n_max) and depth <= d_max. Returns (values [n_max + 1], argmax tables)."""
    R = a.shape[1]
    size = n_max + 2  # subtree sizes 0..n_max+1 (root included)
    # F[s] for the current depth: best value of a subtree with s nodes rooted at that depth
    F = np.full(size, _NEG)
    F[1] = 1.0  # leaves at depth d_max
    m = np.arange(size)
    s_idx = m[None, :]  # [1, S]
    diff = m[:, None] - s_idx  # m - s
    valid = (s_idx >= 1) & (diff >= 0)
    arg = {}
    for d in range(d_max - 1, -1, -1):
        G = np.full(size, _NEG)
        G[0] = 0.0
        choice = np.zeros((R, size), dtype=np.int64)
        for r in range(R - 1, -1, -1):
            acc = a[d, r]
            child = np.where(np.isfinite(F), acc * np.where(np.isfinite(F), F, 0.0), _NEG)  # [S]
            cand = np.where(valid, child[None, :] + G[np.clip(diff, 0, None)], _NEG)  # [m, s]
            best_s = np.argmax(cand, axis=1)
            newG = cand[m, best_s]
            newG[0] = 0.0
            choice[r] = best_s
            G = newG
        arg[d] = choice
        Fd = np.full(size, _NEG)
        Fd[1] = 1.0
        Fd[2:] = 1.0 + G[1:size - 1]
        F = Fd
    return F[1:], arg  # F[n + 1] = tree with n draft nodes


def _rebuild(arg: dict, d: int, n_sub: int, prefix: tuple, out: list) -> None:
    m, r = n_sub - 1, 0
    while m > 0:
        s = int(arg[d][r][m])
        path = prefix + (r,)
        out.append(path)
        _rebuild(arg, d + 1, s, path, out)
        m -= s
        r += 1


#: relative margin of predicted tokens/s within which :func:`fit_tree` prefers the larger tree
FIT_TOLERANCE = 0.05


def fit_tree(acceptance, cost: CycleCost, max_nodes: int = 64, max_depth: int | None = None,
             tolerance: float = FIT_TOLERANCE) -> FittedTree:
    """The static tree maximising expected tokens per second (dynamic programming, exact), made robust.

    For every maximal depth D' and node count n the cycle cost is fixed, so the best tree of that
    (n, D') maximises E alone; E decomposes over subtrees (a child's subtree value is scaled by its
    acceptance), which the DP over (depth, rank, node budget) solves exactly. Among all (n, D')
    whose predicted tokens/s is within ``tolerance`` (relative) of the best, the one with the most
    nodes is chosen (then the higher tokens/s): on the CPU the optimum is flat (a chain and a
    12-node tree within a few percent), and measured costs move with the machine's load, so the
    exact argmax would flip between a chain and a tree from one fit to the next; the larger tree
    gives more tokens per cycle and branches, at a predicted cost of at most ``tolerance``.

    Args:
        acceptance: float ``[D, R]``: ``acceptance[d-1, r]`` = P(the rank-r child at depth d is
            accepted | its parent was). Bounds the tree: depth <= D, at most R children per node.
        cost: :class:`CycleCost` (seconds).
        max_nodes: largest number of draft nodes (root excluded), >= 1.
        max_depth: optional further depth limit (<= D).
        tolerance: relative margin in ``[0, 1)``; 0 gives the exact argmax (ties to the shallower,
            then smaller tree).

    Returns:
        :class:`FittedTree` (``best_tokens_per_s`` holds the exact optimum's predicted tokens/s).

    Raises:
        ValueError: a malformed table, ``max_nodes < 1``, ``max_depth < 1`` or ``tolerance`` outside [0, 1).
    """
    if not 0.0 <= float(tolerance) < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    a = _check_acceptance(acceptance)
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise ValueError(f"max_nodes must be an integer >= 1, got {max_nodes!r}")
    D = a.shape[0] if max_depth is None else int(max_depth)
    if D < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    D = min(D, a.shape[0])
    sizes = np.arange(max_nodes + 1)
    by_size: dict = {}
    cands = []  # (ratio, n, d_max, arg) of the best tree of every (n, d_max)
    best = None
    for d_max in range(1, D + 1):
        vals, arg = _dp(a, max_nodes, d_max)
        cyc = np.array([cost.cycle_s(int(n), d_max) for n in sizes])
        for n in range(1, max_nodes + 1):
            if not np.isfinite(vals[n]):
                continue
            ratio = vals[n] / cyc[n]
            if n not in by_size or ratio > by_size[n][3] * (1 + 1e-12):
                by_size[n] = [n, float(vals[n]), float(cyc[n]), float(ratio)]
            cands.append((float(ratio), n, d_max, arg))
            if best is None or ratio > best[0] * (1 + 1e-12):
                best = cands[-1]
    floor = best[0] * (1.0 - float(tolerance))
    if tolerance > 0:
        best = max((c for c in cands if c[0] >= floor), key=lambda c: (c[1], c[0], -c[2]))
    best_ratio = max(c[0] for c in cands)
    ratio, n, d_max, arg = best
    paths: list = []
    _rebuild(arg, 0, n + 1, (), paths)
    choices = sorted(paths, key=lambda t: (len(t), t))
    nn, dd = tree_stats(choices)
    e, c = expected_tokens(choices, a), cost.cycle_s(nn, dd)
    return FittedTree(choices=[list(p) for p in choices], expected_tokens=e, cycle_s=c, tokens_per_s=e / c,
                      speedup=e / c * cost.decode_s, num_nodes=nn, depth=dd,
                      best_by_size=[by_size[k] for k in sorted(by_size)], best_tokens_per_s=best_ratio,
                      tolerance=float(tolerance))


# ---------------------------------------------------------------------- cache
def cache_path(key: dict, root: str | os.PathLike) -> Path:
    """JSON path of a cached fit: ``<root>/auto_tree/<sha256 of the key>[:16].json``.

    ``root``: the cache folder (the engine passes :func:`eagle.model.default.cache_dir`); ``key``:
    any JSON-serialisable dict (model, head, machine, sampling, ...).
    """
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(root) / "auto_tree" / f"{digest}.json"


def load_cached(key: dict, root) -> dict | None:
    """The cached record for ``key`` (None if absent, unreadable or for another key)."""
    p = cache_path(key, root)
    try:
        rec = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if rec.get("key") != json.loads(json.dumps(key, sort_keys=True, default=str)):
        return None
    return rec


def store_cached(key: dict, record: dict, root) -> Path:
    """Write ``{"key": key, **record}`` atomically; returns the path."""
    p = cache_path(key, root)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, **record}, indent=1, sort_keys=True, default=str))
    os.replace(tmp, p)
    return p
