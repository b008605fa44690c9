"""The peer table on a tiny model: every contender runs, outputs equal greedy decoding at temperature 0, bad
flags fail in one line (no timing claims)."""
import json

import pytest
from harness_helpers import QUESTIONS, _CharTok

from evaluation import bench_peers as B


@pytest.fixture(scope="module")
def tiny():
    from eagle.testing import tiny_ea_model

    m = tiny_ea_model(vocab_size=32, seed=0, aligned=True, tree_choices="2x2")
    m.tokenizer = _CharTok()
    return m


@pytest.fixture
def qfile(tmp_path):
    p = tmp_path / "question.jsonl"
    p.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return p


def test_peer_table_tiny(tiny, qfile, tmp_path, capsys):
    out = tmp_path / "peers" / "run.json"
    doc = B.main(["--ours", "default", "prompt_lookup", "eagle:chain3", "--question-file", str(qfile),
                  "--question-set", "all", "--per-category", "1", "--max-new-tokens", "12", "--bootstrap", "50",
                  "--out", str(out), "--no-progress"], model=tiny)
    keys = [r["key"] for r in doc["rows"]]
    assert keys == ["plain", "hf", "hf_pld", "ours:default", "ours:prompt_lookup", "ours:eagle:chain3"]
    n = len(QUESTIONS)
    for r in doc["rows"]:
        assert r["questions"] == n and r["tokens_per_s"] > 0
        assert r["equal"] == n, r  # every output equals plain greedy decoding token for token
        assert (r["tau"] is None) == (not r["key"].startswith("ours")) and (r["tau"] is None or r["tau"] >= 1)
        assert r["ratio_se"] is not None and r["ratio_hf_pld"] > 0
    assert doc["rows"][0]["ratio"] == pytest.approx(1.0)
    for q in doc["questions"]:  # HF generate ran its full length too (tiny model: no EOS)
        assert {k: len(v["new_ids"]) for k, v in q["results"].items()} == dict.fromkeys(keys, 12)
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(doc["rows"]))
    assert saved["meta"]["loadavg_before"] and saved["meta"]["questions"] == n
    assert saved["meta"]["question_file"] == str(qfile.resolve())
    assert saved["meta"]["default_resolved"]["verifier"] == "argmax"  # the name the calls ran (not an object's repr)
    assert saved["meta"]["verifier"] == "argmax"  # every name runs argmax at temperature 0
    assert all(c["tree_choices"] is None for c in doc["contenders"])  # no 'auto' tree among them
    md = out.with_suffix(".md").read_text()
    printed = capsys.readouterr().out
    assert md.strip() == printed.strip()
    assert "| contender | tokens/s | ratio to plain | ratio to HF PLD | tau | equal to greedy |" in md
    assert f"| {n}/{n} |" in md and "HF prompt lookup" in md and "ours: API defaults" in md


def test_question_file_is_recorded_resolved(qfile, monkeypatch):
    """A relative --question-file is recorded as the absolute path it was read from (a run file names its data)."""
    monkeypatch.chdir(qfile.parent)
    settings = B.check_args(B.parse_args(["--question-file", qfile.name, "--question-set", "all", "--out",
                                          str(qfile.parent / "o.json")]))
    assert settings["question_file"] == str(qfile.resolve())


def test_peer_table_sampling_skips_hf(tiny, qfile, tmp_path):
    doc = B.main(["--temperature", "1", "--ours", "eagle:2x2", "--question-file", str(qfile), "--question-set",
                  "all", "--per-category", "1", "--max-new-tokens", "6", "--out", str(tmp_path / "t1.json"),
                  "--no-progress"], model=tiny)
    assert [r["key"] for r in doc["rows"]] == ["plain", "ours:eagle:2x2"]
    assert all("equal" not in r and "ratio_hf_pld" not in r for r in doc["rows"])
    assert doc["meta"]["verifier"] == "univer" and doc["meta"]["default_resolved"]["verifier"] == "univer"


def test_fitted_tree_recorded_for_auto_contenders():
    """An ``auto`` contender's fitted rank paths go into the run's JSON (the fit itself is the model's)."""
    from types import SimpleNamespace

    fitted = SimpleNamespace(resolve_tree=lambda spec, t: ((0,), (1,), (0, 0)) if spec == "auto" else spec)
    auto = B.Contender("ours:eagle:auto", "ours", spec="eagle:auto", drafter="eagle", tree="auto")
    assert B._fitted(fitted, auto, 0.0) == [[0], [1], [0, 0]]
    assert B._fitted(fitted, B.Contender("ours:eagle:2x2", "ours", spec="eagle:2x2", drafter="eagle", tree="2x2"),
                     0.0) is None
    assert B._fitted(fitted, B.Contender(B.PLAIN, B.PLAIN), 0.0) is None

    def broken(spec, t):
        raise ValueError("no head")
    assert B._fitted(SimpleNamespace(resolve_tree=broken), auto, 0.0) is None


def test_paired_ratio():
    est, se = B.paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0], n_boot=100)
    assert est == pytest.approx(2.0) and se == pytest.approx(0.0, abs=1e-12)  # same ratio on every question
    assert B.paired_ratio([2.0], [1.0])[1] is None


@pytest.mark.parametrize("argv, flag", [
    (["--ours", "bogus"], "--ours"),
    (["--ours", "eagle:nonsense"], "--ours"),
    (["--ours", "prompt_lookup:2x5"], "--ours"),
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "1", "--verifier", "bogus"], "--verifier: unknown verifier 'bogus'; known at temperature 1:"),
    (["--temperature", "1", "--verifier", "naive"], "--verifier: 'naive' is plain decoding"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--max-new-tokens", "1e9"], "--max-new-tokens: 1000000000 does not fit the target's context of 1024 positions"),
    (["--max-new-tokens", "1024"], "give at most 1023"),
    (["--per-category", "x"], "--per-category"),
    (["--question-set", "odd"], "--question-set"),
    (["--bogus-flag"], "unrecognized arguments"),
])
def test_bad_flag_one_line(tiny, qfile, argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        B.main(["--question-file", str(qfile), "--question-set", "all", *argv], model=tiny)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bench_peers: error:") and flag in err, err
    assert "--plugin" not in err  # bench_peers has no --plugin flag
    assert "known" not in err or "'naive'" not in err.split("known", 1)[1]  # plain decoding is not a --verifier


# ---- every drafter and tree of the engine (issue 50 follow-up) --------------------------------------------------
@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny):
    """Folders: a tiny EAGLE-3 head for ``tiny`` (fusing its hidden states 0, 1, 2), a draft LM of its vocabulary
    and one of another vocabulary."""
    import torch
    from transformers import LlamaForCausalLM

    from eagle.testing import tiny_llama_config
    from test_eagle3 import eagle3_config, random_state, write_checkpoint

    root = tmp_path_factory.mktemp("peer_heads")
    cfg = eagle3_config(tiny.base_model.config)
    write_checkpoint(root / "eagle3", cfg, random_state(cfg))
    torch.manual_seed(3)
    LlamaForCausalLM(tiny_llama_config(32, 32, 1)).save_pretrained(root / "draft")
    LlamaForCausalLM(tiny_llama_config(16, 32, 1)).save_pretrained(root / "draft16")
    return root


def test_parse_ours_names_every_drafter_and_dynamic_trees(heads):
    e3 = f"eagle3@path={heads / 'eagle3'},feature_layers=[0,1,2]:2x2"
    ours = B.parse_ours(["default,hybrid@lookup_weight=0.75,depth=4:2x2", "hybrid", "eagle:eagle2",
                         "eagle:eagle2:nodes=6,depth=3,topk=2,prompt_lookup@depth=4",
                         "draft_lm@model_path_or_module=org/x:chain2", e3, "hybrid@depth=4,lookup_weight=0.75:2x2"],
                        0.0, "univer")
    got = [(c.key, c.drafter, c.options, c.tree) for c in ours]
    assert got == [
        ("ours:default", None, None, None),
        ("ours:hybrid@lookup_weight=0.75,depth=4:2x2", "hybrid", {"lookup_weight": 0.75, "depth": 4}, "2x2"),
        ("ours:hybrid", "hybrid", None, None),
        ("ours:eagle:eagle2", "eagle", None, "eagle2"),
        ("ours:eagle:eagle2:nodes=6,depth=3,topk=2", "eagle", None, "eagle2:nodes=6,depth=3,topk=2"),
        ("ours:prompt_lookup@depth=4", "prompt_lookup", {"depth": 4}, None),
        ("ours:draft_lm@model_path_or_module=org/x:chain2", "draft_lm", {"model_path_or_module": "org/x"}, "chain2"),
        (f"ours:eagle3@path={heads / 'eagle3'},feature_layers=[0,1,2]:2x2", "eagle3",
         {"path": str(heads / "eagle3"), "feature_layers": [0, 1, 2]}, "2x2"),
        ("ours:hybrid@depth=4,lookup_weight=0.75:2x2", "hybrid", {"depth": 4, "lookup_weight": 0.75}, "2x2")]
    assert ours[6].label == "ours: draft_lm (model_path_or_module=org/x) tree chain2"
    # at temperature 1 a dynamic tree needs a verifier drafting top-k (univer / greedy)
    assert B.parse_ours(["eagle:eagle2"], 1.0, "greedy")[0].tree == "eagle2"


@pytest.mark.parametrize("argv, words", [
    (["--ours", "draft_lm@model_path_or_module=org/x:eagle2"], "static trees only"),
    (["--temperature", "1", "--verifier", "rrsw", "--ours", "eagle:eagle2"], "'rrsw'"),
    (["--ours", "eagle:eagle2:nodes=0"], "malformed dynamic tree"),
    (["--ours", "draft_lm"], "needs model_path_or_module"),
    (["--ours", "draft_lm@dtype"], "KEY=VALUE"),
    (["--ours", "draft_lm@:2x2"], "'@' without options"),
    (["--ours", "prompt_lookup@size=2"], "no option"),
    (["--ours", "eagle@depth=2"], "no option"),
    (["--ours", "eagle3@path=/no/such/head:2x2"], "does not exist"),
    (["--ours", "eagle3:2x2"], "needs the EAGLE-3 head"),
    (["--ours", "@x=1"], "no drafter name"),
])
def test_bad_drafter_specs_fail_in_one_line(tiny, qfile, argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        B.main(["--question-file", str(qfile), "--question-set", "all", *argv], model=tiny)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("bench_peers: error: --ours:"), err
    assert words in err, err


def test_peer_table_with_every_drafter(tiny, heads, qfile, tmp_path, monkeypatch):
    """hybrid, an EAGLE-2 dynamic tree, a draft LM (built once) and an EAGLE-3 head: every output equals plain
    greedy decoding at temperature 0; at temperature 1 the dynamic tree runs under univer."""
    from eagle.drafters import DraftLMDrafter

    built = []
    real = DraftLMDrafter.for_model.__func__
    monkeypatch.setattr(DraftLMDrafter, "for_model",
                        classmethod(lambda cls, *a, **k: built.append(1) or real(cls, *a, **k)))
    ours = ["hybrid:2x2", "eagle:eagle2:nodes=6,depth=3,topk=2", f"draft_lm@model_path_or_module={heads / 'draft'}:2x2",
            f"eagle3@path={heads / 'eagle3'},feature_layers=[0,1,2]:chain2"]
    common = ["--question-file", str(qfile), "--question-set", "all", "--per-category", "1", "--bootstrap", "20",
              "--no-progress"]
    doc = B.main(["--ours", *ours, "--max-new-tokens", "10", "--out", str(tmp_path / "t0.json"), *common], model=tiny)
    rows = {r["key"]: r for r in doc["rows"]}
    assert list(rows)[3:] == ["ours:hybrid:2x2", "ours:eagle:eagle2:nodes=6,depth=3,topk=2",
                              f"ours:draft_lm@model_path_or_module={heads / 'draft'}:2x2",
                              f"ours:eagle3@path={heads / 'eagle3'},feature_layers=[0,1,2]:chain2"]
    n = len(QUESTIONS)
    for key, r in rows.items():
        assert r["equal"] == n, key
        assert key.startswith("ours") == (r["tau"] is not None) and (r["tau"] or 1) >= 1
    assert len(built) == 1                                     # the draft LM was loaded once for every call
    assert doc["contenders"][5]["options"] == {"model_path_or_module": str(heads / "draft")}
    doc = B.main(["--temperature", "1", "--ours", "eagle:eagle2:nodes=6,depth=3,topk=2", "hybrid:2x2",
                  "--max-new-tokens", "6", "--out", str(tmp_path / "t1.json"), *common], model=tiny)
    assert [r["key"] for r in doc["rows"]] == ["plain", "ours:eagle:eagle2:nodes=6,depth=3,topk=2", "ours:hybrid:2x2"]
    assert all(r["tau"] >= 1 for r in doc["rows"][1:])


def test_a_drafter_that_cannot_be_built_fails_in_one_line(tiny, heads, qfile, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        B.main(["--ours", f"draft_lm@model_path_or_module={heads / 'draft16'}", "--question-file", str(qfile),
                "--question-set", "all", "--out", str(tmp_path / "x.json")], model=tiny)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and err.startswith("bench_peers: error: --ours:") and "vocabulary" in err, err
