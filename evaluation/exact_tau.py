"""Exact expected tau of every method on shared contexts, paired across methods.

A sampled tau needs thousands of cycles to separate methods that differ by a few percent. Here
each method is scored by its EXACT expected tokens per cycle on the SAME contexts:

1. **Contexts**: the cycle starts of a reference generation, by default the plain-decoding answers
   of the same run (``new_token_ids`` of the ``naive`` answer file): for every question,
   ``contexts_per_question`` positions spread evenly over its turns; a context is the turn's prompt
   followed by the first j generated tokens (j >= 1; its last token is the tree's root).
2. For each drafting rule used by the methods (``wor`` for RRSw/Traversal, ``topk_residual`` for
   Greedy/UniVer) and each of ``draws`` draft draws, :meth:`EaModel.tree_laws` drafts ONE tree after
   the context and scores it with one target forward. Methods of the same rule share that tree.
3. For every method, its verifier's exact outcome law on that tree gives
   ``E[tokens per cycle | tree] = sum_i P(path ends at node i) * (depth_i + 1)`` (:func:`expected_tokens`).

Per category group: the mean over the group's contexts (and draws); Avg = mean of the groups (as
Table 1).

**Weighting.** This view weights every context (a token position of the reference) equally, while
the sampled tau of a run weights every CYCLE equally, and a cycle that yields k tokens skips the
k - 1 positions inside it: positions in easy stretches count more here than in a run. So the two
need not be equal (here the shared-context values came out higher, more so for methods whose tau
varies more between positions); at a method's OWN cycle starts they agree (tested). Use this view to
compare methods on identical contexts, the Rao-Blackwellised tau of a run to compare with its
sampled tau. Errors: stratified bootstrap over questions (all contexts of a question move together),
the same resample for every method, so the Delta column vs RRSw has paired errors. Nothing here is
truncated at EOS or ``max_new_tokens``: it is the tau of an unlimited cycle.

Command line (the main job runs it after the answers; standalone it needs a naive answer file or
generates the reference itself)::

    python -m evaluation.exact_tau --answers runs/x/answers/naive-temp1-seed0.jsonl --tree 2x5 \\
        --temperature 1.0 --per-category 2 --contexts-per-question 4 --out runs/x
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from evaluation.questions import build_messages, category_group

__all__ = ["expected_tokens", "branch_usage", "verifier_for", "context_positions", "shared_contexts", "score_contexts",
           "tree_laws_shared", "score_contexts_trees",
           "paired_bootstrap", "summarize_exact", "render_exact", "run_exact_tau", "main"]


def expected_tokens(law, depth) -> float:
    """``E[tokens per cycle | tree]`` from an outcome law.

    Args:
        law: float Tensor ``[N, V]``: P(the accepted path ends at node i and the next token is y).
        depth: LongTensor ``[N]``: depth of node i (root 0), i.e. accepted draft tokens when the path ends there.

    Returns:
        ``sum_i (depth_i + 1) * sum_y law[i, y]`` (accepted draft tokens + the bonus/correction token).
    """
    import torch

    return float(((depth.to(law.device, torch.float64) + 1) * law.to(torch.float64).sum(-1)).sum())


def branch_usage(law, parents, depth) -> tuple[list[float], list[float]]:
    """Where a cycle's tokens come from: per child of the root, in tree order.

    Args:
        law: float Tensor ``[N, V]``, a verifier's outcome law (:func:`expected_tokens`).
        parents: LongTensor ``[N]`` (root's entry ignored); depth: LongTensor ``[N]`` (root 0).

    Returns:
        ``(enter, tokens)``, lists over the root's children (depth-1 nodes in index order, i.e. rank order):
        ``enter[r]`` = P(the accepted path passes through child r), ``tokens[r]`` = E[tokens per cycle; the
        path passes through child r]. ``1 - sum(enter)`` is P(no draft token accepted) and
        ``sum(tokens) + 1 - sum(enter)`` equals :func:`expected_tokens`.
    """
    import torch

    depth = depth.to(law.device)
    anc = torch.arange(depth.numel(), device=law.device)
    par = parents.to(law.device).clamp(min=0)
    for _ in range(int(depth.max()) if depth.numel() else 0):   # climb to the depth-1 ancestor
        anc = torch.where(depth[anc] > 1, par[anc], anc)
    mass = law.to(torch.float64).sum(-1)
    below = depth >= 1                                           # every node but the root
    zero = torch.zeros_like(mass)
    enter = zero.index_add(0, anc[below], mass[below])
    tokens = zero.index_add(0, anc[below], mass[below] * (depth[below].to(torch.float64) + 1))
    kids = depth == 1
    return enter[kids].tolist(), tokens[kids].tolist()


def verifier_for(name: str, temperature: float):
    """The registry's verifier used by the engine for ``name`` at ``temperature`` (temperature 0 -> the
    temperature-0 verifier when the registry has ``select_verifier``)."""
    from eagle.verify import registry

    select = getattr(registry, "select_verifier", None)
    if select is not None:
        return select(name, temperature)
    if float(temperature) == 0.0:
        raise ValueError("--temperature: exact tau at temperature 0 needs the registry's temperature-0 verifier")
    return registry.get_verifier(name)


def context_positions(n_tokens_per_turn: Sequence[int], k: int) -> list[tuple[int, int]]:
    """``k`` (turn, j) positions spread evenly over all turns' generated tokens, j in ``[1, n_t - 1]``
    (the root is generated token j - 1 and the reference continued after it). Fewer if there are fewer."""
    slots = [(t, j) for t, n in enumerate(n_tokens_per_turn) for j in range(1, int(n))]
    if k <= 0 or not slots:
        return []
    if len(slots) <= k:
        return slots
    idx = np.linspace(0, len(slots) - 1, k).round().astype(int)
    return [slots[i] for i in sorted(set(idx.tolist()))]


def shared_contexts(reference: Sequence[dict], questions: Sequence[dict], prompt_ids: Callable[[list], list],
                    contexts_per_question: int) -> list[dict]:
    """Contexts from reference answer records (need ``choices[0]["new_token_ids"]``).

    Args:
        reference: answer records (e.g. the naive file of the run).
        questions: the selected questions (their turns); records of other questions are ignored.
        prompt_ids: ``messages -> list[int]`` (the run's prompt format with its tokenizer).
        contexts_per_question: positions per question (:func:`context_positions`).

    Returns:
        ``[{"question_id", "group", "turn", "position", "input_ids": list[int]}]``.

    Raises:
        ValueError: a reference record without ``new_token_ids`` (written by an older harness).
    """
    by_id = {int(q["question_id"]): q for q in questions}
    out = []
    for r in reference:
        q = by_id.get(int(r["question_id"]))
        if q is None:
            continue
        c = r["choices"][0]
        if "new_token_ids" not in c:
            raise ValueError(f"reference answer {r['question_id']} has no new_token_ids (regenerate it)")
        ids_per_turn = c["new_token_ids"]
        for turn, j in context_positions([len(x) for x in ids_per_turn], contexts_per_question):
            msgs = build_messages(q["turns"][: turn + 1], c["turns"][:turn])
            ctx = list(prompt_ids(msgs)) + list(ids_per_turn[turn][:j])
            out.append({"question_id": int(q["question_id"]), "group": category_group(q["category"]),
                        "turn": turn, "position": j, "input_ids": ctx})
    order = {int(q["question_id"]): i for i, q in enumerate(questions)}
    out.sort(key=lambda x: (order[x["question_id"]], x["turn"], x["position"]))
    return out


def tree_laws_shared(model, input_ids, specs: Sequence[tuple], *, temperature: float, top_p: float = 1.0,
                     top_k: int = 0):
    """:meth:`EaModel.tree_laws` for several ``(tree, drafting rule, generator)`` after ONE target prefill.

    The target's cache of the context is computed once and cut back to the context after every tree, so each
    tree sees exactly what a separate ``tree_laws`` call would (same draws from its generator, same laws); on a
    long context the prefill is most of a call's cost. A model without the engine's parts (``target_forward``,
    ``_score_tree``) gets one ``tree_laws`` call per spec.

    Args:
        input_ids: LongTensor ``[1, L]``, ``L >= 2`` (the last token is every tree's root).
        specs: ``[(tree, rule, torch.Generator | None), ...]``.

    Yields:
        One :class:`TreeLaws` per spec, in order (a generator: only one tree's laws need be held at a time).
    """
    import torch

    parts = ("target_forward", "_score_tree", "drafter", "_prepare", "resolve_tree", "base_model")
    try:
        from eagle.model import ea_model as E
        from eagle.model.kv_cache import truncate_cache
        shared = all(hasattr(model, p) for p in parts) and hasattr(E, "_sampling_config")
    except ImportError:
        shared = False
    if shared and not getattr(model.drafter, "uses_tree", True):
        shared = False  # a drafter of its own shapes: tree_laws per spec
    if not shared or len(specs) < 2:
        for tree, rule, g in specs:
            yield model.tree_laws(input_ids, tree_choices=tree, drafting=rule, temperature=temperature, top_p=top_p,
                                  top_k=top_k, generator=g)
        return
    cfg = E._sampling_config(temperature, top_p, top_k)
    drafter = model.drafter
    # every tree (static buffers or an EAGLE-2 dynamic spec, adaptive ones with their costs) checked before any
    # forward, as tree_laws checks it
    built = [model.call_tree(tree, cfg, drafter, rule) for tree, rule, _ in specs]
    ids = model._prepare(input_ids, 1)                                       # [1, L]
    n = ids.shape[1]
    if n < 2:
        raise ValueError("tree_laws needs a context of at least 2 tokens (the last one is the root)")
    cache = E.new_cache(model.base_model.config)
    layers = getattr(E, "_feature_layers", lambda d: None)(drafter)   # EAGLE-3: the fused target layers
    with torch.no_grad():   # never held across a yield (grad mode is per thread)
        feats, _ = model.target_forward(ids[:, :-1], torch.arange(n - 1, device=model.device)[None], cache,
                                        feature_layers=layers)
    for (tree, rule, g), built_tree in zip(specs, built):
        with torch.no_grad():
            drafter.start(ids[:, :-1], feats if drafter.needs_features else None)
            draft, _, _, _, target_probs = model._score_tree(drafter, cache, int(ids[0, -1]), built_tree, rule,
                                                             cfg, g)
            truncate_cache(cache, n - 1)
        yield E.TreeLaws(parents=draft.parents, tokens=draft.tokens, depth=draft.depth, target_probs=target_probs,
                         draft_probs=draft.draft_probs)


def score_contexts_trees(model, contexts: Sequence[dict], methods: Sequence[str], *, trees: Sequence, temperature: float,
                         top_p: float = 1.0, top_k: int = 0, draws: int = 1, seed: int = 0) -> dict:
    """:func:`score_contexts` for several trees at once, one target prefill per context (:func:`tree_laws_shared`).

    Returns ``{tree: records}``, each list equal to ``score_contexts(..., tree=tree)`` (the same generator seeds).
    """
    import torch

    vs = {m: verifier_for(m, temperature) for m in methods}
    rules = list(dict.fromkeys(v.drafting for v in vs.values()))
    out: dict = {t: [] for t in trees}
    for ci, ctx in enumerate(contexts):
        ids = torch.tensor([ctx["input_ids"]], dtype=torch.long, device=model.device)  # [1, L]
        specs = []
        for tree in trees:
            for ri, rule in enumerate(rules):
                for d in range(draws):
                    g = torch.Generator(device=model.device)
                    g.manual_seed(int(seed) * 1_000_003 + ctx["question_id"] * 7919 + ci * 97 + ri * 13 + d)
                    specs.append((tree, rule, g))
        laws = tree_laws_shared(model, ids, specs, temperature=temperature, top_p=top_p, top_k=top_k)
        per_tree = len(rules) * draws
        for k, tree in enumerate(trees):   # score each tree as soon as its laws exist, then drop them
            mine = [(spec[1], next(laws)) for spec in specs[k * per_tree:(k + 1) * per_tree]]
            out[tree].append(_score_one(ctx, mine, vs, methods, draws))
    return out


def _score_one(ctx: dict, laws_by_rule: Sequence[tuple], vs: dict, methods: Sequence[str], draws: int) -> dict:
    """One context's record of :func:`score_contexts` from its ``[(rule, TreeLaws)]`` (every rule x draw)."""
    sums = {m: 0.0 for m in methods}
    branches: dict[str, dict[str, np.ndarray]] = {}
    for rule, laws in laws_by_rule:
        for m, v in vs.items():
            if v.drafting != rule:
                continue
            law = v.outcome_probs(laws.parents, laws.tokens, laws.target_probs, laws.draft_probs)
            sums[m] += expected_tokens(law, laws.depth)
            enter, tokens = branch_usage(law, laws.parents, laws.depth)
            b = branches.setdefault(m, {"enter": np.zeros(len(enter)), "tokens": np.zeros(len(enter))})
            b["enter"] += np.array(enter) / draws
            b["tokens"] += np.array(tokens) / draws
    rec = {k: ctx[k] for k in ("question_id", "group", "turn", "position")}
    rec["context_tokens"] = len(ctx["input_ids"])
    rec["values"] = {m: sums[m] / draws for m in methods}
    rec["branches"] = {m: {k: [round(float(x), 6) for x in v] for k, v in b.items()} for m, b in branches.items()}
    return rec


def score_contexts(model, contexts: Sequence[dict], methods: Sequence[str], *, tree, temperature: float,
                   top_p: float = 1.0, top_k: int = 0, draws: int = 1, seed: int = 0,
                   on_context: Optional[Callable[[int], None]] = None) -> list[dict]:
    """Exact E[tokens per cycle] of every method at every context (mean over ``draws`` trees per rule).

    Returns:
        ``contexts`` entries (without ``input_ids``) with ``"values": {method: float}`` and
        ``"branches": {method: {"enter": [...], "tokens": [...]}}`` (:func:`branch_usage`, mean over draws).
    """
    import torch

    vs = {m: verifier_for(m, temperature) for m in methods}
    rules = list(dict.fromkeys(v.drafting for v in vs.values()))
    out = []
    for ci, ctx in enumerate(contexts):
        ids = torch.tensor([ctx["input_ids"]], dtype=torch.long, device=model.device)  # [1, L]
        laws = []
        for ri, rule in enumerate(rules):
            for d in range(draws):
                g = torch.Generator(device=model.device)
                g.manual_seed(int(seed) * 1_000_003 + ctx["question_id"] * 7919 + ci * 97 + ri * 13 + d)
                laws.append((rule, model.tree_laws(ids, tree_choices=tree, drafting=rule, temperature=temperature,
                                                   top_p=top_p, top_k=top_k, generator=g)))
        out.append(_score_one(ctx, laws, vs, methods, draws))
        if on_context is not None:
            on_context(1)
    return out


def paired_bootstrap(per_question: dict[str, dict[int, tuple[str, float, float]]], n_boot: int = 1000,
                     seed: int = 0, reference: str = "rrsw") -> dict:
    """Stratified paired bootstrap of ratio means (sum / count per question) for several methods.

    Args:
        per_question: ``{method: {question_id: (group, sum, count)}}`` (same questions for every method).
        n_boot, seed: resamples and numpy seed.
        reference: method for the paired ``delta_pct`` (Avg vs reference, percent).

    Returns:
        ``{method: {group|"avg": {"mean", "se", "ci95"}, "delta_pct": {"mean", "se"} | None,
        "delta_abs": {group|"avg": {"mean", "se"}} | None}}``: ``delta_pct`` = Avg's relative difference
        to the reference (percent), ``delta_abs`` = method - reference (tokens per cycle); both None for
        the reference. SE None when a group has fewer than 2 questions (unknown).
    """
    from evaluation.speed import order_groups

    rng = np.random.default_rng(seed)
    first = next(iter(per_question.values()))
    groups = order_groups({v[0] for v in first.values()})
    idx = {g: sorted(q for q, v in first.items() if v[0] == g) for g in groups}
    draws = {g: rng.integers(0, len(idx[g]), size=(n_boot, len(idx[g]))) for g in groups}
    known = all(len(idx[g]) >= 2 for g in groups)
    point, boot = {}, {}
    for m, data in per_question.items():
        point[m], boot[m] = {}, {}
        for g in groups:
            s = np.array([data[q][1] for q in idx[g]])
            n = np.array([data[q][2] for q in idx[g]])
            point[m][g] = float(s.sum() / n.sum())
            boot[m][g] = s[draws[g]].sum(1) / n[draws[g]].sum(1)
        point[m]["avg"] = float(np.mean([point[m][g] for g in groups]))
        boot[m]["avg"] = np.mean([boot[m][g] for g in groups], axis=0)

    def _stats(mean, b, ok):
        return {"mean": mean, "se": float(np.std(b, ddof=1)) if ok and b.size > 1 else None,
                "ci95": [float(np.percentile(b, 2.5)), float(np.percentile(b, 97.5))] if ok else None}

    out = {}
    for m in per_question:
        res = {g: _stats(point[m][g], boot[m][g], len(idx[g]) >= 2) for g in groups}
        res["avg"] = _stats(point[m]["avg"], boot[m]["avg"], known)
        res["delta_pct"] = None
        if reference in per_question and m != reference:
            d = 100 * (point[m]["avg"] / point[reference]["avg"] - 1)
            db = 100 * (boot[m]["avg"] / boot[reference]["avg"] - 1)
            res["delta_pct"] = {"mean": d, "se": float(np.std(db, ddof=1)) if known else None}
        res["delta_abs"] = None
        if reference in per_question and m != reference:
            ok = {**{g: len(idx[g]) >= 2 for g in groups}, "avg": known}
            res["delta_abs"] = {g: {"mean": point[m][g] - point[reference][g],
                                    "se": float(np.std(boot[m][g] - boot[reference][g], ddof=1)) if ok[g] else None}
                                for g in list(groups) + ["avg"]}
        out[m] = res
    return out


def _mean_branches(scored: Sequence[dict], method: str) -> Optional[dict]:
    """Mean of :func:`branch_usage` over the contexts (None when absent or the root's width varies)."""
    bs = [r["branches"][method] for r in scored if method in r.get("branches", {})]
    if not bs or len({len(b["enter"]) for b in bs}) != 1:
        return None
    enter = np.mean([b["enter"] for b in bs], 0)
    return {"enter": enter.tolist(), "tokens": np.mean([b["tokens"] for b in bs], 0).tolist(),
            "no_draft_accepted": float(1 - enter.sum())}


def summarize_exact(scored: Sequence[dict], methods: Sequence[str], *, n_boot: int = 1000, seed: int = 0,
                    reference: str = "rrsw", meta: Optional[dict] = None) -> dict:
    """Table-1-layout JSON of :func:`score_contexts`' output (see the module docstring)."""
    from evaluation.speed import order_groups

    per_q: dict[str, dict[int, list]] = {m: {} for m in methods}
    for rec in scored:
        for m in methods:
            e = per_q[m].setdefault(rec["question_id"], [rec["group"], 0.0, 0])
            e[1] += rec["values"][m]
            e[2] += 1
    boots = paired_bootstrap({m: {q: tuple(v) for q, v in d.items()} for m, d in per_q.items()}, n_boot, seed,
                             reference)
    groups = order_groups({rec["group"] for rec in scored})
    rows = [{"method": m, "tau": {g: boots[m][g] for g in groups}, "avg_tau": boots[m]["avg"],
             "delta_pct": boots[m]["delta_pct"], "delta_abs": boots[m]["delta_abs"],
             "branches": _mean_branches(scored, m)} for m in methods]
    n_q = {g: len({r["question_id"] for r in scored if r["group"] == g}) for g in groups}
    return {**(meta or {}), "groups": groups, "reference": reference, "n_contexts": len(scored),
            "n_questions": n_q, "bootstrap": {"resamples": n_boot, "seed": seed, "unit": "question (stratified)"},
            "rows": rows, "contexts": list(scored)}


def render_exact(ex: dict, note: Optional[str] = None) -> str:
    """Markdown of :func:`summarize_exact` in the Table-1 layout (groups, Avg, Delta vs the reference)."""
    from evaluation.tables import GROUP_LABELS, _cell, method_label

    heads = [GROUP_LABELS.get(g, g) for g in ex["groups"]] + ["Avg τ", f"Δ vs {method_label(ex['reference'])}"]
    lines = ([f"**{note}**", ""] if note else []) + [
        f"Exact expected τ on shared contexts, temperature {ex.get('temperature', 0):g}, tree {ex.get('tree')}: "
        f"E[tokens per cycle | drafted tree] from each verifier's outcome law", "",
        "| Method | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for row in ex["rows"]:
        cells = [_cell(row["tau"].get(g), 3) for g in ex["groups"]] + [_cell(row["avg_tau"], 3)]
        cells.append("-" if row["method"] == ex["reference"] else _cell(row["delta_pct"], 1, "%", sign=True))
        lines.append(f"| {method_label(row['method'])} | " + " | ".join(cells) + " |")
    nq = ", ".join(f"{GROUP_LABELS.get(g, g)} {n}" for g, n in ex["n_questions"].items())
    branch_lines = _render_branches(ex)
    any_se = any(r["avg_tau"].get("se") is not None for r in ex["rows"])
    lines += ["", f"{ex['n_contexts']} contexts ({ex.get('contexts_per_question', '?')} per question; questions per "
                  f"group: {nq}) from {ex.get('context_source', 'a reference generation')}; "
                  f"{ex.get('draws', 1)} tree draw(s) per drafting rule, shared by the methods of that rule; "
              + ("± = bootstrap SE over questions, paired across methods for Δ." if any_se else
                 "no errors shown: a group has fewer than 2 questions.")
              + " Every context (token position) weighs the same, while a run's sampled τ weighs every cycle the "
                "same: compare methods within this table, not its values with Table 1's."
              + (f" Took {ex['seconds']:.0f} s." if ex.get("seconds") else "")]
    return "\n".join(lines + branch_lines) + "\n"


def _render_branches(ex: dict) -> list[str]:
    """Markdown: per method, P(path enters root child r) and E[tokens through it], averaged over contexts."""
    from evaluation.tables import method_label

    rows = [r for r in ex["rows"] if r.get("branches")]
    if not rows:
        return []
    width = max(len(r["branches"]["enter"]) for r in rows)
    lines = ["", "Where the tokens come from, averaged over the contexts: for each child of the root in tree order "
                 "(rank), P(the accepted path enters its subtree) / E[tokens per cycle through it]; the rest of "
                 "τ is the correction token of cycles that accept no draft token.", "",
             "| Method | no draft token accepted | " + " | ".join(f"rank {r}" for r in range(width)) + " |",
             "|---|---:|" + "---:|" * width]
    for r in rows:
        b = r["branches"]
        cells = [f"{e:.3f} / {t:.3f}" for e, t in zip(b["enter"], b["tokens"])] + [""] * (width - len(b["enter"]))
        lines.append(f"| {method_label(r['method'])} | {b['no_draft_accepted']:.3f} | " + " | ".join(cells) + " |")
    return lines


def run_exact_tau(model, reference: Sequence[dict], questions: Sequence[dict], methods: Sequence[str], *,
                  prompt_ids: Callable[[list], list], tree, temperature: float, top_p: float = 1.0, top_k: int = 0,
                  contexts_per_question: int = 4, draws: int = 1, seed: int = 0, n_boot: int = 1000,
                  reference_method: str = "rrsw", context_source: str = "", progress: bool = True,
                  tree_label: Optional[str] = None) -> dict:
    """Contexts -> scores -> summary (JSON-ready, with timing and settings). ``tree_label`` names a tree
    given as a choices list (e.g. ``"auto"`` after :meth:`EaModel.resolve_tree`)."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    ctxs = shared_contexts(reference, questions, prompt_ids, contexts_per_question)
    with tqdm(total=len(ctxs), desc="exact tau", unit="ctx", disable=not progress, dynamic_ncols=True) as bar:
        scored = score_contexts(model, ctxs, methods, tree=tree, temperature=temperature, top_p=top_p, top_k=top_k,
                                draws=draws, seed=seed, on_context=bar.update)
    meta = {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k),
            "tree": tree_label or (tree if isinstance(tree, str) else json.dumps(tree)), "seed": int(seed),
            "tree_choices": None if isinstance(tree, str) else tree,
            "contexts_per_question": int(contexts_per_question), "draws": int(draws),
            "context_source": context_source or "reference answers",
            "drafting": {m: verifier_for(m, temperature).drafting for m in methods}}
    ex = summarize_exact(scored, methods, n_boot=n_boot, seed=seed,
                         reference=reference_method if reference_method in methods else methods[0], meta=meta)
    ex["seconds"] = time.perf_counter() - t0
    return ex


def write_exact(ex: dict, out_dir, note: Optional[str] = None) -> tuple[Path, Path]:
    """``out_dir/exact_tau.json`` and ``out_dir/exact_tau.md``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pj, pm = out / "exact_tau.json", out / "exact_tau.md"
    pj.write_text(json.dumps(ex, indent=1) + "\n", encoding="utf-8")
    pm.write_text(render_exact(ex, note), encoding="utf-8")
    return pj, pm


def _parser() -> argparse.ArgumentParser:
    from evaluation.arguments import OneLineParser, add_common_arguments

    ap = OneLineParser(prog="exact_tau",
                                 description="Exact expected tau of every method on shared contexts (paired).")
    add_common_arguments(ap)
    ap.add_argument("--answers", default=None,
                    help="reference answer file (e.g. ANSWERS/naive-temp1-seed0.jsonl); default: generate the "
                         "plain-decoding reference here (not written)")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> dict:
    from evaluation.arguments import check_arguments, exit_on_usage_error, load_checked_model

    ap = _parser()
    args = ap.parse_args(argv)
    cfg = exit_on_usage_error(check_arguments, args, prog="exact_tau")
    model, fmt = exit_on_usage_error(load_checked_model, cfg, prog="exact_tau")  # fmt: PromptFormat
    tok = model.tokenizer
    prompt_ids = lambda msgs: fmt.ids(tok, msgs)  # noqa: E731
    if args.answers:
        from evaluation.speed import load_answers

        reference = load_answers(args.answers)
        source = f"{args.answers}"
    else:
        from evaluation.gen_answer import generate_turns

        from tqdm import tqdm

        reference = []
        for q in tqdm(cfg.questions, desc="plain-decoding reference", unit="question", disable=cfg.no_progress):
            c = generate_turns(model, tok, q, "naive", temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                               max_new_tokens=cfg.max_new_tokens, tree=None, seed=cfg.seeds[0],
                               prompt_builder=fmt.ids)
            reference.append({"question_id": q["question_id"], "category": q["category"], "choices": [c]})
        source = "plain-decoding answers generated for this run"
    methods = [m for m in cfg.methods if m != "naive"]
    tree = model.resolve_tree(cfg.tree, cfg.temperature, cfg.top_p, cfg.top_k) if cfg.tree == "auto" else cfg.tree
    ex = run_exact_tau(model, reference, cfg.questions, methods, prompt_ids=prompt_ids, tree=tree, tree_label=cfg.tree,
                       temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                       contexts_per_question=cfg.contexts_per_question, draws=cfg.draws, seed=cfg.seeds[0],
                       n_boot=cfg.bootstrap, context_source=source, progress=not cfg.no_progress)
    pj, pm = write_exact(ex, cfg.out, cfg.note)
    print(render_exact(ex, cfg.note))
    print(f"wrote {pj} and {pm}")
    return ex


if __name__ == "__main__":
    main()
