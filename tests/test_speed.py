"""Spec-Bench metrics on hand-made answer files with known tau, tokens/s, speedup and std."""
import json
import math

import pytest

from evaluation import speed


def _rec(qid, cat, method, seed, new_tokens, wall, accepts, tree="2x5"):
    return {"question_id": qid, "category": cat, "answer_id": "x", "model_id": "m", "tstamp": 0.0,
            "method": method, "seed": seed, "temperature": 1.0, "tree": None if method == "naive" else tree,
            "choices": [{"index": 0, "turns": ["a"] * len(new_tokens), "decoding_steps": [len(a) for a in accepts],
                         "new_tokens": new_tokens, "wall_time": wall, "accept_lengths": accepts}]}


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
        _rec(81, "writing", "univer", 0, [10, 10], [0.5, 0.5], [[2, 3], [4]]),
        _rec(161, "translation", "univer", 0, [20], [0.5], [[1, 2]])])
    # univer seed 1 (no baseline seed 1 -> baseline mean over its seeds): speeds 10 and 40; taus 3 and 2
    _write(d / "univer-temp1-2x5-seed1.jsonl", [
        _rec(81, "writing", "univer", 1, [10, 10], [1.0, 1.0], [[3, 3], [3]]),
        _rec(161, "translation", "univer", 1, [20], [0.5], [[2, 2]]),
        _rec(161, "translation", "univer", 1, [20], [9.0], [[9]])])  # duplicate id: ignored
    return d


def test_question_speed_and_flat_accepts():
    c = {"new_tokens": [10, 30], "wall_time": [1.0, 3.0], "accept_lengths": [[1, 2], [3]]}
    assert speed.question_speed(c) == pytest.approx(10.0)
    assert speed.flat_accept_lengths(c) == [1, 2, 3]
    assert speed.flat_accept_lengths({"accept_lengths": [1, 2, 3]}) == [1, 2, 3]  # Spec-Bench's flat form


def test_run_metrics_known_values(answers):
    recs = speed.load_answers(answers / "univer-temp1-2x5-seed0.jsonl")
    m = speed.run_metrics(recs)
    assert list(m) == ["mt_bench", "translation", "overall", "avg"]
    assert m["mt_bench"]["tau"] == pytest.approx(3.0)
    assert m["translation"]["tau"] == pytest.approx(1.5)
    assert m["overall"]["tau"] == pytest.approx(12 / 5)   # pooled over all 5 steps
    assert m["avg"]["tau"] == pytest.approx(2.25)         # mean of the category columns
    assert m["mt_bench"]["speed"] == pytest.approx(20.0)
    assert m["overall"]["speed"] == pytest.approx(30.0)
    assert m["overall"]["n_steps"] == 5 and m["overall"]["n_questions"] == 2


def test_summarize_speedup_and_std(answers):
    res = speed.summarize(speed.collect_runs([answers]))
    assert res["std_ddof"] == 0 and res["groups"] == ["mt_bench", "translation"]
    naive, univer = res["runs"]
    assert naive["method"] == "naive" and naive["tree"] is None
    assert naive["summary"]["overall"]["speedup"]["mean"] == pytest.approx(1.0)
    assert univer["seeds"] == [0, 1] and univer["tree"] == "2x5"
    s0, s1 = univer["per_seed"]["0"], univer["per_seed"]["1"]
    assert s0["overall"]["speedup"] == pytest.approx(2.0)
    assert s0["mt_bench"]["speedup"] == pytest.approx(2.0)
    assert s1["overall"]["speedup"] == pytest.approx(25 / 15)   # baseline mean over its seeds
    assert s1["translation"]["n_questions"] == 1                # duplicate question id counted once
    tau = univer["summary"]["overall"]["tau"]
    assert tau["mean"] == pytest.approx(2.5) and tau["std"] == pytest.approx(0.1)  # ddof=0
    sp = univer["summary"]["overall"]["speedup"]
    assert sp["mean"] == pytest.approx((2 + 25 / 15) / 2) and sp["std"] == pytest.approx((2 - 25 / 15) / 2)


def test_mean_std():
    assert speed.mean_std([1.0]) == {"mean": 1.0, "std": 0.0}
    assert speed.mean_std([1.0, 3.0])["std"] == pytest.approx(1.0)
    assert speed.mean_std([1.0, 3.0], ddof=1)["std"] == pytest.approx(math.sqrt(2))


def test_cli_writes_json(answers, tmp_path, capsys):
    out = tmp_path / "speed.json"
    speed.main([str(answers), "--out", str(out)])
    data = json.loads(out.read_text())
    assert [r["method"] for r in data["runs"]] == ["naive", "univer"]
    assert "univer" in capsys.readouterr().out
