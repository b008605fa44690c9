"""Device consistency of the verification kernels without a GPU.

The ``meta`` device carries shapes and dtypes but no data, and torch refuses to mix its tensors
with host tensors. UniVer's allocation has no host synchronisation, so it runs there completely:
any structure tensor left on the host (or a state tensor created there) fails this test the way
it would fail on CUDA. The host-side decision and input checks are covered on CPU elsewhere.
"""
from __future__ import annotations

import pytest
import torch

import univer_patch  # noqa: F401  (registers the verifiers)
from eagle.tree import balanced
from eagle.verify import available_verifiers
from eagle.verify.checks import structure_of
from evaluation.bench_verify import make_instance
from univer_patch import univer


@pytest.mark.parametrize("tree", ["2x5", "mc_sim_7b_63", balanced(3, 2)], ids=["2x5", "mc_sim_7b_63", "3x2"])
def test_univer_allocation_stays_on_the_laws_device(tree):
    parents, tokens, target, draft = make_instance(tree, 40, "topk_residual", "cpu", seed=0)
    st = structure_of(parents)
    ref = univer.allocate(st, tokens, target, draft)
    meta = univer.allocate(st, tokens.to("meta"), target.to("meta"), draft.to("meta"))
    for name in ("p_tilde", "p_edge", "p_not", "weight", "scale", "threshold"):
        got, want = getattr(meta, name), getattr(ref, name)
        assert got.device.type == "meta" and got.shape == want.shape and got.dtype == want.dtype, name


def test_positive_part_sums_on_another_device_is_one_pass():
    B = torch.empty(300, 50_000, device="meta")
    out = univer.positive_part_sums(B, B, torch.empty(300, 1, device="meta"))
    assert out.device.type == "meta" and out.shape == (300,)


@pytest.mark.parametrize("method", available_verifiers())
def test_laws_without_values_or_on_two_devices_are_refused(method):
    rule = univer_patch.get_verifier(method).drafting
    parents, tokens, target, draft = make_instance("2x5", 20, rule, "cpu", seed=0)
    with pytest.raises(ValueError, match="meta device"):
        univer_patch.verify(method, parents, tokens, target.to("meta"), draft.to("meta"))
    with pytest.raises(ValueError, match="one device"):
        univer_patch.outcome_probs(method, parents, tokens, target, draft.to("meta"))
