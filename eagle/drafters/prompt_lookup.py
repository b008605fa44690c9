"""Prompt lookup (drafter ``prompt_lookup``): n-gram matches in the prompt and the generated text.

The longest suffix n-gram of the committed text (n from ``max_ngram`` down to ``min_ngram``) is looked up
earlier in the text; the tokens that followed its most recent occurrences are proposed, one branch per
distinct next token (up to ``branches``, most recent first), each a chain of up to ``depth`` tokens. No
model, no training, no target features (Spec-Bench's PLD row; Hugging Face's ``prompt_lookup_num_tokens``).

Draft laws (what the verifier sees): a node's law is uniform over the children the lookup proposes there,
a point mass where there is one child. The proposals are a function of the committed text only, so the
drafted tree is a draw under the verifier's drafting rule from those laws:
  - ``topk`` (temperature 0, ``argmax``): every child is a top token of its law; the branches are merged
    into a trie (shared prefixes once) and may have different lengths.
  - ``wor`` (``rrsw``, ``traversal``) and ``topk_residual`` (``greedy``, ``univer``): the branches are cut
    to their common length (the shape depends on the text only, as a static tree's), and the root's
    children are ordered by a draw of the rule from the root's law (:func:`eagle.rules.draw_children`
    with the caller's generator; one branch: a point mass, nothing drawn).
So every drafting rule, hence every registered verifier, is lossless with it; the exact-enumeration tests
(``tests/test_prompt_lookup.py``) check each verifier on these laws.
"""
from __future__ import annotations

import torch

from ..drafting import Drafter, DraftTree, draft_tree_from_choices
from ..rules import DRAFTING_RULES, draw_children

__all__ = ["PromptLookupDrafter", "chain_tree", "lookup_branches", "lookup_matches"]


def lookup_branches(history: list, index: dict, max_ngram: int, min_ngram: int, branches: int,
                    depth: int) -> list[list[int]]:
    """The proposed continuations of ``history`` (committed tokens, root last).

    Args:
        index: ``{n: {n-gram tuple: [start of the token after each occurrence, increasing]}}``.

    Returns:
        Up to ``branches`` lists of 1..``depth`` tokens with distinct first tokens: the longest suffix n-gram
        with an earlier occurrence first, its most recent occurrences first, then shorter n-grams'.
    """
    return [b for b, _ in lookup_matches(history, index, max_ngram, min_ngram, branches, depth)]


def lookup_matches(history: list, index: dict, max_ngram: int, min_ngram: int, branches: int,
                   depth: int) -> list[tuple[list[int], int]]:
    """:func:`lookup_branches` with the length n of the suffix n-gram each branch was matched on.

    Returns:
        ``[(branch, n), ...]``: the branches of :func:`lookup_branches`, in its order.
    """
    L = len(history)
    found: list[tuple[list[int], int]] = []
    firsts: set = set()
    for n in range(max_ngram, min_ngram - 1, -1):
        if L < n:
            continue
        starts = index[n].get(tuple(history[L - n:]))
        if not starts:
            continue
        for s in reversed(starts):
            if s >= L or history[s] in firsts:
                continue
            firsts.add(history[s])
            found.append((history[s:s + depth], n))
            if len(found) == branches:
                return found
    return found


def check_option_names(drafter: str, options: dict, known) -> None:
    """Refuse options other than ``known`` (one line naming the drafter and the options).

    Raises:
        ValueError: an unknown option.
    """
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"drafter {drafter!r} takes no option(s) {unknown}; its options: {', '.join(known)}")


def check_lookup_values(drafter: str, max_ngram=3, min_ngram=1, depth=10, branches=1, default_min_ngram=1) -> None:
    """The lookup's option values (the one place for these rules; ``drafter`` names the drafter in the message;
    ``default_min_ngram``: the drafter's default, named in the message when a smaller ``max_ngram`` is below it).

    Raises:
        ValueError: a value that is not an integer >= 1, or ``min_ngram > max_ngram`` (one line).
    """
    for key, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram), ("depth", depth),
                       ("branches", branches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{drafter}: {key} must be an integer >= 1, got {value!r}")
    if min_ngram > max_ngram:
        hint = (f" (min_ngram defaults to {default_min_ngram}: give min_ngram={max_ngram} with max_ngram={max_ngram})"
                if min_ngram == default_min_ngram else "")
        raise ValueError(f"{drafter}: min_ngram {min_ngram} > max_ngram {max_ngram}{hint}")


class PromptLookupDrafter(Drafter):
    """N-gram lookup in the committed text (see the module docstring for its laws and rules).

    Args:
        vocab: V, the width of the draft-law rows.
        device: where the drafted tree lives (the model's device).
        max_ngram, min_ngram: the suffix n-gram lengths tried, longest first (``1 <= min <= max``).
        depth: tokens per branch (the most a cycle can accept is ``depth + 1``).
        branches: distinct continuations drafted (1 = Hugging Face's single chain).
    """

    name = "prompt_lookup"
    uses_tree = False
    drafting_rules = DRAFTING_RULES

    #: the options of :meth:`for_model` (and ``__init__``) with their defaults
    OPTIONS = {"max_ngram": 3, "min_ngram": 1, "depth": 10, "branches": 1}

    def __init__(self, vocab: int, device="cpu", max_ngram: int = 3, min_ngram: int = 1, depth: int = 10,
                 branches: int = 1):
        check_lookup_values("prompt_lookup", max_ngram=max_ngram, min_ngram=min_ngram, depth=depth,
                            branches=branches)
        self.vocab, self.device = int(vocab), torch.device(device)
        self.max_ngram, self.min_ngram, self.depth, self.branches = max_ngram, min_ngram, depth, branches
        self.history: list[int] = []
        self._index: dict = {n: {} for n in range(min_ngram, max_ngram + 1)}
        self._root_in = False  # whether the current root is already in history

    @classmethod
    def check_options(cls, options: dict) -> None:
        """Check :meth:`for_model`'s options (names and values) without a model (the harness calls it at the door).

        Raises:
            ValueError: an unknown option, or a bad value (one line naming the drafter and the option).
        """
        check_option_names(cls.name, options, cls.OPTIONS)
        check_lookup_values(cls.name, **{**cls.OPTIONS, **options})

    @classmethod
    def for_model(cls, model, **options) -> "PromptLookupDrafter":
        cls.check_options(options)
        return cls(model.lm_head.weight.shape[0], model.device, **options)

    def _append(self, tokens) -> None:
        h = self.history
        for t in tokens:
            h.append(int(t))
            end = len(h)
            for n, table in self._index.items():
                if end >= n:
                    table.setdefault(tuple(h[end - n:]), []).append(end)

    def start(self, input_ids: torch.Tensor, features=None) -> None:
        self.history = []
        self._index = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._append(input_ids[0].tolist())
        self._root_in = False

    def accept(self, tokens: torch.Tensor, features=None) -> None:
        """The accepted tokens join the text; the last one (the next root) joins at the next :meth:`draft`."""
        self._append(tokens[0, :-1].tolist())
        self._root_in = False

    def proposals(self) -> list[list[int]]:
        """The continuations the committed text proposes now (:func:`lookup_branches`)."""
        return lookup_branches(self.history, self._index, self.max_ngram, self.min_ngram, self.branches, self.depth)

    def propose(self, root: int) -> list[list[int]]:
        """The continuations proposed after ``root`` (the last committed token, joining the text once)."""
        return [b for b, _ in self.propose_matches(root)]

    def propose_matches(self, root: int) -> list[tuple[list[int], int]]:
        """:meth:`propose` with each branch's matched n-gram length (:func:`lookup_matches`)."""
        if not self._root_in:
            self._append([root])
            self._root_in = True
        return lookup_matches(self.history, self._index, self.max_ngram, self.min_ngram, self.branches,
                              self.depth)

    def draft(self, root: int, tree, rule: str, cfg, generator: torch.Generator | None = None) -> DraftTree:
        if rule not in DRAFTING_RULES:
            raise ValueError(f"unknown drafting rule {rule!r}; use one of {DRAFTING_RULES}")
        found = self.propose(root)
        if rule == "topk":
            choices, tokens, laws = _trie(int(root), found)
        else:
            choices, tokens, laws = self._fixed_shape(int(root), found, rule, generator)
        return draft_tree_from_choices(choices, tokens, laws, self.vocab, self.device)

    def _fixed_shape(self, root: int, found: list, rule: str, generator):
        """k chains of their common length; the root's children ordered by a draw of ``rule`` (uniform law)."""
        if not found:
            return [], {(): root}, {}
        d = min(len(b) for b in found)
        k = len(found)
        firsts = [b[0] for b in found]
        if k > 1:
            q = torch.zeros(1, self.vocab, dtype=torch.float32, device=self.device)
            q[0, torch.tensor(firsts, device=self.device)] = 1.0 / k
            order = draw_children(q, k, rule, generator)[0].tolist()
            by_first = {b[0]: b for b in found}
            found = [by_first[t] for t in order]
        return _chains(root, found, d)


def _chains(root: int, found: list, d: int):
    """Rank paths, tokens and laws of ``found``'s chains cut to length ``d``, in order (the root's law uniform
    over their first tokens, point masses below)."""
    k = len(found)
    choices, tokens, laws = [], {(): root}, {(): ([b[0] for b in found], [1.0 / k] * k)}
    for r, b in enumerate(found):
        for j in range(d):
            p = (r,) + (0,) * j
            choices.append(p)
            tokens[p] = b[j]
            if j + 1 < d:
                laws[p] = ([b[j + 1]], [1.0])
    return choices, tokens, laws


def chain_tree(root: int, chain: list, vocab: int, device) -> DraftTree:
    """One looked-up chain as a drafted tree: node i+1 holds ``chain[i]``, every law a point mass on the next token
    (the same tree under every drafting rule: one child per node, nothing drawn).

    Args:
        root: the last committed token; chain: ``[l_1, ..., l_D]`` (D >= 1); vocab: V (draft-law row width).

    Returns:
        :class:`~eagle.drafting.DraftTree` with D + 1 nodes on ``device``.
    """
    chain = [int(t) for t in chain]
    return draft_tree_from_choices(*_chains(int(root), [chain], len(chain)), vocab, device)


def _trie(root: int, found: list):
    """Rank paths, tokens and uniform laws of the trie of ``found`` (children in first-proposed order)."""
    kids: dict = {(): []}
    for b in found:
        path = ()
        for t in b:
            c = kids.setdefault(path, [])
            if t not in c:
                c.append(t)
            path = path + (t,)
            kids.setdefault(path, [])
    choices, tokens, laws = [], {(): root}, {}
    stack = [((), ())]  # (token path, rank path)
    while stack:
        tp, rp = stack.pop()
        c = kids[tp]
        if not c:
            continue
        laws[rp] = (list(c), [1.0 / len(c)] * len(c))
        for r, t in enumerate(c):
            crp = rp + (r,)
            choices.append(crp)
            tokens[crp] = t
            stack.append((tp + (t,), crp))
    return choices, tokens, laws
