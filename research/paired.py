"""Paired comparison of two sets of Spec-Bench runs on the same questions (e.g. two draft heads).

Where :mod:`evaluation.speed` compares methods WITHIN one run set (same head), this compares run set B
with run set A for every ``(method, temperature, tree)`` and seed that both contain, on the questions
both answered: per category group and for Avg, tau of A, tau of B and the difference B - A (tokens per
decoding step) with its bootstrap SE. The SE comes from :func:`evaluation.speed.bootstrap_run_set`
(questions resampled within their group, the SAME resample for A and B), so a difference that is the
same on every question has a small error even when both taus are noisy. tau is
:func:`evaluation.speed.group_tau` (the one definition).

At temperature 0 the two runs are deterministic given the head, so the pairing is exact; at temperature
> 0 the sampled answers of A and B differ, and the paired SE over questions still omits that variance.

The same comparison for two **exact expected tau** files (``exact_tau.json`` of
:mod:`evaluation.exact_tau`, e.g. ``OUT/exact/LABEL/exact_tau.json`` of :mod:`research.head_curve`): the
contexts both files scored (same question, turn and position) are paired, and the questions are resampled
by :func:`evaluation.exact_tau.paired_bootstrap`. One tree draw per context at temperature > 0 is part of
each context's value, so its variance is inside that SE.

Command line::

    python -m research.paired --a runs/tau-s6/*/answers --b runs/tau-s7/*/answers --labels "stage 6" "stage 7"
    python -m research.paired --a runs/curve/exact/stage_6/exact_tau.json --b runs/curve/exact/stage_7/exact_tau.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional, Sequence

from evaluation.exact_tau import paired_bootstrap
from evaluation.questions import category_group
from evaluation.speed import BASELINE, bootstrap_run_set, collect_runs, flat_accept_lengths, group_tau, order_groups

__all__ = ["compare", "compare_runs", "compare_exact", "is_exact_file", "markdown", "main"]


def _restrict(records: Sequence[dict], ids: set) -> list[dict]:
    return sorted((r for r in records if int(r["question_id"]) in ids), key=lambda r: int(r["question_id"]))


def _taus(records: Sequence[dict], groups: Sequence[str]) -> dict[str, float]:
    out = {g: group_tau([r for r in records if category_group(r["category"]) == g]) for g in groups}
    out["avg"] = sum(out[g] for g in groups) / len(groups)
    return out


def compare(records_a: Sequence[dict], records_b: Sequence[dict], n_boot: int = 1000, seed: int = 0) -> dict:
    """Paired tau difference B - A on the questions both record sets answered.

    Args:
        records_a, records_b: answer records (Spec-Bench format with ``accept_lengths``) of ONE method,
            temperature, tree and seed each.
        n_boot, seed: bootstrap resamples over questions and the resampling seed.

    Returns:
        ``{"groups": [...], "n_questions": {group: n}, "a": {group|"avg": tau}, "b": {...},
        "delta": {group|"avg": {"mean", "se"}}, "b_higher_groups": int}`` (tau in tokens per decoding
        step; SE None for a group with one question).

    Raises:
        ValueError: the two sets share no question.
    """
    ids = {int(r["question_id"]) for r in records_a} & {int(r["question_id"]) for r in records_b}
    if not ids:
        raise ValueError("the two run sets share no question id")
    a, b = _restrict(records_a, ids), _restrict(records_b, ids)
    for ra, rb in zip(a, b):
        if category_group(ra["category"]) != category_group(rb["category"]):
            raise ValueError(f"question {ra['question_id']} is {ra['category']!r} in A but {rb['category']!r} in B: "
                             "not the same question set")
    groups = order_groups({category_group(r["category"]) for r in a})
    for side, recs in (("A", a), ("B", b)):
        for g in groups:
            if not any(flat_accept_lengths(r["choices"][0]) for r in recs if category_group(r["category"]) == g):
                raise ValueError(f"run set {side} has no decoding steps (accept_lengths) in group {g}")
    ta, tb = _taus(a, groups), _taus(b, groups)
    boot = bootstrap_run_set({"a": a, "b": b}, n_boot=n_boot, seed=seed, baseline=BASELINE, reference="a")
    ses = boot["b"]["delta_abs"]
    delta = {g: {"mean": tb[g] - ta[g], "se": ses[g]["tau_se"]} for g in list(groups) + ["avg"]}
    return {"groups": groups,
            "n_questions": {g: sum(category_group(r["category"]) == g for r in a) for g in groups},
            "a": ta, "b": tb, "delta": delta, "b_higher_groups": sum(tb[g] > ta[g] for g in groups)}


def compare_runs(paths_a: Sequence[str], paths_b: Sequence[str], n_boot: int = 1000,
                 skipped: Optional[list] = None) -> list[dict]:
    """:func:`compare` for every ``(method, temperature, tree)`` and seed found in both path sets.

    Args:
        skipped: if a list, the ``(side, method, temperature, tree, seed)`` found on one side only are
            appended to it (they cannot be paired).

    Returns:
        a list of ``{"method", "temperature", "tree", "seed", **compare(...)}``, sorted by key.

    Raises:
        ValueError: a side has no answer records, a record is malformed (see
            :func:`evaluation.speed.check_record`), or no (method, temperature, tree, seed) is in both sets.
    """
    ra, rb = collect_runs(paths_a), collect_runs(paths_b)
    for side, runs, paths in (("--a", ra, paths_a), ("--b", rb, paths_b)):
        if not runs:
            raise ValueError(f"{side}: no answer records (*.jsonl / *.jsonl.gz) in {' '.join(map(str, paths))}")
    if skipped is not None:
        for side, mine, other in (("A", ra, rb), ("B", rb, ra)):
            for key, seeds in mine.items():
                skipped.extend((side, *key, sd) for sd in seeds if sd not in other.get(key, {}))
    out = []
    for key in sorted(set(ra) & set(rb), key=lambda k: (k[0], k[1], str(k[2]))):
        for s in sorted(set(ra[key]) & set(rb[key])):
            out.append({"method": key[0], "temperature": key[1], "tree": key[2], "seed": s,
                        **compare(ra[key][s], rb[key][s], n_boot=n_boot)})
    if not out:
        raise ValueError(f"no (method, temperature, tree, seed) in both sets: A has {sorted(ra)}, B has {sorted(rb)}")
    return out


def is_exact_file(path: str) -> bool:
    """True for an ``exact_tau.json`` (a JSON object with per-context ``contexts``), False for answer files."""
    if not str(path).endswith(".json") or not Path(path).is_file():
        return False
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
        return isinstance(d, dict) and "contexts" in d
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def compare_exact(path_a: str, path_b: str, n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """Paired exact-tau difference B - A for every method both ``exact_tau.json`` files scored.

    Returns:
        the same rows as :func:`compare_runs` (``seed`` = the files' drafting seed), tau = exact
        E[tokens per cycle | drafted tree] averaged over the shared contexts.

    Raises:
        ValueError: the files share no context or no method, or differ in temperature or tree.
    """
    da, db = (json.loads(Path(p).read_text(encoding="utf-8")) for p in (path_a, path_b))
    for k in ("temperature", "tree", "top_p", "top_k", "reference"):
        if da.get(k) != db.get(k):
            raise ValueError(f"the exact-tau files differ in {k}: {da.get(k)!r} vs {db.get(k)!r}")

    def contexts(d, path):
        cs = d.get("contexts")
        if not isinstance(cs, list) or not cs:
            raise ValueError(f"{path}: 'contexts' must be a non-empty list")
        out = {}
        for i, c in enumerate(cs):
            try:
                k = (int(c["question_id"]), int(c["turn"]), int(c["position"]))
                vals = {m: float(v) for m, v in c["values"].items()}
                if not isinstance(c["group"], str) or not all(math.isfinite(v) for v in vals.values()):
                    raise ValueError
            except (KeyError, TypeError, ValueError, AttributeError):
                raise ValueError(f"{path}: context {i} needs question_id, turn, position (integers), group "
                                 "(a string) and values (finite numbers per method)") from None
            out[k] = {**c, "values": vals}
        return out
    ca, cb = contexts(da, path_a), contexts(db, path_b)
    shared = sorted(set(ca) & set(cb))
    if not shared:
        raise ValueError("the two exact-tau files share no context (question, turn, position)")
    for k in shared:
        if ca[k]["group"] != cb[k]["group"]:
            raise ValueError(f"context {k} is in group {ca[k]['group']!r} in A but {cb[k]['group']!r} in B")
    methods = [m for m in ca[shared[0]]["values"]
               if all(m in ca[k]["values"] and m in cb[k]["values"] for k in shared)]
    if not methods:
        raise ValueError("the two exact-tau files share no method")
    out = []
    for m in methods:
        per_q = {}
        for side, ctx in (("a", ca), ("b", cb)):
            d = per_q.setdefault(side, {})
            for k in shared:
                e = d.setdefault(k[0], [ctx[k]["group"], 0.0, 0])
                e[1] += float(ctx[k]["values"][m])
                e[2] += 1
        boot = paired_bootstrap({side: {q: tuple(v) for q, v in d.items()} for side, d in per_q.items()},
                                n_boot, seed, reference="a")
        groups = order_groups({v[0] for v in per_q["a"].values()})
        ta = {g: boot["a"][g]["mean"] for g in list(groups) + ["avg"]}
        tb = {g: boot["b"][g]["mean"] for g in list(groups) + ["avg"]}
        out.append({"method": m, "temperature": da.get("temperature"), "tree": da.get("tree"),
                    "seed": da.get("seed"), "groups": groups,
                    "n_questions": {g: sum(v[0] == g for v in per_q["a"].values()) for g in groups},
                    "n_contexts": len(shared), "a": ta, "b": tb, "delta": boot["b"]["delta_abs"],
                    "b_higher_groups": sum(tb[g] > ta[g] for g in groups)})
    return out


def markdown(results: Sequence[dict], label_a: str = "A", label_b: str = "B") -> str:
    """Markdown table: per compared run three rows (A, B, B - A ± SE)."""
    groups = order_groups({g for r in results for g in r["groups"]})
    lines = ["| method | T | tree | seed | row | " + " | ".join(groups) + " | Avg | questions |",
             "|---" * (len(groups) + 7) + "|"]
    for r in results:
        head = f"| {r['method']} | {r['temperature']:g} | {r['tree']} | {r['seed']} |"
        n = sum(r["n_questions"].values())
        for label, taus in ((label_a, r["a"]), (label_b, r["b"])):
            lines.append(f"{head} {label} | " + " | ".join(f"{taus[g]:.2f}" if g in taus else "-" for g in groups)
                         + f" | {taus['avg']:.3f} | {n} |")
        def cell(d):
            return f"{d['mean']:+.3f}" + (f" ± {d['se']:.3f}" if d["se"] is not None else "")
        lines.append(f"{head} {label_b} - {label_a} | "
                     + " | ".join(cell(r["delta"][g]) if g in r["delta"] else "-" for g in groups)
                     + f" | **{cell(r['delta']['avg'])}** | higher in {r['b_higher_groups']} of {len(r['groups'])} |")
    if any(d["se"] is None for r in results for d in r["delta"].values()):
        lines.append("\nNo ± where a group has one question: its SE is unknown (and so is Avg's).")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    ap = argparse.ArgumentParser(description="Paired tau difference B - A of two run sets on shared questions.")
    ap.add_argument("--a", nargs="+", required=True, help="answer JSONL files or folders of run set A")
    ap.add_argument("--b", nargs="+", required=True, help="answer JSONL files or folders of run set B")
    ap.add_argument("--labels", nargs=2, default=["A", "B"], metavar=("LABEL_A", "LABEL_B"))
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples over questions")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    for flag, paths in (("--a", args.a), ("--b", args.b)):
        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            ap.error(f"{flag}: not found: {' '.join(missing)}")
    if any(not label.strip() for label in args.labels):
        ap.error("--labels: labels must not be empty")
    if args.bootstrap < 2:
        ap.error("--bootstrap must be at least 2")
    if args.out:
        out = Path(args.out)
        if out.is_dir():
            ap.error(f"--out: {out} is a folder; give a file name")
        inputs = {Path(p).resolve() for p in args.a + args.b if Path(p).is_file()}
        folders = {Path(p).resolve() for p in args.a + args.b if Path(p).is_dir()}
        if out.resolve() in inputs or (out.resolve().parent in folders and out.name.endswith((".jsonl", ".jsonl.gz"))):
            ap.error(f"--out: {out} is one of the inputs; give another file name")
        if any(parent.is_file() for parent in out.resolve().parents):
            ap.error(f"--out: a parent of {out} is a file")
    skipped: list = []
    exact = [is_exact_file(p) for p in args.a + args.b]
    if any(exact) and not (all(exact) and len(args.a) == len(args.b) == 1):
        ap.error("--a/--b: give either answer files/folders on both sides or one exact_tau.json on each side")
    try:
        results = (compare_exact(args.a[0], args.b[0], n_boot=args.bootstrap) if all(exact)
                   else compare_runs(args.a, args.b, n_boot=args.bootstrap, skipped=skipped))
    except ValueError as e:
        print(f"research.paired: {e}", file=sys.stderr)
        raise SystemExit(2)
    for side, method, t, tree, sd in skipped:
        print(f"research.paired: not compared (only in {side}): {method} T {t:g} tree {tree} seed {sd}",
              file=sys.stderr)
    print(markdown(results, *args.labels))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"labels": args.labels, "results": results}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
