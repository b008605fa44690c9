"""The main job: Spec-Bench answers, metrics with errors, the paper's tables, exact tau, plots.

``scripts/run_specbench.sh`` runs ``python -m evaluation.specbench``; every argument is checked
first (:func:`check_arguments`; a user error is one line naming the flag, exit status 2, nothing
written), then the model is loaded once and the job runs:

1. answers of plain decoding (``naive``) and every method, per seed (``OUT/answers/*.jsonl``,
   Spec-Bench's format + provenance; resumable);
2. metrics (``OUT/speed.json``): tau per category group, Avg, bootstrap SEs over questions,
   speedups, the engine's time breakdown;
3. the Table-1 layout (``OUT/table1.md``/``.json``; Table 3 when several configurations exist);
4. exact expected tau on shared contexts (``OUT/exact_tau.md``/``.json``, :mod:`evaluation.exact_tau`);
5. plots (``OUT/*.png``, :mod:`evaluation.plots`); ``OUT/run.json`` holds the settings, provenance and
   the seconds of every stage.

``--quick`` is a smoke run (1 seed, 2 questions per group, 48 new tokens, 3 exact-tau contexts
per question), labelled so in every table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from evaluation.arguments import (BASELINE, UsageError, check_device, check_head, check_methods, check_model,
                                  check_out_dir, check_positive_int, check_question_file, check_sampling, check_seeds,
                                  check_template, check_tree, exit_on_usage_error, load_plugins)

__all__ = ["QUICK", "OneLineParser", "Config", "add_common_arguments", "check_arguments", "load_checked_model",
           "run_job", "main", "exit_on_usage_error"]

#: what --quick sets (options given explicitly still win)
QUICK = {"seeds": "0", "per_category": 2, "max_new_tokens": 48, "contexts_per_question": 3, "draws": 1}
QUICK_NOTE = ("SMOKE RUN (--quick: {seeds} seed(s), {per_category} question(s) per category group, {max_new} new "
              "tokens per turn): it checks that everything runs; its numbers are not a benchmark")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are ONE line (``prog: error: --flag ...``) and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


@dataclass
class Config:
    """Checked settings of one job (see :func:`check_arguments`)."""

    model: str
    head: Optional[str]
    temperature: float
    top_p: float
    top_k: int
    tree: str
    methods: list
    seeds: list
    per_category: Optional[int]
    max_new_tokens: int
    questions: list = field(repr=False)
    question_file: Optional[str]
    out: Path
    device: str
    dtype: str
    threads: int
    template: Optional[str]
    plugins: list
    quick: bool
    note: Optional[str]
    contexts_per_question: int
    draws: int
    bootstrap: int
    no_progress: bool
    plots: bool

    def settings(self) -> dict:
        d = asdict(self)
        d.pop("questions")
        d["out"] = str(self.out)
        d["question_ids"] = [q["question_id"] for q in self.questions]
        return d


def add_common_arguments(ap: argparse.ArgumentParser, positional: bool = False) -> None:
    """The harness's flags (shared by the main job, ``gen_answer`` and ``exact_tau``)."""
    if positional:
        ap.add_argument("model_pos", nargs="?", metavar="MODEL", help="same as --model")
        ap.add_argument("temperature_pos", nargs="?", metavar="TEMPERATURE", help="same as --temperature")
    ap.add_argument("--model", default=None, help="'default' (embedded SmolLM2-135M-Instruct + our head), a hub id "
                                                  "or a folder")
    ap.add_argument("--head", default=None, help="EAGLE-1 head folder or hub id (required for a non-default model)")
    ap.add_argument("--temperature", default=None, help="sampling temperature (default 1.0)")
    ap.add_argument("--top-p", default=1.0)
    ap.add_argument("--top-k", default=0)
    ap.add_argument("--tree", default="2x5", help="mc_sim_7b_63 | KxD (e.g. 2x5, 3x3) | chainD (default 2x5)")
    ap.add_argument("--methods", nargs="+", default=None,
                    help="verifiers (default: every registered verifier usable at the temperature); 'naive' is "
                         "the plain-decoding baseline and always runs in the main job")
    ap.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                    help="import MODULE first (it registers verifiers); repeatable. univer_patch is always imported")
    ap.add_argument("--seeds", nargs="+", default=None, help='seeds (default "0 1 2")')
    ap.add_argument("--per-category", default=None,
                    help="N questions per category group (mt_bench: N in total over its sub-categories); default all")
    ap.add_argument("--categories", nargs="+", default=None, help="groups (mt_bench translation ...); default all")
    ap.add_argument("--max-new-tokens", default=None, help="per turn (default 256)")
    ap.add_argument("--question-file", default=None,
                    help="Spec-Bench question.jsonl (default data/spec_bench/question.jsonl, downloaded and "
                         "sha256-checked if absent)")
    ap.add_argument("--out", default=None, help="output folder (default runs/specbench/<model>-temp<T>-<tree>)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="auto", help="auto (cuda: float16, cpu: float32) | float16 | bfloat16 | float32")
    ap.add_argument("--threads", default=1,
                    help="CPU: torch threads (default 1: on a shared CPU several threads spin against each other); "
                         "0 = torch's default")
    ap.add_argument("--template", default=None,
                    help="prompt format: a FastChat template (e.g. vicuna_v1.1) or chat_template; default: the "
                         "tokenizer's chat template, or the known family's format (Vicuna -> vicuna_v1.1)")
    ap.add_argument("--contexts-per-question", default=None,
                    help="exact tau: shared contexts per question (default 8; 0 = skip exact tau)")
    ap.add_argument("--draws", default=None, help="exact tau: tree draws per drafting rule and context (default 1)")
    ap.add_argument("--bootstrap", default=1000, help="bootstrap resamples over questions (default 1000)")
    ap.add_argument("--quick", action="store_true", help="smoke run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-progress", action="store_true")


def _pick(explicit, quick_value, default, quick: bool):
    if explicit is not None:
        return explicit
    return quick_value if quick else default


def check_arguments(args: argparse.Namespace) -> Config:
    """Check every argument before any work (see :mod:`evaluation.arguments`); returns the settings.

    Raises:
        UsageError: the first bad argument (the message starts with its flag).
    """
    quick = bool(getattr(args, "quick", False))
    model = args.model or getattr(args, "model_pos", None) or "default"
    temp_raw = args.temperature if args.temperature is not None else (getattr(args, "temperature_pos", None) or 1.0)
    temperature, top_p, top_k = check_sampling(temp_raw, args.top_p, args.top_k)
    seeds = check_seeds(_pick(args.seeds, [QUICK["seeds"]], ["0 1 2"], quick))
    per_cat = _pick(args.per_category, QUICK["per_category"], None, quick)
    per_cat = None if per_cat is None else check_positive_int("--per-category", per_cat)
    max_new = check_positive_int("--max-new-tokens", _pick(args.max_new_tokens, QUICK["max_new_tokens"], 256, quick))
    cpq = check_positive_int("--contexts-per-question",
                             _pick(args.contexts_per_question, QUICK["contexts_per_question"], 8, quick), minimum=0)
    draws = check_positive_int("--draws", _pick(args.draws, QUICK["draws"], 1, quick))
    n_boot = check_positive_int("--bootstrap", args.bootstrap, minimum=2)
    threads = check_positive_int("--threads", args.threads, minimum=0)
    device, dtype = check_device(args.device, args.dtype)
    tree = check_tree(args.tree)
    plugins = load_plugins(args.plugin)
    methods = check_methods(args.methods, temperature)
    model = check_model(model)
    head = check_head(args.head, model)
    template = check_template(args.template, model)
    questions = check_question_file(args.question_file, args.categories, per_cat)
    out = args.out or f"runs/specbench/{Path(str(model)).name}-temp{temperature:g}-{tree}" + ("-quick" if quick else "")
    out = check_out_dir(out)
    return Config(model=model, head=head, temperature=temperature, top_p=top_p, top_k=top_k, tree=tree,
                  methods=methods, seeds=seeds, per_category=per_cat, max_new_tokens=max_new, questions=questions,
                  question_file=args.question_file, out=out, device=device, dtype=dtype, threads=threads,
                  template=template, plugins=plugins, quick=quick,
                  note=QUICK_NOTE.format(seeds=len(seeds), per_category=per_cat, max_new=max_new) if quick else None,
                  contexts_per_question=cpq, draws=draws, bootstrap=n_boot,
                  no_progress=bool(getattr(args, "no_progress", False)), plots=not getattr(args, "no_plots", False))


def load_checked_model(cfg: Config):
    """Load the model once and choose the prompt format; returns ``(model, PromptFormat)``.

    Raises:
        UsageError: ``--model``/``--head`` (the load failed; first line of the cause) or ``--template``.
    """
    import torch

    from evaluation.gen_answer import load_model
    from evaluation.templates import choose_format

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    try:
        model = load_model(cfg.model, cfg.head, cfg.device, cfg.dtype)
    except Exception as e:  # noqa: BLE001 - hub/transformers raise many types; report one line
        flag = "--head" if type(e).__name__ == "CheckpointMismatchError" else "--model/--head"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(flag, f"cannot load {cfg.model!r} + head {cfg.head!r}: {msg}") from None
    if getattr(model, "tokenizer", None) is None:
        raise UsageError("--model", f"{cfg.model} has no loadable tokenizer (Llama tokenizers need sentencepiece "
                                    f"and protobuf)")
    try:
        fmt = choose_format(cfg.model, model.tokenizer, cfg.template)
    except (ValueError, ModuleNotFoundError) as e:
        raise UsageError("--template", str(e).split(": ", 1)[-1] if str(e).startswith("--template") else str(e)) from None
    return model, fmt


def run_job(cfg: Config, model, fmt) -> dict:
    """Steps 1-5 of the module docstring; returns ``run.json``'s content."""
    from evaluation import exact_tau as X
    from evaluation import gen_answer as G
    from evaluation import speed as S
    from evaluation import tables as T

    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    info = G.provenance(model, cfg.model, cfg.head, fmt)
    run = {"settings": cfg.settings(), "provenance": info, "stage_seconds": {}}
    resolve = getattr(model, "resolve_tree", None)
    if cfg.tree == "auto" and callable(resolve):
        run["tree_choices"] = resolve("auto", cfg.temperature)
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    stages = run["stage_seconds"]

    t0 = time.perf_counter()
    methods = [BASELINE] + [m for m in cfg.methods if m != BASELINE]
    G.run(model, cfg.questions, out / "answers", methods, cfg.seeds, temperature=cfg.temperature, top_p=cfg.top_p,
          top_k=cfg.top_k, tree=cfg.tree, max_new_tokens=cfg.max_new_tokens, model_name=cfg.model, head=cfg.head,
          progress=not cfg.no_progress, prompt_format=fmt, run_info=info)
    stages["answers"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    speed = S.summarize(S.collect_runs([out / "answers"]), n_boot=cfg.bootstrap)
    (out / "speed.json").write_text(json.dumps(speed, indent=1) + "\n", encoding="utf-8")
    t1 = T.table1(speed, cfg.temperature, cfg.tree if isinstance(cfg.tree, str) else None)
    md1 = T.render_table1(t1, cfg.note)
    (out / "table1.md").write_text(md1, encoding="utf-8")
    (out / "table1.json").write_text(json.dumps(t1, indent=1) + "\n", encoding="utf-8")
    t3 = T.table3(speed)
    if len(t3["rows"]) > 1:
        (out / "table3.md").write_text(T.render_table3(t3), encoding="utf-8")
    stages["metrics"] = time.perf_counter() - t0
    print()
    print(md1)
    print("tau above = Avg over category groups of mean accepted tokens per step; per run:")
    for r in speed["runs"]:
        print(S.run_line(r))
    for r in speed["runs"]:
        s = S.speed_sentence(r)
        if s:
            print(s)

    exact = None
    verifiers = [m for m in cfg.methods if m != BASELINE]
    if cfg.contexts_per_question > 0 and verifiers:
        t0 = time.perf_counter()
        ref_file = out / "answers" / G.answer_file_name(BASELINE, cfg.temperature, None, cfg.seeds[0])
        reference = S.load_answers(ref_file)
        exact = X.run_exact_tau(model, reference, cfg.questions, verifiers,
                                prompt_ids=lambda msgs: fmt.ids(model.tokenizer, msgs), tree=cfg.tree,
                                temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                contexts_per_question=cfg.contexts_per_question, draws=cfg.draws, seed=cfg.seeds[0],
                                n_boot=cfg.bootstrap, context_source=f"the plain-decoding answers ({ref_file.name})",
                                progress=not cfg.no_progress)
        X.write_exact(exact, out, cfg.note)
        stages["exact_tau"] = time.perf_counter() - t0
        print()
        print(X.render_exact(exact, cfg.note))

    if cfg.plots:
        t0 = time.perf_counter()
        from evaluation.plots import main_job_plots

        pngs = main_job_plots(speed, out, exact, cfg.temperature, cfg.tree)
        stages["plots"] = time.perf_counter() - t0
        run["plots"] = [p.name for p in pngs]
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    return run


def _parser() -> OneLineParser:
    ap = OneLineParser(prog="run_specbench",
                       description="Spec-Bench main job: plain decoding + every verifier, metrics with errors, "
                                   "Table 1, exact expected tau, plots. Usage: run_specbench [MODEL] [TEMPERATURE] "
                                   "[options]")
    add_common_arguments(ap, positional=True)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = _parser().parse_args(argv)
    cfg = exit_on_usage_error(check_arguments, args)
    start = time.perf_counter()
    print(f"== Spec-Bench{' SMOKE RUN (--quick)' if cfg.quick else ''}: model={cfg.model} head={cfg.head or 'default'} "
          f"temperature={cfg.temperature:g} tree={cfg.tree} methods={cfg.methods} seeds={cfg.seeds} "
          f"questions={len(cfg.questions)} max-new-tokens={cfg.max_new_tokens} device={cfg.device} "
          f"threads={cfg.threads} out={cfg.out}", flush=True)
    model, fmt = exit_on_usage_error(load_checked_model, cfg)
    print(f"== prompt format: {fmt.name} ({fmt.reason}); device {model.device}", flush=True)
    run = run_job(cfg, model, fmt)
    total = time.perf_counter() - start
    run["stage_seconds"]["total"] = total
    (cfg.out / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    print(f"== done in {total:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in run['stage_seconds'].items())}); "
          f"tables: {cfg.out}/table1.md, {cfg.out}/exact_tau.md; metrics: {cfg.out}/speed.json; plots: "
          f"{', '.join(run.get('plots', [])) or 'none'}")
    return run


if __name__ == "__main__":
    main()
