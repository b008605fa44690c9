"""EAGLE-2 dynamic draft trees (issue 50, item 3): the spec, the expansion, losslessness, the engine, the harness.

- The spec ``eagle2[:nodes=N,depth=D,topk=K]``: EAGLE-2's defaults, one-line refusals of malformed specs.
- The vectorised expansion (:func:`eagle.tree.dynamic.expand_dynamic`) on context-dependent laws
  (:class:`exact_law.Laws`) equals a plain-Python EAGLE-2 reference; kept children are a prefix of the
  top-k (score order = draft-probability order among siblings), the tree is closed under ancestors.
  A selection on the child's own probability (not the cumulative one) must fail.
- Losslessness by exact enumeration: on the dynamic trees of several contexts, settings and all four law
  regimes, argmax (topk, temperature 0) and Greedy / UniVer (topk_residual) give the target's text law
  to 1e-9. Broken variants must fail: the expansion's deterministic children handed to Greedy / UniVer
  as if drafted under topk_residual; a shape that depends on the target law of a drawn child; EAGLE-2's
  selection over ``wor`` draws under RRSw / Traversal (which is why those are refused).
- The engine: temperature 0 equals plain greedy decoding token for token (several sizes, a draft
  vocabulary included); greedy / univer at temperature 1 are seeded-reproducible; rrsw / traversal and a
  drafter without dynamic trees are refused in one line; the head's dynamic tree equals the reference
  selection on the laws of the full static top-k tree; one host read per draft (topk).
- The harness accepts the spec in ``--tree`` / ``--speed-tree`` and refuses what the engine would.
"""
from __future__ import annotations

import math
import zlib

import pytest
import torch

import eagle.tree.dynamic as dyn
from eagle.drafting import DraftTree, EagleTreeDrafter
from eagle.model.kv_cache import new_cache
from eagle.rules import children_law, stable_topk
from eagle.sampling import SamplingConfig
from eagle.testing import tiny_ea_model
from eagle.tree import EAGLE2, DynamicTree, TreeBuffers, balanced, build_any_tree, build_tree, parse_dynamic_tree
from eagle.verify import get_verifier
from exact_law import F64, REGIMES, TOL, Laws, law_error, text_law_error

# ---- the spec ------------------------------------------------------------------------------------


def test_spec_defaults_and_forms():
    assert EAGLE2 == DynamicTree(nodes=59, depth=6, top_k=10)  # EAGLE-2: 60 tokens per forward incl. the root
    assert parse_dynamic_tree("eagle2") is EAGLE2
    assert parse_dynamic_tree(" EAGLE2:nodes=24,depth=5,topk=8 ") == DynamicTree(24, 5, 8)
    assert parse_dynamic_tree("eagle2:depth=3") == DynamicTree(59, 3, 10)
    assert parse_dynamic_tree("eagle2:topk=2, nodes=3") == DynamicTree(3, 6, 2)
    t = DynamicTree(7, 3, 2)
    assert parse_dynamic_tree(t.spec) == t and parse_dynamic_tree(t) is t and str(t) == t.spec
    for static in ("2x5", "mc_sim_7b_63", "chain3", [[0], [1]], None, 3):
        assert parse_dynamic_tree(static) is None
    assert isinstance(build_any_tree("2x5"), TreeBuffers) and build_any_tree("eagle2:nodes=4") == DynamicTree(4, 6, 10)
    assert t.on("cpu") is None  # no static plan


BAD_SPECS = ["eagle2:", "eagle2x", "eagle2:nodes", "eagle2:nodes=", "eagle2:nodes=0", "eagle2:nodes=-3",
             "eagle2:nodes=2.5", "eagle2:nodes=abc", "eagle2:width=3", "eagle2:nodes=3,nodes=4", "eagle2;nodes=3",
             "eagle2:nodes=11,depth=1,topk=10", "eagle2:nodes=7,depth=2,topk=2", "eagle2:nodes=3,,depth=2",
             "eagle2:adapt=2", "eagle2:adapt=yes", "eagle2:adapt=1,adapt=1"]


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_malformed_specs_are_refused_in_one_line(spec):
    with pytest.raises(ValueError) as e:
        parse_dynamic_tree(spec)
    msg = str(e.value)
    assert "\n" not in msg and "eagle2" in msg, msg
    with pytest.raises(ValueError):
        build_any_tree(spec)


def test_bad_dataclass_values_and_unknown_names():
    for bad in ((0, 1, 1), (1, 0, 1), (1, 1, 0), (True, 1, 1), (1.0, 1, 1), (3, 1, 2)):
        with pytest.raises(ValueError):
            DynamicTree(*bad)
    with pytest.raises(ValueError, match="eagle2"):  # an unknown static name is told about the dynamic form
        build_any_tree("bogus")


# ---- the expansion on context-dependent laws --------------------------------------------------------


class PathLaws:
    """The draft law after a token path, served to :func:`expand_dynamic` as its callback (host reads: fine
    in a test). Paths start with the root token 0, as :class:`exact_law.Laws` keys them."""

    def __init__(self, law_of):
        self.law_of = law_of
        self.paths = [(0,)]  # row 0 = the root

    def root(self):
        return self.law_of((0,))

    def __call__(self, front):
        rows = []
        for tok, prow in zip(front.tokens.tolist(), front.parent_rows.tolist()):
            path = self.paths[prow] + (tok,)
            self.paths.append(path)
            rows.append(self.law_of(path))
        assert front.rows.tolist() == list(range(len(self.paths) - len(rows), len(self.paths)))
        # the visibility of a frontier row = itself and its ancestors among the rows made so far
        anc = [[self.paths[j + 1] == self.paths[r][:len(self.paths[j + 1])] for j in range(front.visible.shape[1])]
               for r in front.rows.tolist()]
        assert front.visible.tolist() == anc
        return torch.stack(rows)


def dynamic_of(tree: DynamicTree, law_of):
    """(choices, tokens by rank path, DynamicDraft) of the dynamic tree on the laws ``law_of(path)``."""
    pl = PathLaws(law_of)
    root = pl.root()
    ex = dyn.expand_dynamic(tree, root, pl, stable_topk)
    res = dyn.finish_dynamic(ex, 0, root.shape[0], max_depth=tree.depth)
    return res


def reference_choices(tree: DynamicTree, law_of, V: int) -> tuple[set, dict]:
    """EAGLE-2's selection in plain Python (lists, math.log): rank paths kept and their tokens."""
    m = min(tree.top_k, V)

    def top(q):
        q = q.tolist()
        return [(x, q[x]) for x in sorted(range(V), key=lambda x: (-q[x], x))[:m]]

    def lg(p):
        return math.log(p) if p > 0 else -math.inf

    cands = []  # (score, creation index, rank path, token path)
    for r, (x, p) in enumerate(top(law_of((0,)))):
        cands.append((min(lg(p), 0.0), len(cands), (r,), (0, x)))
    front = list(cands)
    for _ in range(1, tree.depth):
        new = []
        for score, _, rp, tp in front:
            for r, (x, p) in enumerate(top(law_of(tp))):
                new.append((score + min(lg(p), 0.0), len(cands) + len(new), rp + (r,), tp + (x,)))
        cands += new
        front = sorted(new, key=lambda c: (-c[0], c[1]))[:tree.top_k]
    kept = [c for c in sorted(cands, key=lambda c: (-c[0], c[1]))[:tree.nodes] if c[0] > -math.inf]
    return {c[2] for c in kept}, {c[2]: c[3][-1] for c in kept}


SETTINGS = [DynamicTree(3, 2, 2), DynamicTree(4, 3, 2), DynamicTree(5, 2, 3), DynamicTree(3, 3, 1),
            DynamicTree(6, 3, 3)]
#: larger trees for the comparison with the reference (deep frontiers matter there)
REF_SETTINGS = SETTINGS + [DynamicTree(8, 4, 2), DynamicTree(12, 4, 3), DynamicTree(9, 3, 4), DynamicTree(20, 5, 3)]


def _check_invariants(res, law_of):
    """Closed under ancestors (by construction of parents), siblings = a prefix of the parent's top-k in
    rank order, and among siblings the draft-probability order is the rank order."""
    par, tok = res.parents_list, res.tokens_list
    paths = [(0,)]
    for i in range(1, len(par)):
        assert 0 <= par[i] < i
        paths.append(paths[par[i]] + (tok[i],))
    for v in range(len(par)):
        kids = [i for i in range(1, len(par)) if par[i] == v]
        if not kids:
            continue
        q = law_of(paths[v])
        ranked = [x for x, _ in sorted(enumerate(q.tolist()), key=lambda t: (-t[1], t[0]))]
        assert [tok[i] for i in kids] == ranked[:len(kids)], "kept children are not a prefix of the top-k"
        probs = [float(q[tok[i]]) for i in kids]
        assert probs == sorted(probs, reverse=True) and min(probs) > 0
        assert [c[-1] for c in (res.choices[i - 1] for i in kids)] == list(range(len(kids)))
        assert torch.equal(res.draft_probs[v], q)  # the law the children were taken from


@pytest.mark.parametrize("tree", REF_SETTINGS, ids=str)
def test_expansion_equals_the_reference_on_context_dependent_laws(tree):
    V = 5
    shapes = set()
    for seed, regime in enumerate(REGIMES * 2):
        laws = Laws(V, regime, seed=300 + seed)
        law_of = lambda p: laws(p, "draft")  # noqa: E731
        res = dynamic_of(tree, law_of)
        want, want_tok = reference_choices(tree, law_of, V)
        got = {tuple(c) for c in res.choices}
        assert got == want and len(res.choices) == len(set(got))
        assert len(res.choices) == min(tree.nodes, tree.top_k + (tree.depth - 1) * tree.top_k ** 2)
        assert {tuple(c): t for c, t in zip(res.choices, res.tokens_list[1:])} == want_tok
        _check_invariants(res, law_of)
        # device tensors agree with the host lists; inner nodes carry their draft law
        assert res.parents.tolist() == res.parents_list and res.tokens.tolist() == res.tokens_list
        st = res.structure
        for v in range(len(res.parents_list)):
            assert res.depth[v] == st.depth[v]
            anc, u = set(), v
            while u >= 0:
                anc.add(u)
                u = res.parents_list[u]
            assert {j for j in range(len(res.parents_list)) if res.ancestor[v, j]} == anc
        shapes.add(tuple(sorted(got)))
    if tree.top_k > 1 and tree.nodes < tree.candidates:
        assert len(shapes) > 1, "the shape never changed with the context"


def _tied_law(path, V=4):
    """Laws with exact ties and zeros: a point mass, two halves, or uniform, chosen by the path."""
    h = zlib.crc32(repr(path).encode())
    q = torch.zeros(V, dtype=F64)
    kind = h % 3
    if kind == 0:
        q[(h // 3) % V] = 1.0
    elif kind == 1:
        q[(h // 3) % V] = q[(h // 3 + 1 + h // 12 % (V - 1)) % V] = 0.5
    else:
        q[:] = 1.0 / V
    return q


@pytest.mark.parametrize("tree", [DynamicTree(10, 3, 2), DynamicTree(12, 3, 3), DynamicTree(6, 4, 2),
                                  DynamicTree(30, 4, 3)], ids=str)
def test_ties_and_zero_probabilities(tree):
    """Exact ties (a child with probability 1 ties its parent; equal siblings) go to the candidate made
    first, so the tree stays closed under ancestors and siblings stay a rank prefix; zero-probability
    candidates are never kept (the tree may have fewer than ``nodes`` nodes)."""
    for salt in range(6):
        law_of = lambda p: _tied_law((salt,) + p)  # noqa: E731
        res = dynamic_of(tree, law_of)
        want, want_tok = reference_choices(tree, law_of, 4)
        assert {tuple(c) for c in res.choices} == want
        assert {tuple(c): t for c, t in zip(res.choices, res.tokens_list[1:])} == want_tok
        _check_invariants(res, law_of)


def test_a_selection_on_the_childs_own_probability_fails(monkeypatch):
    """Negative control: scoring a child by its own draft probability (not the cumulative one) breaks the
    equality with the reference (or the closure under ancestors)."""
    monkeypatch.setattr(dyn, "_cumulate", lambda ps, cp: torch.log(cp))
    failures = 0
    for tree in REF_SETTINGS:
        for seed in range(4):
            laws = Laws(5, "peaked", seed=300 + seed)
            law_of = lambda p: laws(p, "draft")  # noqa: E731
            try:
                got = {tuple(c) for c in dynamic_of(tree, law_of).choices}
            except ValueError:
                failures += 1
                continue
            failures += got != reference_choices(tree, law_of, 5)[0]
    assert failures > 0


def test_draft_vocabulary_token_map():
    """With a token map (a draft vocabulary) the tree's tokens are mapped and the laws widened to V."""
    laws = Laws(4, "peaked", seed=5)
    tmap = torch.tensor([7, 2, 9, 4])
    pl = PathLaws(lambda p: laws(tuple(p[:1]) + tuple(int((tmap == t).nonzero()) for t in p[1:]), "draft"))
    tree = DynamicTree(4, 3, 2)
    ex = dyn.expand_dynamic(tree, pl.root(), pl, stable_topk, token_map=tmap)
    res = dyn.finish_dynamic(ex, 3, 12)
    assert set(res.tokens_list[1:]) <= set(tmap.tolist()) and res.draft_probs.shape == (len(res.parents_list), 12)
    assert torch.equal(res.draft_probs[0, tmap], laws((0,), "draft"))
    assert float(res.draft_probs[:, [0, 1, 3, 5, 6, 8, 10, 11]].abs().sum()) == 0.0
    plain = dynamic_of(tree, lambda p: laws(p, "draft"))
    assert res.choices == plain.choices and [tmap[t].item() for t in plain.tokens_list[1:]] == res.tokens_list[1:]


# ---- losslessness by exact enumeration ------------------------------------------------------------


class OneHotTargetLaws(Laws):
    """Temperature 0: the target one-hot on its argmax; the draft keeps its soft law."""

    def __call__(self, path, kind):
        p = super().__call__(path, kind)
        return torch.nn.functional.one_hot(torch.argmax(p), self.V).to(F64) if kind == "target" else p


LOSSLESS_CASES = [(tree, method) for tree in SETTINGS for method in ("argmax", "greedy", "univer")]


@pytest.mark.parametrize("tree,method", LOSSLESS_CASES, ids=lambda x: str(x))
def test_dynamic_trees_are_lossless(tree, method):
    """The dynamic shape of each context (draft laws only), drafted under the verifier's rule and verified,
    gives the target's text law to 1e-9, in every regime."""
    ver = get_verifier(method)
    V = 4
    for i, regime in enumerate(REGIMES):
        laws = (OneHotTargetLaws if method == "argmax" else Laws)(V, regime, seed=400 + 7 * i + len(tree.spec))
        res = dynamic_of(tree, lambda p: laws(p, "draft"))
        err, tau = text_law_error(ver.outcome_probs, res.choices, ver.drafting, laws, root_token=i % V)
        assert err < TOL, f"{method} on {tree} ({regime}): max error {err:.3g}"
        assert 1.0 - 1e-9 <= tau <= tree.depth + 1 + 1e-9


def _mixture_law_error(trees, laws, depth):
    """Max |text law - target law| for a mixture of drafted trees ``[(outcome [N, V], prob, paths)]``."""
    L = {}
    for out, prob, paths in trees:
        assert abs(float(out.sum()) - 1.0) < 1e-9
        for i, row in enumerate(out.tolist()):
            for y, w in enumerate(row):
                if w > 0:
                    key = paths[i][1:] + (y,)
                    L[key] = L.get(key, 0.0) + prob * w
    assert abs(sum(L.values()) - 1.0) < 1e-9
    return law_error(L, lambda p: laws(p, "target"), laws.V, depth)


def _depth1_tree(children, laws):
    """(parents, tokens, target, draft, paths) of a root (token 0) with the given children tokens."""
    n = len(children) + 1
    paths = [(0,)] + [(0, c) for c in children]
    parents = torch.tensor([-1] + [0] * (n - 1))
    tokens = torch.tensor([0] + list(children))
    target = torch.stack([laws(p, "target") for p in paths])
    draft = torch.stack([laws(p, "draft") for p in paths])
    return parents, tokens, target, draft, paths


@pytest.mark.parametrize("method", ["greedy", "univer"])
def test_deterministic_children_under_topk_residual_fail(method):
    """Negative control: the expansion's own tokens (every kept child a top-k token) passed to Greedy /
    UniVer as a topk_residual tree; the last child must be a residual draw instead."""
    ver = get_verifier(method)
    errs = []
    for i, regime in enumerate(("peaked", "flat", "close")):
        laws = Laws(4, regime, seed=500 + i)
        res = dynamic_of(DynamicTree(4, 3, 2), lambda p: laws(p, "draft"))
        errs.append(text_law_error(ver.outcome_probs, res.choices, "topk", laws)[0])
    assert max(errs) > 1e-3, errs


@pytest.mark.parametrize("method", ["greedy", "univer"])
def test_a_shape_that_depends_on_the_target_law_fails(method):
    """Negative control: the root keeps its residual-drawn child only where the target favours it
    (target >= residual draft there), else only its top child. The real rule keeps both: lossless."""
    ver = get_verifier(method)
    errs, good = [], []
    for i, regime in enumerate(("peaked", "flat", "close")):
        laws = Laws(4, regime, seed=600 + i)
        q = laws((0,), "draft")
        p = laws((0,), "target")
        top = children_law(q, 1, "topk")[0][0][0]
        res = q.clone()
        res[top] = 0
        res = res / res.sum()
        broken, real = [], []
        for u in range(4):
            if u == top or res[u] == 0:
                continue
            kids = (top, u) if p[u] >= res[u] else (top,)
            for store, ch in ((broken, kids), (real, (top, u))):
                parents, tokens, target, draft, paths = _depth1_tree(ch, laws)
                store.append((ver.outcome_probs(parents, tokens, target, draft, validate=False), float(res[u]), paths))
        errs.append(_mixture_law_error(broken, laws, 1))
        good.append(_mixture_law_error(real, laws, 1))
    assert max(good) < TOL and max(errs) > 1e-3, (good, errs)


@pytest.mark.parametrize("method", ["rrsw", "traversal"])
def test_eagle2_selection_over_wor_draws_is_lossy(method):
    """Why rrsw / traversal are refused: EAGLE-2's selection (keep the most probable of the top_k drawn
    children) over children drawn without replacement changes the law of the kept child (depth 1, top_k 2,
    one node kept), and the verifier's output law is then not the target's."""
    ver = get_verifier(method)
    errs = []
    for i, regime in enumerate(("peaked", "flat", "close")):
        laws = Laws(4, regime, seed=700 + i)
        q = laws((0,), "draft")
        trees = []
        for draws, prob in children_law(q, 2, "wor"):
            kept = max(draws, key=lambda x: (float(q[x]), -x))
            parents, tokens, target, draft, paths = _depth1_tree((kept,), laws)
            trees.append((ver.outcome_probs(parents, tokens, target, draft, validate=False), prob, paths))
        errs.append(_mixture_law_error(trees, laws, 1))
    assert max(errs) > 1e-3, errs


# ---- the engine -------------------------------------------------------------------------------------

IDS = torch.tensor([[1, 2, 3, 4, 5]])


@pytest.fixture(scope="module")
def model():
    return tiny_ea_model(vocab_size=64, seed=0, aligned=True)


@pytest.fixture(scope="module")
def raw_model():
    """Not aligned: the head's attention (positions, tree mask) moves its laws visibly."""
    return tiny_ea_model(vocab_size=64, seed=1)


@pytest.mark.parametrize("tree", ["eagle2", "eagle2:nodes=8,depth=3,topk=3", "eagle2:nodes=24,depth=5,topk=8",
                                  "eagle2:nodes=1,depth=1,topk=1", "eagle2:nodes=5,depth=5,topk=1"])
def test_temperature_zero_equals_plain_greedy(model, tree):
    ref = model.naivegenerate(IDS, max_new_tokens=40)
    out, st = model.eagenerate(IDS, temperature=0.0, max_new_tokens=40, tree_choices=tree, return_stats=True)
    assert torch.equal(out, ref)
    assert max(st["accept_lengths"]) <= parse_dynamic_tree(tree).depth + 1
    if parse_dynamic_tree(tree).nodes > 1:
        assert sum(st["accept_lengths"]) > len(st["accept_lengths"])  # the aligned head gets tokens accepted


def test_temperature_zero_equals_plain_greedy_with_a_draft_vocabulary():
    m = tiny_ea_model(vocab_size=32, seed=3, aligned=True)
    ref = m.naivegenerate(IDS, max_new_tokens=32)
    m.ea_layer.set_draft_vocab(torch.tensor([0, 1, 2, 3, 5, 6, 7, 8, 13, 21, 30, 31]))
    out = m.eagenerate(IDS, temperature=0.0, max_new_tokens=32, tree_choices="eagle2:nodes=10,depth=4,topk=4")
    assert torch.equal(out, ref)


@pytest.mark.parametrize("method", ["greedy", "univer"])
def test_temperature_one_is_seeded_reproducible(model, method):
    kw = dict(temperature=1.0, max_new_tokens=30, tree_choices="eagle2:nodes=12,depth=4,topk=4", verifier=method)
    a, sa = model.eagenerate(IDS, seed=3, return_stats=True, **kw)
    b, sb = model.eagenerate(IDS, seed=3, return_stats=True, **kw)
    assert torch.equal(a, b) and sa["accept_lengths"] == sb["accept_lengths"]
    outs = {tuple(model.eagenerate(IDS, seed=s, **kw)[0].tolist()) for s in range(4)}
    assert len(outs) > 1  # the seed matters (sampling happens)


@pytest.mark.parametrize("method", ["rrsw", "traversal"])
def test_wor_verifiers_are_refused_in_one_line(model, method):
    with pytest.raises(ValueError) as e:
        model.eagenerate(IDS, temperature=1.0, max_new_tokens=8, tree_choices="eagle2", verifier=method, seed=0)
    msg = str(e.value)
    assert "\n" not in msg and "'eagle'" in msg and "eagle2:nodes=59,depth=6,topk=10" in msg and repr(method) in msg
    # at temperature 0 every name runs argmax: allowed
    model.eagenerate(IDS, temperature=0.0, max_new_tokens=4, tree_choices="eagle2", verifier=method)
    with pytest.raises(ValueError, match="wor"):
        model.tree_laws(IDS, tree_choices="eagle2", drafting="wor")


def test_malformed_spec_through_the_engine(model):
    with pytest.raises(ValueError) as e:
        model.eagenerate(IDS, max_new_tokens=4, tree_choices="eagle2:nodes=0")
    assert "\n" not in str(e.value) and "nodes" in str(e.value)


def test_a_drafter_without_dynamic_trees_is_refused(model):
    class Static(EagleTreeDrafter):  # same laws, but it did not declare dynamic trees
        name = "static_eagle"

    d = Static(model.ea_layer, model.lm_head)
    with pytest.raises(ValueError, match="static trees only") as e:
        model.eagenerate(IDS, max_new_tokens=4, tree_choices="eagle2", drafter=d)
    assert "\n" not in str(e.value) and "'static_eagle'" in str(e.value)
    out = model.eagenerate(IDS, max_new_tokens=4, tree_choices="2x2", drafter=d)  # static trees still run
    assert out.shape[1] == IDS.shape[1] + 4


def _started_drafter(m, ids):
    d = EagleTreeDrafter(m.ea_layer, m.lm_head)
    cache = new_cache(m.base_model.config)
    n = ids.shape[1]
    feats, _ = m.target_forward(ids[:, :-1], torch.arange(n - 1)[None], cache)
    d.start(ids[:, :-1], feats)
    return d


@pytest.mark.parametrize("tree", [DynamicTree(8, 3, 3), DynamicTree(7, 4, 2), DynamicTree(30, 4, 3)], ids=str)
def test_head_tree_equals_the_reference_on_the_full_top_k_tree(raw_model, tree):
    """The head's dynamic tree (topk) = EAGLE-2's selection (plain Python) on the laws of the full static
    top-k tree (``top_k`` children per node, ``depth`` levels); same tokens and laws on every kept node."""
    ids = torch.tensor([[3, 9, 4, 1, 7, 2]])
    d = _started_drafter(raw_model, ids)
    cfg = SamplingConfig(0.0, 1.0, 0)
    root = int(ids[0, -1])
    got = d.draft(root, tree, "topk", cfg)
    full_choices = balanced(tree.top_k, tree.depth)
    full = d.draft(root, build_tree(full_choices), "topk", cfg)  # the same state (the cache is restored)
    order = [()] + [tuple(c) for c in build_tree(full_choices).choices]
    node = {p: i for i, p in enumerate(order)}
    tok_path = {(): (0,)}
    for p in order[1:]:
        tok_path[p] = tok_path[p[:-1]] + (full.tokens_list[node[p]],)
    law_by_tokens = {tok_path[p]: full.draft_probs[node[p]] for p in order}
    want, want_tok = reference_choices(tree, lambda tp: law_by_tokens[tp], full.draft_probs.shape[1])
    paths = [()]
    for i in range(1, got.num_nodes):
        par = got.parents_list[i]
        rank = sum(1 for j in range(1, i) if got.parents_list[j] == par)
        paths.append(paths[par] + (rank,))
    assert set(paths[1:]) == want
    for i, p in enumerate(paths):
        assert got.tokens_list[i] == full.tokens_list[node[p]]
        if any(got.parents_list[j] == i for j in range(got.num_nodes)):  # inner: the law its children came from
            torch.testing.assert_close(got.draft_probs[i], full.draft_probs[node[p]], rtol=1e-5, atol=1e-6)
    assert isinstance(got, DraftTree) and got.tokens.tolist() == got.tokens_list
    assert got.depth.tolist() == [len(p) for p in paths]
    for i in range(got.num_nodes):  # [i, j] iff path j is a prefix of path i
        assert got.ancestor[i].tolist() == [paths[i][:len(paths[j])] == paths[j] for j in range(got.num_nodes)]


def _rank_paths(t):
    paths = [()]
    for i in range(1, t.num_nodes):
        par = t.parents_list[i]
        paths.append(paths[par] + (sum(1 for j in range(1, i) if t.parents_list[j] == par),))
    return paths


@pytest.mark.parametrize("draft_vocab", [False, True], ids=["full_vocab", "draft_vocab"])
def test_topk_residual_drafts_the_dynamic_shape_as_a_static_tree(draft_vocab):
    """Under topk_residual the dynamic tree's shape (from the topk expansion) is drafted as a static tree with the
    caller's generator: the same tokens and laws as drafting that shape with the static expansion and the same
    seed. Where no node with children is a last child or below one, the draft reuses the expansion's laws (no
    head pass after the expansion's); elsewhere the head redrafts the shape. Both cases occur below."""
    m = tiny_ea_model(vocab_size=64, seed=1)
    if draft_vocab:
        m.ea_layer.set_draft_vocab(torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 34, 40, 50, 55, 60, 63]))
    cfg = SamplingConfig(1.0, 1.0, 0)
    calls = []
    hook = m.ea_layer.register_forward_hook(lambda *a: calls.append(1))
    reused = redrafted = 0
    try:
        for ctx in ([3, 9, 4, 1, 7, 2], [5, 5, 6, 0, 2], [1, 2, 3, 4, 5, 6, 7, 8]):
            ids = torch.tensor([ctx])
            for tree in (DynamicTree(9, 3, 3), DynamicTree(5, 2, 3), DynamicTree(6, 3, 2), DynamicTree(3, 3, 1)):
                d = _started_drafter(m, ids)
                d.draft(2, tree, "topk", cfg)  # consume the context
                shape = d.draft(2, tree, "topk", cfg)
                paths = _rank_paths(shape)
                for seed in range(3):
                    calls.clear()
                    a = d.draft(2, tree, "topk_residual", cfg, torch.Generator().manual_seed(seed))
                    passes = len(calls)
                    calls.clear()
                    d.draft(2, tree, "topk", cfg)
                    if passes == len(calls):
                        reused += 1
                    else:
                        redrafted += 1
                        assert passes > len(calls)
                    b = d.draft(2, build_tree([list(p) for p in paths[1:]]), "topk_residual", cfg,
                                torch.Generator().manual_seed(seed))
                    assert a.tokens_list == b.tokens_list and a.parents_list == b.parents_list
                    torch.testing.assert_close(a.draft_probs, b.draft_probs, rtol=1e-5, atol=1e-6)
                    assert _rank_paths(a) == paths
    finally:
        hook.remove()
    assert reused and redrafted, (reused, redrafted)


def test_one_host_read_per_topk_draft(model):
    from test_sync_count import HostReadCounter

    d = _started_drafter(model, torch.tensor([[3, 9, 4, 1, 7, 2]]))
    cfg = SamplingConfig(0.0, 1.0, 0)
    d.draft(2, EAGLE2, "topk", cfg)  # consume the prompt, warm the caches
    with HostReadCounter() as c:
        t = d.draft(2, EAGLE2, "topk", cfg)
    assert t.num_nodes == EAGLE2.nodes + 1
    assert sum(c.counts.values()) == 1, c.what


def test_tree_laws_with_a_dynamic_tree(model):
    laws = model.tree_laws(IDS, tree_choices="eagle2:nodes=10,depth=4,topk=3", drafting="topk_residual",
                           temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert laws.parents.numel() == 11
    for method in ("greedy", "univer"):
        out = get_verifier(method).outcome_probs(laws.parents, laws.tokens, laws.target_probs, laws.draft_probs)
        assert abs(float(out.sum()) - 1.0) < 1e-5


# ---- the harness ----------------------------------------------------------------------------------


def test_harness_accepts_and_refuses_dynamic_trees():
    from evaluation import arguments as A

    assert A.check_tree("eagle2") == "eagle2"
    assert A.check_tree("eagle2:nodes=24,depth=5,topk=8", "--speed-tree") == "eagle2:nodes=24,depth=5,topk=8"
    # one spelling per tree (it names answer files and table rows)
    assert A.check_tree(" EAGLE2") == "eagle2"
    assert A.check_tree("eagle2:depth=2, nodes=5") == "eagle2:nodes=5,depth=2,topk=10"
    with pytest.raises(A.UsageError) as e:
        A.check_tree("eagle2:nodes=0")
    assert str(e.value).startswith("--tree:") and "\n" not in str(e.value)
    A.check_dynamic_trees([("--tree", "eagle2", ["naive", "greedy", "univer"])], "eagle", 1.0)
    A.check_dynamic_trees([("--tree", "eagle2", ["rrsw", "traversal"])], "eagle", 0.0)  # argmax
    A.check_dynamic_trees([("--tree", "2x5", ["rrsw"])], "eagle", 1.0)  # static: untouched
    A.check_dynamic_trees([("--speed-tree", "eagle2", ["univer"])], "eagle", 1.0)
    for trees, flag, words in (([("--tree", "eagle2", ["univer", "rrsw"])], "--tree", "'rrsw'"),
                               ([("--speed-tree", "eagle2", ["traversal"])], "--speed-tree", "'traversal'"),
                               ([("--tree", "eagle2", ["univer"])], "--tree", "'draft_lm'")):
        with pytest.raises(A.UsageError) as e:
            A.check_dynamic_trees(trees, "draft_lm" if "'draft_lm'" in words else "eagle", 1.0)
        assert str(e.value).startswith(flag + ":") and words in str(e.value) and "\n" not in str(e.value)
    assert A.coincidence_note("eagle2", 1.0, ["greedy", "univer"]) is None


# ---- adaptive trees (adapt=1): the node count chosen per cycle from the draft laws and the cycle costs ----


def _costs(nodes, step=0.01, base=0.05):
    return tuple(base + step * n for n in range(1, nodes + 1))


def test_adaptive_spec_round_trip_and_costs():
    from eagle.tree.auto import CycleCost
    t = parse_dynamic_tree("eagle2:nodes=6,depth=3,topk=2,adapt=1")
    assert t.adapt and t.cycle_s is None and parse_dynamic_tree(t.spec) == t and t.spec.endswith(",adapt=1")
    assert parse_dynamic_tree("eagle2:nodes=6,depth=3,topk=2,adapt=0") == DynamicTree(6, 3, 2)
    c = CycleCost(target_tokens=(1, 2, 4, 8), target_s=(0.05, 0.06, 0.08, 0.1), draft_level_s=0.01, fixed_s=0.002)
    tc = t.with_cycle_cost(c)
    assert tc == t and len(tc.cycle_s) == 6 and tc.cycle_s[0] == pytest.approx(c.cycle_s(1, 3))
    for bad in ((0.1,) * 5, (0.1,) * 5 + (float("nan"),), (0.1,) * 5 + (0.0,), 5, "abcdef", (0.1,) * 5 + ("x",),
                (0.1,) * 5 + (True,), [[0.1]] * 6):
        with pytest.raises(ValueError, match="cycle_s") as e:
            DynamicTree(6, 3, 2, adapt=True, cycle_s=bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="adapt"):
        DynamicTree(6, 3, 2, cycle_s=(0.1,) * 6)


def test_adaptive_budget_keeps_the_best_rate_prefix():
    """n maximises (1 + sum of the n best exp(score))/cycle_s[n-1]; the kept set is the n best (checked against
    a brute force), and without costs the selection refuses in one line."""
    g = torch.Generator().manual_seed(0)
    for trial in range(50):
        C, nodes = 12, 8
        score = torch.log(torch.rand(C, generator=g).clamp(min=1e-3)) * 2
        order = torch.sort(score, descending=True, stable=True).indices[:nodes]
        secs = tuple(sorted((0.05 + 0.2 * torch.rand(nodes, generator=g)).tolist()))
        tree = DynamicTree(nodes, 3, 4, adapt=True, cycle_s=secs)
        kept = dyn.adaptive_budget(score, order, tree)
        rates = [(1 + sum(math.exp(float(score[i])) for i in order[:n].tolist())) / secs[n - 1]
                 for n in range(1, nodes + 1)]
        n = max(range(nodes), key=lambda i: (rates[i], -i)) + 1
        assert kept.tolist() == [i in order[:n].tolist() for i in range(C)], trial
    with pytest.raises(ValueError, match="adapt"):
        dyn.adaptive_budget(score, order, DynamicTree(nodes, 3, 4, adapt=True))


def test_adaptive_trees_grow_with_the_drafts_confidence():
    """A confident draft (one token per law at mass 0.95) keeps the deep chain; a flat one keeps one node."""
    V = 4

    def peaked(path):
        return torch.tensor([0.95, 0.03, 0.01, 0.01], dtype=F64)

    def flat(path):
        return torch.full((V,), 0.25, dtype=F64)

    tree = DynamicTree(6, 4, 2, adapt=True, cycle_s=_costs(6, 0.02))
    assert dynamic_of(tree, peaked).choices[:4] == [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]
    assert dynamic_of(tree, flat).choices == [[0]]


ADAPT_SETTINGS = [DynamicTree(4, 3, 2, adapt=True, cycle_s=_costs(4, 0.02)),
                  DynamicTree(6, 3, 3, adapt=True, cycle_s=_costs(6, 0.004)),
                  DynamicTree(5, 2, 3, adapt=True, cycle_s=_costs(5, 0.05, 0.02))]


@pytest.mark.parametrize("tree,method", [(t, m) for t in ADAPT_SETTINGS for m in ("argmax", "greedy", "univer")],
                         ids=lambda x: str(x))
def test_adaptive_trees_are_lossless(tree, method):
    """The adaptive shape is a function of the draft laws (and fixed costs) only: lossless as a dynamic tree."""
    ver = get_verifier(method)
    V = 4
    sizes = set()
    for i, regime in enumerate(REGIMES):
        laws = (OneHotTargetLaws if method == "argmax" else Laws)(V, regime, seed=700 + 7 * i + tree.nodes)
        res = dynamic_of(tree, lambda p: laws(p, "draft"))
        sizes.add(len(res.choices))
        err, tau = text_law_error(ver.outcome_probs, res.choices, ver.drafting, laws, root_token=i % V)
        assert err < TOL, f"{method} on {tree} ({regime}): max error {err:.3g}"


@pytest.mark.parametrize("drafter", ["eagle", "hybrid"])
def test_adaptive_temperature_zero_equals_plain_greedy(model, drafter):
    """Also: the aligned head's confident cycles keep more than one node, and some cycles fewer than all."""
    tree = DynamicTree(10, 4, 3, adapt=True, cycle_s=_costs(10, 0.005))
    out, st = model.eagenerate(IDS, temperature=0.0, max_new_tokens=40, drafter=drafter, tree_choices=tree,
                               return_stats=True)
    assert torch.equal(out, model.naivegenerate(IDS, temperature=0.0, max_new_tokens=40))
    assert sum(st["accept_lengths"]) > len(st["accept_lengths"])


@pytest.mark.parametrize("method", ["greedy", "univer"])
def test_adaptive_temperature_one_is_seeded_reproducible(model, method):
    tree = DynamicTree(8, 3, 3, adapt=True, cycle_s=_costs(8, 0.005))
    outs = [model.eagenerate(IDS, temperature=1.0, max_new_tokens=24, verifier=method, tree_choices=tree, seed=4)
            for _ in range(2)]
    assert torch.equal(outs[0], outs[1])


def test_a_default_dynamic_tree_falls_back_where_it_cannot_be_drafted():
    """A model whose default tree is dynamic, with a static fallback: calls whose rule (rrsw / traversal at
    temperature > 0) or drafter (prompt_lookup picks its own shape; draft_lm drafts static trees) cannot draft it
    run on the fallback; the same dynamic tree passed explicitly is still refused in one line."""
    m = tiny_ea_model(vocab_size=64, seed=0, aligned=True)
    m.tree_choices, m.fallback_tree_choices = "eagle2:nodes=4,depth=3,topk=2", [[0], [1], [0, 0]]
    out, st = m.eagenerate(IDS, temperature=0.0, max_new_tokens=24, return_stats=True)
    assert torch.equal(out, m.naivegenerate(IDS, max_new_tokens=24)) and st["tree"] == m.tree_choices
    _, st = m.eagenerate(IDS, temperature=1.0, max_new_tokens=4, verifier="rrsw", seed=1, return_stats=True)
    assert st["tree"] == [[0], [1], [0, 0]]  # the stats name the tree that ran
    for method in ("rrsw", "traversal"):
        a = m.eagenerate(IDS, temperature=1.0, max_new_tokens=16, verifier=method, seed=5)
        b = m.eagenerate(IDS, temperature=1.0, max_new_tokens=16, verifier=method, seed=5,
                         tree_choices=[[0], [1], [0, 0]])
        assert torch.equal(a, b)  # the fallback tree, drawn alike
        with pytest.raises(ValueError, match=method) as e:
            m.eagenerate(IDS, temperature=1.0, max_new_tokens=4, verifier=method, tree_choices=m.tree_choices)
        assert "\n" not in str(e.value)
    m.fallback_tree_choices = "eagle2:nodes=2,depth=2,topk=1"  # a dynamic fallback is checked too, at the door
    with pytest.raises(ValueError, match="rrsw"):
        m.eagenerate(IDS, temperature=1.0, max_new_tokens=4, verifier="rrsw")
    m.fallback_tree_choices = None
    with pytest.raises(ValueError, match="rrsw"):
        m.eagenerate(IDS, temperature=1.0, max_new_tokens=4, verifier="rrsw")
