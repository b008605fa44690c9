"""``tree_choices="auto"``: measure the head's acceptance and the machine's costs, fit the tree, cache it.

The fit itself is pure (:func:`eagle.tree.auto.fit_tree`, ~15 ms); this module gets its two inputs
and caches each on its own under ``cache_dir()/auto_tree/`` (JSON files):

* the acceptance table, which does not depend on the machine (target, head, draft vocabulary, sampling
  setting, verifier: :func:`acceptance_key`). The embedded default head ships its tables for the
  product's default settings (:data:`SHIPPED_SETTINGS`) in ``auto_tree_acceptance.json`` in its folder
  (:func:`write_acceptance`, ``python -m evaluation.fit_tree --write-acceptance``); other heads are
  measured once (36 contexts, ~1-2 s each on an idle 2-core CPU) and cached;
* the cost model, per machine (:func:`cost_key`): measured once per machine and sampling setting
  (the CPU default: 50-60 s on 2 cores at load average ~5, an estimated 20-30 s idle);
* the fit (:func:`cache_key`: both, plus the node budget), with the printed explanation.

So the embedded default is fitted on a new machine from its costs alone: 52-62 s under that load, against
218-400 s before (acceptance measured, and a cost measurement twice as long).

* Acceptance (:func:`measure_acceptance`): on real contexts (the self-distillation corpus's prompts
  and answers, else Alpaca prompts answered by the target itself), one "probe" tree per context is
  drafted and scored with :meth:`EaModel.tree_laws`; the exact probability that every probe node is
  accepted comes from the verifier's outcome law (temperature > 0) or from the greedy match
  (temperature 0). ``acceptance[d-1, r] = sum P(rank-r node at depth d accepted) / sum P(its parent
  accepted)`` over every such node of every context.
* Costs (:func:`measure_costs`): target forwards over 1..64 tree tokens on a 384-token context (the
  1-token forward is one plain decode step), interleaved round by round with short
  :meth:`EaModel.eagenerate` runs on four trees whose ``stats["timing"]`` gives drafting and the
  per-cycle rest (least squares ``draft = level_s * depth + node_s * nodes``).

The model is duck-typed (``tree_laws``, ``eagenerate``, ``naivegenerate``, ``target_forward``,
``base_model``, ``ea_layer``, ``tokenizer``); nothing here imports the engine.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .model.kv_cache import new_cache, truncate_cache
from .sampling import SamplingConfig
from .tree import build_tree
from .tree.auto import CycleCost, fit_tree, load_cached, store_cached

__all__ = ["probe_tree", "acceptance_from_laws", "measure_acceptance", "smooth_acceptance", "default_contexts", "measure_costs",
           "cost_contexts", "cache_key", "cost_key", "acceptance_key", "target_identity", "shipped_acceptance",
           "write_acceptance", "resolve_auto_tree", "isotonic", "TARGET_TOKENS", "COST_TREES", "SHIPPED_ACCEPTANCE",
           "SHIPPED_SETTINGS"]

#: tree sizes (root included) at which the target forward is timed (linear interpolation between them)
TARGET_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
#: probe trees whose drafting is timed to fit ``draft_level_s`` / ``draft_node_s`` (depth, nodes):
#: (1, 1), (3, 3), (3, 14), (5, 25)
COST_TREES = ("chain1", "chain3", "2x3", "mc_sim_7b_63")
#: tokens of context below the timed target forwards (:func:`cost_contexts`)
TARGET_CONTEXT = 384
#: tokens of real context the timed ``eagenerate`` runs start from (:func:`cost_contexts`)
DRAFT_CONTEXT = 96


def probe_tree(depth: int = 6, ranks: int = 4) -> list[list[int]]:
    """Probe tree for the acceptance table: every rank path of length <= ``depth`` with ranks < ``ranks``
    and at most one non-zero rank (a rank-0 spine; at every depth ``ranks - 1`` branches that continue
    with rank-0 chains). ``depth * ranks + (ranks - 1) * depth (depth - 1) / 2`` nodes (6, 4: 69).

    Raises:
        ValueError: ``depth < 1`` or ``ranks < 1``.
    """
    if depth < 1 or ranks < 1:
        raise ValueError(f"probe_tree needs depth >= 1 and ranks >= 1, got depth={depth}, ranks={ranks}")
    paths = []
    for d in range(1, depth + 1):
        paths.append([0] * d)
        for b in range(d):  # position of the single non-zero rank
            for r in range(1, ranks):
                p = [0] * d
                p[b] = r
                paths.append(p)
    return sorted(paths, key=lambda p: (len(p), p))


def _ranks_depths(parents: list[int]) -> tuple[list[int], list[int]]:
    n = len(parents)
    rank, depth, seen = [0] * n, [0] * n, {}
    for i in range(1, n):
        p = parents[i]
        rank[i] = seen.get(p, 0)
        seen[p] = rank[i] + 1
        depth[i] = depth[p] + 1
    return rank, depth


def acceptance_from_laws(parents: torch.Tensor, accept_probs: torch.Tensor, max_depth: int, max_rank: int):
    """Accumulate one tree's exact acceptance into the table's numerator and denominator.

    Args:
        parents: LongTensor ``[n]`` (common tree form: siblings in rank order, parents first).
        accept_probs: float ``[n]``: P(node i is accepted) (1 for the root).
        max_depth, max_rank: table bounds (D, R).

    Returns:
        ``(num, den)`` float64 numpy ``[D, R]``: ``num[d-1, r]`` = sum of P(accepted) over rank-r
        nodes at depth d, ``den[d-1, r]`` = sum of P(parent accepted) over the same nodes.
    """
    par = [int(x) for x in parents.tolist()]
    acc = accept_probs.double().cpu().tolist()
    rank, depth = _ranks_depths(par)
    num, den = np.zeros((max_depth, max_rank)), np.zeros((max_depth, max_rank))
    for i in range(1, len(par)):
        d, r = depth[i], rank[i]
        if d <= max_depth and r < max_rank:
            num[d - 1, r] += acc[i]
            den[d - 1, r] += acc[par[i]]
    return num, den


def _accept_probs(laws, cfg: SamplingConfig, verifier) -> torch.Tensor:
    """P(node accepted) float64 ``[n]`` from a :class:`TreeLaws`: the greedy match at temperature 0,
    else the verifier's outcome law summed over each node's subtree."""
    par = [int(x) for x in laws.parents.tolist()]
    n = len(par)
    if cfg.greedy:
        best = laws.target_probs.argmax(dim=-1).tolist()
        tok = laws.tokens.tolist()
        acc = [1.0] * n
        for u in range(1, n):  # parents precede children
            acc[u] = acc[par[u]] * float(tok[u] == best[par[u]])
        return torch.tensor(acc, dtype=torch.float64)
    end = verifier.outcome_probs(laws.parents, laws.tokens, laws.target_probs, laws.draft_probs).sum(dim=-1)
    acc = end.double().cpu().clone()
    for u in range(n - 1, 0, -1):  # children after parents: sum each subtree bottom-up
        acc[par[u]] += acc[u]
    return acc


def _verifier(name, temperature):
    from .verify import registry

    if hasattr(registry, "select_verifier"):
        return registry.select_verifier(name, temperature)
    return registry.get_verifier(name)


@torch.no_grad()
def measure_acceptance(model, contexts, *, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                       verifier: str = "rrsw", probe=None, seed: int = 0, progress: bool = False):
    """The positional acceptance table of ``model``'s head on ``contexts``.

    Args:
        model: an ``EaModel`` (needs ``tree_laws``).
        contexts: list of LongTensor ``[L]`` / ``[1, L]`` (L >= 2; the last token is the root).
        temperature, top_p, top_k: the sampling setting (acceptance depends on it).
        verifier: the verifier whose exact outcome law defines acceptance at temperature > 0
            (one tree is shared by every method of a run; RRSw is the conservative choice).
        probe: probe tree choices (default :func:`probe_tree`).
        seed: seeds the draws of the drafted probe trees.
        progress: a progress bar over the contexts (stderr).

    Returns:
        ``(acceptance, weight)``: float64 numpy ``[D, R]`` (0 where never observed) and the summed
        parent-acceptance probabilities behind each entry (how much evidence it has).

    Raises:
        ValueError: no contexts.
    """
    if not contexts:
        raise ValueError("measure_acceptance needs at least one context")
    probe = probe or probe_tree()
    D = max(len(p) for p in probe)
    R = max(max(p) for p in probe) + 1
    cfg = SamplingConfig(temperature, top_p, top_k)
    v = _verifier(verifier, temperature)
    drafting = "topk" if cfg.greedy else v.drafting
    dev = model.device
    gen = torch.Generator(device=dev)
    gen.manual_seed(int(seed))
    num, den = np.zeros((D, R)), np.zeros((D, R))
    for ctx in tqdm(contexts, desc="[auto tree] acceptance", unit="context", disable=not progress,
                    dynamic_ncols=True):
        laws = model.tree_laws(ctx, tree_choices=probe, drafting=drafting, temperature=temperature, top_p=top_p,
                               top_k=top_k, generator=gen)
        a, b = acceptance_from_laws(laws.parents, _accept_probs(laws, cfg, v), D, R)
        num += a
        den += b
    table = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    return np.clip(table, 0.0, 1.0), den


def smooth_acceptance(table: np.ndarray, weight: np.ndarray, strength: float = 4.0) -> np.ndarray:
    """Shrink each entry toward its rank's rate pooled over all depths, by ``strength`` pseudo-observations:
    ``(table * weight + strength * pooled[r]) / (weight + strength)``.

    Deep entries rest on few contexts (a parent must be accepted first): without this an entry seen
    twice reads 0 or 1 and the fit cuts or over-grows the tree there.

    Args:
        table, weight: float ``[D, R]`` from :func:`measure_acceptance`.
        strength: pseudo-observations of the pooled rate (0 = no smoothing).
    """
    num = table * weight
    pooled = np.divide(num.sum(0), weight.sum(0), out=np.zeros(table.shape[1]), where=weight.sum(0) > 0)
    return (num + strength * pooled[None, :]) / (weight + strength) if strength > 0 else table.copy()


@torch.no_grad()
def default_contexts(model, n_prompts: int = 12, new_tokens: int = 48, per_prompt: int = 3,
                     temperature: float = 0.0, seed: int = 0, corpus=None) -> list[torch.Tensor]:
    """Real contexts for the measurements: prompt + the target's own answer cut at ``per_prompt``
    evenly spaced points.

    Sources, in order: the self-distillation corpus (``eagle.data.corpus``, its stored answers; no
    generation); Alpaca prompts in the chat template answered by the target (``naivegenerate`` at
    ``temperature``); for a model without a tokenizer, seeded random prompts answered the same way.
    """
    vocab = model.lm_head.weight.shape[0]
    pairs: list[tuple[list[int], list[int]]] = []
    try:
        from .data.corpus import DEFAULT_ROOT, iter_records

        root = corpus or DEFAULT_ROOT
        if os.path.isdir(root):
            for rec in iter_records(root, split="heldout"):
                for t in rec.get("turns") or [rec]:
                    p, a = list(t.get("prompt_ids", [])), list(t.get("answer_ids", []))
                    if len(a) >= 8 and p and max(p + a) < vocab:
                        pairs.append((p, a[:new_tokens]))
                if len(pairs) >= n_prompts:
                    break
    except ImportError:
        pass
    if len(pairs) < n_prompts:
        prompts = []
        if getattr(model, "tokenizer", None) is not None:
            from .data.corpus import DEFAULT_PROMPTS, load_alpaca

            if os.path.exists(DEFAULT_PROMPTS):
                recs = load_alpaca(DEFAULT_PROMPTS)
                rng = np.random.default_rng(seed)
                for i in rng.choice(len(recs), size=n_prompts - len(pairs), replace=False):
                    msgs = [{"role": "user", "content": recs[int(i)]["prompt"]}]
                    ids = model.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
                    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
                    prompts.append(ids[0].tolist())
        g = torch.Generator().manual_seed(seed)
        while len(prompts) + len(pairs) < n_prompts:
            prompts.append(torch.randint(0, vocab, (16,), generator=g).tolist())
        for k, p in enumerate(prompts):
            out = model.naivegenerate(torch.tensor([p]), temperature=temperature, max_new_tokens=new_tokens,
                                      seed=seed + k)
            pairs.append((p, out[0, len(p):].tolist()))
    contexts = []
    for p, a in pairs[:n_prompts]:
        for j in range(per_prompt):
            cut = 1 + (len(a) - 1) * j // max(per_prompt - 1, 1) if per_prompt > 1 else len(a)
            contexts.append(torch.tensor(p + a[:max(cut, 1)], dtype=torch.long))
    return contexts


def _chain_mask(prefix: int, n: int, dtype) -> torch.Tensor:
    visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()], 1)
    mask = torch.zeros(n, prefix + n, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def _sync(dev):
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


class _ForwardTimer:
    """Times target forwards over n tree tokens (4D chain mask; n = 1 without a mask, as a plain decode
    step) on top of one prefilled cache, pass by pass (so passes can interleave with other timings)."""

    def __init__(self, model, context: torch.Tensor, tokens):
        self.model, self.tokens = model, tuple(tokens)
        dev = self.dev = model.device
        ctx = torch.as_tensor(context, dtype=torch.long).reshape(1, -1).to(dev)
        self.L = ctx.shape[1]
        self.cache = new_cache(model.base_model.config)
        with torch.no_grad():
            model.target_forward(ctx, torch.arange(self.L, device=dev)[None], self.cache)
        dtype = model.lm_head.weight.dtype if model.lm_head.weight.dtype.is_floating_point else torch.float32
        self.masks = {n: _chain_mask(self.L, n, dtype).to(dev) for n in self.tokens}
        self.times = {n: [] for n in self.tokens}
        self.gen = torch.Generator().manual_seed(0)
        self.vocab = model.lm_head.weight.shape[0]

    @torch.no_grad()
    def run(self, record: bool = True) -> None:
        """One forward per size, in increasing size; ``record=False``: a warm-up pass (not kept)."""
        dev = self.dev
        for n in self.tokens:
            ids = torch.randint(0, self.vocab, (1, n), generator=self.gen).to(dev)
            pos = torch.arange(self.L, self.L + n, device=dev)[None]
            _sync(dev)
            t0 = time.perf_counter()
            self.model.target_forward(ids, pos, self.cache, attention_mask=self.masks[n] if n > 1 else None)
            _sync(dev)
            if record:
                self.times[n].append(time.perf_counter() - t0)
            truncate_cache(self.cache, self.L)

    def result(self) -> dict:
        """``{n: seconds}``: per size, the median over passes of its time relative to its pass (log time
        minus the pass's mean log time over the sizes: a load change between passes then shifts no
        ratio between sizes), times the median pass level; made non-decreasing in n (least-squares
        isotonic fit, :func:`isotonic`: a forward over more tokens never costs less, a dip is timing
        noise, and a running maximum would carry one slow sample up to every larger size).

        Under load (2 cores, load average ~5) this halved the spread of the fitted tree over repeated
        measurements against the plain median per size (5 measurements: 6-14 nodes, three at 12-13,
        against 6-27)."""
        log_t = np.log(np.maximum(np.array([self.times[n] for n in self.tokens], dtype=np.float64), 1e-12))
        level = log_t.mean(axis=0)  # [passes]
        est = np.exp(np.median(log_t - level[None], axis=1) + np.median(level))
        return dict(zip(self.tokens, isotonic(est).tolist()))


@torch.no_grad()
def time_target_forwards(model, context: torch.Tensor, tokens=TARGET_TOKENS, rounds: int = 3) -> dict:
    """Seconds of one target forward over n tree tokens (4D mask; n = 1 without a mask, as a plain
    decode step) on top of ``context``'s cache, for every n in ``tokens``, interleaved round-robin over
    ``rounds`` passes after one warm-up pass (estimate: :meth:`_ForwardTimer.result`). Returns ``{n: seconds}``."""
    timer = _ForwardTimer(model, context, tokens)
    for r in range(rounds + 1):  # pass 0 warms up
        timer.run(record=r > 0)
    return timer.result()


def isotonic(values) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators).

    ``values``: 1-D floats; returns float64 ``[len(values)]``.
    """
    blocks: list[list[float]] = []  # [sum, count]
    for v in np.asarray(values, dtype=np.float64).ravel():
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return np.concatenate([np.full(int(c), s / c) for s, c in blocks]) if blocks else np.zeros(0)


def cost_contexts(model, context: torch.Tensor, target_context: int = TARGET_CONTEXT,
                  draft_context: int = DRAFT_CONTEXT) -> tuple[torch.Tensor, torch.Tensor]:
    """The two contexts of :func:`measure_costs`, LongTensor ``[L]`` each.

    * target forwards: ``context`` cut or extended (seeded random tokens: a forward's time does not
      depend on the token values) to exactly ``target_context`` tokens (at most the model's
      ``max_position_embeddings - 65``), so the timing does not depend on which real context a machine has;
    * the timed ``eagenerate`` runs: the last ``draft_context`` tokens of ``context`` (real text, so
      acceptance and cycle counts are realistic; short, so each run's prefill, which is no part of a
      cycle but is charged to it by ``stats["timing"]``, stays small).
    """
    ctx = torch.as_tensor(context, dtype=torch.long).reshape(-1).cpu()
    limit = getattr(model.base_model.config, "max_position_embeddings", None)
    n = int(target_context) if not limit else max(min(int(target_context), int(limit) - 65), 2)
    if ctx.numel() >= n:
        target = ctx[:n]
    else:
        g = torch.Generator().manual_seed(0)
        vocab = model.lm_head.weight.shape[0]
        target = torch.cat([ctx, torch.randint(0, vocab, (n - ctx.numel(),), generator=g)])
    return target, ctx[-max(int(draft_context), 2):]


@torch.no_grad()
def measure_costs(model, context: torch.Tensor, *, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                  verifier: str = "rrsw", tokens=TARGET_TOKENS, trees=COST_TREES, new_tokens: int = 16,
                  rounds: int = 3, target_passes: int = 2, target_context: int = TARGET_CONTEXT,
                  draft_context: int = DRAFT_CONTEXT, progress: bool = False) -> tuple[CycleCost, dict]:
    """The cycle cost model of ``model`` on this machine (seconds).

    ``rounds`` interleaved rounds (after one warm-up pass of target forwards), each: ``target_passes``
    passes of target forwards over every n of ``tokens`` tree tokens on a ``target_context``-token context
    (:func:`cost_contexts`), then one ``eagenerate`` run of ``new_tokens`` tokens from the
    ``draft_context``-token context per tree of ``trees``; so a load change during the measurement
    shifts target and drafting costs alike. Target seconds: per n relative to its pass, median over
    passes, made non-decreasing (:meth:`_ForwardTimer.result`). Drafting: the per-cycle
    ``stats["timing"]["draft"]`` median per tree, fitted by non-negative least squares
    ``draft = level_s * depth + node_s * nodes``; ``fixed_s``: the mean over trees of the median
    per-cycle time of the other parts except the target forward.
    ``progress``: a progress bar over the timed passes and runs (stderr).

    Defaults (11 sizes x 2 passes x 3 rounds; 4 trees x 3 rounds of 16 tokens from 96 tokens): 50-61 s
    on the embedded default on 2 cores at load average ~5 (an estimated 20-30 s idle), against 110-122 s
    for the former 6 trees from the longest context (~390 tokens, whose prefill took half of each run).

    Returns:
        ``(CycleCost, details)``; details holds every measured number.

    Raises:
        RuntimeError: ``eagenerate`` does not report ``stats["timing"]``.
        ValueError: ``rounds < 1`` or ``target_passes < 1``.
    """
    if rounds < 1 or target_passes < 1:
        raise ValueError(f"measure_costs needs rounds >= 1 and target_passes >= 1, got {rounds}, {target_passes}")
    t0 = time.perf_counter()
    tctx, dctx = cost_contexts(model, context, target_context, draft_context)
    timer = _ForwardTimer(model, tctx, tokens)
    timer.run(record=False)
    ctx = dctx.reshape(1, -1)
    per_tree = {t: {"draft": [], "rest": []} for t in trees}
    bar = tqdm(total=rounds * (target_passes + len(trees)), desc="[auto tree] costs", unit="run",
               disable=not progress, dynamic_ncols=True)
    for r in range(rounds):
        for _ in range(target_passes):
            timer.run()
            bar.update(1)
        for t in trees:
            _, st = model.eagenerate(ctx, temperature=temperature, top_p=top_p, top_k=top_k,
                                     max_new_tokens=new_tokens, tree_choices=t, verifier=verifier, seed=r,
                                     return_stats=True)
            bar.update(1)
            tim = st.get("timing")
            if not tim:
                raise RuntimeError("eagenerate(return_stats=True) reports no stats['timing']: the cost model "
                                   "needs the engine's per-part timing")
            cycles = max(int(st["decoding_steps"]), 1)
            per_tree[t]["draft"].append(tim["draft"] / cycles)
            rest = sum(v for k, v in tim.items() if k in ("target_laws", "verify", "cache_update", "other"))
            per_tree[t]["rest"].append(rest / cycles)
    bar.close()
    target = timer.result()
    rows, y, rest = [], [], []
    for t in trees:
        tree = build_tree(t)
        rows.append([tree.max_depth, len(tree.choices)])
        y.append(statistics.median(per_tree[t]["draft"]))
        rest.append(statistics.median(per_tree[t]["rest"]))
    level_s, node_s = _nnls2(np.array(rows, float), np.array(y))
    cost = CycleCost(target_tokens=tuple(target), target_s=tuple(target.values()), draft_level_s=level_s,
                     draft_node_s=node_s, fixed_s=float(np.mean(rest)))
    details = {"target_forward_s": {str(k): v for k, v in target.items()},
               "draft_s_per_cycle": {t: float(v) for t, v in zip(trees, y)},
               "rest_s_per_cycle": {t: float(v) for t, v in zip(trees, rest)},
               "draft_fit": {"level_s": level_s, "node_s": node_s,
                             "residual_s": [float(v - (level_s * a + node_s * b)) for v, (a, b) in zip(y, rows)]},
               "samples": {"target_forward_s": {str(k): v for k, v in timer.times.items()},
                           "draft_s_per_cycle": {t: per_tree[t]["draft"] for t in trees},
                           "rest_s_per_cycle": {t: per_tree[t]["rest"] for t in trees}},
               "contexts": {"target": int(tctx.numel()), "draft": int(dctx.numel())},
               "rounds": int(rounds), "target_passes": int(target_passes), "new_tokens": int(new_tokens),
               "seconds": time.perf_counter() - t0}
    return cost, details


def _nnls2(X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares ``y ~ X @ [a, b]`` with a, b >= 0 (two unknowns: try the free fit, then each
    one-variable fit)."""
    best = None
    cands = []
    sol, *_ = np.linalg.lstsq(X, y, rcond=None)
    if np.all(sol >= 0):
        cands.append(sol)
    for j in range(2):
        col = X[:, j]
        c = max(float(col @ y) / float(col @ col), 0.0) if float(col @ col) > 0 else 0.0
        s = np.zeros(2)
        s[j] = c
        cands.append(s)
    for s in cands:
        err = float(np.sum((X @ s - y) ** 2))
        if best is None or err < best[0]:
            best = (err, s)
    return float(best[1][0]), float(best[1][1])


# ---------------------------------------------------------------------- cache + entry point
def _digest_tensors(tensors, float32: bool = False) -> str:
    """First 16 hex digits of the sha256 of the tensors' shapes and bytes (``float32``: floating tensors
    cast to float32 first, so float16 and float32 copies of float16 weights agree)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu")
        if float32 and t.is_floating_point():
            t = t.float()
        t = t.contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes())
    return h.hexdigest()[:16]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: version of the fit and cost cache entries (older entries are not read). 3: robust fit (FIT_TOLERANCE);
#: 4: the acceptance table cached apart from the machine's costs, costs from interleaved rounds on
#: fixed-size contexts (:func:`measure_costs`)
CACHE_VERSION = 4
#: version of the acceptance tables, cached or shipped (what the probe tree and the contexts are)
ACCEPTANCE_VERSION = 1
#: the probe tree of the acceptance tables: (depth, ranks) of :func:`probe_tree`
PROBE = (6, 4)
#: the default contexts of the acceptance tables (keyword arguments of :func:`default_contexts`)
DEFAULT_CONTEXTS = {"n_prompts": 12, "per_prompt": 3, "new_tokens": 48}
#: the file of acceptance tables shipped in a head folder (:func:`write_acceptance`)
SHIPPED_ACCEPTANCE = "auto_tree_acceptance.json"
#: the (temperature, verifier) settings whose tables ship with the embedded default head: temperature 0
#: (every verifier runs the greedy match), temperature 1 with ``univer`` (the main job's speed table)
#: and with ``rrsw`` (the engine's default verifier)
SHIPPED_SETTINGS = ((0.0, "rrsw"), (1.0, "univer"), (1.0, "rrsw"))


def _sampling(temperature: float, top_p: float, top_k: int, verifier) -> tuple[dict, str]:
    """The sampling setting and verifier as the keys hold them: at temperature 0 every verifier runs
    the greedy match (``argmax``) and top-p / top-k do not matter."""
    if SamplingConfig(float(temperature)).greedy:
        return {"temperature": 0.0, "top_p": 1.0, "top_k": 0}, "argmax"
    return ({"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k)},
            str(getattr(verifier, "name", verifier)).lower())


def _model_key(model, temperature: float, top_p: float, top_k: int, verifier) -> dict:
    head = model.ea_layer
    head_tensors = [p for n, p in sorted(head.named_parameters()) if not n.startswith("embed_tokens")]
    d2t = getattr(head, "d2t", None)
    if d2t is not None:
        head_tensors.append(d2t)
    cfg = model.base_model.config
    dev = model.device
    sampling, v = _sampling(temperature, top_p, top_k, verifier)
    return {
        "target": {"name": getattr(cfg, "_name_or_path", ""), "config": hashlib.sha256(
            cfg.to_json_string(use_diff=False).encode()).hexdigest()[:16]},
        "head": _digest_tensors(head_tensors),
        "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "device": str(dev),
                    "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                    "dtype": str(model.lm_head.weight.dtype),
                    "fast_cpu": bool(getattr(model, "fast_cpu", False)),
                    "attention": getattr(cfg, "_attn_implementation", None)},
        "sampling": sampling, "verifier": v, "version": CACHE_VERSION,
    }


def cache_key(model, temperature: float, top_p: float, top_k: int, verifier: str, max_nodes: int) -> dict:
    """Key of a cached fit: what the fitted tree depends on: target config, head weights (+ draft
    vocabulary), machine (CPU model, cores, torch threads, torch version, device, dtype, the target-forward
    switch and attention implementation), sampling (at temperature 0 the verifier is ``argmax``),
    node budget, :data:`CACHE_VERSION`."""
    return {**_model_key(model, temperature, top_p, top_k, verifier), "max_nodes": int(max_nodes)}


def cost_key(model, temperature: float, top_p: float, top_k: int, verifier: str, measure_kwargs=None) -> dict:
    """Key of the cached cost model: :func:`cache_key` without the node budget, with the measurement's
    arguments (``measure_kwargs`` of :func:`resolve_auto_tree`)."""
    kw = {k: v for k, v in (measure_kwargs or {}).items() if k != "progress"}
    return {**_model_key(model, temperature, top_p, top_k, verifier), "kind": "costs",
            "measure": json.loads(json.dumps(kw, sort_keys=True, default=str))}


def target_identity(model) -> dict:
    """The target as an acceptance table depends on it, the same on every machine and under every
    transformers version: architecture numbers of its config and a digest of its normalisation weights
    (as float32; a GGUF keeps them unquantised, and they tell fine-tunes of one architecture apart)."""
    cfg = model.base_model.config
    norms = [p for n, p in sorted(model.base_model.named_parameters()) if "norm" in n and p.dim() == 1]
    fields = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size")
    return {**{f: getattr(cfg, f, None) for f in fields}, "norms": _digest_tensors(norms, float32=True)}


def acceptance_key(model, temperature: float, top_p: float = 1.0, top_k: int = 0, verifier: str = "rrsw",
                   contexts=None) -> dict:
    """Key of an acceptance table (cached or shipped), machine-independent: the target
    (:func:`target_identity`), the head's weights as float32 and its draft vocabulary, the sampling
    setting and verifier (``argmax`` at temperature 0), the probe tree, the contexts (``"default"``:
    :func:`default_contexts` with :data:`DEFAULT_CONTEXTS`; given contexts: their count and digest) and
    :data:`ACCEPTANCE_VERSION`."""
    head = model.ea_layer
    weights = [p for n, p in sorted(head.named_parameters()) if not n.startswith("embed_tokens")]
    d2t = getattr(head, "d2t", None)
    sampling, v = _sampling(temperature, top_p, top_k, verifier)
    if contexts is None:
        ctx = {"default": dict(DEFAULT_CONTEXTS)}
    else:
        ctx = {"given": len(contexts), "digest": _digest_tensors(
            [torch.as_tensor(c, dtype=torch.long).reshape(-1) for c in contexts])}
    return {"kind": "acceptance", "version": ACCEPTANCE_VERSION, "target": target_identity(model),
            "head": {"weights": _digest_tensors(weights, float32=True),
                     "draft_vocab": None if d2t is None else {"size": int(d2t.numel()),
                                                              "digest": _digest_tensors([d2t])}},
            "sampling": sampling, "verifier": v, "probe": list(PROBE), "contexts": ctx}


def _json_key(key: dict):
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def shipped_acceptance(key: dict, paths=None) -> tuple[dict, Path] | None:
    """The shipped acceptance table whose key equals ``key`` and the file it came from, else None.

    ``paths``: files written by :func:`write_acceptance` (default: :data:`SHIPPED_ACCEPTANCE` in the
    embedded default head's folder, :data:`eagle.data.DEFAULT_HEAD`); missing or unreadable files are
    skipped. The table: ``{"key", "acceptance_raw" [D][R], "acceptance_weight" [D][R], "contexts", ...}``.
    """
    if paths is None:
        from .data import DEFAULT_HEAD

        paths = [Path(DEFAULT_HEAD) / SHIPPED_ACCEPTANCE]
    want = _json_key(key)
    for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths):
        try:
            doc = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        for table in doc.get("tables", []) if isinstance(doc, dict) else []:
            if isinstance(table, dict) and table.get("key") == want:
                return table, Path(p)
    return None


def write_acceptance(model, path=None, settings=SHIPPED_SETTINGS, *, contexts=None, progress: bool = False) -> Path:
    """Measure the acceptance tables of ``model``'s head for ``settings`` and write them as one JSON file,
    which :func:`resolve_auto_tree` then uses instead of measuring (see :func:`shipped_acceptance`).

    Command line (the embedded default head's file): ``python -m evaluation.fit_tree --write-acceptance``.

    Args:
        model: an ``EaModel`` with a head.
        path: the file (default: :data:`SHIPPED_ACCEPTANCE` in :data:`eagle.data.DEFAULT_HEAD`).
        settings: ``(temperature, verifier)`` pairs (top-p 1, top-k 0); settings with equal keys are
            measured once.
        contexts: the contexts (default: :func:`default_contexts` with :data:`DEFAULT_CONTEXTS`, per temperature).
        progress: progress bars (stderr).

    Returns:
        the path written (atomically). About 2-5 s per context and setting under load on the CPU default
        (36 contexts).
    """
    if path is None:
        from .data import DEFAULT_HEAD

        path = Path(DEFAULT_HEAD) / SHIPPED_ACCEPTANCE
    path = Path(path)
    tables, seen = [], set()
    for temperature, verifier in settings:
        key = acceptance_key(model, temperature, 1.0, 0, verifier, contexts)
        text = json.dumps(key, sort_keys=True, default=str)
        if text in seen:
            continue
        seen.add(text)
        t0 = time.perf_counter()
        ctx = contexts if contexts is not None else default_contexts(model, temperature=temperature,
                                                                   **DEFAULT_CONTEXTS)
        raw, weight = measure_acceptance(model, ctx, temperature=temperature, verifier=verifier, progress=progress)
        tables.append({"key": _json_key(key), "acceptance_raw": np.round(raw, 6).tolist(),
                       "acceptance_weight": np.round(weight, 6).tolist(), "contexts": len(ctx),
                       "measure_seconds": round(time.perf_counter() - t0, 1),
                       "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
    doc = {"about": "acceptance tables of this head for tree_choices='auto' (eagle.autotree); regenerate with "
                    "python -m evaluation.fit_tree --write-acceptance", "tables": tables}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def _acceptance(model, temperature, top_p, top_k, verifier, contexts, refresh, shipped, cache_root, verbose):
    """``(raw, weight, note)``: the acceptance table from the shipped file, the cache, or measured (then cached)."""
    key = acceptance_key(model, temperature, top_p, top_k, verifier, contexts)
    if shipped is not False:
        found = shipped_acceptance(key, shipped)
        if found is not None:
            table, p = found
            return (np.asarray(table["acceptance_raw"], float), np.asarray(table["acceptance_weight"], float),
                    f"shipped table ({p.name} in {p.parent.name}, {table.get('contexts', '?')} contexts)")
    rec = None if refresh else load_cached(key, cache_root)
    if rec is not None:
        return (np.asarray(rec["acceptance_raw"], float), np.asarray(rec["acceptance_weight"], float),
                f"cached table (measured {rec.get('measured_at', '?')}, {rec.get('contexts', '?')} contexts)")
    t0 = time.perf_counter()
    if contexts is None:
        contexts = default_contexts(model, temperature=temperature, **DEFAULT_CONTEXTS)
    raw, weight = measure_acceptance(model, contexts, temperature=temperature, top_p=top_p, top_k=top_k,
                                     verifier=verifier, progress=verbose)
    dt = time.perf_counter() - t0
    store_cached(key, {"acceptance_raw": raw.tolist(), "acceptance_weight": weight.tolist(),
                       "contexts": len(contexts), "measure_seconds": dt,
                       "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, cache_root)
    return raw, weight, f"measured on {len(contexts)} contexts in {dt:.0f} s"


def _costs(model, temperature, top_p, top_k, verifier, contexts, refresh, cache_root, verbose, measure_kwargs):
    """``(CycleCost, details, note)``: the machine's cost model from the cache, or measured (then cached)."""
    key = cost_key(model, temperature, top_p, top_k, verifier, measure_kwargs)
    rec = None if refresh else load_cached(key, cache_root)
    if rec is not None:
        c = rec["cost"]
        cost = CycleCost(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})
        return cost, rec["cost_details"], f"cached (measured {rec.get('measured_at', '?')})"
    if contexts:
        context = max(contexts, key=lambda c: torch.as_tensor(c).numel())
    else:  # one real context: the corpus's first held-out answer, else one prompt answered by the target
        context = default_contexts(model, n_prompts=1, per_prompt=1, temperature=temperature)[0]
    cost, details = measure_costs(model, context, temperature=temperature, top_p=top_p, top_k=top_k,
                                  verifier=verifier, **{"progress": verbose, **(measure_kwargs or {})})
    store_cached(key, {"cost": cost.to_dict(), "cost_details": details,
                       "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, cache_root)
    return cost, details, f"measured in {details['seconds']:.0f} s"


def machine_cost(model, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, *, verifier: str = "rrsw",
                 refresh: bool = False, cache_root=None, verbose: bool = True) -> CycleCost:
    """This machine's cycle cost model for ``model`` (the one tree ``auto`` is fitted with): cached on disk
    (:func:`cost_key`), else measured (:func:`measure_costs`, 20-60 s on the embedded default on 2 cores).

    Returns:
        :class:`~eagle.tree.auto.CycleCost` (seconds).
    """
    if cache_root is None:
        from .model.default import cache_dir

        cache_root = cache_dir()
    cost, _, note = _costs(model, temperature, top_p, top_k, verifier, None, refresh, cache_root, verbose, None)
    if verbose:
        print(f"[cycle cost] {note}: decode step {cost.decode_s * 1e3:.1f} ms", file=sys.stderr)
    return cost


def resolve_auto_tree(model, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, *,
                      verifier: str = "rrsw", max_nodes: int = 64, refresh: bool = False, cache_root=None,
                      contexts=None, verbose: bool = True, measure_kwargs: dict | None = None,
                      shipped=None) -> list[list[int]]:
    """The fitted tree for ``model`` at this sampling setting: cached, else fitted from its two inputs.

    Inputs, each cached on its own under ``cache_root/auto_tree/``:

    * the acceptance table (machine-independent, :func:`acceptance_key`): the shipped table when one
      matches (the embedded default head ships its tables for :data:`SHIPPED_SETTINGS`), else cached,
      else measured (:func:`measure_acceptance`, 36 contexts: ~1-2 s each on an idle 2-core CPU);
    * the cost model (this machine, :func:`cost_key`): cached, else measured (:func:`measure_costs`).

    With the shipped table the embedded default is fitted from its costs alone (50-60 s on 2 busy cores,
    an estimated 20-30 s idle); measuring its acceptance too takes 2-3 more minutes under that load.

    Args:
        model: an ``EaModel``.
        temperature, top_p, top_k: sampling setting of the run (acceptance depends on it).
        verifier: the verifier defining acceptance at temperature > 0 (the tree is shared by every
            method of a run, so one is used; default RRSw).
        max_nodes: node budget of the fit (draft nodes, root excluded).
        refresh: measure again even when cached (the fit, the costs, a measured acceptance table); a
            matching shipped table is still used (``shipped=False`` measures it too).
        cache_root: cache folder (default :func:`eagle.model.default.cache_dir`).
        contexts: contexts for the acceptance table and the costs (default: :func:`default_contexts`;
            given contexts key the table by their digest, so a shipped table is not used).
        verbose: print the choice and why, and where its inputs came from (stderr).
        measure_kwargs: passed to :func:`measure_costs` (e.g. ``rounds``, ``new_tokens``, ``trees``).
        shipped: files of shipped tables (:func:`shipped_acceptance`; None: the default head's; False: none).

    Returns:
        choices (list of rank paths).
    """
    if cache_root is None:
        from .model.default import cache_dir

        cache_root = cache_dir()
    key = cache_key(model, temperature, top_p, top_k, verifier, max_nodes)
    rec = None if refresh else load_cached(key, cache_root)
    if rec is not None:
        if verbose:
            print(f"[auto tree] cached fit ({rec.get('measured_at', '?')}):\n{rec['explanation']}", file=sys.stderr)
        return [list(p) for p in rec["choices"]]
    t0 = time.perf_counter()
    if verbose:
        print("[auto tree] fitting the tree to this model, head and machine (once per machine)...", file=sys.stderr)
    raw, weight, acc_note = _acceptance(model, temperature, top_p, top_k, verifier, contexts, refresh, shipped,
                                        cache_root, verbose)
    cost, details, cost_note = _costs(model, temperature, top_p, top_k, verifier, contexts, refresh, cache_root,
                                      verbose, measure_kwargs)
    acceptance = smooth_acceptance(raw, weight)
    fit = fit_tree(acceptance, cost, max_nodes=max_nodes)
    text = f"{fit.explain(cost)}\n  acceptance: {acc_note}; costs: {cost_note}"
    rec = {"choices": fit.choices, "expected_tokens": fit.expected_tokens, "cycle_s": fit.cycle_s,
           "tokens_per_s": fit.tokens_per_s, "predicted_speedup": fit.speedup, "num_nodes": fit.num_nodes,
           "depth": fit.depth, "best_by_size": fit.best_by_size, "acceptance": acceptance.tolist(),
           "acceptance_raw": raw.tolist(), "acceptance_weight": weight.tolist(), "acceptance_source": acc_note,
           "cost": cost.to_dict(), "cost_details": details, "explanation": text,
           "measure_seconds": time.perf_counter() - t0,
           "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    path = store_cached(key, rec, cache_root)
    if verbose:
        print(f"{text}\n  (fitted in {rec['measure_seconds']:.0f} s; cached in {path})", file=sys.stderr)
    return fit.choices
