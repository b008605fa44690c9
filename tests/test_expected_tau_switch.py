"""Issue 49 item 3: the per-cycle exact expected tau is behind a switch (``--expected-tau auto|on|off``,
auto = on on the CPU, off on CUDA), recorded in the answers, never timed; the tables cope without it."""
import json
import time

import pytest
import torch

import univer_patch  # noqa: F401  (registers traversal / greedy / univer)
from evaluation import arguments as A
from evaluation import specbench as SB
from eagle.testing import tiny_ea_model
from eagle.verify.registry import Verifier


def test_expected_tau_on_resolves_auto_by_device(monkeypatch):
    assert A.expected_tau_on("on", "cuda:1") is True and A.expected_tau_on("off", "cpu") is False
    assert A.expected_tau_on("auto", "cpu") is True and A.expected_tau_on("auto", torch.device("cpu")) is True
    assert A.expected_tau_on("auto", "cuda") is False and A.expected_tau_on("auto", torch.device("cuda", 1)) is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert A.expected_tau_on("auto", "auto") is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert A.expected_tau_on("auto", "auto") is True
    with pytest.raises(A.UsageError, match="^--expected-tau: use auto, on or off"):
        A.expected_tau_on("yes", "cpu")


def test_flag_is_parsed_checked_and_in_the_settings(tmp_path, capsys):
    from test_harness_args import _check, _questions

    q = str(_questions(tmp_path))
    base = ["--quick", "--device", "cpu", "--question-file", q, "--out", str(tmp_path / "o")]
    assert _check(base).expected_tau == "auto"
    cfg = _check(base + ["--expected-tau", "off"])
    assert cfg.expected_tau == "off" and cfg.settings()["expected_tau"] == "off"
    with pytest.raises(SystemExit) as e:
        _check(base + ["--expected-tau", "maybe"])
    assert e.value.code == 2 and "--expected-tau" in capsys.readouterr().err


def test_engine_never_times_the_expected_tau_work(monkeypatch):
    """A slowed-down outcome law (50 ms per cycle) is in neither wall_time nor any part."""
    model = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    sleep = 0.05
    original = Verifier.outcome_probs
    calls = []

    def slow(self, *a, **k):
        calls.append(1)
        time.sleep(sleep)
        return original(self, *a, **k)

    monkeypatch.setattr(Verifier, "outcome_probs", slow)
    t0 = time.perf_counter()
    _, st = model.eagenerate([1, 2, 3, 4], temperature=1.0, max_new_tokens=16, tree_choices="2x2",
                             verifier="univer", seed=0, return_stats=True, expected_tau=True)
    elapsed = time.perf_counter() - t0
    n = len(st["accept_lengths"])
    assert len(calls) == n == len(st["expected_accept_lengths"]) and n >= 2
    assert st["wall_time"] <= elapsed - n * sleep
    assert sum(st["timing"].values()) == pytest.approx(st["wall_time"], abs=1e-6)
    assert all(1.0 <= x <= 3.0 + 1e-9 for x in st["expected_accept_lengths"])  # 2x2: at most 2 drafted + bonus
    calls.clear()
    _, st = model.eagenerate([1, 2, 3, 4], temperature=1.0, max_new_tokens=16, tree_choices="2x2",
                             verifier="univer", seed=0, return_stats=True)
    assert not calls and "expected_accept_lengths" not in st


def test_main_job_without_expected_tau_omits_the_rao_blackwellised_table(tmp_path):
    from evaluation.templates import choose_format
    from harness_helpers import _CharTok
    from test_harness_args import _check, _questions

    q = str(_questions(tmp_path))
    out = tmp_path / "o"
    cfg = _check(["--quick", "--device", "cpu", "--tree", "2x2", "--speed-tree", "none", "--methods", "rrsw", "univer",
                  "--max-new-tokens", "4", "--contexts-per-question", "0", "--bootstrap", "20", "--no-progress",
                  "--expected-tau", "off", "--question-file", q, "--out", str(out)])
    torch.set_num_threads(1)
    model = tiny_ea_model(vocab_size=32, seed=0, aligned=True)
    tok = _CharTok()
    tok.chat_template = "{{ messages }}"
    model.tokenizer = tok
    run = SB.run_job(cfg, model, choose_format("tiny", tok, None))
    assert run["expected_tau"] is False and run["settings"]["expected_tau"] == "off"
    for f in (out / "answers").iterdir():
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            assert rec["expected_tau"] is False and "expected_accept_lengths" not in rec["choices"][0], f.name
    t1 = (out / "table1.md").read_text()
    assert "Rao-Blackwellised" not in t1 and "UniVer" in t1
    assert (out / "tau_by_group.png").is_file() and not (out / "tau_expected_by_group.png").exists()
    assert json.loads((out / "run.json").read_text())["expected_tau"] is False
