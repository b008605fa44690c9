"""scripts/gpu_head_round.sh stops before any work, in one line, on a bad INIT or a missing GPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_head_round.sh"


def _run(*args, **env):
    e = {**os.environ, "PYTHON": sys.executable, "WORK": env.pop("WORK", "/nonexistent-never-written"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=e, timeout=120)


def test_usage_without_out():
    r = _run()
    assert r.returncode != 0 and "usage: scripts/gpu_head_round.sh OUT [INIT]" in r.stderr


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
