"""Measuring the auto tree's inputs on a model (eagle.autotree), on tiny random models."""
import numpy as np
import pytest
import torch

import eagle.autotree as autotree
from eagle.autotree import (_accept_probs, acceptance_from_laws, default_contexts, measure_acceptance, probe_tree,
                            resolve_auto_tree)
from eagle.sampling import SamplingConfig
from eagle.testing import tiny_ea_model
from eagle.tree import build_tree

SMALL_COSTS = dict(tokens=(1, 2, 4, 8), trees=("chain1", "chain3", "2x2"), new_tokens=6, rounds=1)


def test_probe_tree():
    for d, r in ((1, 1), (3, 2), (6, 4)):
        t = probe_tree(d, r)
        assert len(t) == d * r + (r - 1) * d * (d - 1) // 2
        assert all(sum(1 for x in p if x) <= 1 for p in t)
        build_tree(t)
    with pytest.raises(ValueError, match="depth"):
        probe_tree(0, 2)


def test_acceptance_from_laws_counts():
    # root; children 1 (rank 0), 2 (rank 1); 3 = child of 1 (depth 2, rank 0)
    parents = torch.tensor([-1, 0, 0, 1])
    acc = torch.tensor([1.0, 0.6, 0.3, 0.45])
    num, den = acceptance_from_laws(parents, acc, 2, 2)
    np.testing.assert_allclose(num, [[0.6, 0.3], [0.45, 0.0]])
    np.testing.assert_allclose(den, [[1.0, 1.0], [0.6, 0.0]])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_accept_probs_match_the_outcome_law(temperature):
    # E[tokens] = 1 + sum of P(node accepted) must equal sum_u P(end at u) (depth(u) + 1)
    from eagle.verify.registry import get_verifier

    m = tiny_ea_model(vocab_size=16, seed=2, aligned=True)
    ctx = torch.tensor([1, 5, 2, 7, 3])
    g = torch.Generator().manual_seed(0)
    v = get_verifier("rrsw")
    cfg = SamplingConfig(temperature)
    laws = m.tree_laws(ctx, tree_choices=probe_tree(3, 3), drafting="topk" if cfg.greedy else v.drafting,
                       temperature=temperature, generator=g)
    acc = _accept_probs(laws, cfg, v)
    assert float(acc[0]) == pytest.approx(1.0, abs=1e-6)
    assert bool(((acc >= -1e-9) & (acc <= 1 + 1e-9)).all())
    par = laws.parents.tolist()
    for u in range(1, len(par)):
        assert float(acc[u]) <= float(acc[par[u]]) + 1e-9
    if cfg.greedy:
        best = laws.target_probs.argmax(-1)
        on_path = [u for u in range(1, len(par)) if acc[u] == 1]
        for u in on_path:
            assert int(laws.tokens[u]) == int(best[par[u]])
    else:
        end = v.outcome_probs(laws.parents, laws.tokens, laws.target_probs, laws.draft_probs).sum(-1).double()
        tau = float((end * (laws.depth.double() + 1)).sum())
        assert float(acc.sum()) == pytest.approx(tau, rel=1e-6)


def test_measure_acceptance_table_shape():
    m = tiny_ea_model(vocab_size=16, seed=1, aligned=True)
    ctx = default_contexts(m, n_prompts=2, new_tokens=6, per_prompt=2)
    assert len(ctx) == 4 and all(c.dim() == 1 and c.numel() >= 2 for c in ctx)
    table, weight = measure_acceptance(m, ctx, temperature=1.0, probe=probe_tree(2, 2))
    assert table.shape == (2, 2) and weight.shape == (2, 2)
    assert np.all((table >= 0) & (table <= 1))
    assert weight[0, 0] == pytest.approx(len(ctx))  # every root is accepted
    with pytest.raises(ValueError, match="context"):
        measure_acceptance(m, [], temperature=1.0)


def test_resolve_auto_tree_measures_once_then_caches(tmp_path, monkeypatch, capsys):
    m = tiny_ea_model(vocab_size=16, seed=3, aligned=True)
    ctx = default_contexts(m, n_prompts=1, new_tokens=6, per_prompt=2)
    choices = resolve_auto_tree(m, 1.0, cache_root=tmp_path, contexts=ctx, max_nodes=6,
                                measure_kwargs=SMALL_COSTS)
    build_tree(choices)
    assert 1 <= len(choices) <= 6
    err = capsys.readouterr().err
    assert "auto tree" in err and "predicted speedup" in err
    files = list((tmp_path / "auto_tree").glob("*.json"))
    assert len(files) == 1

    def boom(*a, **k):
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(autotree, "measure_acceptance", boom)
    monkeypatch.setattr(autotree, "measure_costs", boom)
    assert resolve_auto_tree(m, 1.0, cache_root=tmp_path, max_nodes=6) == choices
    # another sampling setting or another head is another key
    with pytest.raises(AssertionError, match="measured again"):
        resolve_auto_tree(m, 0.0, cache_root=tmp_path, contexts=ctx, max_nodes=6)
    with torch.no_grad():
        m.ea_layer.fc.bias.add_(1e-3)
    with pytest.raises(AssertionError, match="measured again"):
        resolve_auto_tree(m, 1.0, cache_root=tmp_path, contexts=ctx, max_nodes=6)


def test_eagenerate_auto_tree_is_fitted_once_and_stays_lossless(tmp_path, monkeypatch):
    monkeypatch.setenv("UNIVER_EAGLE_CACHE", str(tmp_path))
    m = tiny_ea_model(vocab_size=16, seed=4, aligned=True)
    prompt = torch.tensor([[1, 5, 2, 7]])
    ref = m.naivegenerate(prompt, temperature=0.0, max_new_tokens=12)
    out = m.eagenerate(prompt, temperature=0.0, max_new_tokens=12, tree_choices="auto")
    assert torch.equal(out, ref)
    assert len(list((tmp_path / "auto_tree").glob("*.json"))) == 1
    choices = m.resolve_tree("auto", 0.0)
    build_tree(choices)
    monkeypatch.setattr(autotree, "resolve_auto_tree", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    assert torch.equal(m.eagenerate(prompt, temperature=0.0, max_new_tokens=12, tree_choices="AUTO"), ref)
    assert m.resolve_tree("2x2") == "2x2"


def test_smooth_acceptance():
    from eagle.autotree import smooth_acceptance

    table = np.array([[0.5, 0.2], [1.0, 0.0]])
    weight = np.array([[100.0, 100.0], [1.0, 0.0]])
    s = smooth_acceptance(table, weight, strength=4.0)
    pooled0 = (50 + 1) / 101
    assert s[0, 0] == pytest.approx((50 + 4 * pooled0) / 104)
    assert s[1, 0] == pytest.approx((1 + 4 * pooled0) / 5)  # one lucky observation no longer reads 1.0
    assert s[1, 1] == pytest.approx(0.2)  # never observed: the pooled rate of its rank
    np.testing.assert_allclose(smooth_acceptance(table, weight, 0.0), table)


def test_isotonic_fit_of_forward_times():
    from eagle.autotree import isotonic

    np.testing.assert_allclose(isotonic([93, 111, 100, 98, 105, 112, 123]), [93, 103, 103, 103, 105, 112, 123])
    np.testing.assert_allclose(isotonic([1.0, 2.0, 3.0]), [1, 2, 3])
    np.testing.assert_allclose(isotonic([3.0, 2.0, 1.0]), [2, 2, 2])
    rng = np.random.default_rng(0)
    for _ in range(50):  # non-decreasing, same mean, and no worse than the running maximum in least squares
        y = rng.normal(size=9).cumsum() + rng.normal(size=9)
        f = isotonic(y)
        assert np.all(np.diff(f) >= -1e-12) and np.isclose(f.sum(), y.sum())
        assert ((f - y) ** 2).sum() <= ((np.maximum.accumulate(y) - y) ** 2).sum() + 1e-9
    assert isotonic([]).shape == (0,)
