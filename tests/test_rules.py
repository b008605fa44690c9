"""Drafting rules: draw_children matches children_law, -1 slots on small support, ties, validity."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from eagle.verify.checks import check_tree_inputs
from eagle.rules import children_law, draw_children, residual_draft, stable_topk
from eagle.sampling import sample_with_uniform


def _law(seed, V, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(V, generator=g, dtype=torch.float64), 0)


@pytest.mark.parametrize("rule,m", [("wor", 1), ("wor", 2), ("wor", 3), ("topk_residual", 1),
                                    ("topk_residual", 2), ("topk_residual", 3), ("topk", 2)])
def test_children_law_sums_to_one(rule, m):
    law = children_law(_law(0, 5), m, rule)
    assert abs(sum(p for _, p in law) - 1) < 1e-12
    assert all(len(set(t)) == len(t) == m for t, _ in law)


@pytest.mark.parametrize("rule,m", [("wor", 2), ("wor", 3), ("topk_residual", 1), ("topk_residual", 3)])
def test_draw_children_matches_children_law(rule, m):
    """Chi-square goodness of fit, fixed seed, 20000 draws in one vectorised call; p-value > 1e-3."""
    V, n = 5, 20000
    q = _law(1, V, 1.0)
    law = dict(children_law(q, m, rule))
    drawn = draw_children(q.float().expand(n, V).contiguous(), m, rule, generator=torch.Generator().manual_seed(7))
    counts: dict = {}
    for row in drawn.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    assert set(counts) <= set(law)
    keys = sorted(law)
    obs = [counts.get(k, 0) for k in keys]
    exp = [law[k] * n for k in keys]
    assert chisquare(obs, exp).pvalue > 1e-3


def test_small_support_gives_minus_one():
    q = torch.tensor([[0.0, 0.6, 0.0, 0.4], [1.0, 0.0, 0.0, 0.0]])
    for rule in ("wor", "topk_residual", "topk"):
        out = draw_children(q, 3, rule, generator=torch.Generator().manual_seed(0))
        assert out.shape == (2, 3)
        assert sorted(out[0, :2].tolist()) == [1, 3] and out[0, 2] == -1, rule
        assert out[1].tolist() == [0, -1, -1], rule


def test_topk_ties_to_lowest_id():
    q = torch.tensor([[0.1, 0.3, 0.3, 0.0, 0.3]])
    assert draw_children(q, 2, "topk").tolist() == [[1, 2]]
    vals, idx = stable_topk(q, 4)
    assert idx.tolist() == [[1, 2, 4, 0]]
    tr = draw_children(q, 3, "topk_residual", generator=torch.Generator().manual_seed(0))
    assert tr[0, :2].tolist() == [1, 2] and tr[0, 2] in (0, 4)


def test_residual_draft():
    q = torch.tensor([[0.5, 0.25, 0.25]])
    r = residual_draft(q, torch.tensor([[0]]))
    assert torch.allclose(r, torch.tensor([[0.0, 0.5, 0.5]]))
    assert residual_draft(torch.tensor([[1.0, 0.0]]), torch.tensor([[0]])).tolist() == [[0.0, 0.0]]


def test_drawn_trees_pass_validation():
    g = torch.Generator().manual_seed(3)
    V = 50
    for rule in ("wor", "topk_residual", "topk"):
        for m in (1, 2, 4):
            q = torch.softmax(2 * torch.randn(1, V, generator=g), -1)
            ch = draw_children(q, m, rule, generator=g)[0]
            n = m + 1
            parents = torch.tensor([-1] + [0] * m)
            tokens = torch.cat([torch.tensor([0]), ch])
            target = torch.softmax(torch.randn(n, V, generator=g), -1)
            draft = torch.cat([q, torch.softmax(torch.randn(m, V, generator=g), -1)])
            check_tree_inputs(parents, tokens, target, draft, rule)


def test_sample_with_uniform():
    row = torch.tensor([0.0, 0.2, 0.0, 0.8])
    assert sample_with_uniform(row, 0.0) == 1
    assert sample_with_uniform(row, 0.19) == 1
    assert sample_with_uniform(row, 0.21) == 3
    assert sample_with_uniform(row, 1 - 1e-17) == 3
    assert sample_with_uniform(torch.tensor([0.0, 2.0, 2.0]), 0.5) == 2  # unnormalised rows are fine
    with pytest.raises(ValueError):
        sample_with_uniform(torch.zeros(3), 0.5)


def test_bad_arguments():
    with pytest.raises(ValueError):
        draw_children(torch.ones(1, 3) / 3, 2, "beam")
    with pytest.raises(ValueError):
        draw_children(torch.ones(1, 3) / 3, 4, "wor")
    with pytest.raises(ValueError):
        draw_children(torch.ones(3) / 3, 1, "wor")
