"""Draft-head quality against training-data size: the cheap curve of issue 13.

Several draft heads of the same target are compared on two FIXED sets, so that the only thing that
changes between points is the head:

1. **Held-out accuracy per draft depth** (:func:`research.heldout.evaluate_heads`): the first
   ``--max-records`` held-out records of the self-distillation corpus (prompts no head trained on);
   at depth ``d`` the head has drafted ``d - 1`` tokens of the target's own continuation on its own
   features; top-1 = its argmax is the target's argmax, top-4 = the target's argmax is among its 4 best.
2. **Exact expected tau** (:func:`evaluation.exact_tau.run_exact_tau`, tokens per cycle) on the contexts
   of ONE reference answer file (e.g. plain greedy decoding of Spec-Bench questions): every head drafts
   its tree after the same contexts and the verifier's exact outcome law gives E[tokens per cycle].
   At temperature 0 this is deterministic, so differences between heads carry no sampling noise
   beyond the choice of contexts (± = bootstrap SE over questions).

The x axis is the number of answer (counted) tokens the head was trained on: ``--tokens`` per head,
by default ``train_counted_positions`` of the head's ``train_log.json`` (its last training stage).

``python -m research.head_curve --head LABEL=FOLDER [--head ...] --tokens N [N ...] --reference
ANSWERS.jsonl --question-file Q.jsonl --out DIR`` writes ``DIR/head_curve.{json,md,png}``.
``--previous OLD/head_curve.json`` keeps the rows of an earlier run and measures only the new heads
(both measures are deterministic per head, so re-measuring an old head would repeat its numbers); the
earlier run must have used the same fixed sets (held-out records, sequences and positions; method,
temperature, tree and contexts), otherwise the command stops naming the field that differs.
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["parse_heads", "curve_rows", "previous_mismatches", "merge_previous", "render_curve", "plot_curve", "main"]


def parse_heads(specs: Sequence[str], tokens: Optional[Sequence[int]] = None) -> list[dict]:
    """``["LABEL=FOLDER", ...]`` (+ optional tokens per head) -> ``[{label, path, tokens}]``.

    Raises:
        ValueError: a spec without ``=``, a folder without ``config.json``, a duplicate label, a
            ``tokens`` list of another length, or no token count given and none in ``train_log.json``.
    """
    heads = []
    if tokens is not None and len(tokens) != len(specs):
        raise ValueError(f"--tokens: {len(tokens)} value(s) for {len(specs)} head(s)")
    for i, spec in enumerate(specs):
        if "=" not in spec:
            raise ValueError(f"--head {spec!r}: expected LABEL=FOLDER")
        label, path = spec.split("=", 1)
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"--head {spec!r}: {path} has no config.json")
        if any(h["label"] == label for h in heads):
            raise ValueError(f"--head {spec!r}: label {label!r} given twice")
        if tokens is not None:
            n = int(tokens[i])
        else:
            log = Path(path) / "train_log.json"
            try:
                n = int(json.loads(log.read_text())["train_counted_positions"])
            except (OSError, KeyError, ValueError) as e:
                raise ValueError(f"--head {spec!r}: no --tokens and no train_counted_positions in {log} ({e})") from None
        if n < 0:
            raise ValueError(f"--tokens: {n} < 0 for head {label!r}")
        heads.append({"label": label, "path": path, "tokens": n})
    return heads


def curve_rows(heads: Sequence[dict], heldout: dict, exact: dict) -> list[dict]:
    """One row per head, sorted by training tokens.

    Args:
        heads: :func:`parse_heads` output.
        heldout: ``{path: {"top1_by_depth": [...], "top4_by_depth": [...]}}`` (floats in [0, 1]).
        exact: ``{label: {"avg": {"mean", "se"}, groups...}}`` (tokens per cycle).
    """
    rows = []
    for h in heads:
        r = heldout[h["path"]]
        rows.append({"label": h["label"], "path": h["path"], "tokens": h["tokens"],
                     "top1_by_depth": list(r["top1_by_depth"]), "top4_by_depth": list(r["top4_by_depth"]),
                     "exact_tau": exact[h["label"]]})
    return sorted(rows, key=lambda r: r["tokens"])


def render_curve(res: dict) -> str:
    """Markdown: one row per head (tokens, top-1 / top-4 per depth, exact tau avg ± SE and per group)."""
    from evaluation.tables import _cell

    rows, depths, groups = res["rows"], res["depths"], res["groups"]
    hd = (["head", "train answer tokens"] + [f"top-1 d{d}" for d in range(1, depths + 1)]
          + [f"top-4 d{d}" for d in range(1, depths + 1)] + [f"τ {g}" for g in groups] + ["τ avg"])
    lines = [f"Draft heads on fixed sets: held-out top-1 / top-4 per draft depth ({res['heldout']['sequences']} "
             f"held-out sequences, {res['heldout']['positions']} positions) and exact expected τ "
             f"(tokens per cycle; {res['exact']['method']}, temperature {res['exact']['temperature']:g}, tree "
             f"{res['exact']['tree']}, {res['exact']['n_contexts']} contexts of {res['exact']['reference']}; "
             "± = bootstrap SE over questions)", "",
             "| " + " | ".join(hd) + " |", "|---|" + "---:|" * (len(hd) - 1)]

    for r in rows:
        t = r["exact_tau"]
        cells = ([r["label"], f"{r['tokens']:,}"] + [f"{x:.3f}" for x in r["top1_by_depth"]]
                 + [f"{x:.3f}" for x in r["top4_by_depth"]] + [_cell(t.get(g), 3) for g in groups] + [_cell(t["avg"], 3)])
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Took {res['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def plot_curve(res: dict, out_path) -> Path:
    """PNG: left, held-out top-1 per depth against training tokens; right, exact tau (± SE)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    x = [r["tokens"] for r in rows]
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for d in range(res["depths"]):
        a.plot(x, [r["top1_by_depth"][d] for r in rows], marker="o", label=f"depth {d + 1}")
    a.set_xlabel("training answer tokens")
    a.set_ylabel("held-out top-1")
    a.set_xscale("log")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    taus = [r["exact_tau"]["avg"] for r in rows]
    b.errorbar(x, [t["mean"] for t in taus], yerr=[t.get("se") or 0.0 for t in taus], marker="o", capsize=3)
    for r, t in zip(rows, taus):
        b.annotate(r["label"], (r["tokens"], t["mean"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    b.set_xlabel("training answer tokens")
    b.set_ylabel(f"exact expected τ ({res['exact']['method']}, T={res['exact']['temperature']:g}, "
                 f"{res['exact']['tree']})")
    b.set_xscale("log")
    b.grid(alpha=0.3)
    for ax in (a, b):  # ticks at 1, 2, 5 x 10^k labelled 200k / 1M (the default minor labels overlap)
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# the fields of a head_curve.json that define its two fixed sets; rows of two runs are comparable only if all agree
_SET_FIELDS = {"heldout": ("records", "sequences", "positions"),
               "exact": ("method", "temperature", "tree", "contexts_per_question", "n_contexts", "n_questions")}


def previous_mismatches(previous: dict, current: dict) -> list[str]:
    """Fields of the fixed sets on which an earlier result ``previous`` and ``current`` differ.

    Both are :func:`main` result dicts (``current`` may be partial: only the fields it has are compared,
    so the settings known before measuring can be checked first). Returns e.g.
    ``["heldout.positions: 19071 != 18000"]``; empty when the rows are comparable.
    """
    out = []
    if "depths" in current and previous.get("depths") != current["depths"]:
        out.append(f"depths: {previous.get('depths')} != {current['depths']}")
    for part, keys in _SET_FIELDS.items():
        for k in keys:
            if k in current.get(part, {}) and previous.get(part, {}).get(k) != current[part][k]:
                out.append(f"{part}.{k}: {previous.get(part, {}).get(k)} != {current[part][k]}")
    return out


def merge_previous(previous: dict, res: dict) -> dict:
    """``res`` with the earlier result's heads and rows added (rows sorted by training tokens).

    Raises:
        ValueError: the two were measured on different fixed sets (:func:`previous_mismatches`), or a
            head label is in both.
    """
    bad = previous_mismatches(previous, res)
    if bad:
        raise ValueError("measured on other fixed sets: " + "; ".join(bad))
    labels = {h["label"] for h in previous["heads"]} & {h["label"] for h in res["heads"]}
    if labels:
        raise ValueError(f"head label(s) {sorted(labels)} already in it")
    return {**res, "heads": list(previous["heads"]) + list(res["heads"]),
            "rows": sorted(list(previous["rows"]) + list(res["rows"]), key=lambda r: r["tokens"])}


def _parser() -> argparse.ArgumentParser:
    from evaluation.arguments import OneLineParser

    ap = OneLineParser(prog="head_curve", description=__doc__.split("\n")[0])
    ap.add_argument("--head", action="append", required=True, metavar="LABEL=FOLDER",
                    help="a head to compare (repeat); public EAGLE-1 layout")
    ap.add_argument("--tokens", nargs="+", type=int, default=None,
                    help="training answer tokens per head, in --head order (default: train_log.json)")
    ap.add_argument("--reference", required=True, help="answer file whose contexts every head drafts after")
    ap.add_argument("--question-file", required=True, help="the questions of --reference (Spec-Bench jsonl)")
    ap.add_argument("--per-category", type=int, default=5)
    ap.add_argument("--contexts-per-question", type=int, default=8)
    ap.add_argument("--method", default="rrsw")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--tree", default="mc_sim_7b_63")
    ap.add_argument("--corpus", default="data/distill/smollm2-135m", help="corpus run with the held-out split")
    ap.add_argument("--max-records", type=int, default=96, help="held-out records")
    ap.add_argument("--depths", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--previous", default="", metavar="HEAD_CURVE_JSON",
                    help="an earlier head_curve.json on the same fixed sets: its rows are kept, only --head heads are measured")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar for the exact-tau contexts")
    ap.add_argument("--out", required=True)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Command-line entry point; returns the result dict written to ``OUT/head_curve.json``."""
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        heads = parse_heads(args.head, args.tokens)
    except ValueError as e:
        ap.error(str(e))
    for flag, path in (("--reference", args.reference), ("--question-file", args.question_file)):
        if not Path(path).is_file():
            ap.error(f"{flag} {path}: no such file")
    if args.per_category < 1 or args.contexts_per_question < 1 or args.max_records < 1 or args.depths < 1:
        ap.error("--per-category, --contexts-per-question, --max-records and --depths must be >= 1")
    previous = None
    if args.previous:
        try:
            previous = json.loads(Path(args.previous).read_text(encoding="utf-8"))
            for k in ("heads", "rows", "heldout", "exact", "depths"):
                previous[k]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--previous {args.previous}: not a head_curve.json ({type(e).__name__}: {e})")
        known = {"depths": args.depths, "heldout": {"records": args.max_records},
                 "exact": {"method": args.method, "temperature": args.temperature, "tree": args.tree,
                           "contexts_per_question": args.contexts_per_question}}
        bad = previous_mismatches(previous, known)
        clash = {h["label"] for h in previous["heads"]} & {h["label"] for h in heads}
        if bad or clash:
            ap.error(f"--previous {args.previous}: " + "; ".join(bad + [f"head label {c!r} already in it" for c in sorted(clash)]))
    from research.heldout import main as heldout_main

    from evaluation import exact_tau

    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    held = heldout_main(["--heads", ",".join(h["path"] for h in heads), "--corpus", args.corpus,
                         "--max-records", str(args.max_records), "--depths", str(args.depths),
                         "--threads", str(args.threads)])
    if previous is not None:
        bad = previous_mismatches(previous, {"heldout": {k: held[k] for k in ("sequences", "positions")}})
        if bad:
            ap.error(f"--previous {args.previous}: the held-out set differs ({'; '.join(bad)}); is --corpus the same?")
    exact, meta = {}, None
    for h in heads:
        ex = exact_tau.main(["--model", "default", "--head", h["path"], "--methods", args.method, "--seeds", "0",
                             "--temperature", str(args.temperature), "--tree", args.tree,
                             "--per-category", str(args.per_category),
                             "--contexts-per-question", str(args.contexts_per_question), "--draft-vocab", "off",
                             "--answers", args.reference, "--question-file", args.question_file,
                             "--threads", str(args.threads), *(["--no-progress"] if args.no_progress else []),
                             "--out", str(out / "exact" / re.sub(r"[^\w.-]+", "_", h["label"]))])
        row = next(r for r in ex["rows"] if r["method"] == args.method)
        exact[h["label"]] = {**row["tau"], "avg": row["avg_tau"]}
        meta = ex
    res = {"heads": heads, "depths": args.depths,
           "heldout": {k: held[k] for k in ("corpus", "records", "sequences", "positions")},
           "exact": {"method": args.method, "temperature": args.temperature, "tree": args.tree,
                     "reference": args.reference, "n_contexts": meta["n_contexts"],
                     "contexts_per_question": args.contexts_per_question, "n_questions": meta["n_questions"]},
           "groups": meta["groups"], "rows": curve_rows(heads, held["heads"], exact),
           "seconds": round(time.time() - t0, 1)}
    if previous is not None:
        try:
            res = merge_previous(previous, res)
        except ValueError as e:
            ap.error(f"--previous {args.previous}: {e}")
    (out / "head_curve.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    md = render_curve(res)
    (out / "head_curve.md").write_text(md, encoding="utf-8")
    plot_curve(res, out / "head_curve.png")
    print(md)
    print(f"wrote {out / 'head_curve.json'}, .md and .png")
    return res


if __name__ == "__main__":
    main()
