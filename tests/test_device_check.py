"""scripts/device_check.sh --dry-run: the GPU check's code path on tiny shapes on the CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_device_check_dry_run(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "device_check.json").read_text())
    assert res["env"]["dry_run"] and res["env"]["device"] == "cpu"
    expected = {"verifier_laws", "temperature0", "temperature1_law", "seeded_tiny", "cycle_7b", "seeded_7b",
                "bench_verify", "head_training", "placement_cuda1"}
    assert set(res["checks"]) == expected and all(c["ok"] for c in res["checks"].values())
    assert res["checks"]["placement_cuda1"]["summary"].startswith("skipped: needs 2 GPUs")  # no GPU here
    cyc = res["checks"]["cycle_7b"]["detail"]
    assert set(cyc) == {"2x5", "mc_sim_7b_63"} and all(row["tree_forward_ms"] > 0 for row in cyc.values())
    assert "tree forward ms" in (tmp_path / "device_check.md").read_text()
    ht = res["checks"]["head_training"]["detail"]
    assert ht["features_on_cpu"] and ht["last_loss"] < ht["first_loss"] and len(ht["eval_top1_by_depth"]) == 3
