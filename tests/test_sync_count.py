"""Host reads per decoding cycle (issue 49): every read of a tensor value on the host is a device
synchronisation on CUDA, so it is counted on CPU runs and bounded.

The counter is :class:`eagle.host_reads.HostReadCounter` (what counts as a read is listed there; also used
by ``scripts/device_check.py`` on the device). A cycle starts at each tree scoring
(``EaModel._score_tree``); reads inside ``Verifier.verify`` are the verifier's, the rest the engine's.
Caches are warmed by one generation first (the per-shape structure tensors are built once, not per cycle).
"""
from __future__ import annotations

import pytest
import torch

import univer_patch  # noqa: F401  (registers traversal, greedy, univer)
from eagle.host_reads import CYCLE_BOUND, VERIFIER_BOUND, HostReadCounter, counting  # noqa: F401 (re-exported)
from eagle.testing import tiny_ea_model
from eagle.tree.structure import tree_structure
from eagle.verify import get_verifier


CASES = [("argmax", 0.0), ("rrsw", 1.0), ("traversal", 1.0), ("greedy", 1.0), ("univer", 1.0)]


def _count(monkeypatch, method, temperature, tree):
    m = tiny_ea_model(vocab_size=64, seed=0, aligned=True, tree_choices=tree)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    kw = dict(temperature=temperature, max_new_tokens=24, tree_choices=tree, verifier=method, seed=0)
    m.eagenerate(ids, **kw)  # warm the per-shape caches
    with counting() as c:
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
