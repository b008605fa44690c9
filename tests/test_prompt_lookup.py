"""Prompt lookup (drafter ``prompt_lookup``): lossless with every verifier by exact enumeration on its own
draft laws (point masses / uniform over the proposed children), temperature-0 equality with greedy decoding,
seeded reproducibility, a target-only model, and the drafter/verifier door."""
import pytest
import torch

import univer_patch  # noqa: F401  (traversal, greedy, univer)
from eagle.drafters import PromptLookupDrafter, available_drafters, get_drafter
from eagle.drafting import Drafter
from eagle.model.ea_model import EaModel
from eagle.sampling import SamplingConfig
from eagle.testing import tiny_ea_model
from eagle.verify import get_verifier
from eagle.verify.checks import prepare_step
from exact_law import F64, REGIMES, TOL, Laws, text_law_error

V = 5
#: context [1, 2, 3, 1, 4, 2] + root 1: the 1-gram (1) occurred twice before; continuations [4, 2] (most
#: recent) and [2, 3]
PROMPT, ROOT = [1, 2, 3, 1, 4, 2], 1
SAMPLED = ["rrsw", "traversal", "greedy", "univer"]


def _drafter(branches: int, depth: int = 2) -> PromptLookupDrafter:
    d = PromptLookupDrafter(V, "cpu", max_ngram=3, min_ngram=1, depth=depth, branches=branches)
    d.start(torch.tensor([PROMPT]))
    return d


class LookupLaws(Laws):
    """Target laws of a regime (random functions of the path); draft laws = the drafter's declared laws at
    the node of the same token path (root label 0 = the drafter's root)."""

    def __init__(self, tree, regime: str, seed: int, one_hot_target: bool = False):
        super().__init__(V, regime, seed)
        self.one_hot = one_hot_target
        par, tok = tree.parents_list, tree.tokens_list
        self.rows = {}
        for i in range(tree.num_nodes):
            path, j = [], i
            while j > 0:
                path.append(tok[j])
                j = par[j]
            self.rows[(0,) + tuple(path[::-1])] = tree.draft_probs[i].to(F64)

    def draft(self, path: tuple, m: int) -> torch.Tensor:
        if m == 0:
            return torch.full((V,), 1.0 / V, dtype=F64)  # a leaf's row is unused
        return self.rows[path]

    def __call__(self, path, kind):
        p = super().__call__(path, kind)
        if kind == "target" and self.one_hot:
            return torch.nn.functional.one_hot(torch.argmax(p), V).to(F64)
        return p


def _choices(branches: int, depth: int) -> list:
    return [[r] + [0] * j for r in range(branches) for j in range(depth)]


@pytest.mark.parametrize("branches", [1, 2])
@pytest.mark.parametrize("method", SAMPLED)
def test_lossless_by_enumeration(method, branches):
    """Every tree the verifier's drafting rule draws from the lookup's laws (one branch: point masses; two:
    uniform over the two first tokens at the root), with random targets: the text's law is the target's."""
    v = get_verifier(method)
    tree = _drafter(branches).draft(ROOT, None, "topk", SamplingConfig(0.0))  # the declared laws (a trie)
    assert tree.num_nodes == 1 + 2 * branches
    for regime in REGIMES:
        for seed in (1, 2):
            err, tau = text_law_error(v.outcome_probs, _choices(branches, 2), v.drafting,
                                      LookupLaws(tree, regime, seed))
            assert err < TOL, f"{method} with prompt lookup not lossless ({regime}, seed {seed}): {err:.3g}"
            assert 1.0 <= tau <= 3.0


@pytest.mark.parametrize("branches", [1, 2])
def test_argmax_lossless_by_enumeration(branches):
    v = get_verifier("argmax")
    tree = _drafter(branches).draft(ROOT, None, "topk", SamplingConfig(0.0))
    for regime in REGIMES:
        err, _ = text_law_error(v.outcome_probs, _choices(branches, 2), "topk",
                                LookupLaws(tree, regime, 3, one_hot_target=True))
        assert err < TOL


@pytest.mark.parametrize("rule", ["wor", "topk_residual", "topk"])
def test_drafted_trees_pass_the_verifier_checks(rule):
    """The drafter's own trees, under each rule, are valid inputs for that rule (children drawn from the
    declared laws); under wor both orders of the two branches occur."""
    orders = set()
    for s in range(12):
        d = _drafter(2)
        tree = d.draft(ROOT, None, rule, SamplingConfig(1.0), torch.Generator().manual_seed(s))
        target = torch.full((tree.num_nodes, V), 1.0 / V)
        prepare_step(tree.parents, tree.tokens, target, tree.draft_probs, rule, True)
        orders.add(tuple(tree.tokens_list[1:3]))
    assert orders == ({(4, 2), (2, 4)} if rule == "wor" else {(2, 4)} if rule == "topk_residual" else {(4, 2)})


def test_lookup_branches_and_no_match():
    d = _drafter(2, depth=3)
    tree = d.draft(ROOT, None, "topk", SamplingConfig(0.0))
    assert tree.tokens_list == [1, 4, 2, 2, 3, 1, 1] and tree.parents_list == [-1, 0, 0, 1, 2, 3, 4]
    assert d.proposals() == [[4, 2, 1], [2, 3, 1]]
    lone = PromptLookupDrafter(V, "cpu", max_ngram=2, min_ngram=2)
    lone.start(torch.tensor([[0, 1, 2]]))
    t = lone.draft(3, None, "wor", SamplingConfig(1.0))
    assert t.num_nodes == 1 and t.tokens_list == [3]
    lone.accept(torch.tensor([[4]]))  # nothing accepted, the next root is 4
    assert lone.history == [0, 1, 2, 3]


def _repetitive_prompt():
    return torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3, 7, 1, 2]])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("branches", [1, 3])
def test_temperature_zero_equals_greedy(seed, branches):
    m = tiny_ea_model(vocab_size=16, seed=seed)
    ids = _repetitive_prompt()
    ref = m.naivegenerate(ids, temperature=0.0, max_new_tokens=40)
    m.set_drafter("prompt_lookup", branches=branches, depth=6)
    out, st = m.eagenerate(ids, temperature=0.0, max_new_tokens=40, return_stats=True)
    assert out.tolist() == ref.tolist()
    assert sum(st["accept_lengths"]) == 39  # + the first token, from the prefill


@pytest.mark.parametrize("method", SAMPLED)
def test_seeded_runs_repeat(method):
    m = tiny_ea_model(vocab_size=16, seed=0)
    ids = _repetitive_prompt()
    kw = dict(temperature=1.0, max_new_tokens=30, verifier=method, drafter="prompt_lookup")
    a = m.eagenerate(ids, seed=7, **kw)
    assert a.tolist() == m.eagenerate(ids, seed=7, **kw).tolist()
    others = {tuple(m.eagenerate(ids, seed=s, **kw)[0].tolist()) for s in range(4)}
    assert len(others) > 1


def test_target_only_model():
    """No EAGLE head: prompt lookup runs; the head drafter is refused in one line."""
    full = tiny_ea_model(vocab_size=16, seed=0)
    m = EaModel(full.base_model, None, drafter="prompt_lookup")
    ids = _repetitive_prompt()
    assert m.eagenerate(ids, max_new_tokens=20).tolist() == full.naivegenerate(ids, max_new_tokens=20).tolist()
    with pytest.raises(ValueError, match="needs an EAGLE head"):
        m.eagenerate(ids, max_new_tokens=5, drafter="eagle")
    with pytest.raises(ValueError, match="needs an EAGLE head"):
        EaModel(full.base_model, None)


def test_refused_pair_names_both():
    class TopkOnly(PromptLookupDrafter):
        name = "topk_only_lookup"
        drafting_rules = ("topk",)

    m = tiny_ea_model(vocab_size=16, seed=0)
    d = TopkOnly(16, "cpu")
    with pytest.raises(ValueError, match="drafter 'topk_only_lookup'.*verifier 'rrsw'") as e:
        m.eagenerate(_repetitive_prompt(), temperature=1.0, max_new_tokens=5, verifier="rrsw", drafter=d)
    assert "\n" not in str(e.value)
    m.eagenerate(_repetitive_prompt(), temperature=0.0, max_new_tokens=5, drafter=d)  # argmax drafts topk


def test_registry():
    assert {"eagle", "prompt_lookup"} <= set(available_drafters())
    assert get_drafter("PROMPT_LOOKUP") is PromptLookupDrafter
    assert issubclass(get_drafter("eagle"), Drafter) and get_drafter("eagle").needs_head
    with pytest.raises(ValueError, match="unknown drafter 'nope'"):
        get_drafter("nope")
    with pytest.raises(ValueError, match="depth"):
        PromptLookupDrafter(16, depth=0)
