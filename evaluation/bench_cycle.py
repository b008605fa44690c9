"""Where the time of a speculative cycle goes, against one plain decode step of the same model.

    python -m evaluation.bench_cycle [--trees chain4,mc_sim_7b_63,2x5] [--methods rrsw]
                                     [--temperatures 0] [--draft-vocab off|on|both] [--rounds 3]
                                     [--drafters eagle,prompt_lookup]

``--drafters``: every drafter runs every method; a drafter that picks its own tree shape
(``prompt_lookup``) runs once per method and temperature (tree ``-``, no draft vocabulary). A drafter is named
``DRAFTER[@KEY=VALUE[,KEY=VALUE...]]`` (options as ``--drafter-option`` reads them, checked before any work, the
drafter built once), e.g. ``--drafters eagle,hybrid,draft_lm@model_path_or_module=JackFram/llama-68m,
eagle3@path=/heads/eagle3``; the draft-vocabulary variants apply to the drafters of the model's EAGLE head only.
``--trees`` takes EAGLE-2 dynamic trees too (``eagle2``, ``eagle2:nodes=24,depth=5,topk=8``: a comma followed by
``KEY=`` stays in its tree); they run with the drafters that draft them (``eagle``) under the methods whose drafting
rule keeps them lossless (temperature 0, greedy, univer); the other combinations are listed as skipped.

Every configuration (tree x method x temperature x draft vocabulary x fast CPU linears) and plain
decoding (same fast-CPU setting) run ``--new-tokens`` tokens on each of ``--contexts`` fixed contexts
(``--context-tokens`` tokens each: a prompt and the target's own answer from the self-distillation
corpus, else an Alpaca prompt and its reference answer), interleaved round-robin (``--rounds``
rounds, the order rotated every round). Per cycle, from ``stats["timing"]`` of
:meth:`EaModel.eagenerate`: drafting, target forward, target-law processing, verification, cache
update and the rest; each call's prefill (``stats["prefill_s"]``: prompt forward + first token;
else a one-token plain run of the same round) is subtracted from its target forward. Numbers are
medians over rounds, in decode steps (one decode step = the median per-token time of plain
decoding in the same run) and in ms; ``tau`` = tokens per cycle; ``speedup`` = tokens/s over plain
decoding's in the same round (prefill excluded from both), median over rounds. ``--trees auto``
adds the fitted tree (its measurement is not timed) with its predicted tau.

Table (markdown) on stdout and in ``<out>.md``; every number in ``<out>.json`` (default
``runs/bench_cycle/<UTC time>.json``). A speed goal belongs here, never in a timed unit test; the
machine's load is recorded (``os.getloadavg`` before and after) because ratios move with it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

PARTS = ("draft", "target_forward", "target_laws", "verify", "cache_update", "other")
SHORT = {"draft": "draft", "target_forward": "target fwd", "target_laws": "target laws", "verify": "verify",
         "cache_update": "cache upd", "other": "other"}


def load_model(name: str, head: str | None, threads: int):
    """``"tiny"`` (a random tiny model, for smoke tests) or a base accepted by ``EaModel.from_pretrained``."""
    import univer_patch  # noqa: F401  (registers traversal / greedy / univer)

    if name == "tiny":
        from eagle.testing import tiny_ea_model

        return tiny_ea_model(vocab_size=64, hidden_size=32, seed=0, aligned=True)
    from eagle.model.ea_model import EaModel

    return EaModel.from_pretrained(name, head)


def fixed_contexts(model, tokens: int, n: int = 1, seed: int = 0) -> list[torch.Tensor]:
    """``n`` contexts of ``tokens`` tokens (LongTensors ``[1, L]``): corpus prompt + answer (held-out
    split first, one per record), else Alpaca prompts with their reference answers in the chat
    template, else seeded random ids."""
    vocab = model.lm_head.weight.shape[0]
    out: list[torch.Tensor] = []
    try:
        from eagle.data.corpus import DEFAULT_ROOT, iter_records

        if os.path.isdir(DEFAULT_ROOT):
            for split in ("heldout", "train"):
                for rec in iter_records(DEFAULT_ROOT, split=split):
                    for t in (rec.get("turns") or [rec])[:1]:
                        ids = list(t.get("prompt_ids", [])) + list(t.get("answer_ids", []))
                        if len(ids) >= tokens and max(ids) < vocab and len(out) < n:
                            out.append(torch.tensor([ids[:tokens]]))
    except ImportError:
        pass
    tok = getattr(model, "tokenizer", None)
    if len(out) < n and tok is not None:
        from eagle.data.corpus import DEFAULT_PROMPTS, load_alpaca

        if os.path.exists(DEFAULT_PROMPTS):
            for r in sorted(load_alpaca(DEFAULT_PROMPTS), key=lambda r: -len(r["output"])):
                msgs = [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["output"]}]
                ids = tok.apply_chat_template(msgs, return_tensors="pt")
                ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
                if ids.shape[1] >= tokens and len(out) < n:
                    out.append(ids[:, :tokens])
    g = torch.Generator().manual_seed(seed)
    while len(out) < n:
        out.append(torch.randint(0, vocab, (1, tokens), generator=g))
    return out


def _prefill(stats: dict, fallback: float) -> float:
    """The call's own prefill seconds (``stats["prefill_s"]``: prompt forward + first token) when the
    engine reports it, else ``fallback`` (a one-token plain run of the same round)."""
    p = stats.get("prefill_s")
    return float(p) if p is not None else fallback


def _per_cycle(stats_list: list, prefill: float) -> dict:
    """Per-cycle part seconds, tau and tokens/s of one configuration over every context of a round
    (times, cycles and tokens summed over the contexts, each call's prefill removed)."""
    parts = dict.fromkeys(PARTS, 0.0)
    cycles = tokens = wall = 0.0
    for stats in stats_list:
        own = _prefill(stats, prefill)
        for p in PARTS:
            parts[p] += stats["timing"].get(p, 0.0)
        parts["target_forward"] -= own
        cycles += max(int(stats["decoding_steps"]), 1)
        tokens += stats["new_tokens"]
        wall += max(stats["wall_time"] - own, 1e-9)
    parts["target_forward"] = max(parts["target_forward"], 0.0)
    out = {p: parts[p] / cycles for p in PARTS}
    out["cycle"] = sum(out[p] for p in PARTS)
    out["tau"] = tokens / cycles
    out["tokens_per_s"] = tokens / wall
    return out


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    model = load_model(args.model, args.head, args.threads)
    d2t_file = getattr(model.ea_layer, "d2t", None)
    if args.draft_vocab_file:
        from eagle.train.draft_vocab import load_draft_vocab

        d2t_file = load_draft_vocab(Path(args.draft_vocab_file).parent) if Path(args.draft_vocab_file).is_file() \
            else load_draft_vocab(args.draft_vocab_file)
        if d2t_file is None:
            raise SystemExit(f"--draft-vocab-file {args.draft_vocab_file}: no draft_vocab.safetensors there")
    if args.draft_vocab != "off" and d2t_file is None and args.draft_vocab_k:
        from eagle.train.draft_vocab import count_tokens, top_k_vocab

        # no map beside the head: a K-token stand-in (the context's tokens first, then by id), timing only
        ctx_ids = fixed_contexts(model, args.context_tokens)[0][0].tolist()
        counts = count_tokens([ctx_ids], model.lm_head.weight.shape[0]) + 1
        d2t_file = top_k_vocab(counts, args.draft_vocab_k)
    if args.draft_vocab != "off" and d2t_file is None:
        raise SystemExit(f"--draft-vocab {args.draft_vocab}: the head has no draft_vocab.safetensors and "
                         "--draft-vocab-k is 0")
    contexts = fixed_contexts(model, args.context_tokens, args.contexts)
    dv_variants = {"off": [False], "on": [True], "both": [False, True]}[args.draft_vocab]
    fast_variants = {"off": [False], "on": [True], "both": [False, True]}[args.fast_cpu]

    def setup(fast: bool, dv: bool):
        model.set_fast_cpu(fast)
        model.ea_layer.set_draft_vocab(d2t_file if dv else None)
        for d in instances.values():  # drafters built here are not in the model's own list
            d.refresh(model)

    from eagle.drafters import get_drafter, make_drafter

    # drafters with options: built once (a draft LM loaded once); the others by name (the engine's cache)
    instances = {}
    for d in args.drafters:
        if d["options"]:
            try:
                instances[d["label"]] = make_drafter(d["name"], model, **d["options"])
            except (ValueError, OSError) as e:  # e.g. a draft LM of another vocabulary: one line, no traceback
                msg = " ".join(str(e).split()) or type(e).__name__
                raise SystemExit(f"bench_cycle: error: --drafters: {d['label']!r}: {msg}") from None
    tree_drafters = [d for d in args.drafters if get_drafter(d["name"]).uses_tree]
    own_shape_drafters = [d for d in args.drafters if not get_drafter(d["name"]).uses_tree]
    configs, auto_info, predicted, autotree_contexts, skipped = [], {}, {}, [], []
    for fast in fast_variants:
        for temp in args.temperatures:
            for tree in args.trees:
                for dv in dv_variants:
                    if tree == "auto" and not fast and len(fast_variants) > 1:
                        continue  # the fitted tree is for the optimised model (the eager one keeps named trees)
                    if tree == "auto" and (fast, temp, dv) not in auto_info:
                        from eagle import autotree

                        setup(fast, dv)  # the fitted tree depends on the costs (fast_cpu, draft vocabulary)
                        if not autotree_contexts:  # generated once (greedy), shared by every fit of this run
                            autotree_contexts.extend(autotree.default_contexts(model))
                        auto_info[(fast, temp, dv)] = autotree.resolve_auto_tree(model, temp,
                                                                                 contexts=autotree_contexts)
                        predicted[(fast, temp, dv)] = _predicted(model, temp)
                    for method in args.methods:
                        for d in tree_drafters:
                            if dv and not get_drafter(d["name"]).needs_head:
                                continue  # its own head / draft model: the EAGLE head's draft vocabulary is not used
                            why = dynamic_refusal(tree, d["name"], method, temp)
                            if why:
                                if fast == fast_variants[0] and not dv:
                                    skipped.append(f"{d['label']} on {tree}, {method} at T={temp:g}: {why}")
                                continue
                            configs.append({"tree": tree, "method": method, "temperature": temp, "draft_vocab": dv,
                                            "fast_cpu": fast, "drafter": d["label"], "drafter_name": d["name"]})
            for method in args.methods:
                for d in own_shape_drafters:
                    configs.append({"tree": "-", "method": method, "temperature": temp, "draft_vocab": False,
                                    "fast_cpu": fast, "drafter": d["label"], "drafter_name": d["name"]})
    results = {i: [] for i in range(len(configs))}
    naive = {(f, t): [] for f in fast_variants for t in args.temperatures}
    prefills = {f: [] for f in fast_variants}
    for r in range(args.rounds + (1 if args.warmup else 0)):
        warm = args.warmup and r == 0
        for fast in (fast_variants if r % 2 == 0 else fast_variants[::-1]):
            setup(fast, False)
            _, st = model.naivegenerate(contexts[0], temperature=0.0, max_new_tokens=1, return_stats=True)
            prefill = st["timing"]["target_forward"]
            if not warm:
                prefills[fast].append(prefill)
            order = [i for i, c in enumerate(configs) if c["fast_cpu"] == fast]
            rot = r % max(len(order), 1)
            for i in order[rot:] + order[:rot]:
                c = configs[i]
                setup(fast, c["draft_vocab"])
                key = (fast, c["temperature"], c["draft_vocab"])
                tree = auto_info[key] if c["tree"] == "auto" else None if c["tree"] == "-" else c["tree"]
                runs = [model.eagenerate(ctx, temperature=c["temperature"], max_new_tokens=args.new_tokens,
                                         tree_choices=tree, verifier=c["method"], seed=r, return_stats=True,
                                         drafter=instances.get(c["drafter"], c["drafter_name"]))[1]
                        for ctx in contexts]
                if not warm:
                    results[i].append(_per_cycle(runs, prefill))
            setup(fast, False)
            for temp in args.temperatures:
                runs = [model.naivegenerate(ctx, temperature=temp, max_new_tokens=args.new_tokens, seed=r,
                                            return_stats=True)[1] for ctx in contexts]
                if not warm:
                    steps = sum(max(st["new_tokens"] - 1, 1) for st in runs)
                    fwd = sum(st["timing"]["target_forward"] - _prefill(st, prefill) for st in runs)
                    wall = sum(max(st["wall_time"] - _prefill(st, prefill), 1e-9) for st in runs)
                    naive[(fast, temp)].append({"decode_step": fwd / steps,
                                                "tokens_per_s": sum(st["new_tokens"] for st in runs) / wall})
    load1 = os.getloadavg()
    from eagle.tree import build_tree
    from eagle.tree.dynamic import parse_dynamic_tree

    rows = []
    for i, c in enumerate(configs):
        res = results[i]
        base = naive[(c["fast_cpu"], c["temperature"])]
        step = statistics.median(b["decode_step"] for b in base)
        med = {k: statistics.median(x[k] for x in res) for k in res[0]}
        key = (c["fast_cpu"], c["temperature"], c["draft_vocab"])
        choices = auto_info[key] if c["tree"] == "auto" else c["tree"]
        dyn = parse_dynamic_tree(choices) if isinstance(choices, str) else None
        nodes = None if c["tree"] == "-" else dyn.nodes if dyn is not None else build_tree(choices).num_nodes - 1
        row = {**c, "nodes": nodes, "decode_step_s": step,
               "parts_s": {p: med[p] for p in PARTS}, "cycle_s": med["cycle"],
               "parts_steps": {p: med[p] / step for p in PARTS}, "cycle_steps": med["cycle"] / step,
               "tau": med["tau"], "tokens_per_s": med["tokens_per_s"],
               "speedup": statistics.median(x["tokens_per_s"] / b["tokens_per_s"] for x, b in zip(res, base)),
               "rounds": [dict(x) for x in res]}
        if c["tree"] == "auto":
            row["choices"] = choices
            row["predicted"] = predicted.get(key)
        rows.append(row)
    naive_rows = {f"fast_cpu={f} T={t:g}": {"fast_cpu": f, "temperature": t,
                                            "decode_step_s": statistics.median(b["decode_step"] for b in v),
                                            "tokens_per_s": statistics.median(b["tokens_per_s"] for b in v),
                                            "rounds": v} for (f, t), v in naive.items()}
    if len(fast_variants) == 2:  # the optimised baseline against the eager one, per round
        for t in args.temperatures:
            ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(naive[(True, t)], naive[(False, t)])]
            naive_rows[f"fast_cpu={True} T={t:g}"]["speedup_over_eager"] = statistics.median(ratios)
    return {"rows": rows, "naive": naive_rows, "skipped": skipped,
            "prefill_s": {str(f): statistics.median(v) for f, v in prefills.items() if v},
            "context_tokens": int(contexts[0].shape[1]), "contexts": len(contexts), "new_tokens": args.new_tokens,
            "rounds": args.rounds,
            "threads": args.threads, "model": args.model, "head": args.head,
            "draft_vocab_k": None if d2t_file is None else int(d2t_file.numel()),
            "loadavg_before": load0, "loadavg_after": load1, "machine": platform.platform(),
            "cpu": _cpu(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "argv": sys.argv[1:]}


def dynamic_refusal(tree, drafter: str, method: str, temperature: float) -> str | None:
    """Why ``drafter`` cannot run the EAGLE-2 dynamic ``tree`` under ``method`` at ``temperature`` (one line), or
    None (a static tree, or an allowed combination: :func:`eagle.tree.dynamic.check_dynamic_tree`)."""
    from eagle.drafters import get_drafter
    from eagle.tree.dynamic import check_dynamic_tree, parse_dynamic_tree
    from eagle.verify.registry import select_verifier

    dyn = parse_dynamic_tree(tree) if isinstance(tree, str) else None
    if dyn is None:
        return None
    v = select_verifier(method, temperature)
    try:
        check_dynamic_tree(dyn, get_drafter(drafter), v.drafting, v.name)
    except ValueError as e:
        return " ".join(str(e).split())
    return None


def _cpu() -> str:
    try:
        from eagle.autotree import _cpu_name

        return _cpu_name()
    except ImportError:  # pragma: no cover
        return platform.processor()


def _predicted(model, t: float) -> dict | None:
    """Predicted tau / cycle of the auto tree from its cached fit (None if not found)."""
    try:
        from eagle.autotree import cache_key
        from eagle.model.default import cache_dir
        from eagle.tree.auto import load_cached

        key = (0.0, 1.0, 0) if t == 0 else (float(t), 1.0, 0)
        rec = load_cached(cache_key(model, *key, "rrsw", 64), cache_dir())
    except Exception:  # pragma: no cover - informational only
        return None
    if rec is None:
        return None
    return {"tau": rec["expected_tokens"], "cycle_s": rec["cycle_s"], "speedup": rec["predicted_speedup"]}


def table(res: dict) -> str:
    head = ["drafter", "tree", "method", "T", "fast", "dv", "nodes", "tau"] + [SHORT[p] for p in PARTS] + \
        ["cycle", "cycle ms", "tok/s", "speedup"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res["rows"]:
        tau = f"{r['tau']:.2f}"
        if r.get("predicted"):
            tau += f" (pred {r['predicted']['tau']:.2f})"
        cells = [r.get("drafter", "eagle"), str(r["tree"]), r["method"], f"{r['temperature']:g}", "on" if r["fast_cpu"] else "-",
                 "K" if r["draft_vocab"] else "-",
                 "-" if r["nodes"] is None else str(r["nodes"]), tau] + [f"{r['parts_steps'][p]:.2f}" for p in PARTS] + \
            [f"{r['cycle_steps']:.2f}", f"{1e3 * r['cycle_s']:.1f}", f"{r['tokens_per_s']:.2f}", f"{r['speedup']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"plain decoding {k}: decode step {1e3 * v['decode_step_s']:.1f} ms, {v['tokens_per_s']:.2f} tok/s"
             + (f" ({v['speedup_over_eager']:.2f}x eager)" if "speedup_over_eager" in v else "")
             for k, v in res["naive"].items()]
    lines.append("")
    lines.append("Parts and cycle in decode steps (medians over rounds). " + "; ".join(notes) +
                 f". {res['contexts']} context(s) of {res['context_tokens']} tokens (prefill excluded: "
                 + ", ".join(f"{1e3 * v:.0f} ms" for v in res["prefill_s"].values()) + "), "
                 f"{res['new_tokens']} new tokens, {res['rounds']} rounds, {res['threads']} thread(s), "
                 f"load average {res['loadavg_before'][0]:.2f} -> {res['loadavg_after'][0]:.2f}, {res['utc']} UTC"
                 + (f", draft vocabulary K={res['draft_vocab_k']}" if res["draft_vocab_k"] else "") + ".")
    if res.get("skipped"):
        lines.append("")
        lines.append("Not run (dynamic trees): " + "; ".join(res["skipped"]) + ".")
    return "\n".join(lines)


def parse_args(argv=None):
    from evaluation.arguments import OneLineParser

    ap = OneLineParser(prog="bench_cycle", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'default', 'tiny' (smoke test), a folder or hub id")
    ap.add_argument("--head", default=None, help="head folder / hub id (default: the model's default head)")
    ap.add_argument("--trees", default="chain4,mc_sim_7b_63,2x5",
                    help="comma list; 'auto' = the fitted tree; eagle2 or eagle2:nodes=N,depth=D,topk=K = an EAGLE-2 "
                         "dynamic tree (drafter eagle; greedy / univer or temperature 0)")
    ap.add_argument("--methods", default="rrsw", help="comma list of verifiers")
    ap.add_argument("--drafters", "--drafter", default="eagle",
                    help="comma list of drafters, each DRAFTER[@KEY=VALUE[,KEY=VALUE...]] (values as JSON when they "
                         "parse, no ':'): eagle, hybrid, hybrid@lookup_weight=0.7, prompt_lookup, "
                         "draft_lm@model_path_or_module=JackFram/llama-68m, eagle3@path=HEAD_FOLDER, plug-ins'; "
                         "default eagle")
    ap.add_argument("--temperatures", default="0", help="comma list, e.g. 0,1")
    ap.add_argument("--draft-vocab", default="off", choices=("off", "on", "both"),
                    help="run without / with the head's draft vocabulary (both: paired)")
    ap.add_argument("--draft-vocab-file", default=None,
                    help="a draft_vocab.safetensors (or its folder) to use instead of the head's own")
    ap.add_argument("--draft-vocab-k", type=int, default=0,
                    help="when the head has no draft_vocab.safetensors: build a K-token stand-in (timing only)")
    ap.add_argument("--fast-cpu", default="on", choices=("off", "on", "both"),
                    help="oneDNN packed linears (EaModel.set_fast_cpu); speedups are against plain decoding with the "
                         "same setting; both: paired, plus the optimised baseline over the eager one")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the untimed first round")
    ap.add_argument("--context-tokens", type=int, default=300)
    ap.add_argument("--contexts", type=int, default=1,
                    help="distinct contexts per configuration and round (times and tokens summed over them)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="output path without extension (default runs/bench_cycle/<UTC>)")
    args = ap.parse_args(argv)
    from evaluation.arguments import (UsageError, check_option_dict, check_tree, load_plugins, option_text,
                                      parse_drafter_spec, split_specs)

    args.trees = split_specs([args.trees])
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    from eagle.drafters import available_drafters

    drafters = []
    for spec in split_specs([args.drafters]):
        try:
            name, options, tree = parse_drafter_spec(spec)
        except ValueError as e:
            ap.error(f"--drafters: {e}")
        if tree is not None:
            ap.error(f"--drafters: {spec!r}: give the trees with --trees, not after the drafter")
        if name not in available_drafters():
            ap.error(f"--drafters: unknown {name!r}; use some of {available_drafters()}")
        try:
            options = check_option_dict(name, options)
        except ValueError as e:
            ap.error(f"--drafters: {spec!r}: {' '.join(str(e).split())}")
        label = name + (f"@{option_text(options)}" if options else "")
        if label not in [d["label"] for d in drafters]:
            drafters.append({"label": label, "name": name, "options": options})
    if not drafters:
        ap.error(f"--drafters: empty; use some of {available_drafters()}")
    args.drafters = drafters
    for t in args.trees:
        try:
            check_tree(t, "--trees")
        except UsageError as e:
            ap.error(str(e))
    try:
        args.temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--temperatures must be a comma list of numbers, got {args.temperatures!r}")
    for name in ("new_tokens", "rounds", "context_tokens", "contexts", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not args.trees or not args.methods or not args.temperatures:
        ap.error("--trees, --methods and --temperatures must not be empty")
    load_plugins([])
    from eagle.verify.registry import select_verifier

    for m in args.methods:
        for t in args.temperatures:
            try:
                select_verifier(m, t)
            except ValueError as e:
                ap.error(f"--methods: {' '.join(str(e).split())}")
    for t in args.trees:  # a dynamic tree must run somewhere (the other combinations are skipped, and listed)
        if all(dynamic_refusal(t, d["name"], m, temp) for d in args.drafters for m in args.methods
               for temp in args.temperatures):
            why = dynamic_refusal(t, args.drafters[0]["name"], args.methods[0], args.temperatures[0])
            ap.error(f"--trees: {t!r} runs with none of the drafters / methods / temperatures given ({why})")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    res = run(args)
    text = table(res)
    print(text)
    out = Path(args.out) if args.out else Path("runs") / "bench_cycle" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    out.with_suffix(".md").write_text(text + "\n")
    print(f"-> {out.with_suffix('.json')}", file=sys.stderr)
    return res


if __name__ == "__main__":  # pragma: no cover
    main()
