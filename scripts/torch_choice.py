"""Which torch scripts/install.sh installs, or keeps (issue 49 item 4); standard library only.

    python scripts/torch_choice.py      # prints "keep torch==<installed>" or "install <requirement>"

The second word is also the constraint the rest of the install runs under, so installing
``requirements.txt`` can never swap the torch chosen here. The rule (``TORCH_SPEC`` from the environment):

* ``TORCH_SPEC=keep``: keep the installed torch, whatever its build (none installed: exit 2, one line);
* ``TORCH_SPEC`` unset: keep an installed torch (a CUDA or ROCm build is never replaced); with none
  installed, the CPU pin ``torch==2.13.0`` (an unpinned ``torch`` pulls a multi-GB CUDA build);
* ``TORCH_SPEC=torch`` (the bare name): any installed torch satisfies it and is kept;
* any other ``TORCH_SPEC`` (one pip requirement, e.g. ``torch==2.5.1``; PIP_INDEX_URL picks a wheel index): installed as asked.

The reason goes to stderr.
"""
from __future__ import annotations

import os
import sys

CPU_PIN = "torch==2.13.0"


def choose(spec: str | None, installed: str | None, accelerator: str | None = None) -> tuple[str, str, str]:
    """The torch decision as ``(action, requirement, reason)``; ``action`` is ``"keep"`` or ``"install"``.

    Args:
        spec: ``TORCH_SPEC`` (None or empty: unset).
        installed: the installed torch's version (e.g. ``"2.5.1+cu121"``), None when there is none.
        accelerator: ``"CUDA 12.1"`` / ``"ROCm 6.0"`` for an accelerator build, None for a CPU build.

    Raises:
        ValueError: ``TORCH_SPEC=keep`` with no torch installed.
    """
    spec = (spec or "").strip()
    build = f", {accelerator} build" if accelerator else ""
    if spec == "keep":
        if installed is None:
            raise ValueError("TORCH_SPEC=keep, but this environment has no torch: install your build first "
                             f"or leave TORCH_SPEC unset for the CPU pin {CPU_PIN}")
        return "keep", f"torch=={installed}", f"keeping torch {installed}{build} (TORCH_SPEC=keep)"
    if spec:
        if spec == "torch" and installed is not None:
            return "keep", f"torch=={installed}", f"keeping torch {installed}{build} (it satisfies TORCH_SPEC=torch)"
        return "install", spec, f"installing {spec} (TORCH_SPEC)"
    if installed is not None:
        return "keep", f"torch=={installed}", f"keeping the installed torch {installed}{build}"
    return "install", CPU_PIN, f"no torch installed: the CPU pin {CPU_PIN}"


def installed_torch() -> tuple[str | None, str | None]:
    """``(version, accelerator)`` of the torch this interpreter imports; ``(None, None)`` without one."""
    try:
        import torch
    except ImportError:
        return None, None
    version = getattr(torch, "version", None)
    cuda, hip = getattr(version, "cuda", None), getattr(version, "hip", None)
    return str(torch.__version__), f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else None


def main() -> int:
    try:
        action, requirement, reason = choose(os.environ.get("TORCH_SPEC"), *installed_torch())
    except ValueError as e:
        print(f"install.sh: {e}", file=sys.stderr)
        return 2
    print(f"install.sh: {reason}", file=sys.stderr)
    print(action, requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
