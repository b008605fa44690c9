"""Bad inputs: every case of check_tree_inputs raises ValueError naming the node, for every verifier."""
from __future__ import annotations

import pytest
import torch

import univer_patch
from eagle.verify import available_verifiers, get_verifier
from eagle.verify.checks import check_tree_inputs

V = 6


def _law(logits):
    return torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)


def good(rule="topk_residual"):
    """A valid 2x1 tree + one grandchild: nodes 0 (root), 1, 2 (children of 0), 3 (child of 1)."""
    parents = torch.tensor([-1, 0, 0, 1])
    q0 = _law([3.0, 2.0, 1.0, 0.5, 0.2, 0.1])  # top token 0
    target = torch.stack([_law([1.0, 2.0, 0.0, 1.0, 0.5, 0.0]) for _ in range(4)])
    draft = torch.stack([q0, _law([0.0, 1.0, 2.0, 0.0, 0.0, 0.0]), _law([0.0] * 6), _law([0.0] * 6)])
    draft[1, 0] = 0.0  # node 1's draft law has no mass on token 0
    draft[1] = draft[1] / draft[1].sum()
    tokens = torch.tensor([5, 0, 3, 2])  # root children: top-1 (0) then sampled (3)
    return parents, tokens, target, draft


def test_good_passes_every_rule_that_applies():
    p, t, tp, dp = good()
    for rule in (None, "wor", "topk_residual"):
        check_tree_inputs(p, t, tp, dp, rule)
    for name in available_verifiers(temperature=1.0):  # the tree is drafted for temperature > 0
        out = univer_patch.outcome_probs(name, p, t, tp, dp)
        assert abs(float(out.sum()) - 1) < 1e-9


def _mut(fn):
    p, t, tp, dp = good()
    p, t, tp, dp = p.clone(), t.clone(), tp.clone(), dp.clone()
    return fn(p, t, tp, dp)


CASES = {
    "parents shape": (lambda p, t, tp, dp: (p[:3], t, tp, dp), "nodes"),
    "target shape": (lambda p, t, tp, dp: (p, t, tp[:3], dp), "target_probs"),
    "draft shape": (lambda p, t, tp, dp: (p, t, tp, dp[:, :5]), "draft_probs"),
    "float parents": (lambda p, t, tp, dp: (p.double(), t, tp, dp), "integer"),
    "root parent": (lambda p, t, tp, dp: (torch.tensor([0, 0, 0, 1]), t, tp, dp), "node 0"),
    "parent not before": (lambda p, t, tp, dp: (torch.tensor([-1, 0, 3, 1]), t, tp, dp), "node 2"),
    "nan target": (lambda p, t, tp, dp: (p, t, tp.index_put((torch.tensor([2]), torch.tensor([1])), torch.tensor(float("nan"), dtype=tp.dtype)), dp), "node 2"),
    "inf draft": (lambda p, t, tp, dp: (p, t, tp, dp.index_put((torch.tensor([1]), torch.tensor([1])), torch.tensor(float("inf"), dtype=dp.dtype))), "node 1"),
    "negative": (lambda p, t, tp, dp: (p, t, _neg(tp, 3), dp), "node 3"),
    "target sum": (lambda p, t, tp, dp: (p, t, _scale(tp, 3, 1.01), dp), "node 3"),
    "draft sum": (lambda p, t, tp, dp: (p, t, tp, _scale(dp, 1, 0.9)), "node 1"),
    "out of vocab": (lambda p, t, tp, dp: (p, torch.tensor([5, 0, 3, V]), tp, dp), "node 3"),
    "negative token": (lambda p, t, tp, dp: (p, torch.tensor([5, -1, 3, 2]), tp, dp), "node 1"),
    "zero draft prob": (lambda p, t, tp, dp: (p, torch.tensor([5, 0, 3, 0]), tp, dp), "node 3"),
}


def _neg(x, i):
    x[i, 0] -= 2 * x[i, 0] + 0.01
    x[i, 1] += 0.01 + 2 * abs(float(x[i, 0]))  # keep the sum near 1 (only the sign is wrong)
    x[i] = x[i] / x[i].sum()
    return x


def _scale(x, i, f):
    x[i] = x[i] * f
    return x


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", available_verifiers(temperature=1.0))
def test_bad_input_raises_naming_node(case, method):
    fn, needle = CASES[case]
    args = _mut(fn)
    ver = get_verifier(method)
    with pytest.raises(ValueError, match=needle):
        ver.verify(*args, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=needle):
        ver.outcome_probs(*args)


def test_rule_topk_residual_first_children_must_be_top():
    p, t, tp, dp = good()
    t = torch.tensor([5, 1, 3, 2])  # token 1 is not the most probable of the root's draft law
    with pytest.raises(ValueError, match="node 0"):
        check_tree_inputs(p, t, tp, dp, "topk_residual")
    check_tree_inputs(p, t, tp, dp, "wor")  # fine without replacement
    for m in ("greedy", "univer"):
        with pytest.raises(ValueError, match="node 0"):
            get_verifier(m).verify(p, t, tp, dp)


def test_rule_last_child_not_a_top_one_and_distinct():
    p, t, tp, dp = good()
    t = torch.tensor([5, 0, 0, 2])  # sampled child repeats the top child
    for rule, m in (("topk_residual", "univer"), ("wor", "traversal"), ("wor", "rrsw"), ("topk_residual", "greedy")):
        with pytest.raises(ValueError, match="node 2"):
            check_tree_inputs(p, t, tp, dp, rule)
        with pytest.raises(ValueError, match="node 2"):
            get_verifier(m).verify(p, t, tp, dp)


def test_rule_ties_allow_any_order():
    parents = torch.tensor([-1, 0, 0, 0])
    q = torch.tensor([0.3, 0.3, 0.1, 0.3], dtype=torch.float64)
    tp = torch.full((4, 4), 0.25, dtype=torch.float64)
    dp = torch.stack([q, q, q, q])
    # top-2 among three tokens tied at 0.3: (3, 1) is as valid as (0, 1); last = the remaining one
    check_tree_inputs(parents, torch.tensor([0, 3, 1, 0]), tp, dp, "topk_residual")
    check_tree_inputs(parents, torch.tensor([0, 3, 1, 2]), tp, dp, "topk_residual")
    with pytest.raises(ValueError, match="node 0"):
        check_tree_inputs(parents, torch.tensor([0, 2, 1, 0]), tp, dp, "topk_residual")
    check_tree_inputs(parents, torch.tensor([0, 1, 3, 0]), tp, dp, "topk")
    with pytest.raises(ValueError, match="node 0"):
        check_tree_inputs(parents, torch.tensor([0, 1, 2, 3]), tp, dp, "topk")


def test_unknown_rule_and_method():
    with pytest.raises(ValueError):
        check_tree_inputs(*good(), "beam")
    with pytest.raises(ValueError, match="unknown verifier"):
        univer_patch.verify("nope", *good())


def test_apply_calls_set_verifier():
    class Model:
        def set_verifier(self, name):
            get_verifier(name)
            self.name = name

    m = Model()
    assert univer_patch.apply(m, "univer") is m and m.name == "univer"
    with pytest.raises(ValueError):
        univer_patch.apply(m, "nope")


@pytest.mark.parametrize("rule", ["topk_residual", "topk"])
def test_rule_check_matches_sorting_reference(rule):
    """The one-pass count check accepts exactly the child lists a sort-based reference accepts
    (random laws with many ties, every ordered choice of 3 distinct children at the root)."""
    import itertools

    g = torch.Generator().manual_seed(5)
    V = 6
    parents = torch.tensor([-1, 0, 0, 0])
    for trial in range(20):
        q = torch.randint(1, 4, (V,), generator=g).double()  # values in {1,2,3}: ties everywhere
        q = q / q.sum()
        dp = q.expand(4, V).clone()
        tp = torch.full((4, V), 1.0 / V, dtype=torch.float64)
        ntop = 2 if rule == "topk_residual" else 3
        for kids in itertools.permutations(range(V), 3):
            top = list(kids[:ntop])
            others = [x for x in range(V) if x not in top]
            expected = min(q[top]) >= max(q[others])  # no other token strictly more probable
            tokens = torch.tensor([0, *kids])
            if expected:
                check_tree_inputs(parents, tokens, tp, dp, rule)
            else:
                with pytest.raises(ValueError, match="node 0"):
                    check_tree_inputs(parents, tokens, tp, dp, rule)
