"""Exact losslessness of every verifier, by enumeration (float64).

For a tree shape, a drafting rule and laws that depend on the context (the token path), we
enumerate every tree the rule can produce (:func:`children_law` at each node) with its
probability, combine it with the method's exact ``outcome_probs``, continue each outcome with the
target law token by token, and compare the law of the first depth+1 tokens with the target's
law of those tokens (tolerance 1e-9). Broken variants must fail the same check.
"""
from __future__ import annotations

import pytest
import torch

import univer_patch  # noqa: F401  (registers the verifiers)
from eagle.tree import balanced, build_tree
from eagle.verify import available_verifiers, get_verifier
from eagle.verify.checks import check_tree_inputs
from exact_law import F64, REGIMES, TOL, Laws, enumerate_trees, law_error, text_law_error  # noqa: F401
from univer_patch import block, greedy, univer

UNBALANCED = [[0], [1], [0, 0], [0, 0, 0], [1, 0]]


#: every method the registry lists for temperature > 0 (a newly registered one is tested too)
METHODS = {name: (get_verifier(name).drafting, get_verifier(name).outcome_probs)
           for name in available_verifiers(temperature=1.0)}

# (shape name, choices, V) per drafting rule; sizes keep the enumeration small
SHAPES = {
    "wor": [("chain1", [[0]], 5), ("chain2", [[0], [0, 0]], 4), ("chain3", [[0], [0, 0], [0, 0, 0]], 4),
            ("2x2", balanced(2, 2), 4), ("3x1+", [[0], [1], [2], [0, 0]], 4), ("unbalanced", UNBALANCED, 4)],
    "topk_residual": [("chain1", [[0]], 6), ("chain2", [[0], [0, 0]], 5), ("chain3", [[0], [0, 0], [0, 0, 0]], 4),
                      ("2x2", balanced(2, 2), 5), ("2x3", balanced(2, 3), 4), ("3x2", balanced(3, 2), 5),
                      ("unbalanced", UNBALANCED, 4)],
}


def _cases():
    for name, (rule, _) in METHODS.items():
        for shape, choices, V in SHAPES.get(rule, ()):
            for regime in REGIMES:
                marks = [pytest.mark.slow] if shape == "2x3" else []
                yield pytest.param(name, choices, V, regime, id=f"{name}-{shape}-V{V}-{regime}", marks=marks)


@pytest.mark.parametrize("method,choices,V,regime", list(_cases()))
def test_lossless_by_enumeration(method, choices, V, regime):
    rule, fn = METHODS[method]
    assert get_verifier(method).drafting == rule
    err, tau = text_law_error(fn, choices, rule, Laws(V, regime, seed=11))
    assert err < TOL, f"{method} not lossless: max error {err:.3g}"
    assert 1.0 - 1e-9 <= tau <= max(len(c) for c in choices) + 1 + 1e-9


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("method", list(METHODS))
def test_lossless_more_seeds_2x2(method, seed):
    rule, fn = METHODS[method]
    V = 4
    for regime in ("peaked", "close"):
        err, _ = text_law_error(fn, balanced(2, 2), rule, Laws(V, regime, seed=seed))
        assert err < TOL


# ---- negative controls: each broken variant must fail the same check ------------------------

BROKEN = [
    ("rrsw", "full_draft", "wor", balanced(2, 2), 4, get_verifier("rrsw").outcome_probs),
    ("greedy", "full_draft", "topk_residual", balanced(2, 2), 5, get_verifier("greedy").outcome_probs),
    ("traversal", "no_alpha_update", "wor", [[0], [0, 0]], 4, get_verifier("traversal").outcome_probs),
    ("univer", "softmax_residual", "topk_residual", balanced(2, 2), 5, get_verifier("univer").outcome_probs),
    ("univer", "inner_ptilde", "topk_residual", [[0], [0, 0]], 5, get_verifier("univer").outcome_probs),
]


@pytest.mark.parametrize("method,bug,rule,choices,V,fn", BROKEN, ids=[f"{b[0]}-{b[1]}" for b in BROKEN])
def test_broken_variants_fail(method, bug, rule, choices, V, fn):
    def broken(*args, **kw):
        return fn(*args, _broken=bug, **kw)

    errs = [text_law_error(broken, choices, rule, Laws(V, regime, seed=5))[0] for regime in ("peaked", "flat")]
    assert max(errs) > 1e-4, f"the check did not detect {method}/{bug}: errors {errs}"


# ---- paper invariants by exact expectations -------------------------------------------------

def _expected_taus(methods, choices, rule, laws):
    return {m: text_law_error(METHODS[m][1], choices, rule, laws)[1] for m in methods}


def _rand_law(g, V, scale):
    return torch.softmax(scale * torch.randn(V, generator=g, dtype=F64), 0)


def test_univer_root_plan_is_greedy_plan():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        V = int(torch.randint(4, 12, (1,), generator=g))
        m = int(torch.randint(1, 4, (1,), generator=g))
        B, q = _rand_law(g, V, 2.0), _rand_law(g, V, 2.0)
        order = sorted(range(V), key=lambda x: (-float(q[x]), x))
        top = order[: m - 1]
        rest = order[m - 1:]
        last = rest[int(torch.randint(0, len(rest), (1,), generator=g))]
        ctok = top + [last]
        parents = torch.tensor([-1] + [0] * m)
        tokens = torch.tensor([0] + ctok)
        target = torch.stack([B] + [_rand_law(g, V, 1.0) for _ in range(m)])
        draft = torch.stack([q] + [_rand_law(g, V, 1.0) for _ in range(m)])
        st = check_tree_inputs(parents, tokens, target, draft, "topk_residual")
        alloc = univer.allocate(st, tokens, target, draft)
        row = univer.allocation_row(alloc, st, tokens, target, draft, 0, children_zeroed=False)
        plan = greedy.single_step_plan(B, q, ctok)
        assert torch.allclose(row, plan, atol=1e-12, rtol=0), trial
        assert float(alloc.p_not[0]) == 0.0


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_chains_univer_traversal_block_agree(depth):
    g = torch.Generator().manual_seed(depth)
    V = 6
    for trial in range(30):
        scale = [0.5, 2.0, 4.0][trial % 3]
        target = torch.stack([_rand_law(g, V, scale) for _ in range(depth + 1)])
        draft = torch.stack([_rand_law(g, V, scale) for _ in range(depth + 1)])
        if trial % 2:  # close laws
            draft = 0.7 * target + 0.3 * draft
        tokens = torch.tensor([0] + [int(torch.multinomial(draft[i], 1, generator=g)) for i in range(depth)])
        parents = torch.arange(-1, depth)
        u = get_verifier("univer").outcome_probs(parents, tokens, target, draft)
        t = get_verifier("traversal").outcome_probs(parents, tokens, target, draft)
        b = block.outcome_probs(parents, tokens, target, draft)
        assert torch.allclose(u, b, atol=1e-12, rtol=0)
        assert torch.allclose(t, b, atol=1e-12, rtol=0)


def _tau(out: torch.Tensor, parents: torch.Tensor) -> float:
    depth = build_depth(parents)
    return float((out.sum(1) * (depth + 1)).sum())


def build_depth(parents: torch.Tensor) -> torch.Tensor:
    d = torch.zeros(parents.numel(), dtype=F64)
    for i in range(1, parents.numel()):
        d[i] = d[int(parents[i])] + 1
    return d


@pytest.mark.parametrize("shape", ["2x2", "3x2", "unbalanced"])
def test_tau_univer_at_least_greedy(shape):
    """Theorem 6: expected tau over the drafted trees. (Per tree it can fail: seen on 2x2.)"""
    choices = {"2x2": balanced(2, 2), "3x2": balanced(3, 2), "unbalanced": UNBALANCED}[shape]
    V = 5 if shape != "unbalanced" else 4
    for regime in ("peaked", "flat", "close"):
        taus = _expected_taus(["univer", "greedy"], choices, "topk_residual", Laws(V, regime, seed=21))
        assert taus["univer"] >= taus["greedy"] - 1e-12, (regime, taus)


@pytest.mark.parametrize("shape", ["2x2", "3x1+", "unbalanced"])
def test_tau_traversal_at_least_rrsw(shape):
    choices = {"2x2": balanced(2, 2), "3x1+": [[0], [1], [2], [0, 0]], "unbalanced": UNBALANCED}[shape]
    for regime in ("peaked", "close"):
        taus = _expected_taus(["traversal", "rrsw"], choices, "wor", Laws(4, regime, seed=31))
        assert taus["traversal"] >= taus["rrsw"] - 1e-12, (regime, taus)


@pytest.mark.parametrize("k", [1, 9, 10, 25])
def test_positive_part_sums_blocks_match_one_pass(k):
    """The row-blocked dense part of UniVer's Eq. 3 equals the one-pass formula (V = 100000: 10 rows
    per block, so k = 25 takes three blocks, one of them partial)."""
    g = torch.Generator().manual_seed(k)
    V = 100_000
    B = torch.softmax(3 * torch.randn(k, V, generator=g), -1)
    q = torch.softmax(3 * torch.randn(k, V, generator=g), -1)
    lam = torch.rand(k, 1, generator=g) * 2
    want = (B - lam * q).clamp(min=0).sum(1)
    got = univer.positive_part_sums(B, q, lam)
    assert got.shape == (k,) and got.dtype == B.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("choices", [balanced(2, 3), UNBALANCED, balanced(3, 2)], ids=["2x3", "unbalanced", "3x2"])
def test_outcome_law_does_not_depend_on_node_numbering(method, choices):
    """The common tree form only asks parents[i] < i and siblings in rank order. Renumbering the
    nodes depth-first (so a depth's nodes are no longer consecutive) must permute the exact
    outcome law and change nothing else."""
    rule, fn = METHODS[method]
    laws = Laws(5, "peaked", seed=3)
    parents, tokens, target, draft, _, _ = next(iter(enumerate_trees(choices, rule, laws)))
    n = parents.numel()
    children = [[] for _ in range(n)]
    for i in range(1, n):
        children[int(parents[i])].append(i)
    order, stack = [], [0]  # pre-order, siblings in rank order
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(reversed(children[v]))
    assert order != list(range(n)), "the renumbering must differ from the breadth-first one"
    new_of = {old: new for new, old in enumerate(order)}
    perm = torch.tensor(order)
    parents2 = torch.tensor([-1] + [new_of[int(parents[old])] for old in order[1:]])
    out = fn(parents, tokens, target, draft)
    out2 = fn(parents2, tokens[perm], target[perm], draft[perm])
    torch.testing.assert_close(out2, out[perm], rtol=0, atol=1e-12)


# ---- temperature 0: the "argmax" verifier -------------------------------------------------------

class OneHotTargetLaws(Laws):
    """Temperature-0 laws: the target is one-hot on the argmax of the regime's target law (the
    limit of the processing at temperature 0); the draft keeps its (full-support) softmax law."""

    def __call__(self, path: tuple, kind: str) -> torch.Tensor:
        p = super().__call__(path, kind)
        if kind == "target":
            return torch.nn.functional.one_hot(torch.argmax(p), self.V).to(F64)
        return p


TOPK_SHAPES = [("chain3", [[0], [0, 0], [0, 0, 0]], 4), ("2x2", balanced(2, 2), 5), ("3x2", balanced(3, 2), 5),
               ("unbalanced", UNBALANCED, 4)]


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("shape,choices,V", TOPK_SHAPES, ids=[s[0] for s in TOPK_SHAPES])
def test_argmax_lossless_at_temperature_zero(shape, choices, V, regime):
    """The longest greedy match on the top-k tree gives the temperature-0 (one-hot) target law of the
    text exactly; a greedy match against the draft's argmax (a negative control) does not."""
    ver = get_verifier("argmax")
    assert ver.drafting == "topk" and ver.temperature_zero_only
    for seed in (1, 2, 3):
        laws = OneHotTargetLaws(V, regime, seed=seed)
        err, tau = text_law_error(ver.outcome_probs, choices, "topk", laws)
        assert err < TOL, f"argmax not lossless at temperature 0: {err:.3g}"
        assert 1.0 <= tau <= max(len(c) for c in choices) + 1


def test_argmax_negative_control_fails():
    ver = get_verifier("argmax")

    def against_draft(parents, tokens, target, draft, validate=True):
        return ver.outcome_probs(parents, tokens, draft, draft, validate=validate)

    errs = [text_law_error(against_draft, balanced(2, 2), "topk", OneHotTargetLaws(5, r, seed=4))[0]
            for r in ("peaked", "flat")]
    assert max(errs) > 1e-4
