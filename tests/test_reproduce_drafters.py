"""evaluation.reproduce with any registered drafter and its options (issue 50 follow-up).

- The unit ids and stored unit settings of the EAGLE-head settings (``configs/paper/default-cpu.json``: drafter
  eagle, no options) are pinned byte for byte: a sweep computed before drafters had options merges with this code.
- A setting with options records the drafter and its options in each unit's settings (its resume key): a unit
  made with another draft model is refused.
- ``--dry-run`` lists the Llama-2-7B + Llama-68M cells with the draft model's hub id and loads nothing.
- Config errors name the key in one line (drafter, drafter_options, draft_model, head).
- End to end on tiny folders saved with ``save_pretrained`` (a target with a character tokenizer and a draft LM):
  the real loader drafts with ``draft_lm``, the stored exact tau equals a direct ``score_contexts`` computation.
"""
import json
from pathlib import Path

import pytest
import torch

from evaluation import reproduce as R
from harness_helpers import tiny_draft_lm_folders

REPO = Path(__file__).resolve().parents[1]
QS = [{"question_id": 81, "category": "writing", "turns": ["a", "b"]},
      {"question_id": 161, "category": "translation", "turns": ["c"]}]
METHODS = ["rrsw", "traversal", "greedy", "univer"]


# ------------------------------------------------------------------ the existing setting's keys, pinned
def _settings(seed, t, q, n, **extra):
    d = {"model": "default", "head": None, "draft_vocab": "auto", "template": None, "seed": seed, "temperature": t,
         "question_id": q, "draws": 1, "max_new_tokens": n}
    d.update(extra)
    return json.dumps(d)


def test_default_cpu_unit_ids_and_settings_are_unchanged():
    """The units of default-cpu (ids = file names, and the settings dict stored in each file, key order included)
    are exactly what the code before drafter options wrote."""
    s = R.load_setting(REPO / "configs/paper/default-cpu.json")
    assert s.drafter == "eagle" and s.drafter_options == {}
    units = R.plan_units(s, QS)
    fig4 = ["2x1@4", "2x2@4", "2x3@4", "2x4@4", "2x5@4", "2x6@4", "3x1@4", "3x2@4", "3x3@4", "3x4@4", "3x5@4",
            "4x1@4", "4x2@4", "4x3@4", "4x4@4"]
    table = ["2x5@6", "3x3@6", "mc_sim_7b_63@6"]
    assert [(u["id"], u.get("jobs")) for u in units] == [
        ("exact-s0-t0.3-q81", table), ("exact-s0-t0.3-q161", table), ("exact-s0-t0.6-q81", table),
        ("exact-s0-t0.6-q161", table), ("exact-s0-t1-q81", table + fig4), ("exact-s0-t1-q161", table + fig4),
        ("sampled-s0-t1-2x5-q81", None), ("sampled-s0-t1-2x5-q161", None)]
    got = [json.dumps(R._unit_settings(s, u)) for u in units]
    assert got[0] == _settings(0, 0.3, 81, 128, methods=METHODS)
    assert got[5] == _settings(0, 1.0, 161, 128, methods=METHODS)
    assert got[6] == _settings(0, 1.0, 81, 96, tree="2x5")
    assert got[0] == ('{"model": "default", "head": null, "draft_vocab": "auto", "template": null, "seed": 0, '
                      '"temperature": 0.3, "question_id": 81, "draws": 1, "max_new_tokens": 128, '
                      '"methods": ["rrsw", "traversal", "greedy", "univer"]}')
    q = R.load_setting(REPO / "configs/paper/default-cpu.json", quick=True)
    assert json.dumps(R._unit_settings(q, R.plan_units(q, QS)[-1])) == _settings(0, 1.0, 161, 24, tree="2x5")
    # a unit file of the running sweep (old code) counts as done here
    u = units[0]
    rec = {"settings": json.loads(_settings(0, 0.3, 81, 128, methods=METHODS)), "scores": dict.fromkeys(table, [])}
    assert R.unit_done(s, u, rec)


# ------------------------------------------------------------------ the Table 7 setting: dry run, keys
def test_llama2_68m_dry_run_lists_the_draft_model_and_loads_nothing(capsys):
    p = REPO / "configs/paper/llama2-7b-68m.json"
    s = R.load_setting(p)
    assert s.drafter == "draft_lm" and s.drafter_options == {"model_path_or_module": "JackFram/llama-68m"}
    assert s.head is None
    u = R.plan_units(s, QS)[0]
    key = R._unit_settings(s, u)
    assert key["drafter"] == "draft_lm" and key["drafter_options"] == {"model_path_or_module": "JackFram/llama-68m"}
    assert list(key)[-2:] == ["drafter", "drafter_options"]
    boom = lambda *a: (_ for _ in ()).throw(AssertionError("a dry run must not load a model"))  # noqa: E731
    assert R.main([str(p), "--dry-run"], loader=boom) == 0
    out = capsys.readouterr().out
    assert "drafter draft_lm (model_path_or_module=JackFram/llama-68m)" in out and "NOT RUNNABLE" not in out
    for cell in ("Table 7", "Table 7 trees"):
        assert any(line.strip().startswith(cell) and "T=1" in line for line in out.splitlines())
    assert " 2x5 " in out and " 3x3 " in out and " mc_sim_7b_63 " in out


def _write(tmp_path, **over):
    qf = tmp_path / "q.jsonl"
    qf.write_text("".join(json.dumps(q) + "\n" for q in QS))
    cfg = {"name": "t", "model": "default", "questions": {"file": str(qf), "set": "all"}, "seeds": [0],
           "methods": ["rrsw", "univer"], "tables": [{"table": "T", "layout": "groups", "temperatures": [1.0],
                                                      "trees": ["2x2"]}]}
    cfg.update(over)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.parametrize("change, key, words", [
    ({"drafter": "nonesuch"}, "drafter", "unknown drafter"),
    ({"drafter": 3}, "drafter", "drafter name"),
    ({"drafter": "draft_lm"}, "drafter_options", "needs model_path_or_module"),
    ({"drafter": "draft_lm", "drafter_options": ["x"]}, "drafter_options", "object"),
    ({"drafter": "draft_lm", "draft_model": "a/b", "drafter_options": {"model_path_or_module": "c/d"}},
     "draft_model", "disagree"),
    ({"drafter": "eagle", "draft_model": "a/b"}, "draft_model", "only with drafter 'draft_lm'"),
    ({"drafter": "draft_lm", "draft_model": "a/b", "drafter_options": {"layers": 2}}, "drafter_options",
     "unknown option"),
    ({"drafter": "prompt_lookup", "drafter_options": {"size": 2}}, "drafter_options", "no option"),
    ({"drafter": "eagle3"}, "drafter_options", "needs the EAGLE-3 head"),
    ({"drafter": "eagle3", "drafter_options": {"path": "/no/such/head"}}, "drafter_options", "does not exist"),
    ({"drafter": "hybrid", "model": "org/name"}, "head", "hybrid"),
])
def test_drafter_config_errors_name_the_key(tmp_path, change, key, words):
    with pytest.raises(R.ConfigError) as e:
        R.load_setting(_write(tmp_path, **change))
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 't.json'}: {key}: ") and words in msg and "\n" not in msg, msg


def test_settings_with_options_and_without():
    """Options enter the key; a drafter other than eagle without options adds only its name; both keep the
    EAGLE-era keys first."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        plain = R.load_setting(_write(d, drafter="prompt_lookup", model="org/name"))   # no head needed
        u = R.plan_units(plain, QS)[0]
        assert plain.head is None and R._unit_settings(plain, u)["drafter"] == "prompt_lookup"
        assert "drafter_options" not in R._unit_settings(plain, u)
        opt = R.load_setting(_write(d, drafter="hybrid", drafter_options={"lookup_weight": 0.75, "depth": 4}))
        k = R._unit_settings(opt, u)
        assert k["drafter"] == "hybrid" and k["drafter_options"] == {"lookup_weight": 0.75, "depth": 4}
        assert opt.drafter_text() == "hybrid (lookup_weight=0.75, depth=4)"
        assert list(k)[:10] == list(R._unit_settings(R.load_setting(_write(d)), u))


# ------------------------------------------------------------------ end to end on tiny folders
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny target (with tokenizer and chat template) and two draft LMs (``near``: a noisy copy, ``far``)."""
    return tiny_draft_lm_folders(tmp_path_factory.mktemp("tiny_dlm"))


QUESTIONS = [{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
             {"question_id": 241, "category": "qa", "turns": ["Why is the sky blue?"]}]


def _dlm_config(tmp_path, folders, draft="near", **over):
    qf = tmp_path / "q.jsonl"
    qf.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    cfg = {"name": "tiny-dlm", "model": str(folders / "target"), "drafter": "draft_lm",
           "drafter_options": {"model_path_or_module": str(folders / draft)}, "device": "cpu", "dtype": "float32",
           "questions": {"file": str(qf), "set": "all"}, "seeds": [0], "methods": ["rrsw", "univer"],
           "max_new_tokens": 6, "contexts_per_question": 2, "bootstrap": 20,
           "tables": [{"table": "Table 7", "layout": "groups", "temperatures": [1.0], "trees": ["2x2"]}],
           "sampled_check": {"temperature": 1.0, "tree": "2x2", "per_category": 1, "max_new_tokens": 4}}
    cfg.update(over)
    p = tmp_path / f"dlm-{draft}.json"
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.filterwarnings("ignore")
def test_draft_lm_setting_end_to_end(tmp_path, folders):
    from evaluation import exact_tau as X
    from evaluation.exact_tau import shared_contexts

    p = _dlm_config(tmp_path, folders)
    out = tmp_path / "out"
    assert R.main([str(p), "--out", str(out), "--quiet", "--no-plots"]) == 0   # the real loader
    udir = out / "tiny-dlm" / "units"
    names = sorted(f.name for f in udir.glob("*.json"))
    assert names == ["exact-s0-t1-q241.json", "exact-s0-t1-q81.json", "sampled-s0-t1-2x2-q241.json",
                     "sampled-s0-t1-2x2-q81.json"]
    rep = json.loads((out / "tiny-dlm" / "report.json").read_text())
    assert rep["missing_units"] == [] and rep["drafter"] == "draft_lm"
    assert rep["drafter_options"] == {"model_path_or_module": str(folders / "near")}
    cell = rep["cells"][0]
    assert cell["units_done"] == 2 and {r["method"] for r in cell["exact"]["rows"]} == {"rrsw", "univer"}
    assert all(r["avg_tau"]["mean"] >= 1.0 for r in cell["exact"]["rows"])
    assert "drafter `draft_lm` (model_path_or_module=" in (out / "tiny-dlm" / "report.md").read_text()
    rec = json.loads((udir / "exact-s0-t1-q81.json").read_text())
    assert rec["settings"]["drafter"] == "draft_lm"
    assert rec["settings"]["drafter_options"] == {"model_path_or_module": str(folders / "near")}
    # the direct computation: the setting's own model drafts with draft_lm; same contexts, same seeds
    s = R.load_setting(p)
    model, fmt = R.load_for_setting(s)
    assert model.drafter.name == "draft_lm" and model.ea_layer is None
    ref = [{"question_id": 81, "category": "writing", "choices": [rec["reference"]]}]
    ctxs = shared_contexts(ref, QUESTIONS[:1], lambda msgs: fmt.ids(model.tokenizer, msgs), 2)
    direct = X.score_contexts(model, ctxs, ["rrsw", "univer"], tree="2x2", temperature=1.0, seed=0)
    assert rec["scores"]["2x2@2"] == direct
    # resuming: nothing left; another draft model in the same folder is refused, naming drafter_options
    assert R.main([str(p), "--out", str(out), "--quiet", "--no-plots"],
                  loader=lambda *a: (_ for _ in ()).throw(AssertionError("nothing to run"))) == 0
    other = R.load_setting(_dlm_config(tmp_path, folders, draft="far"))
    with pytest.raises(R.ConfigError, match=r"--out: unit .* other settings \(drafter_options\)"):
        R.run_units(other, R.pick_questions(other), out, log=lambda m: None)
