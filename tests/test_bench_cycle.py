"""Smoke test of the cycle benchmark on a tiny model (no timing claims)."""
import json

import pytest

from evaluation.bench_cycle import PARTS, main, parse_args


def test_bench_cycle_tiny(tmp_path, monkeypatch, capsys):
    import eagle.autotree as autotree

    monkeypatch.setenv("UNIVER_EAGLE_CACHE", str(tmp_path / "cache"))
    fit = autotree.resolve_auto_tree

    def small_fit(model, temperature, contexts=None, **kw):  # a quick fit: few timings
        return fit(model, temperature, contexts=contexts[:2], measure_kwargs=dict(
            tokens=(1, 2, 4), trees=("chain1", "2x2"), new_tokens=4, rounds=1), **kw)

    monkeypatch.setattr(autotree, "resolve_auto_tree", small_fit)
    contexts = autotree.default_contexts
    monkeypatch.setattr(autotree, "default_contexts",
                        lambda model: contexts(model, n_prompts=1, new_tokens=6, per_prompt=2))
    out = tmp_path / "bc"
    res = main(["--model", "tiny", "--trees", "chain2,2x2,auto", "--methods", "rrsw", "--temperatures", "0,1",
                "--draft-vocab", "both", "--draft-vocab-k", "16", "--fast-cpu", "both", "--new-tokens", "4",
                "--rounds", "1", "--no-warmup", "--context-tokens", "12", "--contexts", "2", "--out", str(out)])
    # named trees x T x draft vocabulary x fast CPU, plus the fitted tree for the fast model only
    assert len(res["rows"]) == 2 * 2 * 2 * 2 + 2 * 2
    for r in res["rows"]:
        assert r["cycle_s"] == pytest.approx(sum(r["parts_s"][p] for p in PARTS))
        assert r["tau"] >= 1 and r["speedup"] > 0
        if r["tree"] == "auto":
            assert r["fast_cpu"] and r["choices"] and r["predicted"]["tau"] >= 1
    assert set(res["naive"]) == {"fast_cpu=False T=0", "fast_cpu=False T=1", "fast_cpu=True T=0",
                                 "fast_cpu=True T=1"}
    assert "speedup_over_eager" in res["naive"]["fast_cpu=True T=0"]
    assert res["contexts"] == 2
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["rows"][0]["parts_steps"].keys() == set(PARTS)
    text = out.with_suffix(".md").read_text()
    assert "| tree | method |" in text and "load average" in text
    assert "decode steps" in capsys.readouterr().out


def test_bench_cycle_arguments():
    with pytest.raises(SystemExit):
        parse_args(["--temperatures", "x"])
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])
    a = parse_args(["--trees", "auto, 2x5", "--methods", "rrsw,univer"])
    assert a.trees == ["auto", "2x5"] and a.methods == ["rrsw", "univer"] and a.fast_cpu == "on"
