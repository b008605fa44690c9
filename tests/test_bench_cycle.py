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


# ---- every drafter (with options) and EAGLE-2 dynamic trees (issue 50 follow-up) --------------------------------
def test_bench_cycle_parses_drafter_options_and_dynamic_trees():
    a = parse_args(["--trees", "chain2,eagle2:nodes=6,depth=3,topk=2,eagle2", "--methods", "rrsw,univer",
                    "--temperatures", "0,1", "--drafters",
                    "eagle,hybrid@lookup_weight=0.7,depth=4,draft_lm@model_path_or_module=org/x,eagle,prompt_lookup"])
    assert a.trees == ["chain2", "eagle2:nodes=6,depth=3,topk=2", "eagle2"]
    assert a.drafters == [{"label": "eagle", "name": "eagle", "options": {}},
                          {"label": "hybrid@lookup_weight=0.7,depth=4", "name": "hybrid",
                           "options": {"lookup_weight": 0.7, "depth": 4}},
                          {"label": "draft_lm@model_path_or_module=org/x", "name": "draft_lm",
                           "options": {"model_path_or_module": "org/x"}},
                          {"label": "prompt_lookup", "name": "prompt_lookup", "options": {}}]


@pytest.mark.parametrize("argv, words", [
    (["--drafters", "draft_lm"], "--drafters: 'draft_lm': drafter 'draft_lm' needs model_path_or_module"),
    (["--drafters", "eagle:2x2"], "--drafters: 'eagle:2x2': give the trees with --trees"),
    (["--drafters", "nonesuch"], "--drafters: unknown 'nonesuch'"),
    (["--drafters", "eagle3@path=/no/such/head"], "does not exist"),
    (["--trees", "bogus"], "--trees: unknown tree"),
    (["--trees", "eagle2:nodes=0"], "--trees: malformed dynamic tree"),
    (["--trees", "eagle2", "--drafters", "draft_lm@model_path_or_module=org/x,prompt_lookup"],
     "--trees: 'eagle2' runs with none"),
    (["--trees", "eagle2", "--methods", "rrsw", "--temperatures", "1"], "--trees: 'eagle2' runs with none"),
    (["--methods", "nonesuch"], "--methods:"),
])
def test_bench_cycle_refuses_bad_drafters_and_trees(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().splitlines()[-1].count("error:") == 1 and words in err, err


def test_bench_cycle_tiny_every_drafter_and_a_dynamic_tree(tmp_path):
    """hybrid, a draft LM and an EAGLE-3 head (each with options) on a static tree, and the EAGLE-2 dynamic tree
    with the head drafter under univer; the combinations a dynamic tree cannot run are listed, not run."""
    import torch
    from transformers import LlamaForCausalLM

    from eagle.testing import tiny_llama_config
    from test_eagle3 import eagle3_config, random_state, write_checkpoint

    cfg = eagle3_config(tiny_llama_config(64, 32, 2))
    write_checkpoint(tmp_path / "eagle3", cfg, random_state(cfg))
    torch.manual_seed(2)
    LlamaForCausalLM(tiny_llama_config(64, 32, 1)).save_pretrained(tmp_path / "draft")
    dlm = f"draft_lm@model_path_or_module={tmp_path / 'draft'}"
    e3 = f"eagle3@path={tmp_path / 'eagle3'},feature_layers=[0,1,2]"
    out = tmp_path / "bc"
    res = main(["--model", "tiny", "--trees", "chain2,eagle2:nodes=6,depth=3,topk=2", "--methods", "rrsw,univer",
                "--temperatures", "1", "--drafters", f"eagle,hybrid@lookup_weight=0.75,{dlm},{e3}",
                "--draft-vocab", "off", "--fast-cpu", "off", "--new-tokens", "4", "--rounds", "1", "--no-warmup",
                "--context-tokens", "12", "--out", str(out)])
    got = [(r["drafter"], r["tree"], r["method"]) for r in res["rows"]]
    labels = ["eagle", "hybrid@lookup_weight=0.75", dlm, e3]
    assert got == [(d, "chain2", m) for m in ("rrsw", "univer") for d in labels] + [
        (d, "eagle2:nodes=6,depth=3,topk=2", "univer") for d in labels[:2]]
    for r in res["rows"]:
        assert r["tau"] >= 1 and r["speedup"] > 0 and r["nodes"] == (2 if r["tree"] == "chain2" else 6)
    assert len(res["skipped"]) == 4 + 2 and all("eagle2:nodes=6,depth=3,topk=2" in x for x in res["skipped"])
    text = out.with_suffix(".md").read_text()
    assert "Not run (dynamic trees):" in text and f"| {dlm} | chain2 | univer |" in text
