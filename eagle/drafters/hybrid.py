"""Hybrid drafting (drafter ``hybrid``): the EAGLE head's tree and a prompt-lookup chain in one tree.

Copy-heavy text (summaries, retrieval answers, code edits) is drafted best by looking the text up, the rest
by the head. One tree carries both, and every node's children are still drawn under the verifier's drafting
rule from ONE law, the law the verifier is given, so each verifier's proof applies node by node:

1. Lookup: the committed text proposes one continuation ``L = (l_1, ..., l_D)`` (prompt lookup, the longest
   earlier match of a suffix n-gram, :func:`~eagle.drafters.prompt_lookup.lookup_branches`).
2. Static part: the head expands the caller's static tree as drafter ``eagle`` does, except at the nodes whose
   token path is a prefix of the lookup, ``(l_1, ..., l_d)`` (the root: d = 0). There the children are drawn
   from the mixture ``(1 - w) q_head + w delta(l_{d+1})`` (``w`` = ``lookup_weight``): with ``w >= 1/2`` the
   looked-up token is the law's most probable one, so rule ``topk`` / ``topk_residual`` puts it first and
   ``wor`` draws it first with probability >= w.
3. Chain: where that lookup path ends at a LEAF of the static tree (depth d < D), the rest of the lookup,
   ``l_{d+1} ... l_D``, hangs below it as a chain whose laws are point masses (one child each, drawn under any
   rule: the token itself). Where the path ends at an inner node (its drawn children missed ``l_{d+1}``)
   nothing is added: a node's children are exactly the rule's draw.

4. Lookup only (option ``lookup_only_ngram`` = m >= 1; 0 = never): when the lookup matched a suffix n-gram of
   at least m tokens, the cycle drafts the lookup chain alone, point-mass laws as drafter ``prompt_lookup``
   (no head pass; the head consumes the committed pairs at its next draft). Which of the two a cycle drafts
   is a function of the committed text, so each cycle's tree is still a draw under the rule from the laws
   the verifier is given.

5. Dynamic trees (``tree_choices="eagle2:..."``, rules ``topk`` / ``topk_residual``): the EAGLE-2 expansion runs
   on the mixed laws (:meth:`HybridDrafter.frontier_law`: a frontier node is on the lookup path iff its parent is
   and its token is ``l_d``), so the looked-up path's cumulative probability is at least ``w^d`` and it is
   expanded while that leads; the chosen shape is a function of the mixed draft laws, drafted under the rule
   as a static hybrid tree (step 2), and the chain hangs below a lookup-path leaf as in step 3.

So the tree's shape depends on the context, on each node's rank path (the static tree) and on its own token
path (the chain), never on a sibling's draw or on the target; the laws on every node are functions of its
path. The exact-enumeration tests (``tests/test_hybrid.py``) check every verifier on these trees (every tree
each rule can draw, weighted, the emitted text's law against the target's); a hybrid that adds the lookup
token as an extra child of an inner node, or hides the mixture from the verifier, fails them.

Cost: the head's passes are the static tree's (the mixture is computed on the device with no host read);
the chain costs target-forward width only (no head pass).
"""
from __future__ import annotations

import torch

from ..drafting import DraftTree, EagleTreeDrafter
from ..rules import DRAFTING_RULES
from ..sampling import SamplingConfig
from ..tree import TreeBuffers, tree_structure
from .prompt_lookup import PromptLookupDrafter, chain_tree, check_lookup_values, check_option_names

__all__ = ["HybridDrafter", "append_chain"]


class HybridDrafter(EagleTreeDrafter):
    """The EAGLE head's static tree with a prompt-lookup chain mixed in (see the module docstring).

    Args:
        head, lm_head: as :class:`~eagle.drafting.EagleTreeDrafter`.
        vocab: V (the target's vocabulary); device: the model's device.
        lookup_weight: ``w`` in (0, 1], the lookup's share of the mixture at lookup-path nodes (default 0.5:
            the looked-up token ranks first).
        lookup_only_ngram: m >= 1: cycles whose lookup matched a suffix n-gram of >= m tokens draft the lookup
            chain alone (no head pass); 0 (default): never.
        max_ngram, min_ngram, depth: the lookup (:class:`~eagle.drafters.prompt_lookup.PromptLookupDrafter`);
            ``depth`` = tokens looked up (the deepest node of the tree is max(static depth, depth)). ``min_ngram``
            defaults to 2 (the ``prompt_lookup`` drafter's is 1): a one-token match is weak evidence, and mixed in
            at weight ``w`` it displaces the head's own candidate and adds a chain that is mostly rejected;
            measured on the selection set (12 first turns, 128 tokens, T 0, 1 thread, dynamic tree
            ``eagle2:nodes=5,depth=2,topk=3``) min_ngram 2 ran 1.09x ± 0.02 the tokens/s of min_ngram 1, tau
            2.57 vs 2.53; min_ngram 3, max_ngram 4 or a 6-token chain were level with it (within ± 0.03).

    Raises:
        ValueError: bad options (one line naming the option).
    """

    name = "hybrid"
    needs_head = True
    needs_features = True
    uses_tree = True
    drafting_rules = DRAFTING_RULES
    #: EAGLE-2 dynamic trees with the lookup mixed in (:meth:`frontier_law`; read on this class only)
    dynamic_trees = True

    #: the options of :meth:`for_model` (and ``__init__``) with their defaults
    OPTIONS = {"lookup_weight": 0.5, "max_ngram": 3, "min_ngram": 2, "depth": 10, "lookup_only_ngram": 0}

    def __init__(self, head, lm_head, vocab: int, device="cpu", lookup_weight: float = 0.5, max_ngram: int = 3,
                 min_ngram: int = 2, depth: int = 10, lookup_only_ngram: int = 0):
        super().__init__(head, lm_head)
        self._check_values(lookup_weight=lookup_weight, max_ngram=max_ngram, min_ngram=min_ngram, depth=depth,
                           lookup_only_ngram=lookup_only_ngram)
        self.lookup_weight = float(lookup_weight)
        self.lookup_only_ngram = int(lookup_only_ngram)
        self.vocab = int(vocab)
        self.cycles = {"hybrid": 0, "lookup_only": 0}  # cycles drafted each way (since construction)
        self.lookup = PromptLookupDrafter(vocab, device, max_ngram=max_ngram, min_ngram=min_ngram, depth=depth,
                                          branches=1)
        self._chain = None  # LongTensor [D] of the current cycle's lookup (None: no proposal)
        self._rows_on = None  # BoolTensor: the dynamic expansion's law rows on the lookup path (frontier_law)

    @classmethod
    def _check_values(cls, lookup_weight=0.5, max_ngram=3, min_ngram=2, depth=10, lookup_only_ngram=0) -> None:
        if isinstance(lookup_weight, bool) or not isinstance(lookup_weight, (int, float)) or not (
                0.0 < float(lookup_weight) <= 1.0):
            raise ValueError(f"hybrid: lookup_weight must be a number in (0, 1], got {lookup_weight!r}")
        if isinstance(lookup_only_ngram, bool) or not isinstance(lookup_only_ngram, int) or lookup_only_ngram < 0:
            raise ValueError(f"hybrid: lookup_only_ngram must be an integer >= 0 (0: never), got {lookup_only_ngram!r}")
        check_lookup_values("hybrid", max_ngram=max_ngram, min_ngram=min_ngram, depth=depth,
                            default_min_ngram=cls.OPTIONS["min_ngram"])

    @classmethod
    def check_options(cls, options: dict) -> None:
        """Check :meth:`for_model`'s options (names and values) without a model (the harness calls it at the door).

        Raises:
            ValueError: an unknown option, or a bad value (one line naming the drafter and the option).
        """
        check_option_names(cls.name, options, cls.OPTIONS)
        cls._check_values(**{**cls.OPTIONS, **options})

    @classmethod
    def for_model(cls, model, **options) -> "HybridDrafter":
        cls.check_options(options)
        if getattr(model, "ea_layer", None) is None:
            raise ValueError("drafter 'hybrid' needs an EAGLE head, but the model has none (load it with "
                             "ea_model_path, or use drafter 'prompt_lookup')")
        d = cls(model.ea_layer, model.lm_head, model.lm_head.weight.shape[0], model.device, **options)
        d.packed = bool(getattr(model, "fast_cpu", False))
        return d

    def start(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> None:
        super().start(input_ids, features)
        self.lookup.start(input_ids)

    def accept(self, tokens: torch.Tensor, features: torch.Tensor | None = None) -> None:
        super().accept(tokens, features)
        self.lookup.accept(tokens)

    def draft(self, root: int, tree: TreeBuffers, rule: str, cfg: SamplingConfig,
              generator: torch.Generator | None = None) -> DraftTree:
        """The static tree with the lookup mixed in, plus the lookup chain below a lookup-path leaf; or, when
        the lookup matched a suffix n-gram of at least ``lookup_only_ngram`` tokens, the lookup chain alone
        (point-mass laws, no head pass: the pending pairs wait for the next head draft)."""
        found = self.lookup.propose_matches(root)
        chain, ngram = found[0] if found else ([], 0)
        if chain and self.lookup_only_ngram and ngram >= self.lookup_only_ngram:
            self.cycles["lookup_only"] += 1
            self.defer(root)
            return chain_tree(root, chain, self.vocab, self.head.fc.weight.device)
        self.cycles["hybrid"] += 1
        device = self.head.fc.weight.device
        self._chain = torch.tensor(chain, dtype=torch.long, device=device) if chain else None
        try:
            draft = super().draft(root, tree, rule, cfg, generator)
        finally:
            self._chain = self._rows_on = None
        if not chain:
            return draft
        return append_chain(draft, chain)

    def frontier_law(self, front, q, d2t):
        """A dynamic tree's laws: over the full vocabulary (the looked-up token may lie outside a draft
        vocabulary), ``delta(l_{d+1})`` mixed into the rows of lookup-path nodes (device only; no host read).

        A frontier node is on the lookup path iff its parent's row is and its token is ``l_d``; the flags of the
        rows made so far live in ``self._rows_on`` (row 0: the root)."""
        chain = self._chain
        if chain is None:
            return q, d2t
        if d2t is not None:  # to the full vocabulary, so every call of the expansion has one token map (None)
            q = q.new_zeros(q.shape[0], self.vocab).index_add_(1, d2t.to(q.device), q)
        D = chain.shape[0]
        if front is None:
            d, on = 0, torch.ones(1, dtype=torch.bool, device=q.device)
            self._rows_on = on
        else:
            d = int(front.depth)
            if d - 1 < D:
                on = self._rows_on[front.parent_rows] & (front.tokens == chain[d - 1])
            else:
                on = torch.zeros(front.tokens.shape[0], dtype=torch.bool, device=q.device)
            self._rows_on = torch.cat([self._rows_on, on])
        if d >= D:
            return q, None
        w = self.lookup_weight
        bump = torch.nn.functional.one_hot(chain[d], self.vocab).to(q.dtype)  # [V]
        return torch.where(on[:, None], (1.0 - w) * q + w * bump[None, :], q), None

    def level_law(self, d, expand, q, d2t, tokens, plan):
        """Mix ``delta(l_{d+1})`` into the rows of lookup-path nodes (device only; no host read)."""
        chain = self._chain
        if chain is None or d >= chain.shape[0]:
            return q, d2t
        nxt = chain[d]  # l_{d+1}: 0-d tensor
        # a node is on the lookup path iff every ancestor-or-self u of depth >= 1 has tokens[u] == l_{depth(u)}
        # (the level's nodes have depth d < D: their ancestors' depths index the chain)
        want = chain[(plan.depth - 1).clamp(min=0, max=chain.shape[0] - 1)]  # [n]
        match = (tokens == want) | (plan.depth == 0)
        on_path = ~(plan.ancestor[expand] & ~match[None, :]).any(dim=1)  # [e]
        w = self.lookup_weight
        if d2t is None:
            cols = torch.arange(q.shape[1], device=q.device)
        else:
            cols = d2t
        hit = cols == nxt  # [K]: the looked-up token's column, if it has one
        q_ext = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)  # one more column: l_{d+1} itself
        bump = torch.cat([hit, ~hit.any()[None]]).to(q.dtype)  # [K+1]: exactly one 1
        mixed = (1.0 - w) * q_ext + w * bump[None, :]
        q_ext = torch.where(on_path[:, None], mixed, q_ext)
        cols_ext = torch.cat([cols, nxt[None]])  # a repeated token has zero mass in its extra column
        return q_ext, cols_ext


def append_chain(draft: DraftTree, chain: list) -> DraftTree:
    """Hang the rest of ``chain`` below the deepest node on the chain's path when that node is a leaf.

    Args:
        draft: the drafted static tree (its draft-law rows of leaves are unused, hence zero or free).
        chain: the looked-up continuation ``[l_1, ..., l_D]`` (token ids).

    Returns:
        ``draft`` itself (nothing to add) or a new :class:`DraftTree` with the chain's nodes appended (parents
        precede children), the leaf's row and every new inner row a point mass on the next looked-up token.
    """
    par, tok = draft.parents_list, draft.tokens_list
    n = len(par)
    children = [[] for _ in range(n)]
    for i in range(1, n):
        children[par[i]].append(i)
    v, d = 0, 0
    while d < len(chain):
        nxt = [c for c in children[v] if tok[c] == chain[d]]
        if not nxt:
            break
        v, d = nxt[0], d + 1
    if children[v] or d >= len(chain):
        return draft
    rest = chain[d:]
    k = len(rest)
    device = draft.tokens.device
    parents_list = list(par) + [v] + list(range(n, n + k - 1))
    tokens_list = list(tok) + list(rest)
    depth0 = d  # v's token path is (l_1, ..., l_d)
    new_depth = torch.arange(depth0 + 1, depth0 + 1 + k, dtype=draft.depth.dtype, device=device)
    probs = torch.cat([draft.draft_probs, draft.draft_probs.new_zeros(k, draft.draft_probs.shape[1])])
    inner = torch.tensor([v] + list(range(n, n + k - 1)), dtype=torch.long, device=device)
    probs[inner] = 0.0
    probs[inner, torch.tensor(rest, dtype=torch.long, device=device)] = 1.0
    anc = torch.zeros(n + k, n + k, dtype=torch.bool, device=device)
    anc[:n, :n] = draft.ancestor
    anc[n:, :n] = draft.ancestor[v][None, :]
    anc[n:, n:] = torch.ones(k, k, dtype=torch.bool, device=device).tril()
    return DraftTree(parents=torch.tensor(parents_list, dtype=torch.long, device=device),
                     tokens=torch.tensor(tokens_list, dtype=torch.long, device=device),
                     depth=torch.cat([draft.depth, new_depth]), draft_probs=probs, ancestor=anc,
                     parents_list=parents_list, tokens_list=tokens_list,
                     nodes=torch.arange(n + k, device=device), structure=tree_structure(tuple(parents_list)))
