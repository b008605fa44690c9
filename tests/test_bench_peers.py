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
    md = out.with_suffix(".md").read_text()
    printed = capsys.readouterr().out
    assert md.strip() == printed.strip()
    assert "| contender | tokens/s | ratio to plain | ratio to HF PLD | tau | equal to greedy |" in md
    assert f"| {n}/{n} |" in md and "HF prompt lookup" in md and "ours: API defaults" in md


def test_peer_table_sampling_skips_hf(tiny, qfile, tmp_path):
    doc = B.main(["--temperature", "1", "--ours", "eagle:2x2", "--question-file", str(qfile), "--question-set",
                  "all", "--per-category", "1", "--max-new-tokens", "6", "--out", str(tmp_path / "t1.json"),
                  "--no-progress"], model=tiny)
    assert [r["key"] for r in doc["rows"]] == ["plain", "ours:eagle:2x2"]
    assert all("equal" not in r and "ratio_hf_pld" not in r for r in doc["rows"])
    assert doc["meta"]["verifier"] == "univer"


def test_paired_ratio():
    est, se = B.paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0], n_boot=100)
    assert est == pytest.approx(2.0) and se == pytest.approx(0.0, abs=1e-12)  # same ratio on every question
    assert B.paired_ratio([2.0], [1.0])[1] is None


@pytest.mark.parametrize("argv, flag", [
    (["--ours", "bogus"], "--ours"),
    (["--ours", "eagle:nonsense"], "--ours"),
    (["--ours", "prompt_lookup:2x5"], "--ours"),
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "1", "--verifier", "bogus"], "--verifier"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
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
