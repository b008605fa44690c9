"""verify() samples agree with outcome_probs; kernels are pure functions of their uniforms."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

import univer_patch
from eagle.tree import balanced, build_tree
from eagle.verify import available_verifiers, get_verifier
from eagle.verify.checks import structure_of
from eagle.rules import draw_children
from univer_patch import univer

METHODS = available_verifiers(temperature=1.0)


def instance(choices, V, rule, seed, dtype=torch.float64, close=True):
    tb = build_tree(choices)
    n = tb.num_nodes
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(n, V, generator=g, dtype=torch.float64)
    target = torch.softmax(logits, -1)
    draft = torch.softmax((logits if close else 0) + 1.0 * torch.randn(n, V, generator=g, dtype=torch.float64), -1)
    tokens = torch.zeros(n, dtype=torch.long)
    for v in range(n):
        if tb.children[v]:
            tokens[list(tb.children[v])] = draw_children(draft[v:v + 1], len(tb.children[v]), rule, generator=g)[0]
    return tb.parents, tokens, target.to(dtype), draft.to(dtype)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("close", [True, False])
def test_samples_match_outcome_probs(method, close):
    """Chi-square over outcomes (node, y) with expected count >= 5 (rest pooled), 2000 draws,
    fixed seed; the test passes at p-value > 1e-3 and total variation < 0.08. Zero-probability outcomes never occur."""
    ver = get_verifier(method)
    parents, tokens, target, draft = instance(balanced(2, 2), 5, ver.drafting, seed=3, close=close)
    exact = ver.outcome_probs(parents, tokens, target, draft)
    n = 2000
    counts = sample_counts(ver, (parents, tokens, target, draft), exact, n, seed=11)
    assert chi_square_pvalue(exact, counts) > 1e-3
    tv = 0.5 * float((counts / n - exact).abs().sum())
    assert tv < 0.08


def sample_counts(ver, args, exact: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Counts ``[N, V]`` of ``n`` verify() outcomes; asserts none has probability 0 in ``exact``."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros_like(exact)
    for _ in range(n):
        i, y = ver.verify(*args, g)
        assert exact[i, y] > 0, (i, y)
        counts[i, y] += 1
    return counts


def chi_square_pvalue(exact: torch.Tensor, counts: torch.Tensor) -> float:
    """Pearson chi-square p-value of ``counts`` against the law ``exact`` (cells with an expected
    count below 5 pooled into one); 1.0 when there is only one cell (nothing to test)."""
    n = float(counts.sum())
    e, o = (exact.double() * n).flatten(), counts.double().flatten()
    big = e >= 5
    obs, exp = o[big].tolist(), e[big].tolist()
    if float(e[~big].sum()) > 0:
        obs.append(float(o[~big].sum()))
        exp.append(float(e[~big].sum()))
    if len(exp) < 2:
        return 1.0
    return float(chisquare(obs, [x * sum(obs) / sum(exp) for x in exp]).pvalue)


@pytest.mark.parametrize("method", METHODS)
def test_seeded_determinism_and_purity(method):
    ver = get_verifier(method)
    parents, tokens, target, draft = instance("mc_sim_7b_63", 40, ver.drafting, seed=5, dtype=torch.float32)
    a = [ver.verify(parents, tokens, target, draft, torch.Generator().manual_seed(s)) for s in range(20)]
    b = [ver.verify(parents, tokens, target, draft, torch.Generator().manual_seed(s)) for s in range(20)]
    assert a == b
    st = structure_of(parents)
    u = torch.rand(st.num_nodes, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert ver.kernel(st, tokens, target, draft, u) == ver.kernel(st, tokens, target, draft, u.clone())
    for i, y in a:
        assert 0 <= i < st.num_nodes and 0 <= y < target.shape[1]


@pytest.mark.parametrize("method", METHODS)
def test_float32_large_vocab_no_nan(method):
    ver = get_verifier(method)
    parents, tokens, target, draft = instance("3x3", 32000, ver.drafting, seed=9, dtype=torch.float32, close=False)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        i, y = ver.verify(parents, tokens, target, draft, g)
        assert 0 <= i < target.shape[0] and 0 <= y < 32000 and float(target[i, y]) > 0


def test_univer_one_hot_laws_temperature_zero_like():
    """Degenerate laws (one-hot target, peaked draft): thresholds stay in [0, 1], no NaN."""
    parents, tokens, target, draft = instance(balanced(2, 2), 5, "topk_residual", seed=2)
    target = torch.nn.functional.one_hot(target.argmax(-1), 5).double()
    out = get_verifier("univer").outcome_probs(parents, tokens, target, draft)
    assert torch.isfinite(out).all() and abs(float(out.sum()) - 1) < 1e-12
    st = structure_of(parents)
    alloc = univer.allocate(st, tokens, target, draft)
    assert ((alloc.threshold >= 0) & (alloc.threshold <= 1)).all()
