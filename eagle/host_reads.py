"""Counting host reads of tensors per decoding cycle (issue 49): on CUDA every read of a tensor value
on the host is a device synchronisation, so CPU runs count them and the tests and
``scripts/device_check.py`` bound them.

A :class:`HostReadCounter` (a ``TorchFunctionMode``) counts the calls that read a tensor on the host:
``tolist``, ``item``, ``bool`` / ``float`` / ``int`` / ``index`` conversions, ``cpu``, ``numpy``,
``nonzero`` / ``argwhere`` / ``masked_select`` / ``unique`` (data-dependent shapes), indexing a
tensor with a Python list or a bool mask (both go through the host on CUDA) and ``torch.tensor`` of
host data with an explicit device (a host-built tensor copied to the device). Under :func:`counting`
a cycle starts at each tree scoring (``EaModel._score_tree``; cycle 0 is the prefill); reads inside
``Verifier.verify`` are the verifier's part, the rest the engine's.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["CYCLE_BOUND", "VERIFIER_BOUND", "HostReadCounter", "counting"]

#: the goal of issue 49: host reads per decoding cycle, engine included
CYCLE_BOUND = 8
#: the verifier alone (``Verifier.verify`` with ``validate=False``): one read of the outcome
VERIFIER_BOUND = 1

_READS = {"tolist", "item", "__bool__", "__float__", "__int__", "__index__", "__complex__", "cpu", "numpy",
          "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "__contains__"}


def _host_index(idx) -> bool:
    """An index that goes through the host: a Python list, or a bool tensor mask (nonzero)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, list) or (isinstance(i, torch.Tensor) and i.dtype == torch.bool) for i in items)


class HostReadCounter(TorchFunctionMode):
    """Counts host reads of tensors, per cycle and per part (``"engine"`` / ``"verifier"``).

    Attributes:
        cycle: the current cycle (0 until :func:`counting` marks the first tree scoring).
        part: ``"engine"`` or ``"verifier"`` (set by :func:`counting`).
        counts: reads per ``(cycle, part)``.
        what: the names of the reading calls per ``(cycle, part)``, in call order.
    """

    def __init__(self):
        super().__init__()
        self.cycle = 0
        self.part = "engine"
        self.counts: dict[tuple[int, str], int] = {}
        self.what: dict[tuple[int, str], list] = {}

    def _is_read(self, name, args, kwargs) -> bool:
        if name in _READS:
            return True
        if name in ("__getitem__", "__setitem__") and len(args) > 1:
            return _host_index(args[1])
        if name in ("tensor", "as_tensor") and args and not isinstance(args[0], torch.Tensor):
            return kwargs.get("device") is not None
        return False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self._is_read(name, args, kwargs):
            key = (self.cycle, self.part)
            self.counts[key] = self.counts.get(key, 0) + 1
            self.what.setdefault(key, []).append(name)
        return func(*args, **kwargs)

    def per_cycle(self, part: str | None = None) -> list[int]:
        """Reads of every cycle after the prefill (cycle 0), of one part (or all when None)."""
        return [sum(v for (c, p), v in self.counts.items() if c == k and (part is None or p == part))
                for k in range(1, self.cycle + 1)]


@contextlib.contextmanager
def counting():
    """A :class:`HostReadCounter` active over the block, with cycles and parts marked.

    ``EaModel._score_tree`` and ``Verifier.verify`` are wrapped for the block (process-wide, restored on
    exit); not thread-safe.
    """
    from .model import ea_model as ea_module
    from .verify.registry import Verifier

    counter = HostReadCounter()
    score = ea_module.EaModel._score_tree
    verify = Verifier.verify

    @functools.wraps(score)
    def scored(self, *a, **k):
        counter.cycle += 1
        return score(self, *a, **k)

    @functools.wraps(verify)
    def verified(self, *a, **k):
        counter.part = "verifier"
        try:
            return verify(self, *a, **k)
        finally:
            counter.part = "engine"

    ea_module.EaModel._score_tree = scored
    Verifier.verify = verified
    try:
        with counter:
            yield counter
    finally:
        ea_module.EaModel._score_tree = score
        Verifier.verify = verify
