"""Device names for every ``--device`` flag (the harness and head training): one check, no model code; and
where the parts of a generation call live when the target spans devices (:func:`target_placement`)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

__all__ = ["device_problem", "Placement", "module_device", "resolve_placement", "target_placement"]


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


# ---------------------------------------------------------------------- where a (sharded) target's parts live
@dataclass(frozen=True)
class Placement:
    """Where each part of a generation call lives for a target that may span devices (``device_map="auto"``,
    offloading, ``cuda:1``).

    Attributes:
        input: the device of the target's input embedding: the ids, position ids and tree mask of every
            target forward go there (transformers/accelerate move activations between its layers).
        output: the device of the target's ``lm_head`` (and of its last hidden state as the engine uses it):
            the head, drafting, tree buffers, every law, the verifier, the generator and the timing events.
        cuda: every CUDA device the target or head computes on, sorted (synchronised around the clock).
    """

    input: torch.device
    output: torch.device
    cuda: tuple

    @property
    def sharded(self) -> bool:
        return len(self.cuda) > 1 or self.input != self.output


def module_device(module) -> torch.device:
    """The device ``module`` computes on: an accelerate hook's ``execution_device`` (an offloaded module's
    weights sit on ``meta`` until its forward), else its first parameter's (or buffer's) device, else the CPU."""
    hook = getattr(module, "_hf_hook", None)
    dev = getattr(hook, "execution_device", None)
    if dev is None:  # a SequentialHook holds several hooks
        dev = next((h.execution_device for h in getattr(hook, "hooks", ()) if getattr(h, "execution_device", None)
                    is not None), None)
    if dev is not None:
        return _as_device(dev)
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return torch.device("cpu")


def resolve_placement(input_device, output_device, compute_devices=()) -> Placement:
    """:class:`Placement` from the device of the target's input embedding, of its ``lm_head`` and of every
    module that computes (ints are CUDA indices, as in ``hf_device_map``; ``"disk"`` and ``meta`` weights
    compute elsewhere and are ignored). Pure: no model, no CUDA needed."""
    inp, out = _as_device(input_device), _as_device(output_device)
    named = [x for x in (*compute_devices, inp, out) if not (isinstance(x, str) and x == "disk")]
    cuda = {d for d in map(_as_device, named) if d.type == "cuda"}
    cuda = {torch.device("cuda", d.index if d.index is not None else _current_cuda()) for d in cuda}
    return Placement(input=inp, output=out, cuda=tuple(sorted(cuda, key=lambda d: d.index)))


def target_placement(base_model) -> Placement:
    """:func:`resolve_placement` for a transformers causal LM: input embedding, ``lm_head`` and the devices of
    ``hf_device_map`` (or of its weights when it was not dispatched)."""
    devmap = getattr(base_model, "hf_device_map", None) or {}
    computing = list(devmap.values()) if devmap else [p.device for p in base_model.parameters()
                                                      if p.device.type != "meta"]
    computing += [module_device(m) for m in base_model.modules() if getattr(m, "_hf_hook", None) is not None]
    return resolve_placement(module_device(base_model.get_input_embeddings()),
                             module_device(base_model.get_output_embeddings()), computing)


def _as_device(x) -> torch.device:
    if isinstance(x, torch.device):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        return torch.device("cuda", x)
    return torch.device(str(x))


def _current_cuda() -> int:
    return torch.cuda.current_device() if torch.cuda.is_available() else 0
