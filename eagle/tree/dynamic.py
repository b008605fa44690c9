"""EAGLE-2 dynamic draft trees (Li et al., "EAGLE-2: Faster Inference of Language Models with Dynamic
Draft Trees", 2024): the spec, the door checks and a drafter-independent expansion routine.

The tree is grown from the draft laws alone. The score of a node is its cumulative draft probability
(the product of the draft probabilities along its path; kept here as a sum of logs). Depth by depth,
the ``top_k`` frontier nodes of highest score are expanded, each with its ``top_k`` most probable
children; after ``depth`` levels the ``nodes`` candidates of highest score are kept. A child's score never
exceeds its parent's and ties go to the candidate made first (parents before children, siblings in rank
order), so the kept set is closed under ancestors and **a node's kept children are a prefix of its top-k
children** (among one parent's children the score order is the draft-probability order). The tree is
therefore a set of rank paths (static ``choices``) chosen by a deterministic function of the context:

- drafting rule ``topk`` (temperature 0, verifier ``argmax``): the expansion's tokens are the tree;
- drafting rule ``topk_residual`` (Greedy, UniVer): the shape is drafted as a static tree (the last kept
  child of each node is a residual draw, its subtree drafted below the drawn token), lossless exactly as
  a static tree is;
- ``wor`` (RRSw, Traversal) is refused: its children are random draws, and a shape chosen from their
  probabilities would depend on the draws (not lossless; ``tests/test_dynamic_tree.py`` shows a case).

Spec strings: ``"eagle2"`` (EAGLE-2's setting: 60 tokens per target forward including the root, i.e.
``nodes=59`` draft nodes, ``depth=6``, ``topk=10``) or ``"eagle2:nodes=N,depth=D,topk=K"`` (any subset of
the keys; ``nodes`` counts draft nodes below the root). A drafter opts in with the class attribute
``dynamic_trees = True``, read on its own class only (a subclass that changes the laws must opt in again).

Adaptive trees (``adapt=1``, e.g. ``"eagle2:nodes=10,depth=3,topk=3,adapt=1"``): ``nodes`` is a bound, and each
cycle keeps the n best candidates that maximise the predicted tokens per second,
``(1 + sum of the n best cumulative draft probabilities) / cycle_s[n - 1]`` (:func:`adaptive_budget`), where
``cycle_s`` are this machine's cycle seconds per node count (the engine fills them from the cost model tree
``auto`` is fitted with, :func:`eagle.autotree.machine_cost`). A confident draft keeps a deep tree, a flat one a
single node. n is a function of the draft laws and fixed costs, so the shape still depends on the draft laws
only: the same rules stay lossless (exact enumeration in ``tests/test_dynamic_tree.py``).

This module is layer 0 (``tests/test_layering.py``): it imports nothing from drafting, rules or
verification; the drafter passes its laws (a callback) and its top-k function in.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .buffers import TreeBuffers, build_tree
from .structure import TreeStructure, tree_structure

__all__ = ["DynamicTree", "EAGLE2", "DYNAMIC_RULES", "parse_dynamic_tree", "is_dynamic_tree", "build_any_tree",
           "check_dynamic_tree", "supports_dynamic_trees", "Frontier", "DynamicExpansion", "DynamicDraft",
           "expand_dynamic", "finish_dynamic", "adaptive_budget"]

#: drafting rules under which a dynamic tree is lossless (a deterministic shape; see the module docstring)
DYNAMIC_RULES = ("topk", "topk_residual")

_KEYS = ("nodes", "depth", "topk", "adapt")
_FORM = "'eagle2' or 'eagle2:nodes=N,depth=D,topk=K[,adapt=1]' (any of the keys; N, D, K positive integers)"


@dataclass(frozen=True)
class DynamicTree:
    """An EAGLE-2 dynamic tree spec.

    Attributes:
        nodes: draft nodes kept below the root (EAGLE-2's ``total_tokens - 1``).
        depth: levels below the root (the deepest draft node's depth).
        top_k: frontier nodes expanded per level, and children per expanded node.
    """

    nodes: int
    depth: int
    top_k: int
    adapt: bool = False
    #: seconds of a cycle keeping n = 1 .. nodes draft nodes (``adapt``; set by :meth:`with_cycle_cost`)
    cycle_s: tuple | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        for k, v in (("nodes", self.nodes), ("depth", self.depth), ("topk", self.top_k)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"dynamic tree: {k} must be a positive integer, got {v!r}")
        if not isinstance(self.adapt, bool):
            raise ValueError(f"dynamic tree: adapt must be a bool, got {self.adapt!r}")
        if self.cycle_s is not None:
            if not self.adapt:
                raise ValueError("dynamic tree: cycle_s is for an adaptive tree (adapt=True)")
            try:
                if isinstance(self.cycle_s, (str, bytes)) or any(isinstance(x, bool) for x in self.cycle_s):
                    raise TypeError
                c = tuple(float(x) for x in self.cycle_s)
            except (TypeError, ValueError):
                raise ValueError(f"dynamic tree: cycle_s must be a sequence of {self.nodes} seconds, got "
                                 f"{self.cycle_s!r:.80}") from None
            if len(c) != self.nodes:
                raise ValueError(f"dynamic tree: cycle_s must hold {self.nodes} seconds (n = 1 .. nodes), got "
                                 f"{len(c)} values")
            bad = [i for i, x in enumerate(c) if not (math.isfinite(x) and x > 0)]
            if bad:
                raise ValueError(f"dynamic tree: cycle_s must be finite and > 0, got cycle_s[{bad[0]}] = {c[bad[0]]}")
            object.__setattr__(self, "cycle_s", c)
        if self.nodes > self.candidates:
            raise ValueError(f"dynamic tree: nodes={self.nodes} exceeds the {self.candidates} candidates that "
                             f"depth={self.depth}, topk={self.top_k} make (topk + (depth-1) * topk^2)")

    @property
    def candidates(self) -> int:
        """Candidate nodes the expansion makes (with a vocabulary of at least ``top_k`` tokens)."""
        return self.top_k + (self.depth - 1) * self.top_k ** 2

    @property
    def spec(self) -> str:
        """The canonical spec string (``parse_dynamic_tree(t.spec) == t``)."""
        return f"eagle2:nodes={self.nodes},depth={self.depth},topk={self.top_k}" + (",adapt=1" if self.adapt else "")

    def with_cycle_cost(self, cost) -> "DynamicTree":
        """This spec with ``cycle_s`` from a cycle cost model (``cost.cycle_s(n, depth)``, e.g.
        :class:`~eagle.tree.auto.CycleCost`: seconds of a cycle with n draft nodes of depth ``self.depth``)."""
        return replace(self, cycle_s=tuple(float(cost.cycle_s(n, self.depth)) for n in range(1, self.nodes + 1)))

    def __str__(self) -> str:
        return self.spec

    def on(self, device) -> None:
        """No static plan: the engine's ``tree.on(device)`` gets None (paths come from the drafted tree)."""
        return None


#: EAGLE-2's published setting (60 tokens per target forward including the root, depth 6, top-k 10)
EAGLE2 = DynamicTree(nodes=59, depth=6, top_k=10)


def parse_dynamic_tree(spec) -> DynamicTree | None:
    """The :class:`DynamicTree` a spec names, or None when ``spec`` is not a dynamic tree spec.

    Args:
        spec: a :class:`DynamicTree` (returned as is), a string starting with ``"eagle2"``
            (case-insensitive, surrounding spaces ignored), or anything else (None: a static tree spec).

    Raises:
        ValueError: one line, for a string starting with ``"eagle2"`` that is malformed (unknown or repeated
            key, a value that is not a positive integer, nodes beyond the candidates).
    """
    if isinstance(spec, DynamicTree):
        return spec
    if not isinstance(spec, str):
        return None
    s = spec.strip().lower()
    if not s.startswith("eagle2"):
        return None
    rest = s[len("eagle2"):]
    if rest == "":
        return EAGLE2
    if not rest.startswith(":") or rest == ":":
        raise ValueError(f"malformed dynamic tree {spec!r}: use {_FORM}")
    vals = {"nodes": EAGLE2.nodes, "depth": EAGLE2.depth, "topk": EAGLE2.top_k, "adapt": 0}
    seen = set()
    for item in rest[1:].split(","):
        key, eq, val = (x.strip() for x in item.partition("="))
        if not eq or key not in _KEYS:
            raise ValueError(f"malformed dynamic tree {spec!r}: {item.strip()!r} is not one of "
                             f"{', '.join(k + '=' for k in _KEYS)}; use {_FORM}")
        if key in seen:
            raise ValueError(f"malformed dynamic tree {spec!r}: {key} given twice")
        seen.add(key)
        if key == "adapt":
            if val not in ("0", "1"):
                raise ValueError(f"malformed dynamic tree {spec!r}: adapt must be 0 or 1, got {val!r}")
        elif not re.fullmatch(r"\d+", val) or int(val) < 1:
            raise ValueError(f"malformed dynamic tree {spec!r}: {key} must be a positive integer, got {val!r}")
        vals[key] = int(val)
    try:
        return DynamicTree(nodes=vals["nodes"], depth=vals["depth"], top_k=vals["topk"], adapt=bool(vals["adapt"]))
    except ValueError as e:
        raise ValueError(f"malformed dynamic tree {spec!r}: {str(e).split(': ', 1)[1]}") from None


def is_dynamic_tree(spec) -> bool:
    """Whether ``spec`` names a dynamic tree (a :class:`DynamicTree` or a string starting with ``"eagle2"``,
    well formed or not: :func:`parse_dynamic_tree` then says what is wrong)."""
    return isinstance(spec, DynamicTree) or (isinstance(spec, str) and spec.strip().lower().startswith("eagle2"))


def build_any_tree(spec) -> DynamicTree | TreeBuffers:
    """A dynamic tree spec's :class:`DynamicTree`, else the static tree's buffers (:func:`build_tree`).

    Raises:
        ValueError: a malformed dynamic spec, or what :func:`build_tree` raises (an unknown name is told
            about the dynamic form too).
    """
    dyn = parse_dynamic_tree(spec)
    if dyn is not None:
        return dyn
    try:
        return build_tree(spec)
    except ValueError as e:
        if str(e).startswith("unknown tree"):
            raise ValueError(f"{e}, or a dynamic tree ({_FORM})") from None
        raise


def supports_dynamic_trees(drafter) -> bool:
    """Whether a drafter (class or instance) declares ``dynamic_trees = True`` on its own class."""
    cls = drafter if isinstance(drafter, type) else type(drafter)
    return bool(vars(cls).get("dynamic_trees", False))


def check_dynamic_tree(tree: DynamicTree, drafter, rule: str, verifier: str | None = None) -> None:
    """The door of a dynamic tree: a drafter that declares dynamic trees, a rule that keeps it lossless.

    Args:
        tree: the dynamic tree; drafter: the drafter (class or instance, its ``name`` is reported);
        rule: the drafting rule of the verifier (or of the call); verifier: its name, for the message.

    Raises:
        ValueError: one line naming the drafter, the tree and the verifier (or rule).
    """
    name = getattr(drafter, "name", "") or (drafter.__name__ if isinstance(drafter, type) else type(drafter).__name__)
    if not supports_dynamic_trees(drafter):
        raise ValueError(f"drafter {name!r} drafts static trees only; the dynamic tree {tree.spec!r} needs a drafter "
                         f"that declares dynamic_trees (e.g. 'eagle')")
    if rule not in DYNAMIC_RULES:
        who = f"verifier {verifier!r} (drafting rule {rule!r})" if verifier else f"drafting rule {rule!r}"
        raise ValueError(f"drafter {name!r} with the dynamic tree {tree.spec!r} cannot serve {who}: its children "
                         f"are random draws, so the tree's shape would depend on them (not lossless); use greedy or "
                         f"univer (top-k + residual), temperature 0, or a static tree")


@dataclass(frozen=True)
class Frontier:
    """The frontier nodes of one depth, handed to the drafter's law callback (all on the device).

    Attributes:
        depth: d >= 1, the frontier nodes' depth (a KV-cache drafter feeds them at position
            ``committed - 1 + d``).
        tokens: LongTensor ``[w]``, the nodes' target tokens (a node that cannot be drafted, score -inf, still
            carries a valid token id; its children are never kept).
        parent_rows: LongTensor ``[w]``, law row of each node's parent: 0 = the root, r >= 1 = the r-th
            frontier row made before (rows are numbered 1, 2, ... in the order the callbacks ran).
        rows: LongTensor ``[w]``, the law rows these nodes get (``c + 1 .. c + w``, c = rows made before).
        visible: BoolTensor ``[w, c + w]``: ``[i, j]`` iff frontier row ``j + 1`` is node i or one of its
            ancestors (the tree attention over the rows already fed, then these).
    """

    depth: int
    tokens: torch.Tensor
    parent_rows: torch.Tensor
    rows: torch.Tensor
    visible: torch.Tensor


@dataclass
class DynamicExpansion:
    """The candidates of one expansion (device tensors; candidate order = creation order: depth by depth,
    parent frontier slot, rank), and the selection.

    Attributes:
        token: LongTensor ``[C]`` target tokens; parent: LongTensor ``[C]`` parent candidate (-1 = the root);
        rank: LongTensor ``[C]`` rank among the parent's children; depth: LongTensor ``[C]`` (>= 1);
        score: float ``[C]`` log cumulative draft probability (-inf: a zero-probability token, never kept);
        row: LongTensor ``[C]`` law row of the candidate (-1: not expanded);
        laws: float ``[R + 1, K]`` row 0 = the root's law, row r = the r-th frontier row's;
        token_map: LongTensor ``[K]`` target token of each law column, or None (K = V);
        kept: LongTensor ``[s]`` selected candidates, increasing (parents before children);
        kept_ok: BoolTensor ``[s]`` selected with a positive probability (score > -inf).
    """

    token: torch.Tensor
    parent: torch.Tensor
    rank: torch.Tensor
    depth: torch.Tensor
    score: torch.Tensor
    row: torch.Tensor
    laws: torch.Tensor
    token_map: torch.Tensor | None
    kept: torch.Tensor
    kept_ok: torch.Tensor


@dataclass
class DynamicDraft:
    """One dynamic tree after the single host read (:func:`finish_dynamic`), in the common tree form.

    Attributes:
        parents, tokens, depth: LongTensor ``[n]`` (device), node 0 = the root; parents precede children,
            siblings in rank order.
        draft_probs: float ``[n, V]`` (device): the law each node's children were taken from (zero rows for
            nodes never expanded).
        ancestor: BoolTensor ``[n, n]`` (device), ``[i, j]`` iff j is i or an ancestor of i.
        parents_list, tokens_list: host lists; choices: the rank paths of nodes 1..n-1 (static form);
        structure: :class:`~eagle.tree.structure.TreeStructure`; extra: the host values of ``extra``.
        rows: LongTensor ``[n]`` (device): each node's row of the expansion's ``laws`` (the law its children were
            chosen from; the root 0, -1 for a node never expanded).
    """

    parents: torch.Tensor
    tokens: torch.Tensor
    depth: torch.Tensor
    draft_probs: torch.Tensor
    ancestor: torch.Tensor
    parents_list: list
    tokens_list: list
    choices: list
    structure: TreeStructure
    extra: list
    rows: torch.Tensor


def _cumulate(parent_score: torch.Tensor, child_prob: torch.Tensor) -> torch.Tensor:
    """Children's scores ``[w, m]`` from the parents' ``[w]`` and the children's draft probabilities:
    ``log(parent cumulative probability * q(child))``, never above the parent's (a probability above 1 by
    rounding counts as 1), -inf for q = 0."""
    return parent_score[:, None] + torch.log(child_prob).clamp(max=0.0)


def _best(score: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` highest scores, ties to the lowest index (the candidate made first)."""
    return torch.sort(score, descending=True, stable=True).indices[:k]


def expand_dynamic(tree: DynamicTree, root_law: torch.Tensor, laws_of: Callable[[Frontier], torch.Tensor],
                   topk_fn: Callable, token_map: torch.Tensor | None = None) -> DynamicExpansion:
    """EAGLE-2's expansion and selection, vectorised, with no host read.

    Depth 1: the root's ``m = min(top_k, K)`` most probable tokens. Depths d = 1 .. depth-1: the frontier
    (all of depth 1; then the ``top_k`` best of the previous level's new candidates) is passed to
    ``laws_of`` ONCE (one batched drafter call per depth) and each frontier node's ``m`` most probable
    children become candidates of depth d+1. Finally the ``tree.nodes`` best candidates are selected
    (score ties to the candidate made first).

    Args:
        tree: the spec.
        root_law: float ``[K]``, the processed draft law of the root's children (K = V, or the draft
            vocabulary's size with ``token_map``).
        laws_of: callback ``Frontier -> float [w, K]``, the draft laws after the frontier nodes.
        topk_fn: ``(q [w, K], m) -> (values [w, m], indices [w, m])`` in decreasing order, ties broken
            deterministically (e.g. :func:`eagle.rules.stable_topk`, ties to the lowest id, as the ``topk``
            drafting rule).
        token_map: LongTensor ``[K]`` target token of each law column (a draft vocabulary), or None.

    Returns:
        :class:`DynamicExpansion` (device tensors).

    Raises:
        ValueError: ``root_law`` not 1-D, or a callback row of the wrong shape.
    """
    if root_law.dim() != 1:
        raise ValueError(f"root_law must be [K], got shape {tuple(root_law.shape)}")
    dev = root_law.device
    K = root_law.shape[0]
    m = min(tree.top_k, K)
    tok_of = (lambda idx: idx) if token_map is None else (lambda idx: token_map[idx])
    vals, idx = topk_fn(root_law[None], m)  # [1, m]
    token = [tok_of(idx[0])]
    parent = [torch.full((m,), -1, dtype=torch.long, device=dev)]
    rank = [torch.arange(m, device=dev)]
    depth = [torch.ones(m, dtype=torch.long, device=dev)]
    score = [_cumulate(torch.zeros(1, dtype=root_law.dtype, device=dev), vals)[0]]
    row = [torch.full((m,), -1, dtype=torch.long, device=dev)]
    laws = [root_law[None]]
    n_rows = 0
    front = torch.arange(m, device=dev)  # candidate indices of the frontier
    front_rows_parent = torch.zeros(m, dtype=torch.long, device=dev)  # law rows of their parents (root)
    anc = torch.zeros(0, 0, dtype=torch.bool, device=dev)  # ancestry among frontier rows 1..n_rows
    base = m  # candidates made so far
    cand_row = torch.full((tree.candidates,), -1, dtype=torch.long, device=dev)
    for d in range(1, tree.depth):
        w = front.numel()
        all_tok, all_score = torch.cat(token), torch.cat(score)
        rows = torch.arange(n_rows + 1, n_rows + 1 + w, device=dev)
        # ancestry of the new rows: their parent's row (and its ancestors), then themselves
        par_anc = (anc[front_rows_parent - 1] if d > 1 else torch.zeros(w, n_rows, dtype=torch.bool, device=dev))
        visible = torch.cat([par_anc, torch.eye(w, dtype=torch.bool, device=dev)], dim=1)  # [w, n_rows + w]
        anc = torch.cat([torch.cat([anc, torch.zeros(n_rows, w, dtype=torch.bool, device=dev)], 1), visible], 0)
        q = laws_of(Frontier(depth=d, tokens=all_tok[front], parent_rows=front_rows_parent, rows=rows,
                             visible=visible))
        if q.shape != (w, K):
            raise ValueError(f"laws_of returned shape {tuple(q.shape)}, expected {(w, K)}")
        laws.append(q)
        cand_row[front] = rows
        n_rows += w
        vals, idx = topk_fn(q, m)  # [w, m]
        child_score = _cumulate(all_score[front], vals.to(root_law.dtype)).reshape(-1)  # [w * m]
        token.append(tok_of(idx.reshape(-1)))
        parent.append(front.repeat_interleave(m))
        rank.append(torch.arange(m, device=dev).repeat(w))
        depth.append(torch.full((w * m,), d + 1, dtype=torch.long, device=dev))
        score.append(child_score)
        row.append(torch.full((w * m,), -1, dtype=torch.long, device=dev))
        if d + 1 < tree.depth:  # the next frontier: the best top_k of the new candidates
            pick = _best(child_score, min(tree.top_k, w * m))
            front = base + pick
            front_rows_parent = rows[pick // m]
        base += w * m
    score_t = torch.cat(score)
    C = score_t.numel()
    order = _best(score_t, min(tree.nodes, C))  # score order
    kept = torch.sort(order).values
    kept_ok = score_t[kept] > float("-inf")
    if tree.adapt:
        kept_ok &= adaptive_budget(score_t, order, tree)[kept]
    return DynamicExpansion(token=torch.cat(token), parent=torch.cat(parent), rank=torch.cat(rank),
                            depth=torch.cat(depth), score=score_t, row=cand_row[:C], laws=torch.cat(laws, 0),
                            token_map=token_map, kept=kept, kept_ok=kept_ok)


def adaptive_budget(score: torch.Tensor, order: torch.Tensor, tree: DynamicTree) -> torch.Tensor:
    """Which candidates an adaptive tree keeps this cycle (device only, no host read).

    With the candidates in score order ``s_(1) >= s_(2) >= ...`` (``order``), keeping the first n predicts
    ``1 + sum_{i <= n} exp(s_(i))`` tokens per cycle (EAGLE-2's reading of a node's cumulative draft probability
    as its chance of being accepted) at ``tree.cycle_s[n - 1]`` seconds; the n of the highest predicted
    tokens per second is kept (ties to the smaller n). The first n of the score order are closed under
    ancestors (a child never outscores its parent, ties to the candidate made first), so the kept set is a tree.

    Args:
        score: float ``[C]`` candidates' log cumulative draft probabilities; order: LongTensor ``[s]`` the best
            ``s = min(nodes, C)`` candidates in score order; tree: its ``cycle_s`` set.

    Returns:
        BoolTensor ``[C]``: True on the kept candidates.

    Raises:
        ValueError: ``tree.cycle_s`` unset (the engine sets it from the machine's cost model).
    """
    if tree.cycle_s is None:
        raise ValueError(f"dynamic tree {tree.spec!r}: adapt needs the cycle costs (DynamicTree.with_cycle_cost)")
    s = order.numel()
    gain = 1.0 + torch.cumsum(torch.exp(score[order].double()), 0)  # [s]
    secs = torch.tensor(tree.cycle_s[:s], dtype=torch.float64, device=score.device)
    rate = gain / secs
    n = torch.argmax(rate)  # first maximum: the smaller n on ties
    keep = torch.arange(s, device=score.device) <= n
    return torch.zeros_like(score, dtype=torch.bool).scatter_(0, order, keep)


def finish_dynamic(ex: DynamicExpansion, root_token: int, vocab: int, extra: torch.Tensor | None = None,
                   max_depth: int | None = None) -> DynamicDraft:
    """The selected tree in the common tree form, with ONE host read (the tree's tokens and parents, plus
    ``extra``, e.g. a drafter's finiteness flag); the device tensors are built on the device (a host-built
    index is copied only when some selected candidate has probability 0 and is dropped).

    Args:
        ex: :func:`expand_dynamic`'s result; root_token: node 0's token; vocab: V, the width of
            ``draft_probs``; extra: LongTensor ``[e]`` (device) read in the same transfer;
            max_depth: a bound on the tree's depth (default n - 1; fewer steps build the ancestor table).

    Returns:
        :class:`DynamicDraft`.

    Raises:
        ValueError: the selection is not closed under ancestors (a broken selection), or ``laws`` narrower than
            ``vocab`` without a ``token_map``.
    """
    dev = ex.kept.device
    s = ex.kept.numel()
    extra = torch.zeros(0, dtype=torch.long, device=dev) if extra is None else extra.to(dev, torch.long).reshape(-1)
    host = torch.cat([ex.kept, ex.kept_ok.long(), ex.token[ex.kept], ex.parent[ex.kept], ex.rank[ex.kept],
                      extra]).tolist()  # the one read
    kept, ok, tok, par, rnk = (host[i * s:(i + 1) * s] for i in range(5))
    extra_host = host[5 * s:]
    if all(ok):
        keep = ex.kept
    else:  # a zero-probability candidate was selected: drop it (its descendants have probability 0 too)
        sel = [i for i in range(s) if ok[i]]
        kept, tok, par, rnk = ([x[i] for i in sel] for x in (kept, tok, par, rnk))
        keep = torch.tensor(kept, dtype=torch.long, device=dev)
    n = len(kept) + 1
    node_of = {c: i + 1 for i, c in enumerate(kept)}
    if any(p >= 0 and p not in node_of for p in par):
        raise ValueError("dynamic tree: the selection is not closed under ancestors (a kept node's parent was dropped)")
    parents_list = [-1] + [node_of[p] if p >= 0 else 0 for p in par]
    tokens_list = [int(root_token)] + tok
    paths: list = [()]
    for i in range(1, n):
        paths.append(paths[parents_list[i]] + (rnk[i - 1],))
    choices = [list(p) for p in paths[1:]]
    # device tensors from device data (no host-built tensors)
    remap = torch.zeros(ex.token.numel(), dtype=torch.long, device=dev)
    remap[keep] = torch.arange(1, n, device=dev)
    kp = ex.parent[keep]
    parents = torch.cat([torch.full((1,), -1, dtype=torch.long, device=dev),
                         torch.where(kp >= 0, remap[kp.clamp(min=0)], torch.zeros_like(kp))])
    tokens = torch.empty(n, dtype=torch.long, device=dev)
    tokens[0] = int(root_token)
    tokens[1:] = ex.token[keep]
    depth = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), ex.depth[keep]])
    K = ex.laws.shape[1]
    if ex.token_map is None and K != vocab:
        raise ValueError(f"laws have {K} columns but vocab is {vocab} (pass token_map for a draft vocabulary)")
    rows = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), ex.row[keep]])
    dp = torch.where((rows >= 0)[:, None], ex.laws[rows.clamp(min=0)], torch.zeros((), dtype=ex.laws.dtype,
                                                                                       device=dev))
    if ex.token_map is None:
        draft_probs = dp
    else:
        draft_probs = torch.zeros(n, vocab, dtype=dp.dtype, device=dev)
        draft_probs[:, ex.token_map] = dp
    ancestor = torch.zeros(n, n, dtype=torch.bool, device=dev)
    ar = torch.arange(n, device=dev)
    up, hop = ar.clone(), parents.clamp(min=0)
    bound = n - 1 if max_depth is None else min(int(max_depth), n - 1)
    for _ in range(bound + 1):  # node, parent, grandparent, ... (the root maps to itself)
        ancestor[ar, up] = True
        up = hop[up]
    return DynamicDraft(parents=parents, tokens=tokens, depth=depth, draft_probs=draft_probs, ancestor=ancestor,
                        parents_list=parents_list, tokens_list=tokens_list, choices=choices,
                        structure=tree_structure(tuple(parents_list)), extra=extra_host, rows=rows)
