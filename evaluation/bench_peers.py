"""Peer table: our speculative decoding against plain decoding and Hugging Face's own decoders, on one model.

    python -m evaluation.bench_peers [--ours default prompt_lookup eagle:2x5] [--temperature 0]
                                     [--question-set report] [--per-category 5] [--max-new-tokens 128]
    python -m evaluation.bench_peers --model meta-llama/Llama-2-7b-chat-hf \
        --ours draft_lm@model_path_or_module=JackFram/llama-68m:2x5     # a draft model, no head needed

Contenders, all on the same model object and the same prompts:

- ``plain``: plain decoding, :meth:`EaModel.naivegenerate` (the reference: ratios are to it);
- ``hf``: Hugging Face ``generate`` on ``model.base_model``, greedy (``do_sample=False``);
- ``hf_pld``: Hugging Face prompt-lookup decoding (``generate(..., prompt_lookup_num_tokens=10)``);
- ours, one per ``--ours`` spec ``DRAFTER[@KEY=VALUE[,KEY=VALUE...]][:TREE]``
  (:func:`evaluation.arguments.parse_drafter_spec`): ``default`` = the API defaults
  (``EaModel.eagenerate(ids, temperature=T)``, no tree, drafter or verifier argument at temperature 0), ``eagle``
  = the EAGLE head on the model's default tree, ``eagle:2x5`` / ``eagle:auto`` on that tree, ``eagle:eagle2`` /
  ``eagle:eagle2:nodes=24,depth=5,topk=8`` on an EAGLE-2 dynamic tree (greedy / univer, or temperature 0),
  ``hybrid:2x2`` (head tree + prompt-lookup chain; options ``@lookup_weight=0.7,depth=8``), ``prompt_lookup``
  (n-gram lookup, it picks its own shape), ``draft_lm@model_path_or_module=JackFram/llama-68m:2x5`` (a separate
  draft LM), ``eagle3@path=/heads/eagle3:2x5`` (an EAGLE-3 head). Option values are read as JSON when they parse
  and may not contain ``:``; a comma followed by ``KEY=`` continues the spec, any other comma starts the next one.
  Options are checked before anything is loaded; each such drafter is built once. Default: ``default prompt_lookup``.

At ``--temperature`` > 0 only plain decoding and ours run (Hugging Face's samplers draw differently), each call
seeded per question (:func:`evaluation.gen_answer.call_seed`), ours verified by ``--verifier`` (default univer).

Protocol: the first turn of each question (prompt from the model's prompt format, as
:mod:`evaluation.gen_answer` builds it); one untimed warm-up call per contender; then question by question every
contender once, the order rotated each question, so a load change moves all contenders alike. Each call is timed
with ``time.perf_counter`` around it (CUDA synchronised; prefill included, as Spec-Bench does).

Table: tokens/s = mean over questions of new tokens / seconds; ratio = that mean over plain decoding's, with a
paired bootstrap SE over questions (the same questions resampled for both); at temperature 0 also the ratio to
Hugging Face prompt lookup; tau = tokens per target forward of ours (``stats["accept_lengths"]``); equal = outputs
equal to plain greedy decoding token for token (count / questions, temperature 0 only). Markdown on stdout and in
``<out>.md``, every number in ``<out>.json`` (default ``runs/bench_peers/<UTC time>.json``). The machine's load
(``os.getloadavg`` before and after) is recorded, because ratios move with it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

from evaluation.arguments import (BASELINE, DRAFTER_SPEC_FORM, OneLineParser, UsageError, check_drafter,
                                  check_dynamic_trees, check_fits_context, check_model, check_option_dict,
                                  check_out_dir, check_positive_int,
                                  check_question_file, check_sampling, check_tree, exit_on_usage_error, load_plugins,
                                  method_names, option_text, parse_drafter_spec, split_specs)

__all__ = ["PLAIN", "HF", "HF_PLD", "HF_PLD_TOKENS", "DEFAULT_OURS", "Contender", "parse_ours", "contenders_for",
           "build_drafters", "paired_ratio", "run", "summarise", "table", "parse_args", "main"]

PLAIN, HF, HF_PLD = "plain", "hf", "hf_pld"
#: Hugging Face's prompt-lookup setting compared against (its documented example value)
HF_PLD_TOKENS = 10
DEFAULT_OURS = ("default", "prompt_lookup")
DEFAULT_QUESTION_FILE = Path(__file__).resolve().parents[2] / "shared" / "specbench" / "question.jsonl"
_LABELS = {PLAIN: "plain decoding (naivegenerate)", HF: "HF generate (greedy)",
           HF_PLD: f"HF prompt lookup (prompt_lookup_num_tokens={HF_PLD_TOKENS})"}


@dataclass(frozen=True)
class Contender:
    """One decoder of the table.

    Attributes:
        key: ``plain``, ``hf``, ``hf_pld`` or ``ours:<spec>``.
        kind: ``plain``, ``hf``, ``hf_pld`` or ``ours``.
        spec: the ``--ours`` spec as given (ours only).
        drafter: drafter name, None = the model's default (ours only).
        tree: tree spec (static or EAGLE-2 dynamic), None = the model's default or the drafter's own shape (ours only).
        options: the drafter's ``for_model`` options, None = none (ours only; such a drafter is built once,
            :func:`build_drafters`).
    """

    key: str
    kind: str
    spec: Optional[str] = None
    drafter: Optional[str] = None
    tree: Optional[str] = None
    options: Optional[dict] = None

    @property
    def label(self) -> str:
        if self.kind != "ours":
            return _LABELS[self.kind]
        if self.spec == "default":
            return "ours: API defaults"
        return (f"ours: {self.drafter}" + (f" ({option_text(self.options)})" if self.options else "")
                + (f" tree {self.tree}" if self.tree else ""))


def parse_ours(specs: Sequence[str], temperature: float, verifier: str) -> list[Contender]:
    """``--ours`` specs ``DRAFTER[@KEY=VALUE[,KEY=VALUE...]][:TREE]`` (or ``default``) checked against the drafter
    and tree registries, without loading anything (:func:`evaluation.arguments.parse_drafter_spec`).

    A drafter that picks its own shape (``prompt_lookup``) takes no tree (``:auto`` is accepted and means the
    same). An EAGLE-2 dynamic tree (``eagle2[:nodes=N,depth=D,topk=K]``) needs a drafter that drafts one and a
    verifier whose rule keeps it lossless. Options go through the drafter's own check. Duplicates are dropped.

    Returns:
        The contenders, in the order given; key ``ours:<drafter>[@<options>][:<tree>]``.

    Raises:
        UsageError: ``--ours``: empty, a malformed spec, an unknown drafter or tree, options the drafter refuses, a
            tree for an own-shape drafter, a dynamic tree the drafter or verifier cannot run, or a drafter that
            cannot draft under the verifier's rule (spec and reason named).
    """
    from eagle.drafters import get_drafter

    flat = split_specs(specs)
    if not flat:
        raise UsageError("--ours", "empty list")
    out: list[Contender] = []
    for spec in flat:
        if spec == "default":
            c = Contender(key="ours:default", kind="ours", spec=spec)
        else:
            try:
                name, options, tree = parse_drafter_spec(spec)
            except ValueError as e:
                raise UsageError("--ours", str(e)) from None
            try:
                name = check_drafter(name, [verifier], temperature)
            except UsageError as e:
                raise UsageError("--ours", f"{spec!r}: {str(e).split(': ', 1)[1]}") from None
            try:
                options = check_option_dict(name, options)
            except ValueError as e:
                raise UsageError("--ours", f"{spec!r}: {' '.join(str(e).split())}") from None
            if not get_drafter(name).uses_tree:
                if tree not in (None, "auto", "-"):
                    raise UsageError("--ours", f"{spec!r}: drafter {name!r} picks its own shape; give {name!r} "
                                               f"without a tree")
                tree = None
            elif tree is not None:
                try:
                    tree = check_tree(tree, "--ours")
                    check_dynamic_trees([("--ours", tree, [verifier])], name, temperature)
                except UsageError as e:
                    raise UsageError("--ours", f"{spec!r}: {str(e).split(': ', 1)[1]}") from None
            c = Contender(key=f"ours:{name}" + (f"@{option_text(options)}" if options else "")
                          + (f":{tree}" if tree else ""), kind="ours", spec=spec, drafter=name, tree=tree,
                          options=options or None)
        if c.key not in {o.key for o in out}:
            out.append(c)
    return out


def contenders_for(ours: Sequence[Contender], temperature: float) -> list[Contender]:
    """Plain decoding first, Hugging Face's two at temperature 0, then ours."""
    peers = [Contender(PLAIN, PLAIN)]
    if temperature == 0:
        peers += [Contender(HF, HF), Contender(HF_PLD, HF_PLD)]
    return peers + list(ours)


def build_drafters(model, contenders: Sequence[Contender]) -> dict:
    """One drafter instance per contender with options (``{key: Drafter}``; built once, e.g. the draft LM loaded
    once); contenders without options use the engine's drafter cache by name.

    Raises:
        ValueError: a drafter that cannot be built for ``model`` (e.g. a draft LM of another vocabulary).
    """
    from eagle.drafters import make_drafter

    return {c.key: make_drafter(c.drafter, model, **c.options) for c in contenders if c.kind == "ours" and c.options}


def _sync(device) -> None:
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def _hf_generate(model, input_ids, max_new_tokens: int, prompt_lookup: bool):
    """Greedy ``model.base_model.generate`` stopping on the engine's stop tokens; returns output ids ``[1, L+n]``."""
    import torch

    stops = sorted(model.stop_token_ids())
    kw = dict(do_sample=False, max_new_tokens=max_new_tokens, attention_mask=torch.ones_like(input_ids),
              temperature=None, top_p=None, top_k=None)
    if stops:
        kw.update(eos_token_id=stops, pad_token_id=stops[0])
    if prompt_lookup:
        kw["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
    with torch.no_grad():
        return model.base_model.generate(input_ids, **kw)


def _call(model, c: Contender, input_ids, *, temperature: float, max_new_tokens: int, seed: int,
          verifier: str, drafter=None) -> dict:
    """One timed call of contender ``c`` (``drafter``: its built drafter, None = by name):
    ``{"new_ids", "seconds", "tau"?, "cycles"?}``."""
    device = getattr(model, "device", "cpu")
    stats = None
    _sync(device)
    t0 = time.perf_counter()
    if c.kind == PLAIN:
        out = model.naivegenerate(input_ids, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    elif c.kind in (HF, HF_PLD):
        out = _hf_generate(model, input_ids, max_new_tokens, prompt_lookup=c.kind == HF_PLD)
    else:
        kw = dict(temperature=temperature, max_new_tokens=max_new_tokens, return_stats=True)
        if temperature > 0:
            kw.update(seed=seed, verifier=verifier)
        if c.spec != "default":
            kw.update(drafter=drafter if drafter is not None else c.drafter, tree_choices=c.tree)
        out, stats = model.eagenerate(input_ids, **kw)
    _sync(device)
    seconds = time.perf_counter() - t0
    rec = {"new_ids": [int(t) for t in out[0, input_ids.shape[1]:].tolist()], "seconds": seconds}
    if stats is not None:
        acc = [int(a) for a in stats.get("accept_lengths", [])]
        rec["cycles"] = len(acc)
        rec["cycle_tokens"] = sum(acc)
    return rec


def paired_ratio(num: Sequence[float], den: Sequence[float], n_boot: int = 1000, seed: int = 0):
    """``(mean(num) / mean(den), bootstrap SE)`` over paired per-question values (the SE None for < 2 questions):
    each resample draws question indices once and uses them for both."""
    import numpy as np

    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    est = float(a.mean() / b.mean())
    if len(a) < 2:
        return est, None
    idx = np.random.default_rng(seed).integers(0, len(a), size=(n_boot, len(a)))
    boot = a[idx].mean(1) / b[idx].mean(1)
    return est, float(boot.std(ddof=1))


def _prompts(model, questions: Sequence[dict], prompt_format=None) -> list:
    """First-turn prompt ids ``[1, L]`` of each question, on the model's device."""
    import torch

    from evaluation.questions import build_messages, build_prompt_ids

    build = prompt_format.ids if prompt_format is not None else build_prompt_ids
    device = getattr(model, "device", "cpu")
    return [torch.tensor([build(model.tokenizer, build_messages(q["turns"][:1], []))], dtype=torch.long,
                         device=device) for q in questions]


def run(model, questions: Sequence[dict], contenders: Sequence[Contender], *, temperature: float = 0.0,
        max_new_tokens: int = 128, seed: int = 0, verifier: str = "univer", prompt_format=None,
        progress: bool = True, drafters: Optional[dict] = None) -> dict:
    """Warm up each contender, then run every question on every contender (order rotated per question).

    ``drafters``: :func:`build_drafters`' result (default: built here).

    Returns ``{"questions": [{"question_id", "category", "prompt_tokens", "results": {key: record}}], ...}``
    with each record ``{"new_ids", "seconds", "new_tokens", "tokens_per_s", "equal"?, "cycles"?, ...}``.
    """
    from tqdm import tqdm

    from evaluation.gen_answer import call_seed

    prompts = _prompts(model, questions, prompt_format)
    built = build_drafters(model, contenders) if drafters is None else drafters
    load0 = os.getloadavg()
    kw = dict(temperature=temperature, seed=seed, verifier=verifier)
    for c in contenders:  # untimed warm-up (an 'auto' tree is fitted here, once per machine, then cached)
        _call(model, c, prompts[0], max_new_tokens=min(max_new_tokens, 16), drafter=built.get(c.key), **kw)
    records = []
    n = len(contenders)
    with tqdm(total=len(questions) * n, desc="bench_peers", unit="call", disable=not progress,
              dynamic_ncols=True) as bar:
        for qi, (q, ids) in enumerate(zip(questions, prompts)):
            res = {}
            order = [contenders[(qi + j) % n] for j in range(n)]
            for c in order:
                bar.set_postfix_str(f"q{q['question_id']} {c.key}", refresh=False)
                rec = _call(model, c, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                            seed=call_seed(seed, q["question_id"], 0), verifier=verifier, drafter=built.get(c.key))
                rec["new_tokens"] = len(rec["new_ids"])
                rec["tokens_per_s"] = rec["new_tokens"] / max(rec["seconds"], 1e-9)
                res[c.key] = rec
                bar.update(1)
            if temperature == 0:
                for key, rec in res.items():
                    rec["equal"] = rec["new_ids"] == res[PLAIN]["new_ids"]
            records.append({"question_id": q["question_id"], "category": q["category"],
                            "prompt_tokens": int(ids.shape[1]), "results": {c.key: res[c.key] for c in contenders}})
    contenders_out = [asdict(c) | {"label": c.label, "tree_choices": _fitted(model, c, temperature)}
                      for c in contenders]
    return {"questions": records, "contenders": contenders_out,
            "loadavg_before": load0, "loadavg_after": os.getloadavg(),
            "default_resolved": _default_resolved(model, temperature, verifier)}


def _fitted(model, c: Contender, temperature: float):
    """The rank paths an ``auto`` tree of contender ``c`` resolved to (fitted in the warm-up, remembered by the model),
    else None."""
    if c.kind != "ours" or not (isinstance(c.tree, str) and c.tree.strip().lower() == "auto"):
        return None
    try:
        resolved = model.resolve_tree("auto", temperature)
    except Exception:  # noqa: BLE001 - informational only
        return None
    return [list(p) for p in resolved] if isinstance(resolved, (list, tuple)) else None


def _default_resolved(model, temperature: float, verifier: str = "univer") -> dict:
    """What the API defaults ran: the model's drafter, the default tree its calls drafted (``EaModel.call_tree``
    decides: the default, or its static fallback where the call's rule cannot draft the default dynamic tree; rank
    paths when fitted) and the verifier (the registry's choice: ``argmax`` at temperature 0)."""
    from eagle.sampling import SamplingConfig
    from eagle.tree.dynamic import DynamicTree, is_dynamic_tree
    from eagle.verify.registry import select_verifier

    v = select_verifier(verifier, temperature)
    tree = getattr(model, "tree_choices", None)
    try:  # the spec behind the tree a call builds: the default, or the fallback when call_tree swapped it
        built = model.call_tree(None, SamplingConfig(temperature), model.drafter, v.drafting, v.name)
        if isinstance(built, DynamicTree) != is_dynamic_tree(tree):
            tree = model.fallback_tree_choices
    except Exception:  # noqa: BLE001 - informational only
        pass
    try:
        resolved = model.resolve_tree(tree, temperature)
    except Exception:  # noqa: BLE001 - informational only
        resolved = tree
    return {"drafter": getattr(getattr(model, "drafter", None), "name", None), "tree": tree if isinstance(tree, str)
            else None, "tree_choices": resolved if not isinstance(resolved, str) else None,
            "tree_name": resolved if isinstance(resolved, str) else None, "verifier": v.name}


def summarise(res: dict, n_boot: int = 1000) -> list[dict]:
    """One row per contender: tokens/s, ratio to plain (and to HF prompt lookup) with paired bootstrap SEs,
    tau, equality count."""
    qs = res["questions"]
    tps = {c["key"]: [q["results"][c["key"]]["tokens_per_s"] for q in qs] for c in res["contenders"]}
    rows = []
    for c in res["contenders"]:
        key = c["key"]
        recs = [q["results"][key] for q in qs]
        ratio, se = paired_ratio(tps[key], tps[PLAIN], n_boot)
        row = {"key": key, "label": c["label"], "tokens_per_s": sum(tps[key]) / len(qs), "ratio": ratio,
               "ratio_se": se, "questions": len(qs), "new_tokens": sum(r["new_tokens"] for r in recs)}
        if HF_PLD in tps:
            row["ratio_hf_pld"], row["ratio_hf_pld_se"] = paired_ratio(tps[key], tps[HF_PLD], n_boot)
        cycles = sum(r.get("cycles", 0) for r in recs)
        row["tau"] = sum(r.get("cycle_tokens", 0) for r in recs) / cycles if cycles else None
        if all("equal" in r for r in recs):
            row["equal"] = sum(bool(r["equal"]) for r in recs)
        rows.append(row)
    return rows


def _ratio_cell(est, se) -> str:
    return f"{est:.2f}x" + (f" ± {se:.2f}" if se is not None else "")


def table(rows: Sequence[dict], meta: dict) -> str:
    """Markdown table and a notes line (settings, load, what the API defaults resolved to)."""
    pld = any("ratio_hf_pld" in r for r in rows)
    head = ["contender", "tokens/s", "ratio to plain"] + (["ratio to HF PLD"] if pld else []) + ["tau",
                                                                                                 "equal to greedy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"], f"{r['tokens_per_s']:.2f}", _ratio_cell(r["ratio"], r["ratio_se"])]
        if pld:
            cells.append(_ratio_cell(r["ratio_hf_pld"], r["ratio_hf_pld_se"]))
        cells.append("-" if r["tau"] is None else f"{r['tau']:.2f}")
        cells.append(f"{r['equal']}/{r['questions']}" if "equal" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    d = meta.get("default_resolved") or {}
    tree = d.get("tree_name") or d.get("tree") or "-"
    if d.get("tree_choices") is not None:
        tree = f"{d.get('tree') or 'custom'} = {d['tree_choices']}"
    lines += ["", (f"{meta['questions']} question(s) ({meta['question_set']} set, first turn), {meta['max_new_tokens']} "
                   f"new tokens, temperature {meta['temperature']:g}"
                   + (f" (ours verified by {meta['verifier']}, seeded per question)" if meta["temperature"] > 0 else "")
                   + f", {meta['threads']} thread(s), model {meta['model']} on {meta['device']}; ratios: mean tokens/s "
                   f"over plain decoding's (± paired bootstrap SE over questions, {meta['bootstrap']} resamples); "
                   f"API defaults = drafter {d.get('drafter')}, tree {tree}; load average "
                   f"{meta['loadavg_before'][0]:.2f} -> {meta['loadavg_after'][0]:.2f}, {meta['utc']} UTC.")]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = OneLineParser(prog="bench_peers", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'default' (embedded SmolLM2-135M-Instruct + our head), a "
                                                       "folder or hub id")
    ap.add_argument("--head", default=None, help="EAGLE-1 head folder / hub id (default: the model's default head)")
    ap.add_argument("--ours", nargs="+", default=list(DEFAULT_OURS), metavar="SPEC",
                    help=f"our contenders, {DRAFTER_SPEC_FORM}: default (API defaults), eagle, eagle:2x5, eagle:auto, "
                         "eagle:eagle2 or eagle:eagle2:nodes=24,depth=5,topk=8 (EAGLE-2 dynamic tree), hybrid:2x2, "
                         "hybrid@lookup_weight=0.7:2x2, prompt_lookup, draft_lm@model_path_or_module=JackFram/"
                         "llama-68m:2x5, eagle3@path=HEAD_FOLDER:2x5 (option values as JSON when they parse, no ':'; "
                         "default: default prompt_lookup)")
    ap.add_argument("--temperature", default="0", help="0 (default): every contender; > 0: plain decoding and ours")
    ap.add_argument("--verifier", default="univer", help="our verifier at temperature > 0 (default univer)")
    ap.add_argument("--seed", default="0", help="base seed at temperature > 0 (one engine seed per question)")
    ap.add_argument("--max-new-tokens", default="128")
    ap.add_argument("--question-file", default=None,
                    help=f"Spec-Bench question.jsonl (default {DEFAULT_QUESTION_FILE} when present, else the "
                         f"harness's data/spec_bench/question.jsonl)")
    ap.add_argument("--question-set", default="report", help="all | selection | report (default: report, the "
                                                             "questions the head was never selected on)")
    ap.add_argument("--per-category", default="5", help="questions per category group (default 5)")
    ap.add_argument("--categories", nargs="+", default=None, help="groups (mt_bench translation ...); default all")
    ap.add_argument("--threads", default="1", help="torch threads (default 1)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="auto", help="auto (cuda: float16, cpu: float32) | float16 | bfloat16 | float32")
    ap.add_argument("--bootstrap", default="1000", help="bootstrap resamples over questions (default 1000)")
    ap.add_argument("--out", default=None, help="JSON path (default runs/bench_peers/<UTC time>.json); the markdown "
                                                "table goes beside it (.md)")
    ap.add_argument("--no-progress", action="store_true")
    return ap.parse_args(argv)


def check_args(args: argparse.Namespace, model_given: bool = False) -> dict:
    """Every flag checked before any work; returns the settings.

    Raises:
        UsageError: the first bad flag (its message starts with the flag).
    """
    from evaluation.arguments import check_device

    temperature = check_sampling(args.temperature, 1.0, 0)[0]
    load_plugins([])
    verifier = str(args.verifier).strip()
    if verifier == BASELINE:
        raise UsageError("--verifier", "'naive' is plain decoding, which always runs; name a verifier")
    known = method_names(temperature)
    if verifier not in known:  # plug-ins registered under the entry-point group are loaded above and listed
        raise UsageError("--verifier", f"unknown verifier {verifier!r}; known at temperature {temperature:g}: {known}")
    ours = parse_ours(args.ours, temperature, verifier)
    settings = dict(temperature=temperature, verifier=verifier, ours=ours,
                    seed=check_positive_int("--seed", args.seed, minimum=0),
                    max_new_tokens=check_positive_int("--max-new-tokens", args.max_new_tokens),
                    per_category=check_positive_int("--per-category", args.per_category),
                    threads=check_positive_int("--threads", args.threads),
                    bootstrap=check_positive_int("--bootstrap", args.bootstrap, minimum=2),
                    model=args.model if model_given else check_model(args.model), head=args.head,
                    question_set=args.question_set, no_progress=args.no_progress)
    settings["device"], settings["dtype"] = check_device(args.device, args.dtype)
    qfile = args.question_file
    if qfile is None and DEFAULT_QUESTION_FILE.is_file():
        qfile = str(DEFAULT_QUESTION_FILE)
    settings["questions"] = check_question_file(qfile, args.categories, settings["per_category"],
                                                question_set=args.question_set)
    settings["question_file"] = None if qfile is None else str(Path(qfile).resolve())  # recorded where it was read
    out = Path(args.out) if args.out else Path("runs") / "bench_peers" / (
        time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + ".json")
    if out.suffix != ".json":
        out = out.with_name(out.name + ".json")
    check_out_dir(str(out.parent))
    settings["out"] = out
    return settings


def _main(argv, model=None, prompt_format=None) -> dict:
    import torch
    import transformers

    args = parse_args(argv)
    s = check_args(args, model_given=model is not None)
    torch.set_num_threads(s["threads"])
    if model is None:
        from types import SimpleNamespace

        from eagle.drafters import get_drafter
        from evaluation.arguments import load_checked_model

        # the EAGLE head is loaded unless nothing needs it (e.g. only draft_lm on a model without a head)
        needs_head = s["model"] == "default" or s["head"] is not None or any(
            c.spec == "default" or get_drafter(c.drafter).needs_head for c in s["ours"])
        model, prompt_format = load_checked_model(SimpleNamespace(
            model=s["model"], head=s["head"], device=s["device"], dtype=s["dtype"], threads=s["threads"],
            drafter="eagle" if needs_head else "prompt_lookup", drafter_options={}, draft_vocab="auto", template=None,
            max_new_tokens=s["max_new_tokens"]))
        if s["model"] == "default":  # the API defaults' drafter, as from_pretrained("default") chooses it
            from eagle.model.ea_model import default_drafter_name

            model.set_drafter(default_drafter_name(True, model.device, model.ea_layer is not None))
    else:
        check_fits_context(model, s["max_new_tokens"])
    contenders = contenders_for(s["ours"], s["temperature"])
    try:
        drafters = build_drafters(model, contenders)
    except ValueError as e:
        raise UsageError("--ours", " ".join(str(e).split())) from None
    t0 = time.perf_counter()
    res = run(model, s["questions"], contenders, temperature=s["temperature"], max_new_tokens=s["max_new_tokens"],
              seed=s["seed"], verifier=s["verifier"], prompt_format=prompt_format, progress=not s["no_progress"],
              drafters=drafters)
    rows = summarise(res, s["bootstrap"])
    from evaluation.gen_answer import git_commit

    meta = {k: s[k] for k in ("temperature", "verifier", "seed", "max_new_tokens", "per_category", "threads",
                              "bootstrap", "model", "head", "question_set", "question_file")}
    meta["verifier"] = res["default_resolved"]["verifier"]  # the verifier the calls ran (argmax at temperature 0)
    meta.update(questions=len(s["questions"]), device=str(getattr(model, "device", "cpu")),
                fast_cpu=getattr(model, "fast_cpu", None), loadavg_before=res["loadavg_before"],
                loadavg_after=res["loadavg_after"], default_resolved=res["default_resolved"],
                utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), seconds=time.perf_counter() - t0,
                machine=platform.platform(), cpus=os.cpu_count(), torch=torch.__version__,
                transformers=transformers.__version__, commit=git_commit(), argv=list(argv or sys.argv[1:]),
                prompt_format=None if prompt_format is None else prompt_format.describe())
    text = table(rows, meta)
    print(text)
    out = s["out"]
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "rows": rows, "contenders": res["contenders"], "questions": res["questions"]}
    out.write_text(json.dumps(doc, indent=1, default=str))
    out.with_suffix(".md").write_text(text + "\n")
    print(f"-> {out} and {out.with_suffix('.md')}", file=sys.stderr)
    return doc


def main(argv=None, model=None, prompt_format=None) -> dict:
    """Command line (see the module docstring). ``model`` / ``prompt_format``: an already loaded model (tests);
    then ``--model`` is only a label. A bad flag: one line on stderr, exit status 2."""
    return exit_on_usage_error(_main, argv, model, prompt_format, prog="bench_peers")


if __name__ == "__main__":  # pragma: no cover
    main()
