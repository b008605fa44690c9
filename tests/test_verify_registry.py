"""The registry: verifiers as data, one generic door, plugins, the temperature-0 verifier.

- the uniforms are drawn with the caller's generator on the laws' device (a spy on ``torch.rand``,
  laws on ``meta``, and a default device that is not the laws');
- ``available_verifiers(temperature=)`` / ``select_verifier`` keep ``argmax`` out of temperature > 0;
- plugins: an installed distribution's entry point is loaded, ``load_plugin`` names a bad module;
- a verifier registered by a test (a renamed copy of rrsw) runs through ``eagenerate``.
"""
from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from eagle.verify import (ENTRY_POINT_GROUP, Verifier, available_verifiers, get_verifier, load_plugin,
                          register_verifier, registry, select_verifier, unregister_verifier)
from eagle.verify.rrsw import rrsw_kernel, rrsw_law
from evaluation.bench_verify import make_instance

HOT = available_verifiers(temperature=1.0)  # every method lossless at temperature > 0


def _instance(method, device="cpu"):
    ver = get_verifier(method)
    rule = "topk" if ver.drafting == "topk" else ver.drafting
    return make_instance("2x5", 30, rule, device, seed=2)


@pytest.mark.parametrize("method", available_verifiers())
def test_uniforms_drawn_on_the_laws_device_with_the_callers_generator(method, monkeypatch):
    ver = get_verifier(method)
    parents, tokens, target, draft = _instance(method)
    calls = []
    real_rand = torch.rand

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_rand(*args, **kwargs)

    monkeypatch.setattr(torch, "rand", spy)
    g = torch.Generator().manual_seed(7)
    ver.verify(parents, tokens, target, draft, g)
    assert len(calls) == 1
    assert calls[0]["generator"] is g and torch.device(calls[0]["device"]) == target.device
    # laws on another device: the uniforms follow the laws (meta has no values, so the kernel fails after)
    calls.clear()
    with pytest.raises(Exception):
        ver.verify(parents, tokens, target.to("meta"), draft.to("meta"), None, validate=False)
    assert calls and torch.device(calls[0]["device"]).type == "meta"
    # a generator elsewhere than the laws is refused at the door, naming it (a CUDA generator with host laws)
    calls.clear()
    elsewhere = type("FakeCudaGenerator", (), {"device": torch.device("cuda", 0)})()
    with pytest.raises(ValueError, match="generator is on cuda"):
        ver.verify(parents, tokens, target, draft, elsewhere)
    assert not calls


@pytest.mark.parametrize("method", available_verifiers())
def test_default_device_elsewhere_and_generator_reproducible(method):
    """With torch's default device on meta (as a CUDA default would be) host laws still verify, and the
    caller's generator alone decides the outcome (same seed, same outcome; the generator advances)."""
    parents, tokens, target, draft = _instance(method)
    ver = get_verifier(method)
    outs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(3)
        before = g.get_state().clone()
        with torch.device("meta"):
            outs.append([ver.verify(parents, tokens, target, draft, g) for _ in range(5)])
        assert not torch.equal(before, g.get_state())
    assert outs[0] == outs[1]


def test_validate_false_still_upcasts_half_precision():
    parents, tokens, target, draft = make_instance("2x5", 30, "wor", "cpu", seed=4)
    t16, d16 = target.half(), draft.half()
    rrsw = get_verifier("rrsw")
    a = rrsw.outcome_probs(parents, tokens, t16, d16, validate=False)
    b = rrsw.outcome_probs(parents, tokens, t16, d16)
    assert a.dtype == torch.float32 and torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    assert [rrsw.verify(parents, tokens, t16, d16, g1, validate=False) for _ in range(10)] == \
        [rrsw.verify(parents, tokens, t16, d16, g2) for _ in range(10)]


def test_temperature_filter_and_selection():
    assert "argmax" in available_verifiers() and "argmax" in available_verifiers(temperature=0)
    assert "argmax" not in HOT and {"rrsw", "traversal", "greedy", "univer"} <= set(HOT)
    assert get_verifier("argmax").temperature_zero_only
    for name in HOT:
        assert select_verifier(name, 0.0).name == "argmax"
        assert select_verifier(name, 0.7).name == name
    with pytest.raises(ValueError, match="temperature 0 only"):
        select_verifier("argmax", 1.0)
    with pytest.raises(ValueError, match="unknown verifier"):
        select_verifier("nope", 0.0)


def test_verifier_data_is_checked():
    with pytest.raises(ValueError, match="non-empty"):
        Verifier("", "wor", rrsw_kernel, rrsw_law)
    with pytest.raises(ValueError, match="drafting rule"):
        Verifier("x", "beam", rrsw_kernel, rrsw_law)
    with pytest.raises(ValueError, match="callable"):
        Verifier("x", "wor", None, rrsw_law)
    with pytest.raises(ValueError, match="already registered"):
        register_verifier(Verifier("rrsw", "wor", rrsw_kernel, rrsw_law, description="another"))


def test_load_plugin_names_a_missing_module():
    with pytest.raises(ValueError, match="no_such_plugin_xyz"):
        load_plugin("no_such_plugin_xyz")
    assert load_plugin("univer_patch").__name__ == "univer_patch"


def _installed_distribution(folder, monkeypatch, name: str, entry_point: str) -> None:
    """A minimal installed distribution (a dist-info folder on sys.path) with one entry point in the
    verifier group; the registry is told to load its plugins again."""
    dist = folder / f"{name}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry_point}\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(registry, "_PLUGINS_LOADED", False)


def test_entry_point_plugin_is_loaded(tmp_path, monkeypatch):
    """An installed distribution (a dist-info folder on sys.path) declaring an entry point in the
    group registers its verifier when the registry lists the methods; eagle imports it by no name."""
    (tmp_path / "fake_verifier_plugin.py").write_text(textwrap.dedent('''
        from eagle.verify import Verifier, register_verifier
        from eagle.verify.rrsw import rrsw_kernel, rrsw_law
        register_verifier(Verifier("fake_plugin_rrsw", "wor", rrsw_kernel, rrsw_law, "test plugin"))
    '''))
    _installed_distribution(tmp_path, monkeypatch, "fake_verifier_plugin", "fake = fake_verifier_plugin")
    try:
        assert "fake_plugin_rrsw" in available_verifiers(temperature=1.0)
        assert get_verifier("fake_plugin_rrsw").description == "test plugin"
    finally:
        unregister_verifier("fake_plugin_rrsw")
        sys.modules.pop("fake_verifier_plugin", None)


def test_a_broken_entry_point_warns(tmp_path, monkeypatch):
    _installed_distribution(tmp_path, monkeypatch, "broken_plugin", "broken = no_such_module_abc")
    with pytest.warns(UserWarning, match="broken"):
        names = available_verifiers()
    assert "rrsw" in names


def test_a_verifier_registered_by_a_test_runs_through_eagenerate():
    """A renamed copy of rrsw: listed for temperature > 0, accepted by eagenerate and set_verifier,
    and (same kernel, same seed) token for token rrsw's output."""
    from eagle.testing import tiny_ea_model

    copy = Verifier("rrsw_copy_test", "wor", rrsw_kernel, rrsw_law, "a renamed rrsw")
    register_verifier(copy)
    try:
        assert "rrsw_copy_test" in available_verifiers(temperature=1.0)
        m = tiny_ea_model(vocab_size=32, seed=0, aligned=True)
        ids = torch.tensor([[1, 5, 7, 3]])
        for seed in range(3):
            a = m.eagenerate(ids, temperature=1.0, max_new_tokens=16, tree_choices="2x5", verifier="rrsw_copy_test",
                             seed=seed)
            b = m.eagenerate(ids, temperature=1.0, max_new_tokens=16, tree_choices="2x5", verifier="rrsw", seed=seed)
            assert torch.equal(a, b)
        m.set_verifier("rrsw_copy_test")
        out, stats = m.eagenerate(ids, temperature=1.0, max_new_tokens=8, seed=0, return_stats=True)
        assert out.shape[1] > ids.shape[1]
    finally:
        unregister_verifier("rrsw_copy_test")
    with pytest.raises(ValueError, match="unknown verifier"):
        get_verifier("rrsw_copy_test")


@pytest.mark.parametrize("method", HOT)
def test_temperature_zero_runs_argmax_for_every_method(method):
    """At temperature 0 every name selects "argmax": the output is naivegenerate's."""
    from eagle.testing import tiny_ea_model

    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    ids = torch.tensor([[2, 9, 4]])
    out = m.eagenerate(ids, temperature=0.0, max_new_tokens=20, tree_choices="2x5", verifier=method)
    assert torch.equal(out, m.naivegenerate(ids, temperature=0.0, max_new_tokens=20))


def test_setup_declares_the_entry_point_group():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    assert f'"{ENTRY_POINT_GROUP}": ["univer_patch = univer_patch"]' in text


def test_source_tree_plugin_by_explicit_import():
    """In a fresh interpreter on the source tree (PYTHONPATH=., nothing installed needed): the engine
    loads without univer_patch and lists only the built-ins unless the plugin is installed; an
    explicit import (or load_plugin, as the harness's --plugin) adds traversal, greedy and univer."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = textwrap.dedent('''
        import sys
        import eagle.model.ea_model, eagle.verify as v
        from importlib import metadata
        installed = any(ep.value == "univer_patch" for ep in metadata.entry_points(group=v.ENTRY_POINT_GROUP))
        assert "univer_patch" not in sys.modules
        names = v.available_verifiers()
        assert ("univer" in names) == installed, names
        v.load_plugin("univer_patch")
        assert {"traversal", "greedy", "univer", "rrsw", "argmax"} <= set(v.available_verifiers())
        print("ok")
    ''')
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_a_given_structure_saves_the_parents_copy(monkeypatch):
    """verify(..., validate=False, structure=st) never reads ``parents`` (the engine has the tree's
    structure on the host already): same outcomes as without it."""
    from eagle.verify import checks
    from eagle.verify.checks import tree_structure

    parents, tokens, target, draft = make_instance("2x5", 30, "wor", "cpu", seed=1)
    st = tree_structure(tuple(parents.tolist()))
    want = [get_verifier("rrsw").verify(parents, tokens, target, draft, torch.Generator().manual_seed(s),
                                        validate=False) for s in range(5)]
    monkeypatch.setattr(checks, "structure_of", lambda p: pytest.fail("parents read"))
    got = [get_verifier("rrsw").verify(parents, tokens, target, draft, torch.Generator().manual_seed(s),
                                       validate=False, structure=st) for s in range(5)]
    assert got == want
    law = get_verifier("rrsw").outcome_probs(parents, tokens, target, draft, validate=False, structure=st)
    assert abs(float(law.sum()) - 1) < 1e-6


def test_generator_type_and_meta_laws_get_clear_errors():
    """A seed passed as the generator, and meta laws with a host generator, each get one clear ValueError."""
    ver = get_verifier("rrsw")
    parents, tokens, target, draft = _instance("rrsw")
    with pytest.raises(ValueError, match="generator must be a torch.Generator or None, got int"):
        ver.verify(parents, tokens, target, draft, 3)
    with pytest.raises(ValueError, match="meta device"):
        ver.verify(parents, tokens, target.to("meta"), draft.to("meta"), torch.Generator().manual_seed(0))


def test_same_device_treats_an_unindexed_cuda_generator_as_the_current_device(monkeypatch):
    """``torch.Generator(device="cuda")`` reports ``cuda`` while the laws sit on ``cuda:0``: the door
    must accept it when cuda:0 is current (the first H200 run of scripts/device_check.sh failed three
    checks on exactly this), and still refuse another index or another device type."""
    from eagle.verify.registry import same_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert same_device(torch.device("cuda"), torch.device("cuda:0"))
    assert same_device("cuda:0", "cuda")
    assert same_device("cuda:1", "cuda:1")
    assert not same_device(torch.device("cuda"), torch.device("cuda:1"))
    assert not same_device("cuda:0", "cuda:1")
    assert not same_device("cpu", "cuda:0")
    assert not same_device("cuda", "cpu")
    assert same_device("cpu", torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert not same_device(torch.device("cuda"), torch.device("cuda:0"))
    assert same_device(torch.device("cuda"), torch.device("cuda:1"))
