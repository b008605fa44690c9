"""Host reads per decoding cycle (issue 49): every read of a tensor value on the host is a device
synchronisation on CUDA, so it is counted on CPU runs and bounded.

A :class:`HostReadCounter` (a ``TorchFunctionMode``) counts the calls that read a tensor on the host:
``tolist``, ``item``, ``bool`` / ``float`` / ``int`` / ``index`` conversions, ``cpu``, ``numpy``,
``nonzero`` / ``argwhere`` / ``masked_select`` / ``unique`` (data-dependent shapes), indexing a
tensor with a Python list or a bool mask (both go through the host on CUDA) and ``torch.tensor`` of
host data with an explicit device (a host-built tensor copied to the device). A cycle starts at
each tree scoring (``EaModel._score_tree``); reads inside ``Verifier.verify`` are the verifier's,
the rest the engine's. Caches are warmed by one generation first (the per-shape structure tensors
are built once, not per cycle).
"""
from __future__ import annotations

import contextlib
import functools

import pytest
import torch
from torch.overrides import TorchFunctionMode

import univer_patch  # noqa: F401  (registers traversal, greedy, univer)
from eagle.model import ea_model as ea_module
from eagle.testing import tiny_ea_model
from eagle.tree.structure import tree_structure
from eagle.verify import get_verifier
from eagle.verify.registry import Verifier

#: the goal of issue 49: host reads per cycle, engine included
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
    """Counts host reads of tensors, per cycle and per part (``"engine"`` / ``"verifier"``)."""

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
        """Reads of every cycle after the prefill (cycle 0), of one part or all."""
        return [sum(v for (c, p), v in self.counts.items() if c == k and (part is None or p == part))
                for k in range(1, self.cycle + 1)]


@contextlib.contextmanager
def counting(monkeypatch):
    """A :class:`HostReadCounter` active over the block, with cycles and parts marked."""
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

    monkeypatch.setattr(ea_module.EaModel, "_score_tree", scored)
    monkeypatch.setattr(Verifier, "verify", verified)
    with counter:
        yield counter


CASES = [("argmax", 0.0), ("rrsw", 1.0), ("traversal", 1.0), ("greedy", 1.0), ("univer", 1.0)]


def _count(monkeypatch, method, temperature, tree):
    m = tiny_ea_model(vocab_size=64, seed=0, aligned=True, tree_choices=tree)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    kw = dict(temperature=temperature, max_new_tokens=24, tree_choices=tree, verifier=method, seed=0)
    m.eagenerate(ids, **kw)  # warm the per-shape caches
    with counting(monkeypatch) as c:
        m.eagenerate(ids, **kw)
    assert c.cycle >= 2
    return c


@pytest.mark.parametrize("tree", ["2x5", "mc_sim_7b_63"])
@pytest.mark.parametrize("method,temperature", CASES)
def test_host_reads_per_cycle(monkeypatch, method, temperature, tree):
    c = _count(monkeypatch, method, temperature, tree)
    ver, eng, tot = max(c.per_cycle("verifier")), max(c.per_cycle("engine")), max(c.per_cycle())
    print(f"\n{method} {tree}: verifier {ver} engine {eng} total {tot} per cycle (max over {c.cycle} cycles)")
    assert ver <= VERIFIER_BOUND, (ver, c.what)
    assert tot <= CYCLE_BOUND, (tot, c.what)


@pytest.mark.parametrize("method,temperature", CASES)
def test_verifier_alone_reads_once(monkeypatch, method, temperature):
    m = tiny_ea_model(vocab_size=64, seed=1, tree_choices="2x5")
    gen = torch.Generator().manual_seed(0)
    v = get_verifier(method)
    laws = m.tree_laws(torch.tensor([[1, 2, 3]]), tree_choices="2x5", drafting=v.drafting,
                       temperature=temperature, generator=gen)
    args = (laws.parents, laws.tokens, laws.target_probs, laws.draft_probs, gen)
    st = tree_structure(tuple(laws.parents.tolist()))
    v.verify(*args, validate=False, structure=st)  # warm
    with HostReadCounter() as c:
        v.verify(*args, validate=False, structure=st)
    assert sum(c.counts.values()) <= VERIFIER_BOUND, c.what
