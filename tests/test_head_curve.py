"""research.head_curve: head specs, rows sorted by training tokens, markdown and PNG, one-line CLI errors."""
import json

import pytest

from research import head_curve


def _head(tmp_path, name, counted=None):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text("{}")
    if counted is not None:
        (d / "train_log.json").write_text(json.dumps({"train_counted_positions": counted}))
    return d


def test_parse_heads_tokens_from_log_and_explicit(tmp_path):
    a, b = _head(tmp_path, "a", 1000), _head(tmp_path, "b", 50)
    got = head_curve.parse_heads([f"big={a}", f"small={b}"])
    assert [(h["label"], h["tokens"]) for h in got] == [("big", 1000), ("small", 50)]
    got = head_curve.parse_heads([f"big={a}", f"small={b}"], [7, 8])
    assert [h["tokens"] for h in got] == [7, 8]


@pytest.mark.parametrize("case", ["no_eq", "no_config", "dup", "count", "no_log", "negative"])
def test_parse_heads_errors(tmp_path, case):
    a, nolog = _head(tmp_path, "a", 10), _head(tmp_path, "nolog")
    specs, tokens, match = {
        "no_eq": ([str(a)], None, "LABEL=FOLDER"),
        "no_config": ([f"x={tmp_path}"], None, "no config.json"),
        "dup": ([f"x={a}", f"x={a}"], None, "given twice"),
        "count": ([f"x={a}"], [1, 2], "2 value"),
        "no_log": ([f"x={nolog}"], None, "train_counted_positions"),
        "negative": ([f"x={a}"], [-1], "< 0"),
    }[case]
    with pytest.raises(ValueError, match=match):
        head_curve.parse_heads(specs, tokens)


def _result(tmp_path):
    heads = [{"label": "late", "path": "p2", "tokens": 900}, {"label": "early", "path": "p1", "tokens": 100}]
    held = {"p1": {"top1_by_depth": [0.3, 0.2], "top4_by_depth": [0.5, 0.4]},
            "p2": {"top1_by_depth": [0.4, 0.35], "top4_by_depth": [0.6, 0.55]}}
    ex = {"early": {"qa": {"mean": 1.5, "se": 0.1}, "avg": {"mean": 1.6, "se": 0.05}},
          "late": {"qa": {"mean": 1.9, "se": None}, "avg": {"mean": 2.0, "se": 0.04}}}
    rows = head_curve.curve_rows(heads, held, ex)
    return {"heads": heads, "depths": 2, "heldout": {"sequences": 3, "positions": 40},
            "exact": {"method": "rrsw", "temperature": 0.0, "tree": "2x5", "reference": "ref.jsonl", "n_contexts": 12},
            "groups": ["qa"], "rows": rows, "seconds": 1.0}


def test_rows_sorted_rendered_and_plotted(tmp_path):
    res = _result(tmp_path)
    assert [r["label"] for r in res["rows"]] == ["early", "late"]
    assert res["rows"][0]["top1_by_depth"] == [0.3, 0.2]
    md = head_curve.render_curve(res)
    lines = [ln for ln in md.splitlines() if ln.startswith("| early") or ln.startswith("| late")]
    assert lines[0].startswith("| early | 100 | 0.300 | 0.200 | 0.500 | 0.400 | 1.500 ± 0.100 | 1.600 ± 0.050 |")
    assert "| 1.900 | 2.000 ± 0.040 |" in lines[1]
    png = head_curve.plot_curve(res, tmp_path / "c.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_are_one_line_naming_the_flag(tmp_path, capsys):
    a = _head(tmp_path, "a", 10)
    for argv, flag in ([["--head", str(a), "--reference", "r", "--question-file", "q", "--out", str(tmp_path)], "--head"],
                       [["--head", f"a={a}", "--reference", str(tmp_path / "none.jsonl"), "--question-file", "q",
                         "--out", str(tmp_path)], "--reference"],
                       [["--head", f"a={a}", "--reference", str(a / "config.json"), "--question-file", "q",
                         "--out", str(tmp_path), "--contexts-per-question", "0"], "--question-file"]):
        with pytest.raises(SystemExit) as e:
            head_curve.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0], err


def test_previous_rows_are_merged_only_on_the_same_fixed_sets(tmp_path):
    """--previous: an earlier run's rows are kept when its fixed sets match; any difference is named."""
    old = _result(tmp_path)
    new_heads = [{"label": "next", "path": "p3", "tokens": 5000}]
    new_rows = head_curve.curve_rows(new_heads, {"p3": {"top1_by_depth": [0.5, 0.4], "top4_by_depth": [0.7, 0.6]}},
                                     {"next": {"qa": {"mean": 2.2, "se": 0.1}, "avg": {"mean": 2.3, "se": 0.05}}})
    new = {**old, "heads": new_heads, "rows": new_rows}
    merged = head_curve.merge_previous(old, new)
    assert [r["label"] for r in merged["rows"]] == ["early", "late", "next"]
    assert [h["label"] for h in merged["heads"]] == ["late", "early", "next"]
    assert head_curve.previous_mismatches(old, new) == []
    other = {**new, "heldout": {**new["heldout"], "positions": 41}, "exact": {**new["exact"], "tree": "mc_sim_7b_63"}}
    assert head_curve.previous_mismatches(old, other) == ["heldout.positions: 40 != 41", "exact.tree: 2x5 != mc_sim_7b_63"]
    with pytest.raises(ValueError, match="positions"):
        head_curve.merge_previous(old, other)
    with pytest.raises(ValueError, match="early"):
        head_curve.merge_previous(old, {**new, "heads": [{"label": "early", "path": "p3", "tokens": 5000}]})


def test_cli_previous_mismatch_stops_before_any_work(tmp_path, capsys):
    a = _head(tmp_path, "a", 10)
    ref = tmp_path / "ref.jsonl"
    ref.write_text("{}\n")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(_result(tmp_path)))                 # tree 2x5, depths 2
    base = ["--head", f"a={a}", "--reference", str(ref), "--question-file", str(ref), "--out", str(tmp_path / "o")]
    for extra, needle in ((["--previous", str(old)], "exact.tree"),          # default tree mc_sim_7b_63
                          (["--previous", str(old), "--tree", "2x5", "--depths", "2"], None),
                          (["--previous", str(ref)], "not a head_curve.json"),
                          (["--previous", str(tmp_path / "none.json")], "not a head_curve.json")):
        if needle is None:                                            # a label clash, once the sets agree
            extra = extra[:-4] + ["--tree", "2x5", "--depths", "2", "--head", f"early={a}"]
            needle = "'early' already"
        with pytest.raises(SystemExit) as e:
            head_curve.main(base + extra)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--previous" in err[0] and needle in err[0], err
