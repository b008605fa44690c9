"""Hybrid drafting (drafter ``hybrid``, eagle/drafters/hybrid.py): the head's static tree with a prompt-lookup
chain mixed in. Exact enumeration of every verifier's output law on the trees the hybrid rule draws (static
shapes x lookups x mixture weights x target regimes), negative controls (a hybrid that breaks the rule must
fail), and the drafter on a tiny model: temperature 0 equals greedy decoding, seeded reproducibility, the
tree's invariants."""
import pytest
import torch

import univer_patch  # noqa: F401  (traversal, greedy, univer)
from eagle.drafters import HybridDrafter, available_drafters
from eagle.drafters.hybrid import append_chain
from eagle.drafting import DraftTree
from eagle.rules import children_law
from eagle.testing import tiny_ea_model
from eagle.tree import build_tree, tree_structure
from eagle.verify import get_verifier
from exact_law import F64, REGIMES, TOL, Laws, law_error

V = 5
SAMPLED = ["rrsw", "traversal", "greedy", "univer"]
SHAPES = [[[0]], [[0], [1]], [[0], [0, 0]], [[0], [1], [0, 0]], [[0], [1], [1, 0]], [[0], [1], [0, 0], [1, 0]]]
LOOKUPS = [(2,), (2, 3), (2, 3, 1), (1, 1, 4)]


class HybridLaws(Laws):
    """The hybrid's draft laws on abstract laws: at a node whose token path is (l_1..l_d), d < D, with
    children, ``(1 - w) q + w delta(l_{d+1})``; the base law elsewhere (``hide``: the verifier is told the
    base law instead, a broken hybrid)."""

    def __init__(self, regime, seed, chain, w, hide=False):
        super().__init__(V, regime, seed)
        self.chain, self.w, self.hide = tuple(chain), w, hide

    def on_path(self, path) -> bool:
        d = len(path) - 1
        return d < len(self.chain) and tuple(path[1:]) == self.chain[:d]

    def mixed(self, path, m):
        q = super().draft(path, m)
        if m == 0 or not self.on_path(path):
            return q
        bump = torch.zeros(V, dtype=F64)
        bump[self.chain[len(path) - 1]] = 1.0
        return (1 - self.w) * q + self.w * bump


def hybrid_trees(choices, rule, laws: HybridLaws, extra_child=False):
    """Every hybrid tree with its probability: the static shape drawn under ``rule`` from the mixed laws, then
    the chain below the deepest lookup-path node when it is a leaf (``extra_child``: also below an inner
    node, as one more child: a broken hybrid). Yields (parents, tokens, target, draft, prob, paths)."""
    tb = build_tree(choices)
    n = tb.num_nodes
    children = tb.children
    inner = [v for v in range(n) if children[v]]

    def rec(k, tokens, paths, prob):
        if k == len(inner):
            yield list(tokens), list(paths), prob
            return
        v = inner[k]
        m = len(children[v])
        for tup, p in children_law(laws.mixed(paths[v], m), m, rule):
            assert len(tup) == m
            for c, t in zip(children[v], tup):
                tokens[c], paths[c] = t, paths[v] + (t,)
            yield from rec(k + 1, tokens, paths, prob * p)

    for tokens, paths, prob in rec(0, [0] * n, [(0,)] + [()] * (n - 1), 1.0):
        par = list(tb.parents.tolist())
        kids = [list(c) for c in children]
        v, d = 0, 0
        while d < len(laws.chain):
            nxt = [c for c in kids[v] if tokens[c] == laws.chain[d]]
            if not nxt:
                break
            v, d = nxt[0], d + 1
        rows = {i: (laws.draft(paths[i], len(kids[i])) if laws.hide else laws.mixed(paths[i], len(kids[i])))
                for i in range(n)}
        if d < len(laws.chain) and (not kids[v] or extra_child):
            for t in laws.chain[d:]:
                if kids[v]:  # the broken variant: one more child, its parent's law unchanged
                    pass
                else:
                    rows[v] = torch.nn.functional.one_hot(torch.tensor(t), V).to(F64)
                par.append(v)
                tokens.append(t)
                paths.append(paths[v] + (t,))
                kids.append([])
                kids[v].append(len(par) - 1)
                v = len(par) - 1
                rows[v] = torch.full((V,), 1.0 / V, dtype=F64)  # a leaf's row (unused)
        N = len(par)
        target = torch.stack([laws(paths[i], "target") for i in range(N)])
        draft = torch.stack([rows[i] for i in range(N)])
        yield torch.tensor(par), torch.tensor(tokens), target, draft, prob, paths


def hybrid_law_error(method, choices, laws, **kw):
    v = get_verifier(method)
    L, depth, total = {}, 0, 0.0
    for parents, tokens, target, draft, prob, paths in hybrid_trees(choices, v.drafting, laws, **kw):
        out = v.outcome_probs(parents, tokens, target, draft, validate=True)
        assert abs(float(out.sum()) - 1.0) < 1e-9
        depth = max(depth, max(len(p) for p in paths) - 1)
        total += prob
        for i, row in enumerate(out.tolist()):
            for y, w in enumerate(row):
                if w > 0:
                    key = paths[i][1:] + (y,)
                    L[key] = L.get(key, 0.0) + prob * w
    assert abs(total - 1.0) < 1e-9
    return law_error(L, lambda path: laws(path, "target"), V, depth)


def _check_lossless(method, weights, every_lookup=True):
    for i, choices in enumerate(SHAPES):
        for j, chain in enumerate(LOOKUPS):
            if not every_lookup and j not in (i % 4, (i + 2) % 4):
                continue
            for w in weights(i, j):
                regime = REGIMES[(i + j) % len(REGIMES)]
                cls = OneHotHybridLaws if method == "argmax" else HybridLaws  # temperature 0: one-hot targets
                err = hybrid_law_error(method, choices, cls(regime, i + 7 * j, chain, w))
                assert err < TOL, f"{method} not lossless on hybrid {choices} lookup {chain} w {w} ({regime}): {err:.3g}"


@pytest.mark.parametrize("method", SAMPLED + ["argmax"])
def test_hybrid_lossless_by_enumeration(method):
    """Every verifier: the emitted text's law equals the target's on every hybrid tree law (6 static shapes x
    2 of the 4 lookups each, lookup weight 0.5 or 0.8 alternating, the four target regimes rotating; every
    lookup and weight: the slow test below)."""
    _check_lossless(method, lambda i, j: (0.5,) if (i // 2 + j) % 2 == 0 else (0.8,), every_lookup=False)


@pytest.mark.slow
@pytest.mark.parametrize("method", SAMPLED + ["argmax"])
def test_hybrid_lossless_by_enumeration_both_weights(method):
    """Every setting with lookup weights 0.3 (the looked-up token need not rank first), 0.5 and 0.8."""
    _check_lossless(method, lambda i, j: (0.3, 0.5, 0.8))


class OneHotHybridLaws(HybridLaws):
    def __call__(self, path, kind):
        p = super().__call__(path, kind)
        if kind == "target":
            return torch.nn.functional.one_hot(torch.argmax(p), V).to(F64)
        return p


def _worst_error(method, hide=False, extra_child=False) -> float:
    """The largest law error over the settings, stopping at the first one above 1e-3."""
    worst = 0.0
    for i, choices in enumerate(SHAPES):
        for j, chain in enumerate(LOOKUPS[:3]):
            for regime in REGIMES:
                laws = HybridLaws(regime, i + 7 * j, chain, 0.5, hide=hide)
                worst = max(worst, hybrid_law_error(method, choices, laws, extra_child=extra_child))
                if worst > 1e-3:
                    return worst
    return worst


@pytest.mark.parametrize("method", SAMPLED)
def test_broken_hybrid_hiding_the_mixture_fails(method):
    """Negative control: children drawn from the mixture, the verifier told the head's law: not lossless (or
    refused by the verifier's input check: its children are not its law's top tokens)."""
    try:
        assert _worst_error(method, hide=True) > 1e-3
    except ValueError as e:
        assert "most probable tokens" in str(e)


@pytest.mark.parametrize("method", SAMPLED)
def test_broken_hybrid_extra_child_fails(method):
    """Negative control: the chain added as one more child of an inner node (more children than the rule
    drew): not lossless (or refused by the verifier's input check)."""
    try:
        assert _worst_error(method, extra_child=True) > 1e-3
    except ValueError as e:
        assert "most probable tokens" in str(e)


# ---- the drafter on a tiny model -------------------------------------------------------------------------

PROMPT = torch.tensor([[1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]])


@pytest.fixture(scope="module")
def model():
    return tiny_ea_model(vocab_size=32, seed=0)


def test_registered():
    assert "hybrid" in available_drafters()


@pytest.mark.parametrize("tree", [None, [[0]], [[0], [1], [0, 0]], [[0], [1], [2], [0, 0], [1, 0]]])
def test_temperature0_equals_greedy(model, tree):
    out = model.eagenerate(PROMPT, temperature=0.0, max_new_tokens=40, drafter="hybrid", tree_choices=tree)
    assert torch.equal(out, model.naivegenerate(PROMPT, temperature=0.0, max_new_tokens=40))


@pytest.mark.parametrize("method", SAMPLED)
def test_seeded_reproducible(model, method):
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(model.eagenerate(PROMPT, temperature=1.0, max_new_tokens=24, drafter="hybrid", verifier=method,
                                     tree_choices=[[0], [1], [0, 0]]))
    assert torch.equal(outs[0], outs[1])


def test_tree_invariants(model):
    """The drafted tree: the lookup token first at the root (w = 0.5 makes it the mode), mixture mass >= w on
    it, the chain's rows point masses, the chain below a leaf only."""
    from eagle.model.kv_cache import new_cache
    from eagle.sampling import SamplingConfig
    d = HybridDrafter.for_model(model, depth=4, min_ngram=1)  # the root token 7 matches as a one-token n-gram
    ids = PROMPT
    cache = new_cache(model.base_model.config)
    with torch.no_grad():
        feats, _ = model.target_forward(ids, torch.arange(ids.shape[1])[None], cache)
    d.start(ids, feats)
    draft = d.draft(7, build_tree([[0], [1]]), "topk_residual", SamplingConfig(1.0),
                    torch.Generator().manual_seed(0))
    chain = d.lookup.proposals()[0]
    assert draft.tokens_list[1] == chain[0]
    assert float(draft.draft_probs[0, chain[0]]) >= 0.5
    assert draft.num_nodes == 3 + len(chain) - 1
    for i in range(3, draft.num_nodes - 1):
        assert float(draft.draft_probs[i].max()) == 1.0


def test_default_min_ngram_skips_one_token_matches(model):
    """By default (min_ngram 2) a root whose only earlier match is a one-token n-gram drafts the head's tree alone
    (no lookup token mixed in, no chain); a two-token match still proposes its continuation."""
    from eagle.model.kv_cache import new_cache
    from eagle.sampling import SamplingConfig
    assert HybridDrafter.OPTIONS["min_ngram"] == 2
    tree = build_tree([[0], [1]])
    for root, chain in ((7, None), (4, [5, 6, 7, 1])):  # ... 3 7: only "7" occurs earlier; "2 3 4" does, last before 5 6 7 1
        d = HybridDrafter.for_model(model, depth=4)
        cache = new_cache(model.base_model.config)
        with torch.no_grad():
            feats, _ = model.target_forward(PROMPT, torch.arange(PROMPT.shape[1])[None], cache)
        d.start(PROMPT, feats)
        draft = d.draft(root, tree, "topk", SamplingConfig(0.0))
        if chain is None:
            assert d.lookup.proposals() == [] and draft.num_nodes == 3
        else:
            assert d.lookup.proposals()[0] == chain and draft.num_nodes >= 3


def test_bad_options(model):
    with pytest.raises(ValueError, match="lookup_weight"):
        HybridDrafter.for_model(model, lookup_weight=0.0)
    with pytest.raises(ValueError, match="depth"):
        HybridDrafter.for_model(model, depth=0)


def test_append_chain_below_leaf_only():
    """append_chain on a hand-made tree: below a leaf on the path, nothing below an inner node."""
    par = [-1, 0, 0, 1]
    tok = [9, 2, 4, 5]
    s = tree_structure(tuple(par))
    anc = torch.zeros(4, 4, dtype=torch.bool)
    for i in range(4):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = par[j]
    base = DraftTree(parents=torch.tensor(par), tokens=torch.tensor(tok), depth=torch.tensor([0, 1, 1, 2]),
                     draft_probs=torch.zeros(4, 10), ancestor=anc, parents_list=par, tokens_list=tok, structure=s)
    out = append_chain(base, [2, 5, 7, 8])  # path 2 -> 5 is in the tree; 5 is a leaf: 7, 8 hang below it
    assert out.parents_list == [-1, 0, 0, 1, 3, 4] and out.tokens_list == tok + [7, 8]
    assert out.depth.tolist() == [0, 1, 1, 2, 3, 4]
    assert out.draft_probs[3, 7] == 1.0 and out.draft_probs[4, 8] == 1.0
    assert out.ancestor[5].tolist() == [True, True, False, True, True, True]
    assert append_chain(base, [2, 6]) is base  # 2 is inner and has no child 6: nothing added
    assert append_chain(base, [3]) is base  # the root is inner


# ---- the API default and the door ------------------------------------------------------------------------

def test_default_drafter_rule():
    """from_pretrained(drafter=None): hybrid for the embedded default on the CPU with its head, eagle otherwise."""
    from eagle.model.ea_model import default_drafter_name

    assert default_drafter_name(True, "cpu", True) == "hybrid"
    assert default_drafter_name(True, "cpu", False) == "eagle"
    assert default_drafter_name(False, "cpu", True) == "eagle"
    assert default_drafter_name(True, "meta", True) == "eagle"


def test_auto_tree_without_head_is_one_line(model):
    from eagle.model.ea_model import EaModel

    headless = EaModel(model.base_model, None, drafter="prompt_lookup")
    with pytest.raises(ValueError, match="tree 'auto' is fitted to the model's EAGLE head"):
        headless.resolve_tree("auto")


def test_set_drafter_options_kept_by_name(model):
    """set_drafter('hybrid', lookup_weight=0.9), then eagenerate(drafter='hybrid') drafts with those options."""
    d = model.set_drafter("hybrid", lookup_weight=0.9)
    try:
        assert model._drafter_instance("hybrid") is d and d.lookup_weight == 0.9
    finally:
        model.set_drafter("eagle")


@pytest.mark.parametrize("ngram", [1, 2])
def test_lookup_only_cycles_equal_greedy(model, ngram):
    """lookup_only_ngram: cycles with a long enough n-gram match draft the chain alone; temperature 0 still
    equals greedy decoding, and both kinds of cycle occur on this prompt."""
    d = HybridDrafter.for_model(model, lookup_only_ngram=ngram)
    out = model.eagenerate(PROMPT, temperature=0.0, max_new_tokens=40, drafter=d, tree_choices=[[0], [1], [0, 0]])
    assert torch.equal(out, model.naivegenerate(PROMPT, temperature=0.0, max_new_tokens=40))
    assert d.cycles["lookup_only"] > 0 and d.cycles["hybrid"] > 0


@pytest.mark.parametrize("method", SAMPLED)
def test_lookup_only_seeded_reproducible(model, method):
    outs = []
    for _ in range(2):
        torch.manual_seed(5)
        outs.append(model.eagenerate(PROMPT, temperature=1.0, max_new_tokens=24, verifier=method,
                                     drafter=HybridDrafter.for_model(model, lookup_only_ngram=1),
                                     tree_choices=[[0], [1], [0, 0]]))
    assert torch.equal(outs[0], outs[1])


def test_skipped_head_cycles_keep_the_head_cache(model):
    """Pairs committed by cycles that skipped the head (defer) are consumed at the next head draft: the head's
    root state equals that of a drafter that drafted with the head every cycle."""
    from eagle.drafting import EagleTreeDrafter
    from eagle.model.kv_cache import new_cache
    from eagle.sampling import SamplingConfig
    ids = PROMPT
    cache = new_cache(model.base_model.config)
    with torch.no_grad():
        feats, _ = model.target_forward(ids, torch.arange(ids.shape[1])[None], cache)
    tree, cfg = build_tree([[0], [1]]), SamplingConfig(0.0)
    H = feats.shape[-1]
    chunks = [(torch.tensor([[5, 8, 3]]), torch.randn(1, 3, H)), (torch.tensor([[4, 9]]), torch.randn(1, 2, H))]
    every, skip = EagleTreeDrafter(model.ea_layer, model.lm_head), EagleTreeDrafter(model.ea_layer, model.lm_head)
    for d in (every, skip):
        d.start(ids, feats)
    every.draft(7, tree, "topk", cfg)
    skip.defer(7)  # the first cycle skips the head too
    for toks, f in chunks:
        every.accept(toks, f)
        every.draft(int(toks[0, -1]), tree, "topk", cfg)
        skip.accept(toks, f)
        skip.defer(int(toks[0, -1]))
    skip.draft(9, tree, "topk", cfg)
    assert every.head_cache.get_seq_length() == skip.head_cache.get_seq_length() == ids.shape[1] + 5
    torch.testing.assert_close(every._root_hidden, skip._root_hidden, rtol=1e-4, atol=1e-5)


def test_lookup_only_bad_option(model):
    with pytest.raises(ValueError, match="lookup_only_ngram"):
        HybridDrafter.for_model(model, lookup_only_ngram=-1)


# ---- EAGLE-2 dynamic trees with the lookup mixed in ---------------------------------------------------

DYN_SHAPES = ["eagle2:nodes=3,depth=2,topk=2", "eagle2:nodes=4,depth=3,topk=2", "eagle2:nodes=5,depth=3,topk=3"]


@pytest.mark.parametrize("method", ["argmax", "greedy", "univer"])
def test_dynamic_hybrid_lossless_by_enumeration(method):
    """The dynamic shape is chosen from the MIXED laws of each context (a deterministic function of it), then
    drafted under the rule as a static hybrid tree with the chain below a lookup-path leaf: the emitted text's
    law equals the target's (3 dynamic specs x 4 lookups x 2 weights, regimes rotating)."""
    from test_dynamic_tree import dynamic_of

    from eagle.tree import parse_dynamic_tree
    for i, spec in enumerate(DYN_SHAPES):
        tree = parse_dynamic_tree(spec)
        for j, chain in enumerate(LOOKUPS):
            for w in (0.5, 0.8):
                regime = REGIMES[(i + j) % len(REGIMES)]
                cls = OneHotHybridLaws if method == "argmax" else HybridLaws
                laws = cls(regime, 11 * i + j, chain, w)
                choices = dynamic_of(tree, lambda path: laws.mixed(path, 1)).choices
                err = hybrid_law_error(method, choices, laws)
                assert err < TOL, f"{method} on dynamic hybrid {spec} lookup {chain} w {w} ({regime}): {err:.3g}"


@pytest.mark.parametrize("tree", ["eagle2:nodes=4,depth=3,topk=2", "eagle2:nodes=10,depth=4,topk=3"])
def test_dynamic_temperature0_equals_greedy(model, tree):
    out = model.eagenerate(PROMPT, temperature=0.0, max_new_tokens=40, drafter="hybrid", tree_choices=tree)
    assert torch.equal(out, model.naivegenerate(PROMPT, temperature=0.0, max_new_tokens=40))


def test_dynamic_temperature0_equals_greedy_with_a_draft_vocabulary():
    m = tiny_ea_model(vocab_size=32, seed=1)
    m.ea_layer.set_draft_vocab(torch.tensor([0, 1, 2, 3, 5, 8, 13, 21]))  # most lookup tokens lie outside it
    out = m.eagenerate(PROMPT, temperature=0.0, max_new_tokens=40, drafter="hybrid",
                       tree_choices="eagle2:nodes=6,depth=3,topk=2")
    assert torch.equal(out, m.naivegenerate(PROMPT, temperature=0.0, max_new_tokens=40))


@pytest.mark.parametrize("method", ["greedy", "univer"])
def test_dynamic_seeded_reproducible(model, method):
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(model.eagenerate(PROMPT, temperature=1.0, max_new_tokens=24, drafter="hybrid", verifier=method,
                                     tree_choices="eagle2:nodes=6,depth=3,topk=2"))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("method", ["rrsw", "traversal"])
def test_dynamic_wor_refused_in_one_line(model, method):
    with pytest.raises(ValueError, match="hybrid") as e:
        model.eagenerate(PROMPT, temperature=1.0, max_new_tokens=4, drafter="hybrid", verifier=method,
                         tree_choices="eagle2:nodes=4,depth=3,topk=2")
    assert "\n" not in str(e.value) and method in str(e.value)


@pytest.mark.parametrize("rule", ["topk", "topk_residual"])
def test_dynamic_tree_invariants(model, rule):
    """The looked-up token is the root's first child with mixture mass >= w, the lookup path is expanded as
    long as its mass leads, and the rest of the chain hangs below its leaf as point masses."""
    from eagle.model.kv_cache import new_cache
    from eagle.sampling import SamplingConfig
    from eagle.tree import parse_dynamic_tree
    d = HybridDrafter.for_model(model, depth=4, lookup_weight=0.9)
    cache = new_cache(model.base_model.config)
    with torch.no_grad():
        feats, _ = model.target_forward(PROMPT, torch.arange(PROMPT.shape[1])[None], cache)
    d.start(PROMPT, feats)
    # under topk_residual l_2 (a single child) is a draw from the mixture, l_2 with probability 0.9 + : the seed
    # is one that draws it
    draft = d.draft(4, parse_dynamic_tree("eagle2:nodes=3,depth=2,topk=2"), rule, SamplingConfig(1.0),
                    torch.Generator().manual_seed(1))
    chain = d.lookup.proposals()[0]
    assert len(chain) == 4
    par, tok = draft.parents_list, draft.tokens_list
    assert tok[1] == chain[0] and float(draft.draft_probs[0, chain[0]]) >= 0.9
    # w = 0.9: the lookup path's score 0.9^d leads every other candidate, so l_1, l_2 are kept (depth 2),
    # then l_3, l_4 hang below l_2 as a chain of point masses
    v, path = 0, []
    while True:
        kids = [c for c in range(1, len(par)) if par[c] == v and tok[c] == chain[len(path)]] if len(path) < 4 else []
        if not kids:
            break
        v = kids[0]
        path.append(tok[v])
    assert path == chain
    for u in range(len(par)):
        kids = [c for c in range(1, len(par)) if par[c] == u]
        if draft.depth[u] >= 2 and kids:
            assert len(kids) == 1 and float(draft.draft_probs[u].max()) == 1.0
