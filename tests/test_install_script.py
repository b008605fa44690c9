"""scripts/install.sh's torch decision (issue 49 item 4): an installed torch is kept (a CUDA build is never
replaced), the CPU pin only where none is installed, TORCH_SPEC=keep / torch / a requirement. No network:
``choose`` is a pure function, and install.sh runs against a fake interpreter that records its pip calls
and sees a fake torch (or none)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("torch_choice", ROOT / "scripts" / "torch_choice.py")
torch_choice = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_choice)
choose = torch_choice.choose


@pytest.mark.parametrize("spec,installed,accel,expected", [
    (None, None, None, ("install", "torch==2.13.0")),                # CPU path: the pin
    ("", None, None, ("install", "torch==2.13.0")),
    (None, "2.5.1+cu121", "CUDA 12.1", ("keep", "torch==2.5.1+cu121")),  # a CUDA build is never replaced
    (None, "2.13.0+cpu", None, ("keep", "torch==2.13.0+cpu")),
    ("keep", "2.4.0", "ROCm 6.0", ("keep", "torch==2.4.0")),
    ("torch", "2.5.1+cu121", "CUDA 12.1", ("keep", "torch==2.5.1+cu121")),  # satisfied: kept
    ("torch==2.12.0", "2.13.0", None, ("install", "torch==2.12.0")),   # asked for explicitly
])
def test_choose(spec, installed, accel, expected):
    action, requirement, reason = choose(spec, installed, accel)
    assert (action, requirement) == expected and reason
    if accel and action == "keep":
        assert accel in reason


def test_keep_without_torch_is_refused():
    with pytest.raises(ValueError, match="TORCH_SPEC=keep"):
        choose("keep", None)


def test_the_cpu_pin_is_not_in_requirements():
    """requirements.txt has a lower bound only: installing it cannot replace the torch chosen first."""
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    torch_lines = [ln for ln in lines if ln.startswith("torch")]
    assert torch_lines and all("==" not in ln for ln in torch_lines)


FAKE_PY = r"""#!/usr/bin/env bash
# a python that records pip calls instead of running them; everything else runs without site-packages
if [[ $1 == -m && $2 == pip ]]; then
  echo "pip ${*:3}" >>"$PIP_LOG"
  args=("$@"); for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == -c ]] && echo "constraint $(cat "${args[i+1]}")" >>"$PIP_LOG"; done
  exit 0
fi
[[ $1 == -c ]] && exit 0   # the closing version print
exec "$REAL_PY" -S "$@"
"""


def _fake_torch(folder: Path, version: str, cuda: str | None) -> Path:
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\nfrom . import version\n")
    (folder / "torch" / "version.py").write_text(f"cuda = {cuda!r}\nhip = None\n")
    return folder


def _run_install(tmp_path: Path, torch_spec: str | None, fake_torch: Path | None) -> tuple[int, list[str], str]:
    py = tmp_path / "python"
    py.write_text(FAKE_PY)
    py.chmod(0o755)
    log = tmp_path / "pip.log"
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_SPEC", "PYTHONPATH")}
    env.update(PYTHON=str(py), REAL_PY=sys.executable, PIP_LOG=str(log))
    if torch_spec is not None:
        env["TORCH_SPEC"] = torch_spec
    if fake_torch is not None:
        env["PYTHONPATH"] = str(fake_torch)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], env=env, capture_output=True, text=True,
                       timeout=120)
    return r.returncode, log.read_text().splitlines() if log.exists() else [], r.stderr


def _torch_installs(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("pip install -q torch")]


def test_install_without_torch_applies_the_cpu_pin(tmp_path):
    rc, calls, err = _run_install(tmp_path, None, None)
    assert rc == 0, err
    assert _torch_installs(calls) == ["pip install -q torch==2.13.0"]
    assert "constraint torch==2.13.0" in calls  # requirements.txt installs under the pin
    assert any("-r requirements.txt" in c for c in calls) and "CPU pin" in err


@pytest.mark.parametrize("torch_spec", [None, "torch", "keep"])
def test_install_keeps_an_installed_cuda_torch(tmp_path, torch_spec):
    fake = _fake_torch(tmp_path / "fake", "2.5.1+cu121", "12.1")
    rc, calls, err = _run_install(tmp_path, torch_spec, fake)
    assert rc == 0, err
    assert _torch_installs(calls) == []  # never replaced, never downgraded
    assert "constraint torch==2.5.1+cu121" in calls and "keeping" in err and "CUDA 12.1" in err


def test_install_honours_an_explicit_requirement(tmp_path):
    fake = _fake_torch(tmp_path / "fake", "2.13.0", None)
    rc, calls, err = _run_install(tmp_path, "torch==2.12.0", fake)
    assert rc == 0, err
    assert _torch_installs(calls) == ["pip install -q torch==2.12.0"] and "constraint torch==2.12.0" in calls


def test_install_keep_without_torch_stops_in_one_line(tmp_path):
    rc, calls, err = _run_install(tmp_path, "keep", None)
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "TORCH_SPEC=keep" in lines[0], err
    assert not any("requirements.txt" in c for c in calls) and _torch_installs(calls) == []
