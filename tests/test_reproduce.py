"""The paper-reproduction sweep (evaluation.reproduce): config errors, dry run, resume, shards + merge, verdicts."""
import json
import os
from pathlib import Path

import pytest
import torch

from evaluation import reproduce as R
from harness_helpers import _CharTok

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
    {"question_id": 91, "category": "roleplay", "turns": ["Be a pirate."]},
    {"question_id": 161, "category": "translation", "turns": ["Translate: bonjour"]},
    {"question_id": 162, "category": "translation", "turns": ["Translate: merci"]},
    {"question_id": 241, "category": "qa", "turns": ["Why is the sky blue?"]},
    {"question_id": 242, "category": "qa", "turns": ["Why is grass green?"]},
]


@pytest.fixture(scope="module")
def tiny():
    from eagle.testing import tiny_ea_model

    torch.set_num_threads(1)
    m = tiny_ea_model(vocab_size=32, seed=0, aligned=True)
    m.tokenizer = _CharTok()
    return m


class Fmt:
    name = "test"

    @staticmethod
    def ids(tok, messages):
        return [3 + len(m["content"]) % 20 for m in messages] + [1, 2]


def _config(tmp_path, **over):
    qf = tmp_path / "q.jsonl"
    qf.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    cfg = {"name": "tiny", "model": "default", "paper_model": "vicuna-7b-v1.3",
           "questions": {"file": str(qf), "set": "all"}, "seeds": [3], "methods": ["rrsw", "univer"],
           "max_new_tokens": 8, "contexts_per_question": 2, "bootstrap": 50,
           "tables": [{"table": "Table 1", "layout": "groups", "temperatures": [1.0], "trees": ["2x2"]},
                      {"table": "Table 3", "layout": "grid", "temperatures": [0.3, 1.0], "trees": ["2x2", "chain2"]},
                      {"table": "Figure 4", "layout": "depth_width", "temperatures": [1.0], "widths": [2],
                       "depths": [1, 2, 3], "max_nodes": 6, "per_category": 1, "contexts_per_question": 1}],
           "sampled_check": {"temperature": 1.0, "tree": "2x2", "per_category": 1, "max_new_tokens": 6},
           "quick": {"questions": {"per_category": 1}, "tables": {"Figure 4": None}}}
    cfg.update(over)
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps(cfg))
    return p


def _loader(tiny, calls=None):
    def load(setting, device):
        if calls is not None:
            calls.append(setting.name)
        return tiny, Fmt()
    return load


@pytest.mark.parametrize("change, key", [
    ({"tablez": []}, "tablez"),
    ({"tables": [{"table": "T", "layout": "grid", "temperatures": [1.0], "trees": ["bogus"]}]}, "tables[0].trees"),
    ({"tables": [{"table": "T", "layout": "grid", "temperatures": [1.0], "trees": ["2x2"], "colour": 1}]},
     "tables[0].colour"),
    ({"questions": {"set": "mine"}}, "questions.set"),
    ({"reference": "greedy"}, "reference"),
    ({"methods": ["rrsw", "nonesuch"]}, "methods"),
    ({"seeds": [0, 0]}, "seeds"),
    ({"paper_model": "gpt-9"}, "paper_model"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"sampled_check": {"tree": "2x2", "methods": ["greedy"]}}, "sampled_check.methods"),
    ({"model": "org/name"}, "head"),
])
def test_config_errors_name_the_key(tmp_path, capsys, change, key):
    p = _config(tmp_path, **change)
    with pytest.raises(R.ConfigError, match=rf"tiny.json: {key.replace('[', '.').replace(']', '.')}"):
        R.load_setting(p)
    assert R.main([str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reproduce: error: ") and err.count("\n") == 1 and key in err


def test_config_errors_in_quick_and_json(tmp_path):
    p = _config(tmp_path, quick={"tables": {"Table 9": {}}})
    with pytest.raises(R.ConfigError, match=r"quick.tables.Table 9"):
        R.load_setting(p, quick=True)
    R.load_setting(p)  # without --quick the overrides are not read
    bad = tmp_path / "bad.json"
    bad.write_text("{\"name\": ")
    with pytest.raises(R.ConfigError, match="not valid JSON"):
        R.load_setting(bad)
    with pytest.raises(R.ConfigError, match="no such config file"):
        R.load_setting(tmp_path / "none.json")


def test_shipped_configs_load_and_dry_run(capsys):
    for p in sorted((REPO / "configs" / "paper").glob("*.json")):
        for quick in (False, True):
            s = R.load_setting(p, quick=quick)
            assert s.blocks and s.methods[0] == "rrsw"
    boom = lambda *a: (_ for _ in ()).throw(AssertionError("a dry run must not load a model"))  # noqa: E731
    assert R.main([str(REPO / "configs/paper/vicuna-7b.json"), str(REPO / "configs/paper/llama2-7b-68m.json"),
                   "--dry-run"], loader=boom) == 0
    out = capsys.readouterr().out
    assert "yuhuili/EAGLE-Vicuna-7B-v1.3" in out and "3.06/3.13/3.21/3.29" in out and "UniVer +7.5%" in out
    assert "drafter draft_lm (model_path_or_module=JackFram/llama-68m)" in out and "NOT RUNNABLE" not in out
    assert "at temperature 0.3 all four methods are within 0.05" in out


def test_dry_run_lists_cells_and_cost(tmp_path, capsys):
    p = _config(tmp_path)
    assert R.main([str(p), "--dry-run", "--processes", "2"]) == 0
    out = capsys.readouterr().out
    assert "Table 1" in out and "chain2" in out and "2x3" in out and "SKIPPED: 14 draft nodes > max_nodes 6" in out
    assert "units: 15 (12 exact, 3 sampled)" in out and "cost estimate" in out and "with 2 processes" in out
    s = R.load_setting(p, quick=True)
    assert [b.table for b in s.blocks] == ["Table 1", "Table 3"] and s.per_category == 1


def test_question_sets_are_disjoint():
    from evaluation.questions import load_questions, select_questions

    f = R.SHARED_QUESTION_FILE if R.SHARED_QUESTION_FILE.is_file() else REPO / "data/spec_bench/question.jsonl"
    if not f.is_file():
        pytest.skip("no Spec-Bench question file here")
    qs = load_questions(f)
    sets = R.question_sets(qs)
    sel = {q["question_id"] for q in sets["selection"]}
    rep = {q["question_id"] for q in sets["report"]}
    assert sel == {q["question_id"] for q in select_questions(qs, None, 10)}   # what head_tau.sh PER_CATEGORY=10 ran
    assert len(sel) == 60 and not sel & rep and len(sel | rep) == len(qs)
    s = R.load_setting(REPO / "configs/paper/default-cpu.json")
    assert s.question_set == "report" and not {q["question_id"] for q in R.pick_questions(s)} & sel


def test_detect_shard():
    assert R.detect_shard({}) == (0, 1, None)
    assert R.detect_shard({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == (3, 4, 1)
    assert R.detect_shard({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}) == (1, 2, None)
    assert R.detect_shard({"RANK": "0", "WORLD_SIZE": "1"}) == (0, 1, None)
    assert R.parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "x", "1/0"):
        with pytest.raises(R.ConfigError, match="--shard"):
            R.parse_shard(bad)


def test_resume_skips_done_units(tmp_path, tiny):
    p = _config(tmp_path)
    calls = []
    out = tmp_path / "out"
    assert R.main([str(p), "--out", str(out), "--quiet", "--no-plots"], loader=_loader(tiny, calls)) == 0
    units = sorted((out / "tiny" / "units").glob("*.json"))
    assert len(units) == 15 and calls == ["tiny"]
    stamp = {u.name: u.stat().st_mtime_ns for u in units}
    assert R.main([str(p), "--out", str(out), "--quiet", "--no-plots"], loader=_loader(tiny, calls)) == 0
    assert calls == ["tiny"]                                   # nothing left: the model is not even loaded
    assert {u.name: u.stat().st_mtime_ns for u in units} == stamp
    units[0].unlink()
    s = R.load_setting(p)
    res = R.run_units(s, R.pick_questions(s), out, model=tiny, fmt=Fmt(), log=lambda m: None)
    assert res == {**res, "ran": 1, "skipped": 14}
    # a unit computed with other settings is refused, naming --out
    s2 = R.load_setting(_config(tmp_path, max_new_tokens=9))
    with pytest.raises(R.ConfigError, match="--out: unit .* other settings .*max_new_tokens"):
        R.run_units(s2, R.pick_questions(s2), out, model=tiny, fmt=Fmt(), log=lambda m: None)


def test_a_new_tree_reuses_the_stored_reference(tmp_path, tiny):
    p = _config(tmp_path, sampled_check=None,
                tables=[{"table": "Table 1", "layout": "groups", "temperatures": [1.0], "trees": ["2x2"]}])
    out = tmp_path / "out"
    s = R.load_setting(p)
    qs = R.pick_questions(s)
    R.run_units(s, qs, out, model=tiny, fmt=Fmt(), log=lambda m: None)
    before = json.loads((out / "tiny/units/exact-s3-t1-q81.json").read_text())
    p = _config(tmp_path, sampled_check=None,
                tables=[{"table": "Table 3", "layout": "grid", "temperatures": [1.0], "trees": ["2x2", "chain2"]}])
    s = R.load_setting(p)
    calls = []
    real = tiny.eagenerate

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    tiny.eagenerate = counting
    try:
        res = R.run_units(s, qs, out, model=tiny, fmt=Fmt(), log=lambda m: None)
    finally:
        del tiny.eagenerate
    after = json.loads((out / "tiny/units/exact-s3-t1-q81.json").read_text())
    assert res["ran"] == 6 and not calls                      # only the new tree was scored, no regeneration
    assert after["reference"] == before["reference"] and after["scores"]["2x2@2"] == before["scores"]["2x2@2"]
    assert set(after["scores"]) == {"2x2@2", "chain2@2"}


def _report(out):
    rep = json.loads((out / "tiny" / "report.json").read_text())
    return rep


def test_two_merged_shards_equal_one_unsharded_run(tmp_path, tiny):
    p = str(_config(tmp_path))
    load = _loader(tiny)
    a, b, c, d = (tmp_path / x for x in "abcd")
    assert R.main([p, "--out", str(a), "--shard", "0/2", "--quiet"], loader=load) == 0
    assert not (a / "tiny" / "report.json").exists()          # a shard alone writes no report
    assert R.main([p, "--out", str(b), "--shard", "1/2", "--quiet"], loader=load) == 0
    na, nb = len(list((a / "tiny/units").glob("*.json"))), len(list((b / "tiny/units").glob("*.json")))
    assert (na, nb) == (8, 7)
    assert R.main([p, "--out", str(c), "--merge", str(a), str(b), "--quiet"], loader=load) == 0
    assert R.main([p, "--out", str(d), "--quiet"], loader=load) == 0
    merged, single = _report(c), _report(d)
    assert merged["missing_units"] == [] and merged == single
    for f in sorted((d / "tiny/units").glob("*.json")):
        one = json.loads(f.read_text())
        two = json.loads((c / "tiny/units" / f.name).read_text())
        one.pop("seconds"), two.pop("seconds")
        assert one == two, f.name
    # the report reads: verdicts, paper values, the sampled check, plots
    md = (d / "tiny" / "report.md").read_text()
    assert "## Paper cell by cell" in md and "| Table 3 | 1 | 2x2 | UniVer |" in md
    assert "| Table 1 | 1 | 2x2 | UniVer | - | - |" in md and "at temperature 0.3" in md and "## Sampled check" in md and "## Figure 4" in md
    assert "not run (14 draft nodes > max_nodes 6)" in md
    assert all((d / "tiny" / png).is_file() for png in ("table1_groups.png", "table3_delta.png", "figure4_delta.png"))


def test_merge_into_a_shared_folder_and_partial_report(tmp_path, tiny):
    p = str(_config(tmp_path))
    out = tmp_path / "o"
    assert R.main([p, "--out", str(out), "--shard", "0/2", "--quiet"], loader=_loader(tiny)) == 0
    assert R.main([p, "--out", str(out), "--merge", "--quiet", "--no-plots"], loader=_loader(tiny)) == 0
    rep = _report(out)
    assert len(rep["missing_units"]) == 7 and "Incomplete: 7 of 15 units missing" in (out / "tiny/report.md").read_text()
    assert R.main([p, "--out", str(out), "--merge", str(tmp_path / "nowhere"), "--quiet"]) == 2


def test_verdicts():
    v = R._verdict
    assert v({"mean": 5.0, "se": 1.0}, 7.5, None, None)[1] == "same"
    assert v({"mean": -5.0, "se": 1.0}, 7.5, None, None)[1] == "opposite"
    assert v({"mean": 1.0, "se": 1.0}, 7.5, None, None)[1] == "noise"
    assert v({"mean": 5.0, "se": 1.0}, None, None, None)[1] == "no_paper"
    note = {"max_abs_delta": 0.05, "text": "within 0.05"}
    assert v({"mean": 1.0, "se": 0.5}, None, note, {"mean": 0.04, "se": 0.01})[1] == "note_ok"
    assert v({"mean": 9.0, "se": 0.5}, None, note, {"mean": 0.3, "se": 0.01})[1] == "note_differs"
    row = {"method": "univer", "branches": {"enter": [0.5, 0.2], "tokens": [1.5, 0.4], "no_draft_accepted": 0.3}}
    ref = {"method": "rrsw", "branches": {"enter": [0.6, 0.1], "tokens": [2.0, 0.2], "no_draft_accepted": 0.3}}
    why = R._reason(row, ref)
    assert "rank 0" in why and "-0.500" in why and "P(no draft token accepted)" in why


def test_script_header_documents_the_commands():
    text = (REPO / "scripts" / "reproduce_paper.sh").read_text()
    assert "--quick" in text and "--dry-run" in text and "accelerate launch" in text and "--merge" in text
    assert os.access(REPO / "scripts" / "reproduce_paper.sh", os.X_OK)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_shared_prefill_equals_separate_tree_laws(tiny, temperature):
    from evaluation import exact_tau as X

    ids = torch.tensor([[3, 7, 1, 4, 9, 2, 6, 5, 8]])
    specs = [(t, r, s) for t in ("2x2", "chain3", "mc_sim_7b_63") for r, s in (("wor", 1), ("topk_residual", 2))]
    shared = list(X.tree_laws_shared(tiny, ids, [(t, r, torch.Generator().manual_seed(s)) for t, r, s in specs],
                                     temperature=temperature))
    for (t, r, s), got in zip(specs, shared):
        ref = tiny.tree_laws(ids, tree_choices=t, drafting=r, temperature=temperature,
                             generator=torch.Generator().manual_seed(s))
        for k in ("parents", "tokens", "depth", "target_probs", "draft_probs"):
            assert torch.equal(getattr(got, k), getattr(ref, k)), (t, r, k)
    ctxs = [{"question_id": 1, "group": "qa", "turn": 0, "position": 2, "input_ids": ids[0].tolist()},
            {"question_id": 2, "group": "qa", "turn": 0, "position": 3, "input_ids": ids[0, :6].tolist()}]
    many = X.score_contexts_trees(tiny, ctxs, ["rrsw", "univer"], trees=["2x2", "chain3"], temperature=temperature,
                                  seed=4)
    for t in ("2x2", "chain3"):
        assert many[t] == X.score_contexts(tiny, ctxs, ["rrsw", "univer"], tree=t, temperature=temperature, seed=4)


def test_identical_and_note_verdicts():
    assert R._verdict({"mean": 0.0, "se": 0.0}, None, None, None)[1] == "identical"
    note = {"max_abs_delta": 0.05, "text": "within 0.05"}
    assert R._verdict({"mean": 1.0, "se": None}, None, note, {"mean": 0.3, "se": None})[1] == "none"
