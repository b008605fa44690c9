"""Paired comparison of two run sets (two heads) on shared questions: known differences and errors."""
import json
import math

import pytest

from evaluation import speed
from research import paired
from test_speed import _group_file


def _shift(src, dst, by):
    recs = speed.load_answers(src)
    for r, b in zip(recs, by):
        r["choices"][0]["accept_lengths"] = [a + b for a in r["choices"][0]["accept_lengths"]]
    dst.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_constant_shift_has_zero_error_and_counts_groups(tmp_path):
    _group_file(tmp_path / "a.jsonl", {"qa": [1, 2, 3, 6], "rag": [1, 4, 2, 5]})
    _shift(tmp_path / "a.jsonl", tmp_path / "b.jsonl", [0.5] * 8)
    res = paired.compare(speed.load_answers(tmp_path / "a.jsonl"), speed.load_answers(tmp_path / "b.jsonl"))
    assert res["a"]["qa"] == pytest.approx(3.0) and res["b"]["qa"] == pytest.approx(3.5)
    for g in ("qa", "rag", "avg"):
        assert res["delta"][g]["mean"] == pytest.approx(0.5)
        assert res["delta"][g]["se"] == pytest.approx(0.0, abs=1e-9)   # same shift on every question
    assert res["b_higher_groups"] == 2 and res["n_questions"] == {"qa": 4, "rag": 4}
    # the unpaired errors are large: pairing is what makes the difference visible
    boot = speed.bootstrap_run_set({"a": speed.load_answers(tmp_path / "a.jsonl")})
    assert boot["a"]["qa"]["tau_se"] > 0.5


def test_known_paired_error(tmp_path):
    # differences 0 and 2 on two qa questions: the bootstrap SE of their mean is sqrt(1/2)
    _group_file(tmp_path / "a.jsonl", {"qa": [1, 3], "rag": [2, 2]})
    _shift(tmp_path / "a.jsonl", tmp_path / "b.jsonl", [0, 2, 0, 0])
    res = paired.compare(speed.load_answers(tmp_path / "a.jsonl"), speed.load_answers(tmp_path / "b.jsonl"),
                         n_boot=20000, seed=3)
    assert res["delta"]["qa"]["mean"] == pytest.approx(1.0)
    assert res["delta"]["qa"]["se"] == pytest.approx(math.sqrt(0.5), rel=0.03)
    assert res["delta"]["rag"]["se"] == 0.0
    assert res["delta"]["avg"]["se"] == pytest.approx(math.sqrt(0.5) / 2, rel=0.03)


def test_only_shared_questions_count(tmp_path):
    _group_file(tmp_path / "a.jsonl", {"qa": [1, 3, 5]})
    recs_b = speed.load_answers(tmp_path / "a.jsonl")[:2]          # B answered only the first two
    res = paired.compare(speed.load_answers(tmp_path / "a.jsonl"), recs_b)
    assert res["a"]["qa"] == pytest.approx(2.0) and res["n_questions"] == {"qa": 2}
    with pytest.raises(ValueError, match="share no question"):
        paired.compare(speed.load_answers(tmp_path / "a.jsonl")[2:], recs_b)


def test_cli_table_and_errors(tmp_path, capsys):
    (tmp_path / "A").mkdir(), (tmp_path / "B").mkdir()
    _group_file(tmp_path / "A" / "rrsw.jsonl", {"qa": [1, 2], "rag": [3, 4]})
    _shift(tmp_path / "A" / "rrsw.jsonl", tmp_path / "B" / "rrsw.jsonl", [1, 1, 1, 1])
    out = paired.main(["--a", str(tmp_path / "A"), "--b", str(tmp_path / "B"), "--labels", "old", "new",
                       "--out", str(tmp_path / "p.json")])
    text = capsys.readouterr().out
    assert "| new - old |" in text and "**+1.000 ± 0.000**" in text and "higher in 2 of 2" in text
    assert out[0]["method"] == "rrsw" and json.loads((tmp_path / "p.json").read_text())["labels"] == ["old", "new"]
    with pytest.raises(SystemExit):
        paired.main(["--a", str(tmp_path / "nope"), "--b", str(tmp_path / "B")])
    assert "--a: not found" in capsys.readouterr().err
    _group_file(tmp_path / "C.jsonl", {"qa": [1, 2]}, method="univer")
    with pytest.raises(SystemExit):
        paired.main(["--a", str(tmp_path / "A"), "--b", str(tmp_path / "C.jsonl")])
    assert "no (method, temperature, tree, seed) in both" in capsys.readouterr().err


def test_gzip_answer_files_read_like_plain_ones(tmp_path):
    import gzip
    (tmp_path / "A").mkdir()
    _group_file(tmp_path / "A" / "rrsw.jsonl", {"qa": [1, 3]})
    with gzip.open(tmp_path / "rrsw.jsonl.gz", "wt") as f:
        f.write((tmp_path / "A" / "rrsw.jsonl").read_text())
    assert speed.load_answers(tmp_path / "rrsw.jsonl.gz") == speed.load_answers(tmp_path / "A" / "rrsw.jsonl")
    (tmp_path / "G").mkdir()
    (tmp_path / "rrsw.jsonl.gz").rename(tmp_path / "G" / "rrsw.jsonl.gz")
    res = paired.compare_runs([str(tmp_path / "A")], [str(tmp_path / "G")])
    assert res[0]["delta"]["avg"]["mean"] == 0.0


def _exact_file(path, values, temperature=1.0, tree="2x5"):
    """An exact_tau.json with one context per (question, position): ``values`` = {(qid, group): [v, ...]}."""
    ctx = [{"question_id": q, "group": g, "turn": 0, "position": i, "context_tokens": 10, "values": {"rrsw": v}}
           for (q, g), vs in values.items() for i, v in enumerate(vs)]
    path.write_text(json.dumps({"temperature": temperature, "tree": tree, "seed": 0, "contexts": ctx}))
    return str(path)


def test_exact_files_pair_contexts(tmp_path, capsys):
    va = {(1, "qa"): [1.0, 2.0], (2, "qa"): [3.0, 3.0], (3, "rag"): [2.0], (4, "rag"): [4.0]}
    vb = {k: [x + 0.25 for x in v] for k, v in va.items()}
    vb[(5, "rag")] = [9.0]                                     # only in B: not compared
    a, b = _exact_file(tmp_path / "a.json", va), _exact_file(tmp_path / "b.json", vb)
    assert paired.is_exact_file(a) and not paired.is_exact_file(str(tmp_path / "nope.json"))
    (r,) = paired.compare_exact(a, b, n_boot=500)
    assert r["a"]["qa"] == pytest.approx(2.25) and r["n_contexts"] == 6 and r["n_questions"] == {"qa": 2, "rag": 2}
    for g in ("qa", "rag", "avg"):
        assert r["delta"][g]["mean"] == pytest.approx(0.25) and r["delta"][g]["se"] == pytest.approx(0.0, abs=1e-9)
    paired.main(["--a", a, "--b", b])
    assert "**+0.250 ± 0.000**" in capsys.readouterr().out
    with pytest.raises(ValueError, match="differ in temperature"):
        paired.compare_exact(a, _exact_file(tmp_path / "c.json", vb, temperature=0.0))
    with pytest.raises(SystemExit):                            # an exact file against answer folders
        paired.main(["--a", a, "--b", str(tmp_path)])
    assert "either answer files/folders on both sides or one exact_tau.json" in capsys.readouterr().err


@pytest.mark.parametrize("damage, message", [
    (lambda r: r["choices"][0].__setitem__("accept_lengths", [1.0, float("nan")]), "not a finite number"),
    (lambda r: r.pop("question_id"), "question_id must be an integer"),
    (lambda r: r.pop("category"), "category must be a string"),
    (lambda r: r.__setitem__("choices", []), "choices must be a non-empty list"),
    (lambda r: r["choices"][0].__setitem__("accept_lengths", ["2"]), "not a finite number"),
    (lambda r: r.__setitem__("temperature", "hot"), "temperature must be a number"),
])
def test_malformed_records_fail_with_file_and_field(tmp_path, capsys, damage, message):
    (tmp_path / "A").mkdir(), (tmp_path / "B").mkdir()
    _group_file(tmp_path / "A" / "r.jsonl", {"qa": [1, 2]})
    recs = speed.load_answers(tmp_path / "A" / "r.jsonl")
    damage(recs[1])
    (tmp_path / "B" / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(SystemExit):
        paired.main(["--a", str(tmp_path / "A"), "--b", str(tmp_path / "B")])
    err = capsys.readouterr().err
    assert message in err and "r.jsonl (record 2)" in err and "Traceback" not in err


def test_bad_files_and_sets_fail_clearly(tmp_path, capsys):
    (tmp_path / "A").mkdir(), (tmp_path / "E").mkdir()
    _group_file(tmp_path / "A" / "r.jsonl", {"qa": [1, 2]})
    (tmp_path / "bad.jsonl.gz").write_text("not gzip")
    for args, message in ((["--b", str(tmp_path / "bad.jsonl.gz")], "not a readable answer file"),
                          (["--b", str(tmp_path / "E")], "--b: no answer records"),
                          (["--b", str(tmp_path / "A"), "--out", str(tmp_path / "A" / "r.jsonl")], "is one of the inputs"),
                          (["--b", str(tmp_path / "A"), "--out", str(tmp_path)], "is a folder"),
                          (["--b", str(tmp_path / "A"), "--labels", "", "x"], "must not be empty")):
        with pytest.raises(SystemExit):
            paired.main(["--a", str(tmp_path / "A"), *args])
        assert message in capsys.readouterr().err
    # the same question filed under another category on the other side: not the same question set
    recs = speed.load_answers(tmp_path / "A" / "r.jsonl")
    recs[0]["category"] = "rag"
    with pytest.raises(ValueError, match="not the same question set"):
        paired.compare(speed.load_answers(tmp_path / "A" / "r.jsonl"), recs)
    # no decoding steps on one side
    for r in recs:
        r["category"], r["choices"][0]["accept_lengths"] = "qa", []
    with pytest.raises(ValueError, match="no decoding steps"):
        paired.compare(speed.load_answers(tmp_path / "A" / "r.jsonl"), recs)


def test_malformed_exact_files_fail_clearly(tmp_path):
    a = _exact_file(tmp_path / "a.json", {(1, "qa"): [1.0], (2, "qa"): [2.0]})
    d = json.loads(open(a).read())
    d["contexts"][1]["values"]["rrsw"] = float("nan")
    (tmp_path / "b.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="context 1 needs"):
        paired.compare_exact(a, str(tmp_path / "b.json"))
    (tmp_path / "list.json").write_text(json.dumps(["contexts"]))
    assert not paired.is_exact_file(str(tmp_path / "list.json"))
    d = json.loads(open(a).read())
    d["reference"] = "other.jsonl"
    (tmp_path / "c.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="differ in reference"):
        paired.compare_exact(a, str(tmp_path / "c.json"))


def test_speed_cli_names_a_bad_record(tmp_path, capsys):
    _group_file(tmp_path / "r.jsonl", {"qa": [1, 2]})
    recs = speed.load_answers(tmp_path / "r.jsonl")
    recs[0]["choices"][0]["accept_lengths"] = [float("inf")]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(SystemExit):
        speed.main([str(tmp_path / "r.jsonl")])
    assert "record 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        speed.main([str(tmp_path / "missing")])
    assert "not found" in capsys.readouterr().err
