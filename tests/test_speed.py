"""Spec-Bench metrics on hand-made answer files: one tau definition, known bootstrap errors, Spec-Bench's format."""
import json
import math

import numpy as np
import pytest

from evaluation import speed
from harness_helpers import specbench_speed


def _rec(qid, cat, method, seed, new_tokens, wall, accepts, tree="2x5", expected=None, timing=None):
    """A record in our (Spec-Bench) format: ``accepts`` per turn, written as ONE flat list."""
    choice = {"index": 0, "turns": ["a"] * len(new_tokens), "decoding_steps": [len(a) for a in accepts],
              "new_tokens": new_tokens, "wall_time": wall, "accept_lengths": [x for a in accepts for x in a]}
    if expected is not None:
        choice["expected_accept_lengths"] = expected
    if timing is not None:
        choice["timing"] = timing
    return {"question_id": qid, "category": cat, "answer_id": "x", "model_id": "m", "tstamp": 0.0,
            "method": method, "seed": seed, "temperature": 1.0, "tree": None if method == "naive" else tree,
            "choices": [choice]}


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture
def answers(tmp_path):
    d = tmp_path / "answers"
    d.mkdir()
    # baseline: mt_bench 20 tokens / 2 s = 10 tokens/s; translation 20 tokens / 1 s = 20 tokens/s
    _write(d / "naive-temp1-seed0.jsonl", [
        _rec(81, "writing", "naive", 0, [10, 10], [1.0, 1.0], [[1] * 9, [1] * 9]),
        _rec(161, "translation", "naive", 0, [20], [1.0], [[1] * 19])])
    # univer seed 0: speeds 20 and 40; taus mt 3, translation 1.5
    _write(d / "univer-temp1-2x5-seed0.jsonl", [
        _rec(81, "writing", "univer", 0, [10, 10], [0.5, 0.5], [[2, 3], [4]],
             timing=[{"draft": 0.2, "target_forward": 0.2, "verify": 0.05, "other": 0.05}] * 2),
        _rec(161, "translation", "univer", 0, [20], [0.5], [[1, 2]],
             timing=[{"draft": 0.2, "target_forward": 0.2, "verify": 0.05, "other": 0.05}])])
    # univer seed 1 (no baseline seed 1 -> baseline mean over its seeds): speeds 10 and 40; taus 3 and 2
    _write(d / "univer-temp1-2x5-seed1.jsonl", [
        _rec(81, "writing", "univer", 1, [10, 10], [1.0, 1.0], [[3, 3], [3]]),
        _rec(161, "translation", "univer", 1, [20], [0.5], [[2, 2]]),
        _rec(161, "translation", "univer", 1, [20], [9.0], [[9]])])  # duplicate id: ignored
    return d


def test_question_speed_and_flat_accepts():
    c = {"new_tokens": [10, 30], "wall_time": [1.0, 3.0], "accept_lengths": [1, 2, 3]}
    assert speed.question_speed(c) == pytest.approx(10.0)
    assert speed.flat_accept_lengths(c) == [1, 2, 3]
    assert speed.flat_accept_lengths({"accept_lengths": [[1, 2], [3]]}) == [1, 2, 3]  # older nested files


def test_one_tau_definition(answers):
    recs = speed.load_answers(answers / "univer-temp1-2x5-seed0.jsonl")
    m = speed.run_metrics(recs)
    assert list(m) == ["mt_bench", "translation", "avg", "pooled", "overall"]
    assert m["mt_bench"]["tau"] == pytest.approx(3.0) == speed.group_tau(recs[:1])
    assert m["translation"]["tau"] == pytest.approx(1.5)
    assert m["avg"]["tau"] == pytest.approx(2.25)            # mean of the category groups: THE headline tau
    assert m["overall"]["tau"] == m["avg"]["tau"]            # the same number wherever "tau" is printed
    assert m["pooled"]["tau"] == pytest.approx(12 / 5)       # all steps pooled: labelled, never the headline
    assert m["mt_bench"]["speed"] == pytest.approx(20.0)
    assert m["overall"]["speed"] == pytest.approx(30.0)
    assert m["overall"]["n_steps"] == 5 and m["overall"]["n_questions"] == 2


def test_summarize_speedup_std_and_timing(answers):
    res = speed.summarize(speed.collect_runs([answers]), n_boot=200)
    assert res["std_ddof"] == 1 and res["groups"] == ["mt_bench", "translation"]
    naive, univer = res["runs"]
    assert naive["method"] == "naive" and naive["tree"] is None
    assert naive["summary"]["overall"]["speedup"]["mean"] == pytest.approx(1.0)
    assert univer["seeds"] == [0, 1] and univer["tree"] == "2x5"
    s0, s1 = univer["per_seed"]["0"], univer["per_seed"]["1"]
    assert s0["overall"]["speedup"] == pytest.approx(2.0)
    assert s0["mt_bench"]["speedup"] == pytest.approx(2.0)
    assert s1["overall"]["speedup"] == pytest.approx(25 / 15)   # baseline mean over its seeds
    assert s1["translation"]["n_questions"] == 1                # duplicate question id counted once
    tau = univer["summary"]["avg"]["tau"]                       # seed taus 2.25 and 2.5
    assert tau["mean"] == pytest.approx(2.375) and tau["std"] == pytest.approx(0.125 * math.sqrt(2))  # ddof=1
    assert tau["se"] is None        # one question per group: no bootstrap error (unknown, not zero)
    assert s0["mt_bench"]["tau_se"] is None
    t = univer["timing"]
    assert t["seconds"] == pytest.approx({"draft": 0.6, "target_forward": 0.6, "verify": 0.15, "other": 0.15})
    assert sum(t["share"].values()) == pytest.approx(1.0) and t["share"]["draft"] == pytest.approx(0.4)
    assert naive["timing"] is None
    assert speed.speed_sentence(univer) == ("univer on tree 2x5 generated 1.83x as many tokens per second as "
                                            "plain decoding (83% faster).")


def test_single_seed_has_no_std():
    assert speed.mean_std([1.0]) == {"mean": 1.0, "std": None, "se": None}
    assert speed.mean_std([1.0, 3.0])["std"] == pytest.approx(math.sqrt(2))
    assert speed.mean_std([1.0, 3.0], [0.3, 0.4])["se"] == pytest.approx(0.25)


def _group_file(path, values_by_group, method="rrsw", seed=0):
    """One single-step, single-turn question per value (tau of a question = its value)."""
    recs, qid = [], 1000
    for cat, vals in values_by_group.items():
        for v in vals:
            recs.append(_rec(qid, cat, method, seed, [v + 1], [1.0], [[v]]))
            qid += 1
    _write(path, recs)


def test_bootstrap_known_interval(tmp_path):
    # two questions with tau 1 and 3: resampling 2 of 2 gives 1, 2, 3 with probabilities 1/4, 1/2, 1/4,
    # so the bootstrap SE is sqrt(1/2) and the 95% percentile interval is [1, 3]
    _group_file(tmp_path / "a.jsonl", {"qa": [1, 3]})
    res = speed.bootstrap_run_set({"rrsw": speed.load_answers(tmp_path / "a.jsonl")}, n_boot=20000, seed=1)
    e = res["rrsw"]["qa"]
    assert e["tau_se"] == pytest.approx(math.sqrt(0.5), rel=0.03)
    assert e["tau_ci95"] == [1.0, 3.0]
    # four questions 1, 2, 3, 6: ideal bootstrap SE of a mean = sqrt(sum (x - mean)^2) / n = sqrt(14) / 4
    _group_file(tmp_path / "b.jsonl", {"qa": [1, 2, 3, 6], "rag": [2, 2, 2, 2]})
    res = speed.bootstrap_run_set({"rrsw": speed.load_answers(tmp_path / "b.jsonl")}, n_boot=20000, seed=2)["rrsw"]
    assert res["qa"]["tau_se"] == pytest.approx(math.sqrt(14) / 4, rel=0.03)
    assert res["rag"]["tau_se"] == 0.0                              # no spread: exactly zero
    assert res["avg"]["tau_se"] == pytest.approx(math.sqrt(14) / 8, rel=0.03)  # Avg = (qa + rag) / 2


def test_bootstrap_paired_delta(tmp_path):
    # univer = rrsw + 0.5 on every question: the paired delta has a much smaller error than either tau
    _group_file(tmp_path / "r.jsonl", {"qa": [1, 2, 3, 6], "rag": [1, 4, 2, 5]})
    recs_r = speed.load_answers(tmp_path / "r.jsonl")
    recs_u = json.loads(json.dumps(recs_r))
    for r in recs_u:
        r["method"] = "univer"
        r["choices"][0]["accept_lengths"] = [a + 0.5 for a in r["choices"][0]["accept_lengths"]]
    res = speed.bootstrap_run_set({"rrsw": recs_r, "univer": recs_u}, n_boot=4000, seed=0)
    assert res["univer"]["delta_pct"]["tau_se"] < 0.5 * 100 * res["rrsw"]["avg"]["tau_se"] / 3.0
    assert res["rrsw"]["delta_pct"] is None


def test_cli_writes_json_and_prints_the_same_tau(answers, tmp_path, capsys):
    out = tmp_path / "speed.json"
    speed.main([str(answers), "--out", str(out), "--bootstrap", "50"])
    data = json.loads(out.read_text())
    assert [r["method"] for r in data["runs"]] == ["naive", "univer"]
    printed = capsys.readouterr().out
    assert "Avg tau 2.38" in printed and "all steps pooled" in printed


def test_specbench_speed_reads_our_two_turn_files(answers):
    tokenize = lambda text: [0] + [1] * len(text)  # noqa: E731  (BOS + one id per character)
    meth, base = answers / "univer-temp1-2x5-seed0.jsonl", answers / "naive-temp1-seed0.jsonl"
    ours = speed.run_metrics(speed.load_answers(meth))
    for task in ("mt_bench", "translation", "overall"):
        tps, tps0, ratio, mean_acc = specbench_speed(meth, base, tokenize, task)
        key = "pooled" if task == "overall" else task
        assert mean_acc == pytest.approx(ours[key]["tau"])
        assert tps == pytest.approx(ours["overall" if task == "overall" else task]["speed"])


def test_two_seeds_two_methods_errors_combine(tmp_path):
    d = tmp_path / "ans"
    d.mkdir()
    for seed, shift in ((0, 0.0), (1, 0.2)):
        for method, extra in (("rrsw", 0.0), ("univer", 0.3)):
            recs, qid = [], 1000
            for cat, vals in {"qa": [1, 2, 3], "rag": [2, 4, 3]}.items():
                for v in vals:
                    recs.append(_rec(qid, cat, method, seed, [5], [1.0], [[v + shift + extra]]))
                    qid += 1
            _write(d / f"{method}-{seed}.jsonl", recs)
    res = speed.summarize(speed.collect_runs([d]), n_boot=400)
    rrsw, univer = res["runs"]
    assert (rrsw["method"], univer["method"]) == ("rrsw", "univer")
    ses = [univer["per_seed"][s]["avg"]["tau_se"] for s in ("0", "1")]
    avg = univer["summary"]["avg"]["tau"]
    assert avg["mean"] == pytest.approx((2.5 + 0.3 + 2.7 + 0.3) / 2)
    assert avg["se"] == pytest.approx(math.sqrt(ses[0] ** 2 + ses[1] ** 2) / 2)
    assert avg["std"] == pytest.approx(0.2 / math.sqrt(2))
    # univer = rrsw + 0.3 on every step: paired, the delta's error is far below an unpaired one
    delta = univer["delta_pct"]["tau"]
    assert delta["mean"] == pytest.approx(100 * ((0.3 / 2.5 + 0.3 / 2.7) / 2))
    r = rrsw["summary"]["avg"]["tau"]
    unpaired = 100 * math.sqrt(2) * r["se"] / r["mean"]
    assert delta["se"] < 0.15 * unpaired and rrsw["delta_pct"] is None


def test_group_without_decoding_steps_is_not_nan(tmp_path):
    """A group whose only answer ended at its first token (e.g. an immediate EOS) has no steps: its tau is
    None (not NaN, which is not JSON), Avg is the mean of the other groups and names the empty one."""
    d = tmp_path / "answers"
    d.mkdir()
    _write(d / "naive-temp1-seed0.jsonl", [_rec(81, "writing", "naive", 0, [1], [0.1], [[]]),
                                            _rec(161, "translation", "naive", 0, [4], [0.4], [[1, 1, 1]])])
    _write(d / "univer-temp1-2x5-seed0.jsonl", [_rec(81, "writing", "univer", 0, [1], [0.1], [[]]),
                                                 _rec(161, "translation", "univer", 0, [4], [0.2], [[2, 1]])])
    sp = speed.summarize(speed.collect_runs([d]), n_boot=50)
    text = json.dumps(sp)
    assert "NaN" not in text
    run = next(r for r in sp["runs"] if r["method"] == "univer")
    seed0 = run["per_seed"]["0"]
    assert seed0["mt_bench"]["tau"] is None
    assert seed0["avg"]["tau"] == pytest.approx(1.5) and seed0["avg"]["groups_without_steps"] == ["mt_bench"]
