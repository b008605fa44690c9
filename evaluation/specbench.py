"""The main job: Spec-Bench answers, metrics with errors, the paper's tables, exact tau, plots.

``scripts/run_specbench.sh`` runs ``python -m evaluation.specbench``; every argument is checked
first (:func:`check_arguments`; a user error is one line naming the flag, exit status 2, nothing
written), then the model is loaded once and the job runs:

1. answers of plain decoding (``naive``) and every method on the comparison tree (``--tree``, the
   paper's 2x5 by default), per seed, plus the speed methods on the speed tree (``--speed-tree``:
   the tree fitted to this machine for the embedded default on the CPU), sharing plain decoding
   (``OUT/answers/*.jsonl``, Spec-Bench's format + provenance; resumable);
2. metrics (``OUT/speed.json``): tau per category group, Avg, bootstrap SEs over questions,
   speedups, the engine's time breakdown; with ``--expected-tau`` (auto: on the CPU only) also the
   Rao-Blackwellised tau of the same runs (left out of the tables when off);
3. the Table-1 layout on the comparison tree (``OUT/table1.md``/``.json``; it says so when verifiers
   coincide on that tree), the speed table on the speed tree (``OUT/speed_table.md``); Table 3 when
   several configurations exist;
4. exact expected tau on shared contexts (``OUT/exact_tau.md``/``.json``, :mod:`evaluation.exact_tau`);
5. plots (``OUT/*.png``, :mod:`evaluation.plots`); ``OUT/run.json`` holds the settings, provenance and
   the seconds of every stage.

``--quick`` is a smoke run (1 seed, 2 questions per group, 16 new tokens, 1 exact-tau context
per question), labelled so in every table and plot.
"""
from __future__ import annotations

import json
import time
from typing import Optional, Sequence

from evaluation.arguments import (BASELINE, QUICK, Config, OneLineParser, UsageError,  # noqa: F401
                                  add_common_arguments, check_arguments, exit_on_usage_error, expected_tau_on,
                                  load_checked_model)

__all__ = ["run_job", "main"]

def run_job(cfg: Config, model, fmt) -> dict:
    """Steps 1-5 of the module docstring; returns ``run.json``'s content."""
    from evaluation import exact_tau as X
    from evaluation import gen_answer as G
    from evaluation import speed as S
    from evaluation import tables as T

    out = cfg.out
    info = G.provenance(model, cfg.model, cfg.head, fmt, drafter_options=cfg.drafter_options)
    methods = [BASELINE] + [m for m in cfg.methods if m != BASELINE]
    t0 = time.perf_counter()  # an auto tree is fitted here (cached on disk per machine), never inside a timed call
    choices = G.resolve_tree_choices(model, cfg)
    speed_tree = cfg.speed_tree if cfg.speed_methods else "none"
    speed_choices = (G.resolve_tree_choices(model, cfg, tree=speed_tree) if speed_tree != "none" else None)
    fit_seconds = time.perf_counter() - t0
    runs = [(m, cfg.tree, choices) for m in methods]
    runs += [(m, speed_tree, speed_choices) for m in cfg.speed_methods] if speed_tree != "none" else []
    for seed in cfg.seeds:  # resuming: an existing answer file must come from the same settings (and tree)
        for m, tree_spec, tree_choices in runs:
            tree = None if m == BASELINE else tree_spec
            settings = G.resume_settings(info, m, seed=seed, temperature=cfg.temperature, top_p=cfg.top_p,
                                         top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens, tree=tree,
                                         tree_choices=tree_choices)
            why = G.resume_conflict(out / "answers" / G.answer_file_name(m, cfg.temperature, tree, seed), settings)
            if why:
                raise UsageError("--out", f"{why}; use another --out or delete that file")
    out.mkdir(parents=True, exist_ok=True)
    run = {"settings": cfg.settings(), "provenance": info, "stage_seconds": {}}
    stages = run["stage_seconds"]
    if choices is not None:
        run["tree_choices"] = choices
    if speed_choices is not None:
        run["speed_tree_choices"] = speed_choices
    if choices is not None or speed_choices is not None:
        stages["auto_tree"] = fit_seconds
    expected_tau = expected_tau_on(cfg.expected_tau, model.device)  # --expected-tau auto: on on the CPU only
    run["expected_tau"] = expected_tau
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    common = dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens,
                  model_name=cfg.model, head=cfg.head, progress=not cfg.no_progress, prompt_format=fmt, run_info=info,
                  expected_tau=expected_tau)
    t0 = time.perf_counter()
    if speed_tree != "none":  # plain decoding interleaved with the speed runs: their ratio is paired
        G.run(model, cfg.questions, out / "answers", [BASELINE] + cfg.speed_methods, cfg.seeds, tree=speed_tree,
              tree_choices=speed_choices, **common)
        stages["answers_speed_tree"] = time.perf_counter() - t0
        t0 = time.perf_counter()
    G.run(model, cfg.questions, out / "answers", methods, cfg.seeds, tree=cfg.tree, tree_choices=choices, **common)
    stages["answers"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    speed = S.summarize(S.collect_runs([out / "answers"]), n_boot=cfg.bootstrap)
    (out / "speed.json").write_text(json.dumps(speed, indent=1) + "\n", encoding="utf-8")
    from evaluation.arguments import coincidence_note

    t1 = T.table1(speed, cfg.temperature, cfg.tree if isinstance(cfg.tree, str) else None,
                  methods=[m for m in T.order_methods(cfg.methods) if m != BASELINE])
    t1["tree_choices"] = choices
    t1["coincide"] = coincidence_note(choices if choices is not None else cfg.tree, cfg.temperature, cfg.methods)
    md1 = T.render_table1(t1, cfg.note)
    (out / "table1.md").write_text(md1, encoding="utf-8")
    (out / "table1.json").write_text(json.dumps(t1, indent=1) + "\n", encoding="utf-8")
    if speed_tree != "none":
        ts = T.table1(speed, cfg.temperature, speed_tree, methods=cfg.speed_methods)
        ts["tree_choices"] = speed_choices
        md_speed = T.render_speed_table(ts, cfg.note)
        (out / "speed_table.md").write_text(md_speed, encoding="utf-8")
        (out / "speed_table.json").write_text(json.dumps(ts, indent=1) + "\n", encoding="utf-8")
        md1 = md1 + "\n" + md_speed
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
                                prompt_ids=lambda msgs: fmt.ids(model.tokenizer, msgs),
                                tree=choices if choices is not None else cfg.tree, tree_label=cfg.tree,
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

        pngs = main_job_plots(speed, out, exact, cfg.temperature, cfg.tree, note=cfg.note,
                              speed_tree=None if speed_tree == "none" else speed_tree)
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
    ap.epilog = ("Outputs in --out: answers/*.jsonl (Spec-Bench format + provenance), speed.json, table1.md/.json "
                 "(verifiers on --tree), speed_table.md/.json (--speed-tree), exact_tau.md/.json, PNG plots, run.json.")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = _parser().parse_args(argv)
    cfg = exit_on_usage_error(check_arguments, args)
    start = time.perf_counter()
    print(f"== Spec-Bench{' SMOKE RUN (--quick)' if cfg.quick else ''}: model={cfg.model} head={cfg.head or 'default'} "
          f"temperature={cfg.temperature:g} tree={cfg.tree} methods={cfg.methods} "
          f"speed-tree={cfg.speed_tree} speed-methods={cfg.speed_methods} seeds={cfg.seeds} "
          f"questions={len(cfg.questions)} max-new-tokens={cfg.max_new_tokens} device={cfg.device} "
          f"threads={cfg.threads} out={cfg.out}", flush=True)
    model, fmt = exit_on_usage_error(load_checked_model, cfg)
    print(f"== prompt format: {fmt.name} ({fmt.reason}); device {model.device}", flush=True)
    run = exit_on_usage_error(run_job, cfg, model, fmt)
    total = time.perf_counter() - start
    run["stage_seconds"]["total"] = total
    (cfg.out / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    print(f"== done in {total:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in run['stage_seconds'].items())}); "
          f"tables: {cfg.out}/table1.md{', ' + str(cfg.out) + '/speed_table.md' if cfg.speed_methods else ''}, "
          f"{cfg.out}/exact_tau.md; metrics: {cfg.out}/speed.json; plots: "
          f"{', '.join(run.get('plots', [])) or 'none'}")
    return run


if __name__ == "__main__":
    main()
