"""research/gpu_head_round.sh: stops before any work, in one line, on a bad INIT or a missing GPU; passes the recipe's flags."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "research" / "gpu_head_round.sh"


def _run(*args, **env):
    e = {**os.environ, "PYTHON": sys.executable, "WORK": env.pop("WORK", "/nonexistent-never-written"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=e, timeout=120)


def test_usage_without_out():
    r = _run()
    assert r.returncode != 0 and "usage: research/gpu_head_round.sh OUT [INIT]" in r.stderr


def test_init_without_config_is_named(tmp_path):
    r = _run(str(tmp_path / "out"), str(tmp_path / "no-head"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"gpu_head_round.sh: INIT {tmp_path / 'no-head'} has no config.json"]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_no_cuda_stops_before_any_work(tmp_path):
    r = _run(str(tmp_path / "out"), WORK=str(tmp_path / "work"))
    assert r.returncode == 2
    assert "no CUDA device (DEV=cpu to run on the CPU)" in r.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


def test_missing_pool_file_is_named(tmp_path):
    r = _run(str(tmp_path / "out"), POOL=str(tmp_path / "pool.json.gz"), DEV="cpu", WORK=str(tmp_path / "work"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"gpu_head_round.sh: POOL {tmp_path / 'pool.json.gz'}: no such file"]
    assert not (tmp_path / "work").exists()


def _commands(tmp_path, **env):
    """Run the round with a stand-in interpreter that only records its arguments; return the recorded calls."""
    log = tmp_path / "calls.txt"
    stub = tmp_path / "py"
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    stub.chmod(0o755)
    r = _run(str(tmp_path / "out"), DEV="cpu", NF="1", PYTHON=str(stub), WORK=str(tmp_path / "work"), **env)
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines()


def test_round_cuts_at_1024_tokens_and_weights_kinds_by_default(tmp_path):
    calls = _commands(tmp_path)
    feats = [c for c in calls if c.startswith("-m eagle.train.features")]
    trains = [c for c in calls if c.startswith("-m eagle.train.train")]
    assert len(feats) == 1 and "--max-len 1024" in feats[0]
    assert len(trains) == 2
    for c in trains:
        assert "--max-len 1024" in c
        assert "--kind-weights summarization=2,rag=2,writing=2,chat=0.7,chitchat2=0.6" in c


def test_round_stage8_recipe_and_rehearsal_have_no_kind_weights(tmp_path):
    calls = _commands(tmp_path, MAX_LEN="768", KIND_WEIGHTS="")
    trains = [c for c in calls if c.startswith("-m eagle.train.train")]
    assert all("--max-len 768" in c and "--kind-weights" not in c for c in trains)
    (tmp_path / "calls.txt").unlink()
    calls = _commands(tmp_path, SHARDS="0,39")
    trains = [c for c in calls if c.startswith("-m eagle.train.train")]
    assert all("--kind-weights" not in c for c in trains) and len(trains) == 2
