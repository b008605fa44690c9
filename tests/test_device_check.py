"""scripts/device_check.sh --dry-run: the GPU check's code path on tiny shapes on the CPU; the sync bound
fails when set below the reads a cycle makes; the Vicuna prompt without fschat (the GPU machine has only
torch and transformers)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

CHECKS = ["verifier_laws", "sync_counts", "temperature0", "temperature1_law", "seeded_tiny", "cycle_7b",
          "harness_e2e", "seeded_7b", "bench_verify", "head_training", "placement_cuda1"]
METHODS = ["greedy", "rrsw", "traversal", "univer"]


def _script():
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "scripts" / "device_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "device_check.json").read_text()), (out / "device_check.md").read_text()


def test_device_check_dry_run(dry_run):
    out, res, md = dry_run
    assert res["env"]["dry_run"] and res["env"]["device"] == "cpu"
    assert list(res["checks"]) == CHECKS
    assert all(c["ok"] for c in res["checks"].values()), {k: c["summary"] for k, c in res["checks"].items()}
    assert res["checks"]["placement_cuda1"]["summary"].startswith("skipped: needs 2 GPUs")  # no GPU here
    ht = res["checks"]["head_training"]["detail"]
    assert ht["features_on_cpu"] and ht["last_loss"] < ht["first_loss"] and len(ht["eval_top1_by_depth"]) == 3
    laws = res["checks"]["verifier_laws"]["detail"]
    assert {k.split("/")[2] for k in laws} == {"float32", "float16", "bfloat16"}  # bfloat16 runs on the CPU


def test_sync_counts_every_verifier_both_trees(dry_run):
    _, res, md = dry_run
    sync = res["checks"]["sync_counts"]["detail"]
    assert sync["bound"] == 8
    assert set(sync["cases"]) == {f"{m}@T{t}/{tree}" for tree in ("2x5", "mc_sim_7b_63")
                                  for m, t in [("argmax", 0)] + [(m, 1) for m in METHODS]}
    for row in sync["cases"].values():
        assert row["cycles"] >= 2 and 1 <= row["max_reads"] <= 8 and row["max_verifier_reads"] <= 1
        assert "max_cuda_syncs" not in row  # counted on CUDA only
    assert "Host reads per cycle (bound 8" in md and "| univer@T1/mc_sim_7b_63 |" in md


def test_temperature_checks_cover_dtypes_draft_vocab_and_pruned_trees(dry_run):
    _, res, _ = dry_run
    t0 = res["checks"]["temperature0"]["detail"]
    one = t0["draft_vocab_one_token"]
    assert one["k"] == 1 and one["equal"] == one["runs"] == 2 and one["pruned"] == one["trees"] > 0
    assert t0["draft_vocab_every_other"]["equal"] == 2
    t1 = res["checks"]["temperature1_law"]["detail"]
    cases = ["float32", "float16", "bfloat16", "draft_vocab", "pruned_top_k3", "pruned_top_p0.4"]
    assert set(t1) == {f"{c}/{m}" for c in cases for m in METHODS}
    assert all(r["chi2_p"] > 1e-4 for r in t1.values())
    for m in METHODS:
        assert t1[f"pruned_top_k3/{m}"]["pruned"] == t1[f"pruned_top_k3/{m}"]["trees"] > 0
        assert t1[f"pruned_top_p0.4/{m}"]["pruned"] > 0
        assert t1[f"draft_vocab/{m}"]["k"] == 5 and t1[f"float32/{m}"]["pruned"] == 0


def test_cycle_7b_reports_decode_step_multiples_and_univer_over_rrsw(dry_run):
    _, res, md = dry_run
    cyc = res["checks"]["cycle_7b"]["detail"]
    assert set(cyc) == {"2x5", "mc_sim_7b_63"}
    for row in cyc.values():
        assert row["tree_forward_ms"] > 0 and row["decode_step_ms"] > 0
        assert row["univer_over_rrsw_verify"] == pytest.approx(row["univer_verify_ms"] / row["rrsw_verify_ms"])
        for m in METHODS:
            assert row[f"{m}_cycles"] >= 1
            assert row[f"{m}_cycle_over_decode"] == pytest.approx(row[f"{m}_cycle_ms"] / row["decode_step_ms"])
    assert "UniVer / RRSw verify" in md and "plain decode step ms" in md and "univer cycle ms (x decode step)" in md


def test_harness_e2e_writes_answers_and_tables(dry_run):
    out, res, _ = dry_run
    h = res["checks"]["harness_e2e"]["detail"]
    assert h["methods"] == ["naive", "rrsw", "traversal", "greedy", "univer"]
    assert h["prompt_format"]["name"] == "vicuna_v1.1" and h["tokenizer_size"] == 512
    assert h["prompt"] == {"bos_first": True, "roundtrip": True, "vicuna_text": True,
                           "prompt_tokens": h["prompt"]["prompt_tokens"], "builtin_equals_fschat": True}
    dest = out / "harness_e2e"
    assert sorted(p.name for p in (dest / "answers").iterdir()) == [
        "greedy-temp1-2x5-seed0.jsonl", "naive-temp1-seed0.jsonl", "rrsw-temp1-2x5-seed0.jsonl",
        "traversal-temp1-2x5-seed0.jsonl", "univer-temp1-2x5-seed0.jsonl"]
    recs = [json.loads(x) for x in (dest / "answers" / "univer-temp1-2x5-seed0.jsonl").read_text().splitlines()]
    assert [r["question_id"] for r in recs] == [81, 161, 241] and len(recs[0]["choices"][0]["turns"]) == 2
    assert recs[0]["model"].endswith("random-vicuna-7b-shaped") and recs[0]["head_sha256"]
    t1 = (dest / "table1.md").read_text()
    assert all(label in t1 for label in ("RRSw", "Traversal", "Greedy", "UniVer", "MT-bench", "Translation", "QA"))
    assert json.loads((dest / "exact_tau.json").read_text())
    assert json.loads((dest / "run.json").read_text())["settings"]["question_ids"] == [81, 161, 241]


def test_a_bound_below_the_reads_fails_sync_counts():
    dc = _script()
    with torch.no_grad():
        ok, detail = dc.check_sync_counts(torch.device("cpu"), True, bound=1)
    assert not ok and detail["bound"] == 1
    assert all(not r["ok"] and r["max_reads"] > 1 and r["worst_cycle_reads"] for r in detail["cases"].values())
    assert "bound 1" in dc._summary("sync_counts", detail)


def test_offline_llama_tokenizer_has_the_models_vocabulary():
    dc = _script()
    tok = dc.offline_llama_tokenizer(400, ["Why is the sky blue?", "Le chat dort."])
    assert len(tok) == 400 and tok.bos_token_id == 1 and tok.eos_token_id == 2 and not tok.chat_template
    ids = tok("Why is the sky blue? é").input_ids  # é is not in the training text: byte fallback
    assert ids[0] == 1 and tok.decode(ids[1:]) == "Why is the sky blue? é"
    with pytest.raises(ValueError, match="vocab_size 300"):
        dc.offline_llama_tokenizer(300, ["x"])


def test_vicuna_prompt_without_fschat(monkeypatch):
    from evaluation import templates as TP
    from evaluation.arguments import check_template
    from evaluation.questions import build_messages

    cases = [build_messages(["What is 2+2?"], []), build_messages(["What is 2+2?", "And 3+3?"], ["4."])]
    with_fschat = [TP.PromptFormat("vicuna_v1.1", "fschat", "x").render(None, msgs) for msgs in cases]

    def missing():
        raise ModuleNotFoundError(f"FastChat templates need the package fschat; install it with: {TP.FSCHAT_HINT}")

    monkeypatch.setattr(TP, "_conversation_module", missing)
    fmt = TP.choose_format("lmsys/vicuna-7b-v1.3", type("Tok", (), {"chat_template": None})())
    assert (fmt.name, fmt.source) == ("vicuna_v1.1", TP.BUILTIN_SOURCE)
    assert [fmt.render(None, msgs) for msgs in cases] == with_fschat  # byte for byte FastChat's
    assert check_template(None, "lmsys/vicuna-7b-v1.3") is None and TP.check_template_name("vicuna_v1.1")
    with pytest.raises(ModuleNotFoundError, match="fschat"):
        TP.check_template_name("llama-2")  # other FastChat names still need the package


def test_cuda_syncs_are_counted_per_cycle(monkeypatch):
    """The sync-debug route without a GPU: the mode is set to warn and restored, each "synchronizing" warning
    is charged to the counter's current cycle, other warnings still reach the caller."""
    import types
    import warnings

    dc = _script()
    modes = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    counter = types.SimpleNamespace(cycle=0)
    per_cycle = {}
    with warnings.catch_warnings(record=True) as outer:
        warnings.simplefilter("always")
        with dc.cuda_syncs_per_cycle(counter, per_cycle):
            warnings.warn("called a synchronizing CUDA operation")  # the prefill's
            for cycle in (1, 2):
                counter.cycle = cycle
                for _ in range(cycle + 2):
                    warnings.warn("called a synchronizing CUDA operation")
            warnings.warn("something else")
    assert modes == ["warn", 0] and per_cycle == {0: 1, 1: 3, 2: 4}
    assert [str(w.message) for w in outer] == ["something else"]
