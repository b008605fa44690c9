"""Rows that sum to 1 only within the tolerance, and confident float32 drafts.

Inputs are accepted when every row sums to 1 within ``SUM_TOL`` (1e-4): a float32 softmax never
sums to exactly 1. The verifiers must then give the law of the normalised rows up to that
tolerance, and in particular must not form the residual draft mass as ``1 - q(top)``: when the top
tokens hold nearly all the draft mass that difference cancels (0.99995 / 0.00005 summing to
1.00002 gives 0.00003 instead of 0.00005, and accepted the residual child with 0.15 instead of 0.25).
"""
from __future__ import annotations

import pytest
import torch

import univer_patch
from eagle.tree import build_tree
from eagle.verify import available_verifiers
from eagle.rules import draw_children, remaining_mass, remaining_masses
from evaluation.bench_verify import make_instance

METHODS = tuple(available_verifiers(temperature=1.0))


def _normalised(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x / x.sum(-1, keepdim=True)


@pytest.mark.parametrize("row_sum", [0.99995, 1.00002, 1.00006])
@pytest.mark.parametrize("method", METHODS)
def test_confident_draft_row_within_tolerance(method, row_sum):
    parents = torch.tensor([-1, 0, 0])
    tokens = torch.tensor([0, 0, 1])  # child 1: the top token, child 2: the residual draw
    target = torch.full((3, 4), 0.25, dtype=torch.float64)
    q = torch.tensor([0.99995, 0.00005, 0.0, 0.0], dtype=torch.float64) * row_sum
    draft = q.expand(3, 4).clone()
    got = univer_patch.outcome_probs(method, parents, tokens, target, draft)
    want = univer_patch.outcome_probs(method, parents, tokens, target, _normalised(draft))
    assert float((got - want).abs().max()) < 1e-5


@pytest.mark.parametrize("method", METHODS)
def test_confident_float32_draft_matches_its_normalised_law(method):
    """float32 softmax drafts with top probability ~0.9999 (V = 1000, tree 2x5): the law equals the
    float64 law of the same, normalised rows to 1e-6 (it was 1e-4 with ``1 - q(top)``)."""
    rule = univer_patch.get_verifier(method).drafting
    tb = build_tree("2x5")
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for seed in range(3):
        parents, _, target, _ = make_instance("2x5", 1000, rule, "cpu", seed)
        logits = torch.randn(tb.num_nodes, 1000, generator=g)
        logits[:, 0] += 14.0
        draft = torch.softmax(logits, -1)
        tokens = torch.zeros(tb.num_nodes, dtype=torch.long)
        for v in range(tb.num_nodes):
            if tb.children[v]:
                tokens[list(tb.children[v])] = draw_children(draft[v: v + 1], len(tb.children[v]), rule, g)[0]
        got = univer_patch.outcome_probs(method, parents, tokens, target, draft).double()
        want = univer_patch.outcome_probs(method, parents, tokens, _normalised(target), _normalised(draft))
        worst = max(worst, float((got - want).abs().max()))
    assert worst < 1e-6, worst


def test_remaining_masses_sum_the_rest_directly():
    q = torch.tensor([[0.99995, 0.00005, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float32) * 1.00002
    tokens = torch.tensor([[0, 1], [3, 0]])
    remove = torch.tensor([[True, False], [True, True]])
    got = remaining_masses(q, tokens, remove)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.tensor([float(q[0, 1]), float(q[1, 1] + q[1, 2])], dtype=torch.float64))
    assert remaining_mass(q[0], [0]) == pytest.approx(float(q[0, 1]), rel=1e-6)
    # several blocks (V = 300000: 3 rows per block), rows on both paths (little / most mass removed)
    big = torch.rand(7, 300_000, dtype=torch.float64)
    big[1, 5] = big[4, 2] = 1e6  # rows 1 and 4: the removed token holds nearly all the mass
    tok = torch.tensor([[5, 9], [5, 2], [0, 3], [7, 8], [2, 1], [3, 4], [6, 1]])
    rem = torch.tensor([[True, True], [True, False], [True, True], [True, False], [True, False], [False, False],
                        [False, True]])
    want = torch.stack([big[i].sum() - sum(big[i, int(t)] for t, k in zip(tok[i], rem[i]) if k) for i in range(7)])
    got = remaining_masses(big, tok, rem)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=0)
    assert float(got[1]) == pytest.approx(float(big[1].sum() - 1e6), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", METHODS)
def test_half_precision_laws_are_upcast_and_normalised(method, dtype):
    """A float16 / bfloat16 cast of a float32 softmax is accepted (its rows sum to 1 only within the
    dtype's rounding), computed in float32, and gives the law of its normalised rows."""
    rule = univer_patch.get_verifier(method).drafting
    parents, tokens, target, draft = make_instance("3x3", 50, rule, "cpu", seed=4)
    t16, d16 = target.to(dtype), draft.to(dtype)
    got = univer_patch.outcome_probs(method, parents, tokens, t16, d16)
    assert got.dtype == torch.float32
    want = univer_patch.outcome_probs(method, parents, tokens, _normalised(t16), _normalised(d16))
    assert float((got.double() - want).abs().max()) < 1e-6
    node, y = univer_patch.verify(method, parents, tokens, t16, d16, generator=torch.Generator().manual_seed(0))
    assert 0 <= node < parents.numel() and 0 <= y < 50


@pytest.mark.parametrize("method", METHODS)
def test_mixed_float32_float64_laws_are_promoted(method):
    rule = univer_patch.get_verifier(method).drafting
    parents, tokens, target, draft = make_instance("2x5", 30, rule, "cpu", seed=5)
    got = univer_patch.outcome_probs(method, parents, tokens, target, draft.double())
    assert got.dtype == torch.float64
    want = univer_patch.outcome_probs(method, parents, tokens, target.double(), draft.double())
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for seed in range(20):  # the sampler too (UniVer once failed an index_put on mixed dtypes)
        univer_patch.verify(method, parents, tokens, target, draft.double(), generator=torch.Generator().manual_seed(seed))
