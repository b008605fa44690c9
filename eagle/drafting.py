"""Drafting: the drafter interface, the drafted tree, and the EAGLE-1 head as one drafter.

A :class:`Drafter` turns "committed context" into a :class:`DraftTree`: the pruned tree in the common
tree form (parents, tokens, depth) plus, for every node, the full processed draft law its children
were drawn from (what the verifier must use). The generation loop sees only that, through three calls
(as small as transformers' candidate generators):

    drafter.start(input_ids, features)          # a new prompt (+ its target features if declared)
    tree = drafter.draft(root, tree, rule, cfg, generator)   # one DraftTree below the root
    drafter.accept(tokens, features)            # what this cycle committed

A drafter owns its state and caches (the EAGLE head's KV cache lives in :class:`EagleTreeDrafter`).
Drafters are registered by name in :mod:`eagle.drafters` (``eagle``, ``prompt_lookup``, plug-ins
through the entry-point group ``univer_eagle.drafters``).

Host synchronisations on an accelerator: drafting itself makes none of its own (the expansion plan is
static and on the device; nodes that turn out undrafted are expanded anyway and pruned afterwards);
building the :class:`DraftTree` makes ONE (the drafted tokens and the logits' finiteness flag come back
together). The drafting rules' own kernels may add theirs (eagle.rules).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .model.kv_cache import cache_length, new_cache, truncate_cache
from .model.packed_linear import packed_rows
from .sampling import SamplingConfig, logits_to_probs
from .tree import TreeBuffers, TreeStructure, additive_mask, tree_structure
from .tree.buffers import _plan, build_tree
from .tree.dynamic import DynamicTree, check_dynamic_tree, expand_dynamic, finish_dynamic
from .rules import DRAFTING_RULES, draw_children, stable_topk

__all__ = ["Drafter", "DraftTree", "EagleTreeDrafter", "draft_tree_from_choices", "pruned_draft_tree"]


@dataclass
class DraftTree:
    """One drafted tree, pruned, in the common tree form (``eagle.verify.registry``).

    Attributes:
        parents: LongTensor ``[n]`` (device), node 0 = root (-1); parents precede children and
            siblings are in rank order.
        tokens: LongTensor ``[n]`` (device), ``tokens[0]`` = the root (last committed) token.
        depth: LongTensor ``[n]`` (device), 0 for the root; the position offset from the root.
        draft_probs: float32 ``[n, V]`` (device): row i = the processed draft law node i's children
            were drawn from (rows of leaves are unused). At temperature 0 it is the softmax of the
            draft logits (only its ranking is used).
        ancestor: BoolTensor ``[n, n]`` (device): ``[i, j]`` iff j is i or an ancestor of i (the tree
            attention of the target forward, see :func:`eagle.tree.additive_mask`).
        parents_list, tokens_list: the same parents and tokens on the host (lists of ints).
        nodes: LongTensor ``[n]`` (device) or None: the static tree's node of each drafted node (None
            when nothing was pruned, or for a tree the drafter shaped itself: :meth:`path_index` then uses the
            static plan only when ``parents`` is the plan's own tensor).
        structure: the tree's :class:`~eagle.tree.TreeStructure` (children, levels, post-order), for
            the verifiers (saves them a host copy of ``parents``).
    """

    parents: torch.Tensor
    tokens: torch.Tensor
    depth: torch.Tensor
    draft_probs: torch.Tensor
    ancestor: torch.Tensor
    parents_list: list
    tokens_list: list
    nodes: torch.Tensor | None = None
    structure: TreeStructure | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.parents_list)

    def path_index(self, node: int, plan=None) -> torch.Tensor:
        """LongTensor (device): node indices from the root down to ``node`` (no host sync when the
        tree is ``plan``'s own, unpruned: ``parents`` is the plan's tensor; any other tree walks ``parents_list``)."""
        if self.nodes is None and plan is not None and self.parents is plan.parents:
            return plan.path_index[node]
        par = self.parents_list
        path = [node]
        while par[path[-1]] >= 0:
            path.append(par[path[-1]])
        return torch.tensor(path[::-1], dtype=torch.long, device=self.parents.device)


class Drafter:
    """The drafter interface: ``start`` on a prompt, ``draft`` one tree per cycle, ``accept`` what was committed.

    Committed tokens: the prompt, then every generated token. Between cycles the last committed token is the
    **root** of the next tree; it is passed to :meth:`draft` (the first root, sampled after the prompt, is only
    known there). A drafter keeps whatever state it needs (caches, n-gram tables) and nothing leaks into the
    generation loop.

    Class attributes (declarations the engine reads):
        name: registry key (lower case).
        needs_head: drafts with the model's EAGLE head (``EaModel.ea_layer``); a model without a head can
            still run drafters that need none.
        needs_features: wants the target's last hidden states (after the final norm, ``[1, k, H]``) in
            :meth:`start` and :meth:`accept`; otherwise ``None`` is passed.
        feature_layers: with ``needs_features``, other target hidden states instead of the last one: indices
            into transformers' ``hidden_states`` (0 = the embeddings, i = the output of decoder layer i - 1),
            passed concatenated in this order (``[1, k, len * H]``); None = the last hidden state (may be set
            per instance, e.g. from the target's layer count).
        uses_tree: drafts the caller's static tree shape (``tree``); False: the drafter chooses its own shape
            (the caller's tree is then not built, ``tree`` is None).
        drafting_rules: the drafting rules (:data:`eagle.rules.DRAFTING_RULES`) it can draft under losslessly;
            a verifier whose rule is not listed is refused at the door (:meth:`check_verifier`).
    """

    name: str = ""
    needs_head: bool = False
    needs_features: bool = False
    feature_layers: tuple | None = None
    uses_tree: bool = True
    drafting_rules: tuple = DRAFTING_RULES

    @classmethod
    def for_model(cls, model, **options) -> "Drafter":
        """A drafter for ``model`` (an :class:`~eagle.model.ea_model.EaModel`); ``options`` are the drafter's own."""
        return cls(**options)

    def refresh(self, model) -> None:
        """Called when the model's layers are swapped (``EaModel.set_fast_cpu``); re-read what was taken from it."""

    def check_verifier(self, verifier) -> None:
        """Refuse a verifier whose drafting rule this drafter cannot draft under.

        Raises:
            ValueError: one line naming the drafter and the verifier.
        """
        if verifier.drafting not in self.drafting_rules:
            raise ValueError(f"drafter {self.name!r} cannot draft under {verifier.drafting!r}, the rule verifier "
                             f"{verifier.name!r} needs (it drafts under {list(self.drafting_rules)})")

    def start(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """Begin a new sequence.

        Args:
            input_ids: LongTensor ``[1, L]``, the prompt (on the model's device).
            features: float ``[1, L, H]``: ``features[:, t]`` = the target's last hidden state after reading
                ``input_ids[:, t]`` (None unless :attr:`needs_features`).
        """
        raise NotImplementedError

    def draft(self, root: int, tree: TreeBuffers | None, rule: str, cfg: SamplingConfig,
              generator: torch.Generator | None = None) -> DraftTree:
        """Draft one tree below ``root`` (the last committed token) with the drafting rule ``rule``.

        Args:
            root: the last committed token (node 0 of the returned tree).
            tree: the caller's static tree (None when :attr:`uses_tree` is False).
            rule: "wor", "topk_residual" or "topk" (REFERENCE section 1); the verifier's.
            cfg: the sampling processing of target and draft laws.
            generator: the caller's ``torch.Generator`` on the model's device (None = global RNG).

        Returns:
            :class:`DraftTree` on the model's device: for every inner node, the draft law its children were
            drawn from under ``rule``.
        """
        raise NotImplementedError

    def accept(self, tokens: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """Take what a cycle committed.

        Args:
            tokens: LongTensor ``[1, k]``: the accepted draft tokens, then the next root (the verifier's token).
            features: float ``[1, k, H]``: ``features[:, i]`` = the target's last hidden state at the token before
                ``tokens[:, i]`` (the root, then the accepted nodes); None unless :attr:`needs_features`.
        """
        raise NotImplementedError


def draft_tree_from_choices(choices, tokens: dict, laws: dict, vocab: int, device) -> DraftTree:
    """A :class:`DraftTree` for a drafter that picks its own shape (no head passes).

    Args:
        choices: rank paths of the non-root nodes (``eagle.tree`` form, e.g. ``[[0], [0, 0], [1]]``; empty:
            the root alone); the buffers are built once per shape and cached.
        tokens: ``{rank path (tuple): token}``, with ``()`` = the root token.
        laws: ``{rank path: (tokens, probs)}`` for every inner node: the draft law of its children as a sparse
            row (zero elsewhere).
        vocab: V, the width of the draft-law rows.

    Returns:
        :class:`DraftTree` (float32 ``draft_probs`` ``[n, V]``) on ``device``.
    """
    key = tuple(sorted((tuple(c) for c in choices), key=lambda t: (len(t), t)))  # buffers' node order
    plan = _plan(key, str(torch.device(device)))  # cached per shape; () = the root alone
    order = [()] + list(key)
    tok = [int(tokens[p]) for p in order]
    n = len(order)
    rows, cols, vals = [], [], []
    for i, p in enumerate(order):
        if p in laws:
            ts, ps = laws[p]
            rows += [i] * len(ts)
            cols += list(ts)
            vals += list(ps)
    draft_probs = torch.zeros(n, vocab, dtype=torch.float32, device=device)
    if rows:
        draft_probs[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = torch.tensor(
            vals, dtype=torch.float32, device=device)
    return DraftTree(parents=plan.parents, tokens=torch.tensor(tok, dtype=torch.long, device=device),
                     depth=plan.depth, draft_probs=draft_probs, ancestor=plan.ancestor,
                     parents_list=list(plan.parents_list), tokens_list=tok, nodes=None, structure=plan.structure)


@lru_cache(maxsize=256)
def _residual_leaf_order(choices: tuple) -> tuple | None:
    """For a dynamic shape's rank paths (``choices``, in the expansion's kept order, node j = ``choices[j - 1]``):
    None when some node with children is a last child or lies below one; else, for each node of the static tree
    ``build_tree(choices)``, its index in the kept order (root 0). A function of the shape alone, computed once per
    shape (:meth:`EagleTreeDrafter._redraw_residual_leaves`)."""
    shape = build_tree([list(p) for p in choices])
    redrawn = [False] * shape.num_nodes  # a last child, or below one
    for u, kids in enumerate(shape.children):  # parents precede children
        if kids and redrawn[u]:
            return None
        for v in kids:
            redrawn[v] = redrawn[u] or v == kids[-1]
    index = {p: j for j, p in enumerate(choices, start=1)}
    return (0,) + tuple(index[tuple(p)] for p in shape.choices)


def pruned_draft_tree(plan, tokens: torch.Tensor, draft_probs: torch.Tensor, tok: list) -> DraftTree:
    """The :class:`DraftTree` of the drafted nodes of a static tree (the one place drafters prune).

    Args:
        plan: the static tree's :class:`~eagle.tree.TreePlan` (parents precede children).
        tokens: LongTensor ``[n]`` (device), -1 where a node could not be drafted (its law's support was
            smaller than its rank); tok: the same tokens on the host (list of ints).
        draft_probs: float32 ``[n, V]``.

    Returns:
        ``DraftTree``: every node when all were drafted (``nodes`` None); otherwise only the nodes whose token and
        every ancestor's token are >= 0 (``nodes`` = their static indices).
    """
    n = len(tok)
    par = plan.parents_list
    alive = [True] * n
    for i in range(1, n):  # parents precede children
        alive[i] = tok[i] >= 0 and alive[par[i]]
    if all(alive):
        return DraftTree(parents=plan.parents, tokens=tokens, depth=plan.depth, draft_probs=draft_probs,
                         ancestor=plan.ancestor, parents_list=list(par), tokens_list=tok, nodes=None,
                         structure=plan.structure)
    keep = [i for i in range(n) if alive[i]]
    remap = {v: i for i, v in enumerate(keep)}
    parents_list = [-1] + [remap[par[v]] for v in keep[1:]]
    device = tokens.device
    keep_t = torch.tensor(keep, dtype=torch.long, device=device)
    return DraftTree(parents=torch.tensor(parents_list, dtype=torch.long, device=device), tokens=tokens[keep_t],
                     depth=plan.depth[keep_t], draft_probs=draft_probs[keep_t],
                     ancestor=plan.ancestor[keep_t][:, keep_t], parents_list=parents_list,
                     tokens_list=[tok[v] for v in keep], nodes=keep_t, structure=tree_structure(tuple(parents_list)))


class EagleTreeDrafter(Drafter):
    """EAGLE-1 drafting over a static tree with an :class:`~eagle.model.head.EagleHead` (drafter ``eagle``).

    The drafter owns the head's KV cache (committed (token_{t+1}, feature_t) pairs only); the pairs a
    cycle commits are consumed lazily, at the next :meth:`draft`. :meth:`consume` and :meth:`expand`
    are the head-level steps with an explicit cache (device checks, tests).

    Args:
        head: the draft head (its ``embed_tokens`` set). When ``head.d2t`` (LongTensor ``[K]``, a
            draft vocabulary, see :meth:`~eagle.model.head.EagleHead.set_draft_vocab`) is set, the draft
            logits are computed for those K target tokens only (the lm_head's K rows), the processed
            draft law lives on them and is zero on every other token (lossless: the verifiers use
            that law; tokens outside it come from the residual / bonus draws).
        lm_head: the target's output projection (``[H] -> [V]``), shared with the target.
    """

    name = "eagle"
    needs_head = True
    needs_features = True
    #: drafts EAGLE-2 dynamic trees (:mod:`eagle.tree.dynamic`; read on this class only, not inherited)
    dynamic_trees = True

    def __init__(self, head, lm_head):
        self.head = head
        self.lm_head = lm_head
        self._draft_rows = (None, None, None)  # (d2t it was made for, lm_head.weight[d2t] [K, H], packed or None)
        self.packed = False  # set by EaModel.set_fast_cpu: pack the draft-vocabulary rows too
        self.head_cache = None
        self._pending = (None, None, False)  # (tokens [1, k], features [1, k, H], whether tokens end with the root)
        self._root_hidden = None

    @classmethod
    def for_model(cls, model, **options) -> "EagleTreeDrafter":
        if getattr(model, "ea_layer", None) is None:
            raise ValueError("drafter 'eagle' needs an EAGLE head, but the model has none (load it with ea_model_path, "
                             "or choose a drafter that needs no head, e.g. 'prompt_lookup')")
        if options:
            raise ValueError(f"drafter 'eagle' takes no options, got {sorted(options)}")
        d = cls(model.ea_layer, model.lm_head)
        d.packed = bool(getattr(model, "fast_cpu", False))
        return d

    def refresh(self, model) -> None:
        self.lm_head = model.lm_head
        self.packed = bool(getattr(model, "fast_cpu", False))

    def start(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """A fresh head cache; the prompt's pairs (input_ids[t+1], features[t]) are consumed at the first draft."""
        if features is None:
            raise ValueError("drafter 'eagle' needs the target features of the prompt")
        self.head_cache = new_cache(self.head.config)
        self._pending = (input_ids[:, 1:], features, False)
        self._root_hidden = None

    def accept(self, tokens: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """The committed pairs (``tokens`` [1, k], the next root last; ``features`` [1, k, H]) wait for the next
        draft; pairs a cycle left unconsumed (:meth:`defer`) are kept before them."""
        old, old_feats, has_root = self._pending
        if old is not None and has_root:
            tokens = torch.cat([old, tokens.to(old.device)], dim=1)
            features = torch.cat([old_feats, features.to(old_feats.device, old_feats.dtype)], dim=1)
        self._pending = (tokens, features, True)

    def defer(self, root: int) -> None:
        """This cycle drafts without the head: keep the pending pairs (the root's included) for a later draft."""
        tokens, feats, has_root = self._pending
        if tokens is not None and not has_root:
            tokens = torch.cat([tokens, torch.tensor([[int(root)]], device=tokens.device)], dim=1)
            self._pending = (tokens, feats, True)

    def draft(self, root: int, tree: TreeBuffers, rule: str, cfg: SamplingConfig,
              generator: torch.Generator | None = None) -> DraftTree:
        """Consume the pending committed pairs (the root's included), then :meth:`expand` ``tree`` (a
        :class:`~eagle.tree.dynamic.DynamicTree`: :meth:`expand_dynamic`)."""
        self.defer(root)
        tokens, feats, _ = self._pending
        if tokens is not None:
            self._root_hidden = self.consume(self.head_cache, tokens, feats)
            self._pending = (None, None, False)
        if self._root_hidden is None:
            raise ValueError("drafter 'eagle': draft before start")
        if isinstance(tree, DynamicTree):
            return self.expand_dynamic(self.head_cache, root, self._root_hidden, tree, rule, cfg, generator)
        return self.expand(self.head_cache, root, self._root_hidden, tree, rule, cfg, generator)

    def _draft_logits(self, hidden: torch.Tensor):
        """Draft logits ``[n, K]`` (float32) and ``d2t`` (None = the full vocabulary, K = V)."""
        d2t = getattr(self.head, "d2t", None)
        if d2t is None:
            return self.lm_head(hidden).float(), None
        d2t = d2t.to(hidden.device)
        w = self.lm_head.weight
        if w.device.type == "meta":  # an offloaded lm_head (its hook loads the weight): all logits, then K columns
            return self.lm_head(hidden).float().index_select(-1, d2t), d2t
        cached, rows, fast = self._draft_rows
        if (cached is None or cached is not self.head.d2t or rows.device != w.device or rows.dtype != w.dtype
                or (fast is not None) != self.packed):
            rows = w.detach()[d2t].contiguous()  # [K, H], made once per draft vocabulary
            fast = packed_rows(rows) if self.packed else None
            self._draft_rows = (self.head.d2t, rows, fast)
        bias = getattr(self.lm_head, "bias", None)
        if fast is not None and bias is None:
            return fast(hidden).float(), d2t
        logits = torch.nn.functional.linear(hidden, rows, None if bias is None else bias[d2t])
        return logits.float(), d2t

    def frontier_law(self, front, q: torch.Tensor,
                     d2t: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The law a dynamic tree's frontier children are chosen from (the hook of :meth:`expand_dynamic`).

        Args:
            front: the :class:`~eagle.tree.dynamic.Frontier` (None: the root's row, called first);
            q: float ``[w, K]`` the head's processed draft law of each frontier node; d2t: as
                :meth:`level_law` (None: K = V).

        Returns:
            ``(q, d2t)``: here unchanged. An override may change the rows and the columns, but must return the
            same ``d2t`` (or None) for every call of one expansion (the expansion's token map is fixed), and the
            same laws :meth:`level_law` gives the same nodes (``topk_residual`` redrafts the chosen shape as a
            static tree through :meth:`expand`).
        """
        return q, d2t

    def level_law(self, d: int, expand: torch.Tensor, q: torch.Tensor, d2t: torch.Tensor | None,
                  tokens: torch.Tensor, plan) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The law the children of one tree level are drawn from (a hook for drafters built on this one).

        Args:
            d: the level's depth; expand: LongTensor ``[e]``, its expanded nodes; q: float ``[e, K]``, the
                head's processed draft law over the columns ``d2t`` (LongTensor ``[K]`` target tokens; None:
                K = V, column = token); tokens: LongTensor ``[n]``, the tokens drafted so far (every node of
                depth <= d set); plan: the static tree's :class:`~eagle.tree.TreePlan`.

        Returns:
            ``(q, d2t)``: here unchanged. An override may return other rows and columns (e.g. one more column
            for a token outside the draft vocabulary; a column may repeat a token only with zero mass).
            Runs on the device: it must not read tensors on the host.
        """
        return q, d2t

    @torch.no_grad()
    def consume(self, head_cache, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Append committed (token_{t+1}, feature_t) pairs to the head cache.

        Args:
            head_cache: the head's ``DynamicCache`` (committed positions only).
            tokens: LongTensor ``[1, k]``; features: float ``[1, k, H]`` (target features).

        Returns:
            float ``[H]``: the head's output at the last pair, whose ``lm_head`` gives the draft law
            of the root's children.
        """
        past = cache_length(head_cache)
        w = self.head.fc.weight  # the head's device: the lm_head's (a sharded target's features are moved here)
        pos = torch.arange(past, past + tokens.shape[1], device=w.device)[None]
        out = self.head(tokens.to(w.device), features.to(w.device, w.dtype), position_ids=pos, cache=head_cache)
        return out[0, -1]

    @torch.no_grad()
    def expand(self, head_cache, root_token: int, root_hidden: torch.Tensor, tree: TreeBuffers, rule: str,
               cfg: SamplingConfig, generator: torch.Generator | None = None) -> DraftTree:
        """Expand ``tree`` below ``root_token`` level by level with the head; return the pruned tree.

        The head cache holds the committed positions (C of them); node v at depth d >= 1 is fed
        ``(embed(token_v), head output at parent(v))`` at position ``C - 1 + d`` and attends to the
        committed positions, its tree ancestors and itself. The cache is restored to C positions
        before returning.

        Args:
            root_token: the last committed token (node 0).
            root_hidden: float ``[H]`` from :meth:`consume`.
            tree: static tree buffers.
            rule: drafting rule ("wor", "topk_residual" or "topk"; REFERENCE section 1).
            cfg: sampling processing applied to the draft logits (same as the target's).

        Returns:
            :class:`DraftTree`: the drafted nodes; a node is dropped when it or an ancestor could not be
            drafted (the draft law's support had fewer tokens than the node's rank).

        Raises:
            ValueError: NaN or inf draft logits.
        """
        device = root_hidden.device
        plan = tree.on(device)
        committed = cache_length(head_cache)
        hidden = torch.zeros(tree.num_nodes, root_hidden.shape[-1], dtype=root_hidden.dtype, device=device)
        hidden[0] = root_hidden
        # the draft logits' finiteness is checked with the one sync below (a check per level would wait
        # for the device each time)
        extremes = []  # (min, max) of every level's logits
        mask_dtype = self.head.fc.weight.dtype

        def level_laws(d, level, tokens):
            expand = level.expand
            if d > 0:
                # undrafted nodes (token -1) are expanded with token 0 and pruned afterwards
                out = self.head(tokens[expand].clamp(min=0)[None], hidden[plan.parents[expand]][None],
                                position_ids=(committed - 1 + plan.depth[expand])[None],
                                attention_mask=additive_mask(level.visible, committed, mask_dtype),
                                cache=head_cache)
                hidden[expand] = out[0]
            logits, d2t = self._draft_logits(hidden[expand])  # [e, K]
            # NaN/inf reported after the one sync below; draw from finite stand-ins
            extremes.append(torch.stack(torch.aminmax(logits)))
            logits = torch.nan_to_num(logits, nan=0.0, posinf=0.0, neginf=0.0)
            if cfg.greedy:
                q = torch.softmax(logits, dim=-1)  # topk ranks by the raw draft logits
            else:
                q = logits_to_probs(logits, cfg, check=False)  # checked above (or after the sync)
            return self.level_law(d, expand, q, d2t, tokens, plan)

        try:
            tokens, draft_probs = self._draw_levels(plan, root_token, level_laws, rule, generator)
        finally:
            truncate_cache(head_cache, committed)
        finite = (torch.isfinite(torch.stack(extremes)).all() if extremes
                  else torch.ones((), dtype=torch.bool, device=device))
        host = torch.cat([tokens, finite.to(device=device, dtype=torch.long)[None]]).tolist()  # the one sync
        if not host[-1]:
            raise ValueError("draft logits (head output) contain NaN or inf")
        return pruned_draft_tree(plan, tokens, draft_probs, host[:-1])

    def _redraw_residual_leaves(self, res, ex, shape: TreeBuffers, root_token: int, generator):
        """Draft a dynamic tree's shape under ``topk_residual`` on the expansion's own laws (no head pass), or None.

        Under ``topk_residual`` every node's kept children but the last are its most probable tokens: the ones the
        expansion made, whose laws it computed. When no node with children is a last child or lies below one
        (a function of the shape alone), every law the static draft needs is the expansion's, and only the
        residual leaves are drawn: :meth:`_draw_levels` on those laws, the same draws as drafting ``shape`` with
        :meth:`expand` on the same laws. Otherwise None (the caller drafts ``shape`` with the head).

        Args:
            res: :func:`~eagle.tree.dynamic.finish_dynamic`'s result; ex: the expansion (its ``laws`` and
                ``token_map``); shape: ``build_tree(res.choices)``; root_token, generator: as :meth:`expand`.

        Returns:
            :class:`DraftTree` (one host read) or None.
        """
        order = _residual_leaf_order(tuple(tuple(p) for p in res.choices))
        if order is None:
            return None
        plan = shape.on(res.rows.device)
        rows = res.rows[torch.tensor(order, dtype=torch.long, device=plan.device)]  # each static node's law row

        def level_laws(d, level, tokens):
            return ex.laws[rows[level.expand]], ex.token_map

        tokens, draft_probs = self._draw_levels(plan, root_token, level_laws, "topk_residual", generator)
        return pruned_draft_tree(plan, tokens, draft_probs, tokens.tolist())  # the one sync

    def _draw_levels(self, plan, root_token: int, level_laws, rule: str, generator):
        """Draw a static tree level by level: the one loop of :meth:`expand` and of a dynamic shape's redraft.

        Args:
            plan: the static tree's :class:`~eagle.tree.TreePlan`; root_token: node 0's token.
            level_laws: ``(d, level, tokens) -> (q, d2t)``: float ``[e, K]`` the laws of the level's expanded
                nodes (``level.expand``) over the columns ``d2t`` (LongTensor ``[K]`` target tokens; None: K = V);
                ``tokens`` are the tokens drafted so far.
            rule, generator: the drafting rule and the caller's generator.

        Returns:
            ``(tokens, draft_probs)``: LongTensor ``[n]`` (-1 = not drafted: the law's support was smaller than
            the node's rank) and float32 ``[n, V]`` (zero rows for leaves), on the plan's device; no host read.
        """
        device = plan.device
        n = len(plan.parents_list)
        tokens = torch.full((n,), -1, dtype=torch.long, device=device)
        tokens[0] = int(root_token)
        draft_probs = torch.zeros(n, self.lm_head.weight.shape[0], dtype=torch.float32, device=device)
        for d, level in enumerate(plan.levels):
            expand = level.expand
            q, d2t = level_laws(d, level, tokens)
            if d2t is None:
                draft_probs[expand] = q
            else:  # the law over the K draft tokens, zero elsewhere (accumulated: d2t may repeat a
                # token with zero mass, see level_law)
                draft_probs.index_put_((expand[:, None].expand(-1, d2t.shape[0]), d2t[None, :].expand(
                    expand.shape[0], -1)), q, accumulate=True)
            for m, rows, child_idx in level.groups:
                kids = draw_children(q[rows], min(m, q.shape[1]), rule, generator)  # [g, min(m, K)]
                if d2t is not None:  # draft index -> target token (-1 = not drafted stays)
                    kids = torch.where(kids >= 0, d2t[kids.clamp(min=0)], kids)
                if kids.shape[1] < m:  # more children than tokens: the extra ones are pruned
                    kids = torch.cat([kids, kids.new_full((kids.shape[0], m - kids.shape[1]), -1)], 1)
                tokens[child_idx.flatten()] = kids.flatten().to(device)
        return tokens, draft_probs

    @torch.no_grad()
    def expand_dynamic(self, head_cache, root_token: int, root_hidden: torch.Tensor, tree: DynamicTree, rule: str,
                       cfg: SamplingConfig, generator: torch.Generator | None = None) -> DraftTree:
        """Draft an EAGLE-2 dynamic tree (:mod:`eagle.tree.dynamic`) below ``root_token``.

        The head runs once per depth 2..``tree.depth`` on the ``top_k`` frontier nodes (batched, under the
        tree mask of :func:`~eagle.tree.additive_mask`, at position ``C - 1 + d`` as in :meth:`expand`), the
        selection stays on the device, and ONE host read returns the tree with the draft logits' finiteness
        flag. ``rule="topk"``: that tree is the draft. ``rule="topk_residual"``: its shape (rank paths, a
        deterministic function of the context) is drafted as a static tree (the last kept child of a node
        becomes the residual draw; one more read): on the expansion's own laws where no node with children is
        a last child or below one (:meth:`_redraw_residual_leaves`, no head pass), else by :meth:`expand` (one
        more pass per level). The cache is restored to C positions.

        Args:
            root_token, root_hidden, cfg, generator: as :meth:`expand`; tree: the dynamic tree spec;
            rule: "topk" or "topk_residual".

        Returns:
            :class:`DraftTree` (``nodes`` None).

        Raises:
            ValueError: rule "wor" (one line naming the drafter, the tree and the rule), NaN or inf draft logits.
        """
        check_dynamic_tree(tree, self, rule)
        committed = cache_length(head_cache)
        mask_dtype = self.head.fc.weight.dtype
        extremes = []  # (min, max) of every pass's logits, read with the one sync
        hidden_rows = [root_hidden[None]]  # [1, H] per law row: the root, then each frontier

        def law(hidden):
            logits, d2t = self._draft_logits(hidden)  # [w, K]
            extremes.append(torch.stack(torch.aminmax(logits)))
            logits = torch.nan_to_num(logits, nan=0.0, posinf=0.0, neginf=0.0)
            q = torch.softmax(logits, dim=-1) if cfg.greedy else logits_to_probs(logits, cfg, check=False)
            return q, d2t

        def laws_of(front):
            hid = torch.cat(hidden_rows)
            out = self.head(front.tokens[None], hid[front.parent_rows][None],
                            position_ids=torch.full_like(front.tokens, committed - 1 + front.depth)[None],
                            attention_mask=additive_mask(front.visible, committed, mask_dtype), cache=head_cache)
            hidden_rows.append(out[0])
            return self.frontier_law(front, *law(out[0]))[0]

        root_q, d2t = self.frontier_law(None, *law(root_hidden[None]))
        try:
            ex = expand_dynamic(tree, root_q[0], laws_of, stable_topk, token_map=d2t)
        finally:
            truncate_cache(head_cache, committed)
        finite = torch.isfinite(torch.stack(extremes)).all()
        res = finish_dynamic(ex, root_token, self.lm_head.weight.shape[0], extra=finite[None], max_depth=tree.depth)
        if not res.extra[0]:
            raise ValueError("draft logits (head output) contain NaN or inf")
        if rule == "topk_residual":
            shape = build_tree(res.choices)
            drawn = self._redraw_residual_leaves(res, ex, shape, root_token, generator)
            if drawn is not None:
                return drawn
            return self.expand(head_cache, root_token, root_hidden, shape, rule, cfg, generator)
        return DraftTree(parents=res.parents, tokens=res.tokens, depth=res.depth, draft_probs=res.draft_probs.float(),
                         ancestor=res.ancestor, parents_list=res.parents_list, tokens_list=res.tokens_list,
                         nodes=None, structure=res.structure)
