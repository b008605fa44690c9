"""Every harness argument is checked before any work: one line naming the flag, exit 2, nothing written;
method lists come from the registry (a verifier registered by a plugin runs through answers, tables, plots)."""
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evaluation import arguments as A
from evaluation import specbench as SB

ROOT = Path(__file__).resolve().parents[1]


def _questions(tmp_path):
    qs = [{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
          {"question_id": 82, "category": "roleplay", "turns": ["Be a pirate.", "Again."]},
          {"question_id": 161, "category": "translation", "turns": ["Translate German to English: Hallo"]},
          {"question_id": 162, "category": "translation", "turns": ["Translate German to English: Danke"]}]
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(q) + "\n" for q in qs))
    return f


@pytest.mark.parametrize("bad, flag", [(["--tree", "bogus_tree"], "--tree"),
                                       (["--methods", "rrsw foo"], "--methods")])
def test_bad_tree_or_method_fails_fast_without_writing(tmp_path, bad, flag):
    out = tmp_path / "out"
    cmd = ["bash", str(ROOT / "scripts" / "run_specbench.sh"), "--quick", "--question-file",
           str(_questions(tmp_path)), "--out", str(out), *bad]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    elapsed = time.perf_counter() - t0
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"run_specbench: error: {flag}:"), p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert elapsed < 30.0  # no model load (~40 s); generous for a loaded shared machine
    assert not out.exists() and sorted(x.name for x in tmp_path.iterdir()) == ["q.jsonl"]


def _check(argv):
    return SB.check_arguments(SB._parser().parse_args(argv))


@pytest.mark.parametrize("argv, flag", [
    (["--temperature", "-0.5"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-k", "-1"], "--top-k"),
    (["--seeds", "0 0"], "--seeds"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--per-category", "1.5"], "--per-category"),
    (["--threads", "-2"], "--threads"),
    (["--device", "tpu"], "--device"),
    (["--dtype", "float8"], "--dtype"),
    (["--tree", "3x0"], "--tree"),
    (["--methods", "univer", "bogus"], "--methods"),
    (["--plugin", "no_such_plugin_module"], "--plugin"),
    (["--template", "no_such_template"], "--template"),
    (["--model", "/no/such/folder"], "--model"),
    (["--model", "not a hub id"], "--model"),
    (["--model", "lmsys/vicuna-7b-v1.3"], "--head"),
    (["--head", "/no/such/head"], "--head"),
    (["--categories", "poetry"], "--categories"),
    (["--question-file", "/no/such/q.jsonl"], "--question-file"),
])
def test_each_flag_is_named(tmp_path, argv, flag):
    base = ["--question-file", str(_questions(tmp_path)), "--out", str(tmp_path / "out")]
    with pytest.raises(A.UsageError) as e:
        _check(base + argv)
    assert str(e.value).startswith(flag + ":") and e.value.flag == flag
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_and_head_without_weights(tmp_path):
    q = str(_questions(tmp_path))
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(A.UsageError, match="^--out: .* not a folder"):
        _check(["--question-file", q, "--out", str(f)])
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(A.UsageError, match="^--head: .* no model.safetensors"):
        _check(["--question-file", q, "--model", str(model), "--head", str(head)])


def test_quick_defaults_and_explicit_values_win(tmp_path):
    q = str(_questions(tmp_path))
    cfg = _check(["default", "0.7", "--quick", "--question-file", q, "--out", str(tmp_path / "o")])
    assert (cfg.model, cfg.temperature, cfg.seeds, cfg.per_category, cfg.max_new_tokens) == ("default", 0.7, [0], 2, 16)
    assert cfg.note.startswith("SMOKE RUN") and cfg.contexts_per_question == 1
    assert cfg.methods == A.method_names(0.7) and {"rrsw", "traversal", "greedy", "univer"} <= set(cfg.methods)
    assert [x["question_id"] for x in cfg.questions] == [81, 82, 161, 162]   # 2 per group
    cfg = _check(["--quick", "--seeds", "3", "4", "--max-new-tokens", "8", "--question-file", q, "--out",
                  str(tmp_path / "o")])
    assert (cfg.seeds, cfg.max_new_tokens, cfg.note is not None) == ([3, 4], 8, True)


def test_exit_on_usage_error_prints_one_line(capsys):
    def bad():
        raise A.UsageError("--tree", "unknown tree 'x'\nsecond line")

    with pytest.raises(SystemExit) as e:
        A.exit_on_usage_error(bad)
    assert e.value.code == 2
    assert capsys.readouterr().err == "run_specbench: error: --tree: unknown tree 'x' second line\n"


PLUGIN = '''
import dataclasses
from eagle.verify.registry import get_verifier, register_verifier
register_verifier(dataclasses.replace(get_verifier("rrsw"), name="rrsw_copy"), overwrite=True)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_verifier_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_verifier_plugin"
    from eagle.verify import registry

    unregister = getattr(registry, "unregister_verifier", None)
    if unregister is not None:
        unregister("rrsw_copy")
    else:
        registry._REGISTRY.pop("rrsw_copy", None)
    sys.modules.pop("my_verifier_plugin", None)


def test_plugin_verifier_runs_through_answers_tables_and_plots(tmp_path, plugin):
    import torch

    from evaluation import gen_answer as G
    from evaluation import plots, speed, tables
    from eagle.testing import tiny_ea_model
    from harness_helpers import QUESTIONS, _CharTok

    cfg = _check(["--plugin", plugin, "--methods", "rrsw", "rrsw_copy", "--question-file", str(_questions(tmp_path)),
                  "--out", str(tmp_path / "o")])
    assert cfg.methods == ["rrsw", "rrsw_copy"] and plugin in cfg.plugins
    assert "rrsw_copy" in A.method_names(1.0)
    torch.set_num_threads(1)
    model = tiny_ea_model(vocab_size=32, seed=0, aligned=True)
    G.run(model, QUESTIONS[1:], tmp_path / "answers", ["naive", *cfg.methods], [0], temperature=1.0, tree="2x2",
          max_new_tokens=5, tokenizer=_CharTok(), progress=False)
    sp = speed.summarize(speed.collect_runs([tmp_path / "answers"]), n_boot=20)
    t = tables.table1(sp, 1.0, "2x2")
    assert [r["method"] for r in t["rows"]] == ["rrsw", "rrsw_copy"]
    assert "| rrsw_copy |" in tables.render_table1(t)
    pngs = plots.main_job_plots(sp, tmp_path / "plots", None, 1.0, "2x2")
    assert pngs and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_verifiers_compared_on_2x5_and_speed_on_the_cpu_default_tree(tmp_path):
    """Issue 48: the comparison tree is the paper's 2x5 everywhere; the embedded default on the CPU
    adds a speed table (univer at temperature > 0), sharing plain decoding, on the API's CPU default tree
    (issue 50: the EAGLE-2 dynamic tree) where the drafter and speed methods can draft it, else on the tree
    fitted to this machine ('auto')."""
    from eagle.model.ea_model import CPU_DEFAULT_TREE

    assert A.default_tree("default", "cpu") == "2x5" and A.default_tree("default", "cuda") == "2x5"
    assert A.default_speed_tree("default", "cpu") == "auto"
    assert A.default_speed_tree("default", "cuda") == "none"
    assert A.default_speed_tree("lmsys/vicuna-7b-v1.3", "cpu") == "none"
    q = str(_questions(tmp_path))
    cfg = _check(["--device", "cpu", "--question-file", q, "--out", str(tmp_path / "a")])
    assert cfg.tree == "2x5" and cfg.speed_tree == CPU_DEFAULT_TREE and cfg.speed_methods == ["univer"]
    assert str(cfg.out).endswith("a")
    cfg0 = _check(["default", "0", "--device", "cpu", "--question-file", q, "--out", str(tmp_path / "z")])
    assert cfg0.speed_methods == [m for m in cfg0.methods if m != "naive"][:1]
    assert cfg0.speed_tree == CPU_DEFAULT_TREE  # temperature 0: argmax drafts it
    for methods in ("rrsw", "univer traversal"):  # a speed method that cannot draft a dynamic tree: the fitted one
        cfg_w = _check(["--device", "cpu", "--question-file", q, "--speed-methods", methods,
                        "--out", str(tmp_path / methods.replace(" ", "_"))])
        assert cfg_w.speed_tree == "auto"
    cfg_a = _check(["--device", "cpu", "--question-file", q, "--speed-tree", "auto", "--out", str(tmp_path / "y")])
    assert cfg_a.speed_tree == "auto"  # named: kept
    with pytest.raises(A.UsageError) as e:  # plain decoding alone on the speed tree: nothing to time
        _check(["--device", "cpu", "--question-file", q, "--speed-methods", "naive", "--out", str(tmp_path / "x")])
    assert str(e.value).startswith("--speed-methods:") and "\n" not in str(e.value)
    cfg2 = _check(["--device", "cpu", "--question-file", q, "--tree", "mc_sim_7b_63", "--speed-tree", "none",
                   "--out", str(tmp_path / "b")])
    assert cfg2.tree == "mc_sim_7b_63" and cfg2.speed_methods == []  # explicit values win
    cfg3 = _check(["--device", "cpu", "--question-file", q, "--speed-tree", "chain3", "--speed-methods", "rrsw greedy",
                   "--out", str(tmp_path / "c")])
    assert cfg3.speed_tree == "chain3" and cfg3.speed_methods == ["rrsw", "greedy"]


@pytest.mark.parametrize("argv,flag", [
    (["--tree", "bogus"], "--tree"), (["--tree", "none"], "--tree"), (["--speed-tree", "bogus"], "--speed-tree"),
    (["--speed-methods", "bogus"], "--speed-methods"), (["no/such/folder"], "MODEL"), (["default", "hot"], "TEMPERATURE"),
    (["--temperature", "0.5", "default", "1.0"], "--temperature"), (["--model", "default", "org/other"], "--model"),
])
def test_bad_tree_and_positional_errors_name_their_flag(tmp_path, argv, flag):
    q = str(_questions(tmp_path))
    with pytest.raises(A.UsageError) as e:
        _check(argv + ["--device", "cpu", "--question-file", q, "--out", str(tmp_path / "o")])
    assert str(e.value).startswith(flag)
    if argv[:2] == ["--tree", "bogus"]:
        assert "'auto'" in str(e.value)


def test_coincidence_note_names_the_verifiers_that_coincide():
    methods = ["naive", "rrsw", "traversal", "greedy", "univer"]
    note = A.coincidence_note([[0], [0, 0]], 1.0, methods)
    assert "greedy = rrsw" in note and "univer = traversal" in note
    assert A.coincidence_note("2x5", 1.0, methods) is None
    assert "argmax" in A.coincidence_note("2x5", 0.0, methods)
    assert A.coincidence_note("chain3", 1.0, ["naive", "rrsw", "univer"]) is None  # no coinciding pair present


def test_draft_vocab_flag(tmp_path):
    q = str(_questions(tmp_path))
    assert _check(["--question-file", q, "--out", str(tmp_path / "a")]).draft_vocab == "auto"
    assert _check(["--question-file", q, "--out", str(tmp_path / "a"), "--draft-vocab", "off"]).draft_vocab == "off"
    with pytest.raises(SystemExit) as e:
        _check(["--question-file", q, "--out", str(tmp_path / "a"), "--draft-vocab", "maybe"])
    assert e.value.code == 2


def test_draft_vocab_off_drafts_over_the_full_vocabulary(tmp_path, monkeypatch):
    """load_checked_model drops the head's draft vocabulary for --draft-vocab off (and keeps it for auto);
    provenance reports K or None, and resuming with the other setting is refused."""
    import torch

    from eagle.model.head import EagleHead
    from evaluation import gen_answer as G

    class _Stub:
        def __init__(self):
            from transformers import LlamaConfig

            cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2)
            self.ea_layer = EagleHead(cfg)
            self.ea_layer.set_draft_vocab(torch.arange(0, 40, 4))
            self.tokenizer = object()

    monkeypatch.setattr(A, "load_model", lambda *a, **k: _Stub())
    monkeypatch.setattr("evaluation.templates.choose_format", lambda *a, **k: None)
    q = str(_questions(tmp_path))
    for flag, k in (("auto", 10), ("off", None)):
        cfg = _check(["--question-file", q, "--out", str(tmp_path / flag), "--draft-vocab", flag])
        model, _ = A.load_checked_model(cfg)
        assert G._draft_vocab_size(model) == k
    f = tmp_path / "a.jsonl"
    f.write_text(json.dumps({"method": "rrsw", "draft_vocab": 10}) + "\n")
    assert G.resume_conflict(f, {"method": "rrsw", "draft_vocab": 10}) is None
    assert "draft_vocab" in G.resume_conflict(f, {"method": "rrsw", "draft_vocab": None})


@pytest.mark.parametrize("tree,coincide", [("2x2", False), pytest.param("chain2", True, marks=pytest.mark.slow)])
def test_main_job_compares_on_its_tree_and_times_the_speed_tree(tmp_path, tree, coincide):
    """run_job end to end on a tiny model: Table 1 on --tree (saying so when verifiers coincide on it),
    the speed table on --speed-tree sharing the plain-decoding answers, plots titled as a smoke run."""
    import torch

    from evaluation.templates import choose_format
    from eagle.testing import tiny_ea_model
    from harness_helpers import _CharTok

    q = str(_questions(tmp_path))
    out = tmp_path / "o"
    cfg = _check(["--quick", "--device", "cpu", "--tree", tree, "--speed-tree", "chain3", "--max-new-tokens", "4",
                  "--contexts-per-question", "0", "--bootstrap", "20", "--no-progress", "--question-file", q,
                  "--out", str(out)])
    assert cfg.speed_methods == ["univer"]
    torch.set_num_threads(1)
    model = tiny_ea_model(vocab_size=32, seed=0, aligned=True)
    tok = _CharTok()
    tok.chat_template = "{{ messages }}"
    model.tokenizer = tok
    fmt = choose_format("tiny", tok, None)
    SB.run_job(cfg, model, fmt)
    files = sorted(p.name for p in (out / "answers").iterdir())
    assert files.count("naive-temp1-seed0.jsonl") == 1  # plain decoding shared by both tables
    assert f"univer-temp1-{tree}-seed0.jsonl" in files and "univer-temp1-chain3-seed0.jsonl" in files
    t1 = (out / "table1.md").read_text()
    assert f"tree {tree}:" in t1 and "SMOKE RUN" in t1
    assert ("This tree is a chain" in t1) == coincide
    ts = (out / "speed_table.md").read_text()
    assert "tree chain3" in ts and "| plain decoding |" in ts and "| UniVer |" in ts
    assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"


def test_max_new_tokens_beyond_the_target_context_fails_after_the_load(tmp_path, monkeypatch):
    """--max-new-tokens at or above the target's max_position_embeddings is one line naming the flag, raised by
    load_checked_model (before any generation or file); below it passes."""
    from types import SimpleNamespace

    stub = SimpleNamespace(base_model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64)),
                           ea_layer=None, tokenizer=object())
    monkeypatch.setattr(A, "load_model", lambda *a, **k: stub)
    monkeypatch.setattr("evaluation.templates.choose_format", lambda *a, **k: None)
    q = str(_questions(tmp_path))
    for n, ok in (("63", True), ("64", False), ("1e9", False)):
        cfg = _check(["--question-file", q, "--out", str(tmp_path / n), "--max-new-tokens", n])
        if ok:
            assert A.load_checked_model(cfg)[0] is stub
        else:
            with pytest.raises(A.UsageError) as e:
                A.load_checked_model(cfg)
            assert str(e.value).startswith("--max-new-tokens") and "give at most 63" in str(e.value)
            assert "\n" not in str(e.value) and not (tmp_path / n).exists()
