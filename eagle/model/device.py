"""Device names for every ``--device`` flag (the harness and head training): one check, no model code."""
from __future__ import annotations

import re

import torch

__all__ = ["device_problem"]


def device_problem(device: str) -> str | None:
    """Why the device name ``device`` (``auto``, ``cpu``, ``cuda`` or ``cuda:N``) cannot hold a model on
    this machine (malformed, no CUDA, no such CUDA index), or ``None`` when it can. The one check behind
    every ``--device`` flag (harness and head training)."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(device)):
        return f"use auto, cpu, cuda or cuda:N, got {device!r}"
    if str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            return f"{device} requested but CUDA is not available"
        idx = int(device.split(":")[1]) if ":" in device else 0
        if idx >= torch.cuda.device_count():
            return f"{device}: only {torch.cuda.device_count()} CUDA device(s)"
    return None
