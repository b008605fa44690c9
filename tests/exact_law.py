"""Exact losslessness checks by enumeration, shared by the verifier tests (not a test module).

For a tree shape, a drafting rule and laws that depend on the context (the token path), every tree
the rule can produce is enumerated (:func:`~eagle.rules.children_law` at each node) with its
probability, combined with a method's exact ``outcome_probs``, continued with the target law token
by token, and the law of the first depth+1 tokens is compared with the target's law of those tokens.

:func:`ordered_shapes` generates every tree shape systematically; :func:`subtree_patterns` cuts
the distinct few-level patterns out of a larger tree (e.g. ``mc_sim_7b_63``).
"""
from __future__ import annotations

import itertools
import math
import zlib
from functools import lru_cache

import torch

from eagle.rules import children_law
from eagle.tree import build_tree

F64 = torch.float64
TOL = 1e-9
REGIMES = ("peaked", "flat", "close", "sparse")


class Laws:
    """Target and draft laws as functions of the token path (a tuple starting at the root token).

    regime: ``peaked`` (independent, scale 2.5), ``flat`` (independent, scale 0.4), ``close``
    (draft = target logits + small noise: many acceptances with probability 1), ``sparse``
    (target with its 1-2 least likely tokens set to 0, as after top-p).
    """

    def __init__(self, V: int, regime: str, seed: int, minimal_draft: bool = False):
        self.V, self.regime, self.seed, self.minimal_draft = V, regime, seed, minimal_draft
        self._cache: dict = {}

    def draft(self, path: tuple, m: int) -> torch.Tensor:
        """The draft law at a node with ``m`` children. With ``minimal_draft`` an inner node's law
        keeps only its ``m`` most probable tokens (renormalised; zeros elsewhere): the smallest
        support that still gives ``m`` children, so ``wor`` trees stay few enough to enumerate on
        wide shapes. (A draft law may depend on the node's place in the tree; the target's may not.)"""
        q = self(path, "draft")
        if not self.minimal_draft or m == 0:
            return q
        keep = torch.zeros_like(q)
        top = torch.topk(q, m).indices
        keep[top] = q[top]
        return keep / keep.sum()

    def _logits(self, path: tuple, kind: str) -> torch.Tensor:
        h = zlib.crc32(repr((self.seed, self.regime, kind, path)).encode())
        g = torch.Generator().manual_seed(h)
        return torch.randn(self.V, generator=g, dtype=F64)

    def __call__(self, path: tuple, kind: str) -> torch.Tensor:
        key = (path, kind)
        if key in self._cache:
            return self._cache[key]
        base = self._logits(path, "target")
        if self.regime == "peaked":
            lg = 2.5 * (base if kind == "target" else self._logits(path, "draft"))
        elif self.regime == "flat":
            lg = 0.4 * (base if kind == "target" else self._logits(path, "draft"))
        elif self.regime == "close":
            lg = 1.5 * base + (0.0 if kind == "target" else 0.5 * self._logits(path, "draft"))
        else:  # sparse
            lg = 1.5 * (base if kind == "target" else self._logits(path, "draft"))
        p = torch.softmax(lg, 0)
        if self.regime == "sparse" and kind == "target":
            k = 1 + (zlib.crc32(repr(path).encode()) % 2)
            p[torch.argsort(p)[:k]] = 0.0
            p = p / p.sum()
        self._cache[key] = p
        return p


def enumerate_trees(choices, rule: str, laws: Laws, root_token: int = 0):
    """Yield ``(parents, tokens, target [N,V], draft [N,V], prob, paths)`` for every tree the rule can
    draw on the shape ``choices``. Laws must have full draft support (no pruning).

    The laws are keyed on token paths that start with 0 whatever ``root_token`` is: the root's own
    token is only a label (the laws after it are given), so a verifier's law must not depend on it.
    ``root_token`` sets ``tokens[0]`` (it collides with children tokens, as padding of node 0 does).
    """
    tb = build_tree(choices)
    n = tb.num_nodes
    children = tb.children
    inner = [v for v in range(n) if children[v]]

    def rec(k: int, tokens: list, paths: list, prob: float):
        if k == len(inner):
            yield list(tokens), list(paths), prob
            return
        v = inner[k]
        m = len(children[v])
        for tup, p in children_law(laws.draft(paths[v], m), m, rule):
            assert len(tup) == m, "laws must have full draft support"
            for c, t in zip(children[v], tup):
                tokens[c] = t
                paths[c] = paths[v] + (t,)
            yield from rec(k + 1, tokens, paths, prob * p)

    tokens0 = [0] * n
    tokens0[0] = root_token
    paths0 = [()] * n
    paths0[0] = (0,)
    for tokens, paths, prob in rec(0, tokens0, paths0, 1.0):
        target = torch.stack([laws(paths[i], "target") for i in range(n)])
        draft = torch.stack([laws.draft(paths[i], len(children[i])) for i in range(n)])
        yield tb.parents, torch.tensor(tokens), target, draft, prob, paths


def text_law_error(outcome_fn, choices, rule: str, laws: Laws, root_token: int = 0) -> tuple[float, float]:
    """Max |generated law - target law| over sequences of depth+1 tokens, and the expected tau.

    Enumerates every draft tree (:func:`enumerate_trees`), weights ``outcome_fn``'s exact law of
    each by the tree's draft probability, continues every outcome with the target's law and compares
    the law of the first depth+1 emitted tokens with the target's (:func:`law_error`).
    """
    depth = max(len(c) for c in choices)
    L: dict[tuple, float] = {}
    tau = 0.0
    check = True
    for parents, tokens, target, draft, prob, paths in enumerate_trees(choices, rule, laws, root_token):
        out = outcome_fn(parents, tokens, target, draft, validate=check)
        check = False  # validate the first tree only (validation has its own tests); speed
        assert torch.isfinite(out).all() and (out >= 0).all()
        assert abs(float(out.sum()) - 1.0) < 1e-9
        rows = out.tolist()
        for i, row in enumerate(rows):
            mass_i = 0.0
            for y, w in enumerate(row):
                if w > 0:
                    key = paths[i][1:] + (y,)
                    L[key] = L.get(key, 0.0) + prob * w
                    mass_i += w
            tau += prob * mass_i * len(paths[i])
    return law_error(L, lambda path: laws(path, "target"), laws.V, depth), tau


def law_error(L: dict, target_law, V: int, depth: int) -> float:
    """Max over token sequences of length depth+1 of |generated law - target law|.

    ``L[prefix]``: probability that the verifier emits exactly ``prefix`` (then the target continues);
    ``target_law(path)``: the target's law ``[V]`` after the token path (root token 0 first).
    """
    err = 0.0
    for seq in itertools.product(range(V), repeat=depth + 1):
        target_p, gen = 1.0, 0.0
        for k in range(depth + 1):
            prefix = seq[: k + 1]
            # generated: prefix emitted by the verifier, continued by the target from there
            if prefix in L:
                cont = 1.0
                for j in range(k + 1, depth + 1):
                    cont *= float(target_law((0,) + seq[:j])[seq[j]])
                gen += L[prefix] * cont
            target_p *= float(target_law((0,) + seq[:k])[seq[k]])
        err = max(err, abs(gen - target_p))
    return err


# ---- systematic tree shapes -------------------------------------------------------------------

@lru_cache(maxsize=None)
def _forests(n: int, depth: int) -> tuple:
    """Every ordered forest of ``n`` nodes and at most ``depth`` levels, as nested tuples
    (a tree = the tuple of its children's subtrees)."""
    if n == 0:
        return ((),)
    if depth == 0:
        return ()
    out = []
    for k in range(1, n + 1):  # the first tree has k nodes
        for first in _forests(k - 1, depth - 1):
            for rest in _forests(n - k, depth):
                out.append((first,) + rest)
    return tuple(out)


def _max_width(forest: tuple) -> int:
    return max([len(forest)] + [_max_width(t) for t in forest])


def _to_choices(forest: tuple, prefix: tuple = ()) -> list[list[int]]:
    out = []
    for i, t in enumerate(forest):
        out.append(list(prefix + (i,)))
        out += _to_choices(t, prefix + (i,))
    return out


def _to_forest(choices) -> tuple:
    kids: dict[tuple, list] = {}
    for p in sorted(map(tuple, choices), key=lambda p: (len(p), p)):
        kids.setdefault(p[:-1], []).append(p)

    def sub(p):
        return tuple(sub(c) for c in kids.get(p, []))
    return sub(())


def ordered_shapes(max_nodes: int, max_depth: int, max_children: int) -> list[list[list[int]]]:
    """Every tree shape (as choices) with 1..``max_nodes`` draft nodes below the root, depth at most
    ``max_depth`` and at most ``max_children`` children per node: the ordered rooted trees (sibling
    order matters: ranks differ). Sorted by node count."""
    return [_to_choices(f) for n in range(1, max_nodes + 1) for f in _forests(n, max_depth)
            if _max_width(f) <= max_children]


def subtree_patterns(choices, levels: int) -> list[list[list[int]]]:
    """The distinct patterns of ``levels`` levels (a node, its children, ... down to ``levels - 1``
    generations) below every inner node of the tree ``choices``, as choices rooted at that node."""
    forest = _to_forest(choices)
    seen, out = set(), []

    def cut(f, d):
        return tuple(cut(t, d - 1) for t in f) if d > 0 else ()

    def walk(f):
        if f:
            p = cut(f, levels - 1)
            if p not in seen:
                seen.add(p)
                out.append(_to_choices(p))
        for t in f:
            walk(t)
    walk(forest)
    return out


def tree_count(choices, rule: str, V: int) -> int:
    """How many distinct trees ``rule`` can draw on ``choices`` with a full-support law over V tokens."""
    forest = _to_forest(choices)

    def count(f):
        m = len(f)
        c = 1 if m == 0 else ((V - m + 1) if rule == "topk_residual" else math.perm(V, m) if rule == "wor" else 1)
        for t in f:
            c *= count(t)
        return c
    return count(forest)
