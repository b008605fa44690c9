"""Losslessness of every verifier on every small tree shape, by exact enumeration (issue 52).

The shapes are generated, not picked: every ordered tree with up to 6 draft nodes below the root
(7 nodes), depth up to 4 and up to 3 children per node (150 shapes), plus every distinct two- and
three-level pattern of ``mc_sim_7b_63``, plus the shape on which UniVer once failed. For each, all
draft trees the method's drafting rule can produce are enumerated and the law of the emitted text
is compared with the target's (:func:`exact_law.text_law_error`), with the root token varying (it
collides with children tokens) and the law regimes rotating over peaked, flat, close and sparse
(a target with zeros). The shapes with the most draft trees are marked slow.

Invariances beside it: the exact law does not depend on the root's token or on the numbering of
the nodes. A verifier with the old bug put back (a racing scatter in the masked sums) must fail.
"""
from __future__ import annotations

import pytest
import torch

import eagle.rules as rules
from eagle.tree import MC_SIM_7B_63, build_tree
from eagle.verify import available_verifiers, get_verifier
from exact_law import REGIMES, TOL, Laws, enumerate_trees, ordered_shapes, subtree_patterns, text_law_error, tree_count

METHODS = {name: get_verifier(name) for name in available_verifiers(temperature=1.0)}

#: the shape of issue 52: UniVer's law was off by up to 8e-2 here before the fix
ISSUE52 = [[0], [0, 0], [0, 1], [0, 0, 0], [0, 0, 1], [0, 0, 2]]

#: vocabulary per drafting rule for the systematic shapes (3 children + a residual choice)
V_SHAPES = 4
#: trees per (method, shape) above which a case is marked slow (~1 ms a tree)
SLOW_TREES = 1500


def _shape_id(choices) -> str:
    return "".join("".join(map(str, c)) + "." for c in choices).rstrip(".")


def _systematic_cases():
    shapes = ordered_shapes(6, 4, 3)
    for name, ver in METHODS.items():
        for i, choices in enumerate(shapes):
            n = tree_count(choices, ver.drafting, V_SHAPES)
            marks = [pytest.mark.slow] if n > SLOW_TREES or len(choices) == 6 else []
            yield pytest.param(name, choices, i, id=f"{name}-n{len(choices)}-{_shape_id(choices)}", marks=marks)


@pytest.mark.parametrize("method,choices,index", list(_systematic_cases()))
def test_every_small_shape_is_lossless(method, choices, index):
    ver = METHODS[method]
    regime = REGIMES[index % len(REGIMES)]
    root = index % V_SHAPES
    err, tau = text_law_error(ver.outcome_probs, choices, ver.drafting, Laws(V_SHAPES, regime, seed=100 + index),
                              root_token=root)
    assert err < TOL, f"{method} not lossless on {choices} ({regime}, root token {root}): max error {err:.3g}"
    assert 1.0 - 1e-9 <= tau <= max(len(c) for c in choices) + 1 + 1e-9


def _pattern_cases():
    patterns = []
    for levels in (2, 3):
        for p in subtree_patterns(MC_SIM_7B_63, levels):
            if p not in patterns:
                patterns.append(p)
    V = 5  # mc_sim_7b_63's root has 4 children
    for name, ver in METHODS.items():
        for i, choices in enumerate(patterns):
            full = tree_count(choices, ver.drafting, V)
            minimal = full > 20_000  # wide wor patterns: draft support = the children (see Laws.draft)
            n = full if not minimal else _minimal_count(choices, ver.drafting)
            marks = [pytest.mark.slow] if n > SLOW_TREES else []
            yield pytest.param(name, choices, V, minimal, i,
                               id=f"{name}-{_shape_id(choices)}{'-minimal' if minimal else ''}", marks=marks)


def _minimal_count(choices, rule: str) -> int:
    """Trees ``rule`` can draw when each node's draft support is exactly its children."""
    import math
    tb = build_tree(choices)
    c = 1
    for kids in tb.children:
        if kids and rule == "wor":
            c *= math.factorial(len(kids))
    return c


@pytest.mark.parametrize("method,choices,V,minimal,index", list(_pattern_cases()))
def test_mc_sim_patterns_are_lossless(method, choices, V, minimal, index):
    ver = METHODS[method]
    for regime in ("peaked", "sparse"):
        laws = Laws(V, regime, seed=200 + index, minimal_draft=minimal)
        err, _ = text_law_error(ver.outcome_probs, choices, ver.drafting, laws, root_token=index % V)
        assert err < TOL, f"{method} not lossless on {choices} ({regime}): max error {err:.3g}"


@pytest.mark.parametrize("root", range(5))
@pytest.mark.parametrize("method", list(METHODS))
def test_issue52_shape_every_root_token(method, root):
    ver = METHODS[method]
    V = 5 if ver.drafting == "topk_residual" else 4  # wor: 1,152 trees at V = 4 against 6,000 at V = 5
    if root >= V:
        pytest.skip("root token outside the vocabulary")
    for regime in ("peaked", "flat", "sparse"):
        err, _ = text_law_error(ver.outcome_probs, ISSUE52, ver.drafting, Laws(V, regime, seed=7), root_token=root)
        assert err < TOL, f"{method} not lossless on issue 52's shape ({regime}, root {root}): {err:.3g}"


# ---- invariances -------------------------------------------------------------------------------

def _random_tree(choices, rule, V, seed, scale):
    """One drafted tree with random laws (V tokens): (parents, tokens, target, draft)."""
    g = torch.Generator().manual_seed(seed)
    tb = build_tree(choices)
    n = tb.num_nodes
    target = torch.softmax(scale * torch.randn(n, V, generator=g, dtype=torch.float64), -1)
    draft = torch.softmax(scale * torch.randn(n, V, generator=g, dtype=torch.float64), -1)
    tokens = torch.zeros(n, dtype=torch.long)
    for v in range(n):
        kids = tb.children[v]
        if kids:
            kid_tokens = rules.draw_children(draft[v:v + 1], len(kids), rule,
                                             torch.Generator().manual_seed(seed * 1000 + v))[0]
            tokens[list(kids)] = kid_tokens
    return tb.parents, tokens, target, draft


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("tree", ["issue52", "mc_sim_7b_63"])
def test_outcome_law_does_not_depend_on_root_token(method, tree):
    """The root's token is a label: the laws after it are given. Changing it (to every children
    token of the tree, where padding would collide) must leave the exact law unchanged."""
    ver = METHODS[method]
    choices = ISSUE52 if tree == "issue52" else MC_SIM_7B_63
    for seed in range(6):
        scale = (1.0, 3.0, 6.0)[seed % 3]  # 6: a confident draft (the masked-sum path)
        parents, tokens, target, draft = _random_tree(choices, ver.drafting, 12, seed, scale)
        ref = ver.outcome_probs(parents, tokens, target, draft)
        for root in sorted(set(tokens[1:].tolist())):
            t2 = tokens.clone()
            t2[0] = root
            torch.testing.assert_close(ver.outcome_probs(parents, t2, target, draft), ref, rtol=0, atol=1e-12)


# ---- negative control: the bug put back must be caught ---------------------------------------

def _racing_masked_sums(sub, tokens, remove):
    """The pre-fix masked sums, made deterministic: kept slots write their own (old) value after the
    removed slots are zeroed, so a kept padding slot naming a removed token brings it back."""
    old = sub.gather(1, tokens)
    sub.scatter_(1, tokens, torch.where(remove, 0.0, old))
    kept = ~remove
    rows = torch.arange(sub.shape[0], device=sub.device)[:, None].expand_as(tokens)
    sub[rows[kept], tokens[kept]] = old[kept]
    return sub.sum(1).to(torch.float64)


def test_racing_masked_sums_fail_the_enumeration(monkeypatch):
    monkeypatch.setattr(rules, "_masked_sums", _racing_masked_sums)
    ver = METHODS["univer"]
    errs = [text_law_error(ver.outcome_probs, ISSUE52, ver.drafting, Laws(5, "peaked", seed=7), root_token=r)[0]
            for r in range(5)]
    assert max(errs) > 1e-3, f"the enumeration did not catch the racing masked sums: {errs}"
