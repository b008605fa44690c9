"""``tree_choices="auto"``: measure the head's acceptance and the machine's costs, fit the tree, cache it.

The fit itself is pure (:func:`eagle.tree.auto.fit_tree`); this module measures its two inputs on a
loaded model and caches the choice per model + head (+ draft vocabulary) + machine + sampling
setting under ``cache_dir()/auto_tree/`` (a JSON with the tables, the cost model, the choice and
the printed explanation), so a run pays the measurement (about two minutes on the CPU default) at
most once per machine.

* Acceptance (:func:`measure_acceptance`): on real contexts (the self-distillation corpus's prompts
  and answers, else Alpaca prompts answered by the target itself), one "probe" tree per context is
  drafted and scored with :meth:`EaModel.tree_laws`; the exact probability that every probe node is
  accepted comes from the verifier's outcome law (temperature > 0) or from the greedy match
  (temperature 0). ``acceptance[d-1, r] = sum P(rank-r node at depth d accepted) / sum P(its parent
  accepted)`` over every such node of every context.
* Costs (:func:`measure_costs`): target forwards over 1..64 tree tokens on a real context, timed
  round-robin (the 1-token forward is one plain decode step); drafting and the per-cycle rest from
  ``stats["timing"]`` of short :meth:`EaModel.eagenerate` runs on a few probe trees (least squares
  ``draft = level_s * depth + node_s * nodes``).

The model is duck-typed (``tree_laws``, ``eagenerate``, ``naivegenerate``, ``target_forward``,
``base_model``, ``ea_layer``, ``tokenizer``); nothing here imports the engine.
"""
from __future__ import annotations

import hashlib
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

from .model.kv_cache import new_cache, truncate_cache
from .sampling import SamplingConfig
from .tree import build_tree
from .tree.auto import CycleCost, fit_tree, load_cached, store_cached

__all__ = ["probe_tree", "acceptance_from_laws", "measure_acceptance", "smooth_acceptance", "default_contexts", "measure_costs",
           "cache_key", "resolve_auto_tree", "isotonic", "TARGET_TOKENS", "COST_TREES"]

#: tree sizes (root included) at which the target forward is timed
TARGET_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: probe trees whose drafting is timed to fit ``draft_level_s`` / ``draft_node_s``
COST_TREES = ("chain1", "chain3", "chain6", "4x1", "2x3", "mc_sim_7b_63")


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


@torch.no_grad()
def time_target_forwards(model, context: torch.Tensor, tokens=TARGET_TOKENS, rounds: int = 3) -> dict:
    """Median seconds of one target forward over n tree tokens (4D mask; n = 1 without a mask, as a
    plain decode step) on top of ``context``'s cache, for every n in ``tokens``, interleaved
    round-robin; made non-decreasing in n (least-squares isotonic fit, :func:`isotonic`). Returns
    ``{n: seconds}``."""
    dev = model.device
    ctx = torch.as_tensor(context, dtype=torch.long).reshape(1, -1).to(dev)
    L = ctx.shape[1]
    cache = new_cache(model.base_model.config)
    model.target_forward(ctx, torch.arange(L, device=dev)[None], cache)
    dtype = model.lm_head.weight.dtype if model.lm_head.weight.dtype.is_floating_point else torch.float32
    masks = {n: _chain_mask(L, n, dtype).to(dev) for n in tokens}
    times = {n: [] for n in tokens}
    g = torch.Generator().manual_seed(0)
    vocab = model.lm_head.weight.shape[0]
    for r in range(rounds + 1):  # round 0 warms up
        for n in tokens:
            ids = torch.randint(0, vocab, (1, n), generator=g).to(dev)
            pos = torch.arange(L, L + n, device=dev)[None]
            _sync(dev)
            t0 = time.perf_counter()
            model.target_forward(ids, pos, cache, attention_mask=masks[n] if n > 1 else None)
            _sync(dev)
            if r:
                times[n].append(time.perf_counter() - t0)
            truncate_cache(cache, L)
    med = [statistics.median(times[n]) for n in tokens]
    # a forward over more tokens never costs less: a dip is timing noise. The isotonic fit averages
    # the violators (a running maximum would carry one slow sample up to every larger size)
    return dict(zip(tokens, isotonic(med).tolist()))


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


@torch.no_grad()
def measure_costs(model, context: torch.Tensor, *, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                  verifier: str = "rrsw", tokens=TARGET_TOKENS, trees=COST_TREES, new_tokens: int = 16,
                  rounds: int = 3, progress: bool = False) -> tuple[CycleCost, dict]:
    """The cycle cost model of ``model`` on this machine (seconds).

    Target forwards are timed directly (:func:`time_target_forwards`); drafting and the rest of a
    cycle come from ``stats["timing"]`` of ``eagenerate`` runs of ``new_tokens`` tokens on each
    tree of ``trees`` (interleaved over ``rounds``), fitted by non-negative least squares
    ``draft = level_s * depth + node_s * nodes``; ``fixed_s`` is the mean per-cycle time of the
    other parts except the target forward. ``progress``: a progress bar over the timed runs (stderr).

    Returns:
        ``(CycleCost, details)``; details holds every measured number.

    Raises:
        RuntimeError: ``eagenerate`` does not report ``stats["timing"]``.
    """
    target = time_target_forwards(model, context, tokens, rounds=rounds + 1)
    ctx = torch.as_tensor(context, dtype=torch.long).reshape(1, -1)
    per_tree = {t: {"draft": [], "rest": [], "cycles": 0} for t in trees}
    bar = tqdm(total=rounds * len(trees), desc="[auto tree] drafting costs", unit="run", disable=not progress,
               dynamic_ncols=True)
    for r in range(rounds):
        for t in trees:
            bar.update(1)
            _, st = model.eagenerate(ctx, temperature=temperature, top_p=top_p, top_k=top_k,
                                     max_new_tokens=new_tokens, tree_choices=t, verifier=verifier, seed=r,
                                     return_stats=True)
            tim = st.get("timing")
            if not tim:
                raise RuntimeError("eagenerate(return_stats=True) reports no stats['timing']: the cost model "
                                   "needs the engine's per-part timing")
            cycles = max(int(st["decoding_steps"]), 1)
            per_tree[t]["draft"].append(tim["draft"] / cycles)
            rest = sum(v for k, v in tim.items() if k in ("target_laws", "verify", "cache_update", "other"))
            per_tree[t]["rest"].append(rest / cycles)
    bar.close()
    rows, y, rest = [], [], []
    for t in trees:
        n, d = len(build_tree(t).choices), build_tree(t).max_depth
        rows.append([d, n])
        y.append(statistics.median(per_tree[t]["draft"]))
        rest.append(statistics.median(per_tree[t]["rest"]))
    level_s, node_s = _nnls2(np.array(rows, float), np.array(y))
    cost = CycleCost(target_tokens=tuple(target), target_s=tuple(target.values()), draft_level_s=level_s,
                     draft_node_s=node_s, fixed_s=float(np.mean(rest)))
    details = {"target_forward_s": {str(k): v for k, v in target.items()},
               "draft_s_per_cycle": {t: float(v) for t, v in zip(trees, y)},
               "rest_s_per_cycle": {t: float(v) for t, v in zip(trees, rest)},
               "draft_fit": {"level_s": level_s, "node_s": node_s,
                             "residual_s": [float(v - (level_s * a + node_s * b)) for v, (a, b) in zip(y, rows)]}}
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
def _digest_tensors(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
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


def cache_key(model, temperature: float, top_p: float, top_k: int, verifier: str, max_nodes: int) -> dict:
    """What the fitted tree depends on: target config, head weights (+ draft vocabulary), machine
    (CPU model, cores, torch threads, torch version, device, dtype, the target-forward switch and attention
    implementation), sampling."""
    head = model.ea_layer
    head_tensors = [p for n, p in sorted(head.named_parameters()) if not n.startswith("embed_tokens")]
    d2t = getattr(head, "d2t", None)
    if d2t is not None:
        head_tensors.append(d2t)
    cfg = model.base_model.config
    dev = model.device
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
        "sampling": {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k)},
        "verifier": verifier, "max_nodes": int(max_nodes), "version": 3,  # 3: robust fit (FIT_TOLERANCE)
    }


def resolve_auto_tree(model, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, *,
                      verifier: str = "rrsw", max_nodes: int = 64, refresh: bool = False, cache_root=None,
                      contexts=None, verbose: bool = True, measure_kwargs: dict | None = None) -> list[list[int]]:
    """The fitted tree for ``model`` at this sampling setting: cached, else measured, fitted and stored.

    Args:
        model: an ``EaModel``.
        temperature, top_p, top_k: sampling setting of the run (acceptance depends on it).
        verifier: the verifier defining acceptance at temperature > 0 (the tree is shared by every
            method of a run, so one is used; default RRSw).
        max_nodes: node budget of the fit (draft nodes, root excluded).
        refresh: measure again even when a cached fit exists.
        cache_root: cache folder (default :func:`eagle.model.default.cache_dir`).
        contexts: contexts for the acceptance table (default :func:`default_contexts`).
        verbose: print the choice and why (stderr).
        measure_kwargs: passed to :func:`measure_costs` (e.g. ``rounds``, ``new_tokens``, ``trees``).

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
        print("[auto tree] measuring acceptance and costs on this machine (once per model + head + machine)...",
              file=sys.stderr)
    if contexts is None:
        contexts = default_contexts(model, temperature=temperature)
    raw, weight = measure_acceptance(model, contexts, temperature=temperature, top_p=top_p, top_k=top_k,
                                     verifier=verifier, progress=verbose)
    acceptance = smooth_acceptance(raw, weight)
    longest = max(contexts, key=lambda c: c.numel())
    cost, details = measure_costs(model, longest, temperature=temperature, top_p=top_p, top_k=top_k,
                                  verifier=verifier, **{"progress": verbose, **(measure_kwargs or {})})
    fit = fit_tree(acceptance, cost, max_nodes=max_nodes)
    text = fit.explain(cost)
    rec = {"choices": fit.choices, "expected_tokens": fit.expected_tokens, "cycle_s": fit.cycle_s,
           "tokens_per_s": fit.tokens_per_s, "predicted_speedup": fit.speedup, "num_nodes": fit.num_nodes,
           "depth": fit.depth, "best_by_size": fit.best_by_size, "acceptance": acceptance.tolist(),
           "acceptance_raw": raw.tolist(), "acceptance_weight": weight.tolist(), "cost": cost.to_dict(), "cost_details": details,
           "contexts": len(contexts), "explanation": text, "measure_seconds": time.perf_counter() - t0,
           "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    path = store_cached(key, rec, cache_root)
    if verbose:
        print(f"{text}\n  (measured in {rec['measure_seconds']:.0f} s; cached in {path})", file=sys.stderr)
    return fit.choices

