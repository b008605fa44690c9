"""The fitted tree (eagle.tree.auto): exact optimum of E[tokens] / cycle seconds.

Checked against brute force over every tree within small bounds, against closed forms (a chain
when only rank 0 is ever accepted; the full tree when drafting is free), and for bad input.
"""
import itertools
import math

import numpy as np
import pytest

from eagle.tree import build_tree
from eagle.tree.auto import CycleCost, expected_tokens, fit_tree, load_cached, store_cached, tree_stats


def all_trees(max_nodes, max_depth, max_rank):
    """Every valid choices set (ranks contiguous, parents present) with 1..max_nodes nodes."""
    out = []

    def grow(paths, frontier_min):
        if paths:
            out.append(list(paths))
        if len(paths) == max_nodes:
            return
        # canonical growth: add candidate paths in (depth, path) order beyond the last added one
        cands = []
        existing = set(paths)
        for p in [()] + paths:
            if len(p) >= max_depth:
                continue
            k = sum(1 for q in paths if len(q) == len(p) + 1 and q[:-1] == p)
            if k < max_rank:
                cands.append(p + (k,))
        for c in cands:
            key = (len(c), c)
            if key > frontier_min and c not in existing:
                grow(paths + [c], key)

    grow([], (0, ()))
    return out


def brute_best(acc, cost, max_nodes):
    D, R = acc.shape
    best = None
    for t in all_trees(max_nodes, D, R):
        r = expected_tokens(t, acc) / cost.cycle_s(*tree_stats(t))
        if best is None or r > best[0]:
            best = (r, t)
    return best


def test_enumeration_is_complete():
    # number of ordered trees with n nodes below a root, ranks unbounded: Catalan(n)
    trees = all_trees(4, 4, 4)
    counts = [sum(1 for t in trees if len(t) == n) for n in range(1, 5)]
    assert counts == [1, 2, 5, 14]
    for t in trees:
        build_tree(t)  # every enumerated tree is valid


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    D, R, N = int(rng.integers(2, 5)), int(rng.integers(1, 4)), 6
    acc = np.sort(rng.uniform(0.05, 0.95, size=(D, R)), axis=1)[:, ::-1]
    pts = np.cumsum(rng.uniform(0.2, 1.0, size=N + 1)) + rng.uniform(0, 3)
    cost = CycleCost(target_tokens=tuple(range(1, N + 2)), target_s=tuple(pts),
                     draft_level_s=float(rng.uniform(0, 1.5)), draft_node_s=float(rng.uniform(0, 0.5)),
                     fixed_s=float(rng.uniform(0, 1)))
    fit = fit_tree(acc, cost, max_nodes=N, tolerance=0)
    ratio, tree = brute_best(acc, cost, N)
    assert fit.tokens_per_s == pytest.approx(ratio, rel=1e-9)
    assert fit.expected_tokens / fit.cycle_s == pytest.approx(ratio, rel=1e-9)
    assert fit.expected_tokens == pytest.approx(expected_tokens(fit.choices, acc))
    build_tree(fit.choices)


def test_unsorted_acceptance_matches_brute_force():
    # a rank-1 child better than rank 0 (not monotone): the fit still respects contiguous ranks
    acc = np.array([[0.2, 0.9], [0.3, 0.8], [0.5, 0.5]])
    cost = CycleCost((1, 2, 3, 4, 5, 6, 7), (1.0, 1.1, 1.25, 1.4, 1.6, 1.8, 2.0), 0.1, 0.05, 0.2)
    fit = fit_tree(acc, cost, max_nodes=6, tolerance=0)
    ratio, _ = brute_best(acc, cost, 6)
    assert fit.tokens_per_s == pytest.approx(ratio, rel=1e-9)


def test_chain_closed_form():
    # only rank 0 is ever accepted, with probability 0.8 at every depth; a cycle with L nodes
    # costs 1 + 0.25 L (+ nothing else): best L maximises (sum_{i<=L} 0.8^i) / (1 + 0.25 L)
    D = 10
    acc = np.zeros((D, 3))
    acc[:, 0] = 0.8
    cost = CycleCost(tuple(range(1, 12)), tuple(1.0 + 0.25 * i for i in range(11)))
    fit = fit_tree(acc, cost, max_nodes=10, tolerance=0)
    ratios = [sum(0.8 ** i for i in range(L + 1)) / (1 + 0.25 * L) for L in range(1, D + 1)]
    L = int(np.argmax(ratios)) + 1
    assert fit.choices == [[0] * k for k in range(1, L + 1)]
    assert fit.tokens_per_s == pytest.approx(max(ratios))


def test_free_drafting_takes_everything():
    # a constant cycle cost: the largest tree within the bounds (value grows with every node)
    acc = np.full((2, 2), 0.5)
    cost = CycleCost((1, 100), (1.0, 1.0))
    fit = fit_tree(acc, cost, max_nodes=6)
    assert sorted(map(tuple, fit.choices)) == sorted(map(tuple, build_tree("2x2").choices))
    assert fit.expected_tokens == pytest.approx(1 + 2 * 0.5 + 4 * 0.25)


def test_expensive_nodes_give_one_node():
    acc = np.full((3, 3), 0.3)
    cost = CycleCost((1, 2, 3), (1.0, 1.01, 5.0))  # a second draft node costs 4 decode steps
    fit = fit_tree(acc, cost, max_nodes=8)
    assert fit.choices == [[0]]
    assert fit.speedup == pytest.approx(1.3 / 1.01)
    text = fit.explain(cost)
    assert "1 draft nodes" in text and "predicted speedup" in text


def test_draft_cost_terms_change_the_choice():
    # per-level cost favours wide trees, per-node cost favours narrow deep ones
    acc = np.array([[0.7, 0.4, 0.3], [0.7, 0.4, 0.3], [0.7, 0.4, 0.3]])
    flat = CycleCost((1, 20), (1.0, 1.0 + 19 * 0.02), draft_level_s=2.0)
    deep = CycleCost((1, 20), (1.0, 1.0 + 19 * 0.02), draft_node_s=2.0)
    f1, f2 = fit_tree(acc, flat, max_nodes=8, tolerance=0), fit_tree(acc, deep, max_nodes=8, tolerance=0)
    assert f1.depth < f2.depth or f1.num_nodes > f2.num_nodes
    for f, c in ((f1, flat), (f2, deep)):
        ratio, _ = brute_best(acc, c, 5) if f.num_nodes <= 5 else (None, None)
        if ratio is not None:
            assert f.tokens_per_s >= ratio - 1e-12


@pytest.mark.parametrize("seed", range(8))
def test_tolerance_prefers_the_largest_tree_near_the_optimum(seed):
    """Within ``tolerance`` of the best predicted tokens/s the fit takes the most nodes, never a tree
    below the margin; tolerance 0 is the exact optimum."""
    rng = np.random.default_rng(100 + seed)
    acc = np.sort(rng.uniform(0.2, 0.9, size=(4, 3)), axis=1)[:, ::-1]
    cost = CycleCost(tuple(range(1, 14)), tuple(1.0 + 0.05 * i + 0.002 * i * i for i in range(13)),
                     draft_level_s=0.05, draft_node_s=0.01)
    exact = fit_tree(acc, cost, max_nodes=12, tolerance=0)
    robust = fit_tree(acc, cost, max_nodes=12, tolerance=0.05)
    assert robust.best_tokens_per_s == pytest.approx(exact.tokens_per_s)
    assert robust.tokens_per_s >= 0.95 * exact.tokens_per_s - 1e-12
    assert robust.num_nodes >= exact.num_nodes
    # no tree with more nodes is within the margin
    for n, _, _, r in robust.best_by_size:
        if n > robust.num_nodes:
            assert r < 0.95 * exact.tokens_per_s + 1e-12
    assert "within 5%" in robust.explain(cost)


def test_flat_optimum_picks_a_branching_tree():
    """The CPU default's situation (issue 48): predicted tokens/s flat within 4% from 1 to 12 nodes;
    the exact argmax is a chain of 2, the robust fit a larger tree."""
    acc = np.array([[0.55, 0.2, 0.1], [0.5, 0.15, 0.1], [0.5, 0.1, 0.05], [0.45, 0.1, 0.05]])
    cost = CycleCost(tuple(range(1, 14)), tuple(1.0 + 0.06 * i for i in range(13)), draft_level_s=0.1)
    exact = fit_tree(acc, cost, max_nodes=12, tolerance=0)
    robust = fit_tree(acc, cost, max_nodes=12)
    assert robust.num_nodes > exact.num_nodes
    assert robust.tokens_per_s >= 0.95 * robust.best_tokens_per_s
    with pytest.raises(ValueError, match="tolerance"):
        fit_tree(acc, cost, tolerance=1.0)


def test_interpolation_and_extrapolation():
    c = CycleCost((1, 3, 5), (1.0, 2.0, 2.5))
    assert float(c.target(2)) == pytest.approx(1.5)
    assert float(c.target(7)) == pytest.approx(3.0)
    assert c.decode_s == 1.0


@pytest.mark.parametrize("bad", [
    dict(target_tokens=(2, 3), target_s=(1.0, 2.0)),
    dict(target_tokens=(1, 1), target_s=(1.0, 2.0)),
    dict(target_tokens=(1, 2), target_s=(1.0,)),
    dict(target_tokens=(1, 2), target_s=(1.0, -2.0)),
    dict(target_tokens=(1,), target_s=(1.0,), fixed_s=math.nan),
    dict(target_tokens=(1,), target_s=(1.0,), draft_level_s=-1.0),
])
def test_bad_cost(bad):
    with pytest.raises(ValueError):
        CycleCost(**bad)


def test_bad_acceptance_and_bounds():
    cost = CycleCost((1, 2), (1.0, 1.5))
    with pytest.raises(ValueError, match="acceptance"):
        fit_tree(np.array([0.5, 0.4]), cost)
    with pytest.raises(ValueError, match="probabilities"):
        fit_tree(np.array([[1.5]]), cost)
    with pytest.raises(ValueError, match="max_nodes"):
        fit_tree(np.array([[0.5]]), cost, max_nodes=0)
    with pytest.raises(ValueError, match="outside"):
        expected_tokens([[0, 1]], np.array([[0.5, 0.5]]))


def test_cache_roundtrip(tmp_path):
    key = {"model": "m", "head": "h", "machine": {"cpus": 2}, "temperature": 1.0}
    assert load_cached(key, tmp_path) is None
    p = store_cached(key, {"choices": [[0], [1]]}, tmp_path)
    assert p.parent.name == "auto_tree"
    assert load_cached(key, tmp_path)["choices"] == [[0], [1]]
    assert load_cached({**key, "temperature": 0.0}, tmp_path) is None
