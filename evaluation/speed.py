"""Spec-Bench metrics from answer files: tau, tokens/s, speedup, time breakdown, with errors.

**tau, defined once** (:func:`group_tau`). Per category group: Spec-Bench's mean accepted tokens,
i.e. the mean over ALL decoding steps of that group's questions (all turns pooled) of
``accept_lengths`` (accepted draft tokens + the bonus/correction token; 1 for plain decoding).
**Avg** = the plain mean of the six groups' tau (the paper's "Avg" column). Anything pooled over
all steps of all groups is called ``pooled`` ("all steps pooled") and is never the headline number.
The same definitions give ``tau_expected`` from ``expected_accept_lengths`` (the Rao-Blackwellised
tau: per cycle the exact E[tokens | drafted tree] from the verifier's outcome law).

**speed** of a question = ``sum(new_tokens) / sum(wall_time)`` (tokens/s); of a group = the mean
over its questions; ``overall`` speed = the mean over all questions (Spec-Bench's "overall");
**speedup** = a method's overall (or group) speed / the baseline's (method ``naive``, same
temperature and seed; else the baseline's mean over its seeds).

**Errors.** Standard errors over questions by a stratified, paired bootstrap
(:func:`bootstrap_run_set`): within each seed, the questions of each group are resampled with
replacement (``n_boot`` times, fixed seed), the SAME resample for every method and the baseline, so
differences between methods (``delta_pct`` vs the reference) get paired errors. SE = std of the
bootstrap values (ddof=1); ``ci95`` = their 2.5 / 97.5 percentiles. Across seeds: ``mean``, ``std``
(ddof=1; None for one seed) and ``se`` = sqrt(sum of per-seed SE^2) / n_seeds.

**Time breakdown.** From the engine's per-part timing (``choices[0]["timing"]``, one dict per turn:
``draft``, ``target_forward``, ``target_laws``, ``verify``, ``cache_update``, ``other`` seconds),
summed over the run; ``share`` = part / sum of parts.

Output JSON (:func:`summarize`)::

    {"definitions": {...}, "std_ddof": 1, "bootstrap": {"resamples", "seed", "unit"}, "baseline": "naive",
     "reference": "rrsw", "groups": [...],
     "runs": [{"method", "temperature", "tree", "seeds",
               "per_seed": {"<seed>": {"<group>"|"avg"|"pooled"|"overall": {"tau", "tau_se", "tau_ci95",
                            "tau_expected", "tau_expected_se", "speed", "speed_se", "speedup", "speedup_se",
                            "n_questions", "n_steps", "new_tokens", "wall_time"}},
               "summary": {"<group>"|"avg"|"pooled"|"overall": {"tau"|"tau_expected"|"speed"|"speedup":
                           {"mean", "std", "se"}}},
               "delta_pct": {"tau": {"mean", "se"}, "tau_expected": {...}} | null   (Avg vs the reference),
               "timing": {"seconds": {part: s}, "share": {part: fraction}, "wall_time": s} | null}]}

Command line::

    python -m evaluation.speed runs/specbench/answers --out runs/specbench/speed.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from evaluation.arguments import BASELINE, PAPER_METHODS
from evaluation.questions import CATEGORY_GROUPS, category_group

__all__ = ["STD_DDOF", "BASELINE", "REFERENCE", "TIMING_PARTS", "DEFINITIONS", "load_answers",
           "check_record", "flat_accept_lengths", "question_speed", "group_tau", "order_groups", "run_metrics", "bootstrap_run_set", "mean_std",
           "combine_seeds", "collect_runs", "timing_breakdown", "summarize", "run_line", "speed_sentence", "main"]

STD_DDOF = 1
REFERENCE = "rrsw"
TIMING_PARTS = ("draft", "target_forward", "target_laws", "verify", "cache_update", "other")
DEFINITIONS = {
    "tau": "per category group: mean over all decoding steps of that group's questions of accepted draft tokens + 1",
    "avg": "Avg = mean of the category groups' values (the paper's Avg column)",
    "pooled": "all steps of all groups pooled (not the headline number)",
    "tau_expected": "same definitions over the exact E[tokens per cycle | drafted tree] of every cycle",
    "speed": "per question sum(new_tokens)/sum(wall_time); group/overall = mean over questions",
    "speedup": "method speed / plain-decoding (naive) speed, same temperature and seed",
    "se": "bootstrap standard error over questions (stratified by group, paired across methods)",
    "std": "std over seeds (ddof=1)",
}


def load_answers(path: os.PathLike | str) -> list[dict]:
    """Answer records of one JSONL file, plain or gzip-compressed (``.gz``); blank and truncated lines skipped.

    Raises:
        ValueError: the file is not valid gzip / UTF-8 text, or a line is JSON but not an object.
    """
    out = []
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(rec, dict):
                    raise ValueError(f"{path}:{n}: an answer line must be a JSON object, got {type(rec).__name__}")
                out.append(rec)
    except (OSError, EOFError, UnicodeDecodeError) as e:   # BadGzipFile is an OSError
        raise ValueError(f"{path}: not a readable answer file ({type(e).__name__}: {e})") from None
    return out


def check_record(r: dict, where: str) -> None:
    """Raise ValueError (naming ``where`` and the field) unless ``r`` is a usable answer record.

    A usable record has ``question_id`` (an integer), ``category`` (a string), ``choices[0]`` (an object)
    whose ``accept_lengths`` and, when present, ``expected_accept_lengths`` are lists of finite numbers
    (or per-turn lists of them), and numeric ``temperature`` / integer ``seed`` when present.
    """
    def bad(msg):
        raise ValueError(f"{where}: {msg}")
    qid = r.get("question_id")
    if isinstance(qid, bool) or not isinstance(qid, int) and not (isinstance(qid, str) and qid.isdigit()):
        bad(f"question_id must be an integer, got {qid!r}")
    if not isinstance(r.get("category"), str):
        bad(f"question {qid}: category must be a string, got {r.get('category')!r}")
    ch = r.get("choices")
    if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        bad(f"question {qid}: choices must be a non-empty list of objects")
    for key in ("accept_lengths", "expected_accept_lengths"):
        if key not in ch[0] and key == "expected_accept_lengths":
            continue
        vals = ch[0].get(key)
        if not isinstance(vals, list):
            bad(f"question {qid}: choices[0].{key} must be a list, got {vals!r}")
        for v in flat_accept_lengths(ch[0], key):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                bad(f"question {qid}: choices[0].{key} holds {v!r}, not a finite number")
    t = r.get("temperature", 0.0)
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        bad(f"question {qid}: temperature must be a number, got {t!r}")
    sd = r.get("seed", 0)
    if isinstance(sd, bool) or not isinstance(sd, int):
        bad(f"question {qid}: seed must be an integer, got {sd!r}")


def flat_accept_lengths(choice: dict, key: str = "accept_lengths") -> list[float]:
    """All ``accept_lengths`` of a choice: Spec-Bench's flat list (also reads older per-turn nesting)."""
    flat: list[float] = []
    for a in choice.get(key, []) or []:
        if isinstance(a, (list, tuple)):
            flat.extend(a)
        else:
            flat.append(a)
    return flat


def question_speed(choice: dict) -> float:
    """``sum(new_tokens) / sum(wall_time)`` of one answer (tokens/s)."""
    t = float(sum(choice["wall_time"]))
    return float(sum(choice["new_tokens"])) / t if t > 0 else float("nan")


def group_tau(records: Sequence[dict], key: str = "accept_lengths") -> Optional[float]:
    """THE tau of a set of questions: mean over all their decoding steps (None without steps: every
    answer ended at its first token, e.g. an immediate EOS; tau is undefined there, not NaN)."""
    vals = [x for r in records for x in flat_accept_lengths(r["choices"][0], key)]
    return float(sum(vals)) / len(vals) if vals else None


def order_groups(groups: Iterable[str]) -> list[str]:
    """Category groups in the paper's column order (:data:`CATEGORY_GROUPS`), unknown ones after, sorted."""
    g = set(groups)
    return [x for x in CATEGORY_GROUPS if x in g] + sorted(x for x in g if x not in CATEGORY_GROUPS)


def _has_expected(records: Sequence[dict]) -> bool:
    return bool(records) and all("expected_accept_lengths" in r["choices"][0] for r in records)


def _set_stats(records: Sequence[dict]) -> dict:
    speeds = [question_speed(r["choices"][0]) for r in records]
    return {"tau": group_tau(records),
            "tau_expected": group_tau(records, "expected_accept_lengths") if _has_expected(records) else None,
            "speed": float(np.mean(speeds)) if speeds else float("nan"),
            "n_questions": len(records),
            "n_steps": sum(len(flat_accept_lengths(r["choices"][0])) for r in records),
            "new_tokens": int(sum(sum(r["choices"][0]["new_tokens"]) for r in records)),
            "wall_time": float(sum(sum(r["choices"][0]["wall_time"]) for r in records))}


def run_metrics(records: Sequence[dict]) -> dict[str, dict]:
    """Point metrics of one run (one method, one seed): keys = groups, ``avg``, ``pooled``, ``overall``.

    ``avg`` tau/tau_expected/speed = mean of the groups' values; ``pooled`` = tau over all steps pooled;
    ``overall`` = speed over all questions (Spec-Bench's overall) with tau = the Avg tau.
    """
    by_group: dict[str, list[dict]] = {}
    for r in records:
        by_group.setdefault(category_group(r["category"]), []).append(r)
    out = {g: _set_stats(by_group[g]) for g in order_groups(by_group)}
    cats = list(out)
    allq = _set_stats(records)

    empty = [g for g in cats if out[g]["n_steps"] == 0]

    def _mean(k):  # groups without decoding steps have no tau: Avg is over the others (listed in the JSON)
        vals = [out[g][k] for g in cats if not (k != "speed" and g in empty)]
        return None if not vals or any(v is None for v in vals) else float(np.mean(vals))

    totals = {k: allq[k] for k in ("n_questions", "n_steps", "new_tokens", "wall_time")}
    out["avg"] = {"tau": _mean("tau"), "tau_expected": _mean("tau_expected"), "speed": _mean("speed"), **totals}
    if empty:
        out["avg"]["groups_without_steps"] = empty
    out["pooled"] = {"tau": allq["tau"], "tau_expected": allq["tau_expected"], "speed": allq["speed"], **totals}
    out["overall"] = {"tau": out["avg"]["tau"], "tau_expected": out["avg"]["tau_expected"], "speed": allq["speed"],
                      **totals}
    return out


def _question_arrays(records: Sequence[dict]) -> dict[int, dict]:
    """Per question id: step sums/counts (sampled and expected) and speed."""
    out = {}
    for r in records:
        c = r["choices"][0]
        acc = flat_accept_lengths(c)
        exp = flat_accept_lengths(c, "expected_accept_lengths") if "expected_accept_lengths" in c else None
        out[int(r["question_id"])] = {"group": category_group(r["category"]), "sum": float(sum(acc)),
                                      "n": len(acc), "esum": None if exp is None else float(sum(exp)),
                                      "en": 0 if exp is None else len(exp), "speed": question_speed(c)}
    return out


def bootstrap_run_set(runs: dict[str, Sequence[dict]], n_boot: int = 1000, seed: int = 0,
                      baseline: str = BASELINE, reference: str = REFERENCE) -> dict[str, dict]:
    """Stratified paired bootstrap over questions for several methods of ONE seed.

    Args:
        runs: ``{method: records}`` (the baseline among them for speedups); the questions used are those
            present in every run (paired), grouped by category group.
        n_boot: resamples; seed: numpy seed of the resampling (fixed: reproducible errors).
        baseline, reference: method names for the speedup and for ``delta_pct``.

    Returns:
        ``{method: {group|"avg"|"overall": {"tau_se", "tau_ci95", "tau_expected_se", "speed_se",
        "speedup_se"}, "delta_pct": {"tau_se", "tau_expected_se"},
        "delta_abs": {group|"avg": {"tau_se", "tau_expected_se"}}}}``: ``delta_pct`` = SE of the Avg's
        relative difference to the reference (percent), ``delta_abs`` = SE of the absolute difference
        method - reference (tokens per step) per group and for Avg; both None for the reference and the
        baseline. A group with one question has no SE
        and every SE involving it is None
        (nothing to resample: unknown, not zero); None also where a quantity is missing.
    """
    rng = np.random.default_rng(seed)
    arrays = {m: _question_arrays(recs) for m, recs in runs.items()}
    common = set.intersection(*[set(a) for a in arrays.values()]) if arrays else set()
    first = next(iter(arrays.values()), {})
    groups = order_groups({first[q]["group"] for q in common})
    idx = {g: sorted(q for q in common if first[q]["group"] == g) for g in groups}
    draws = {g: rng.integers(0, len(idx[g]), size=(n_boot, len(idx[g]))) for g in groups}
    boot: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for m, arr in arrays.items():
        res: dict[str, dict[str, np.ndarray]] = {}
        for g in groups:
            qs = idx[g]
            s = np.array([arr[q]["sum"] for q in qs])[draws[g]].sum(1)
            n = np.array([arr[q]["n"] for q in qs])[draws[g]].sum(1)
            tau = np.where(n > 0, s / np.maximum(n, 1), np.nan)
            if all(arr[q]["esum"] is not None for q in qs):
                es = np.array([arr[q]["esum"] for q in qs])[draws[g]].sum(1)
                en = np.array([arr[q]["en"] for q in qs])[draws[g]].sum(1)
                etau = np.where(en > 0, es / np.maximum(en, 1), np.nan)
            else:
                etau = None
            speed = np.array([arr[q]["speed"] for q in qs])[draws[g]]
            res[g] = {"tau": tau, "tau_expected": etau, "speed": speed.mean(1), "speed_sum": speed.sum(1),
                      "n": np.full(n_boot, len(qs))}
        with warnings.catch_warnings():  # a group without steps is NaN in every resample: left out of Avg
            warnings.simplefilter("ignore", RuntimeWarning)
            avg_tau = np.nanmean([res[g]["tau"] for g in groups], axis=0)
            avg_etau = (None if any(res[g]["tau_expected"] is None for g in groups)
                        else np.nanmean([res[g]["tau_expected"] for g in groups], axis=0))
        res["avg"] = {"tau": avg_tau, "tau_expected": avg_etau,
                      "speed": np.mean([res[g]["speed"] for g in groups], axis=0)}
        res["overall"] = {"tau": res["avg"]["tau"], "tau_expected": res["avg"]["tau_expected"],
                          "speed": sum(res[g]["speed_sum"] for g in groups) / sum(len(idx[g]) for g in groups)}
        boot[m] = res

    def _se(x):
        if x is None:
            return None
        x = x[np.isfinite(x)]
        return float(np.std(x, ddof=1)) if x.size > 1 else None

    def _ci(x):
        if x is None:
            return None
        x = x[np.isfinite(x)]
        return [float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))] if x.size else None

    # a group with fewer than 2 questions has no resampling variance: its errors (and Avg's) are unknown
    known = {g: len(idx[g]) >= 2 for g in groups}
    known["avg"] = known["overall"] = bool(groups) and all(known[g] for g in groups)
    out: dict[str, dict] = {}
    for m, res in boot.items():
        entry = {}
        for g, v in res.items():
            if not known[g]:
                entry[g] = {"tau_se": None, "tau_ci95": None, "tau_expected_se": None, "speed_se": None,
                            "speedup_se": None}
                continue
            sp = None
            if baseline in boot and m != baseline:
                sp = _se(v["speed"] / boot[baseline][g]["speed"])
            entry[g] = {"tau_se": _se(v["tau"]), "tau_ci95": _ci(v["tau"]), "tau_expected_se": _se(v["tau_expected"]),
                        "speed_se": _se(v["speed"]), "speedup_se": sp}
        d = None
        if reference in boot and m not in (reference, baseline) and known["avg"]:
            ref = boot[reference]["avg"]
            d = {"tau_se": _se(100 * (res["avg"]["tau"] / ref["tau"] - 1)),
                 "tau_expected_se": None if res["avg"]["tau_expected"] is None or ref["tau_expected"] is None
                 else _se(100 * (res["avg"]["tau_expected"] / ref["tau_expected"] - 1))}
        entry["delta_pct"] = d
        a = None
        if reference in boot and m not in (reference, baseline):
            a = {}
            for g in list(groups) + ["avg"]:
                v, r = res[g], boot[reference][g]
                a[g] = {"tau_se": _se(v["tau"] - r["tau"]) if known[g] else None,
                        "tau_expected_se": None if not known[g] or v["tau_expected"] is None
                        or r["tau_expected"] is None else _se(v["tau_expected"] - r["tau_expected"])}
        entry["delta_abs"] = a
        out[m] = entry
    return out


def mean_std(values: Sequence[Optional[float]], ses: Optional[Sequence[Optional[float]]] = None,
             ddof: int = STD_DDOF) -> Optional[dict]:
    """``{"mean", "std", "se"}`` of per-seed values: std over seeds with ``ddof`` (None for one seed),
    se = sqrt(sum se_s^2) / n from per-seed standard errors (None if any is missing). None if no value."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    m = float(np.mean(vals))
    std = float(np.std(vals, ddof=ddof)) if len(vals) - ddof > 0 else None
    se = None
    if ses is not None and len(ses) == len(vals) and all(s is not None for s in ses):
        se = math.sqrt(sum(float(s) ** 2 for s in ses)) / len(vals)
    return {"mean": m, "std": std, "se": se}


def combine_seeds(per_seed: dict[str, dict], keys: Sequence[str]) -> dict:
    """Summary over seeds of every group: ``{group: {quantity: mean_std}}``."""
    groups = []
    for row in per_seed.values():
        groups.extend(g for g in row if g not in groups)
    out = {}
    for g in keys:
        rows = [r[g] for r in per_seed.values() if g in r]
        if not rows:
            continue
        out[g] = {q: mean_std([r.get(q) for r in rows], [r.get(q + "_se") for r in rows])
                  for q in ("tau", "tau_expected", "speed", "speedup")}
    return out


def _answer_files(paths: Iterable[os.PathLike | str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted([*p.glob("*.jsonl"), *p.glob("*.jsonl.gz")]) if p.is_dir() else [p])
    return files


def collect_runs(paths: Iterable[os.PathLike | str]) -> dict[tuple, dict[int, list[dict]]]:
    """Read answer files (``.jsonl`` or ``.jsonl.gz``, or folders of them) and group their records.

    Returns:
        ``{(method, temperature, tree): {seed: [records]}}`` from the records' metadata (tree None for the
        baseline). A question id appearing twice for the same key and seed is counted once (the first).

    Raises:
        ValueError: a record without the ``method`` field (not written by this harness), or one that
            :func:`check_record` rejects (missing fields, NaN/inf accept lengths), naming file and line.
    """
    runs: dict[tuple, dict[int, list[dict]]] = {}
    seen: set[tuple] = set()
    for f in _answer_files(paths):
        for n, r in enumerate(load_answers(f), 1):
            method = r.get("method")
            if method is None:
                raise ValueError(f"{f}: answer lacks the 'method' metadata field")
            check_record(r, f"{f} (record {n})")
            tree = None if method == BASELINE else r.get("tree")
            tree = None if tree is None else str(tree)
            key = (method, float(r.get("temperature", float("nan"))), tree)
            seed = int(r.get("seed", 0))
            ident = key + (seed, r["question_id"])
            if ident in seen:
                continue
            seen.add(ident)
            runs.setdefault(key, {}).setdefault(seed, []).append(r)
    return runs


def timing_breakdown(records: Sequence[dict]) -> Optional[dict]:
    """Engine per-part seconds summed over a run's turns, with shares; None when the engine reported none."""
    secs: dict[str, float] = {}
    found = False
    for r in records:
        for t in r["choices"][0].get("timing", []) or []:
            for k, v in (t or {}).items():
                if k == "expected_tau":
                    continue
                found = True
                secs[k] = secs.get(k, 0.0) + float(v)
    if not found:
        return None
    order = [p for p in TIMING_PARTS if p in secs] + sorted(p for p in secs if p not in TIMING_PARTS)
    secs = {p: secs[p] for p in order}
    total = sum(secs.values())
    return {"seconds": secs, "share": {p: (v / total if total > 0 else None) for p, v in secs.items()},
            "wall_time": float(sum(sum(r["choices"][0]["wall_time"]) for r in records))}


def _sort_key(key: tuple):
    """Baseline first, then by temperature and tree, methods in the paper's order, others by name."""
    method, temp, tree = key
    rank = PAPER_METHODS.index(method) if method in PAPER_METHODS else len(PAPER_METHODS)
    return (method != BASELINE, temp, "" if tree is None else str(tree), rank, method)


def summarize(runs: dict[tuple, dict[int, list[dict]]], baseline: str = BASELINE, reference: str = REFERENCE,
              n_boot: int = 1000, boot_seed: int = 0) -> dict:
    """Metrics of every run with bootstrap errors, speedups, deltas vs ``reference`` and time breakdown."""
    per_run = {key: {seed: run_metrics(recs) for seed, recs in sorted(seeds.items())} for key, seeds in runs.items()}
    groups = order_groups({g for m in per_run.values() for s in m.values() for g in s
                     if g not in ("overall", "avg", "pooled")})
    keys_all = groups + ["avg", "pooled", "overall"]
    # bootstrap per (temperature, tree) and seed, paired across that configuration's methods + the baseline
    boots: dict[tuple, dict] = {}
    configs = {(k[1], k[2]) for k in runs if k[0] != baseline}
    for temp, tree in configs:
        seeds = sorted({s for k, v in runs.items() if k[1] == temp and k[2] == tree for s in v})
        for seed in seeds:
            members = {k[0]: v[seed] for k, v in runs.items() if k[1] == temp and k[2] == tree and seed in v}
            b = runs.get((baseline, temp, None), {})
            if seed in b:
                members[baseline] = b[seed]
            res = bootstrap_run_set(members, n_boot=n_boot, seed=boot_seed + seed, baseline=baseline,
                                    reference=reference)
            for m, v in res.items():
                boots[(m, temp, None if m == baseline else tree, seed)] = v
    out_runs = []
    for key in sorted(per_run, key=_sort_key):
        method, temp, tree = key
        base = per_run.get((baseline, temp, None))
        per_seed = {}
        deltas_tau, deltas_exp = [], []
        for seed, metrics in per_run[key].items():
            bs = boots.get((method, temp, tree, seed), {})
            if method == baseline and not bs:
                # a baseline's own errors when it was not paired with any method
                bs = bootstrap_run_set({baseline: runs[key][seed]}, n_boot=n_boot, seed=boot_seed + seed,
                                       baseline="", reference="")[baseline]
            row = {}
            for g, m in metrics.items():
                entry = dict(m)
                b_speed = None
                if base:
                    if seed in base and g in base[seed]:
                        b_speed = base[seed][g]["speed"]
                    else:
                        vals = [s[g]["speed"] for s in base.values() if g in s]
                        b_speed = float(np.mean(vals)) if vals else None
                entry["speedup"] = (m["speed"] / b_speed) if b_speed else None
                e = bs.get("avg" if g == "pooled" else g, {})
                entry["tau_se"] = None if g == "pooled" else e.get("tau_se")
                entry["tau_ci95"] = None if g == "pooled" else e.get("tau_ci95")
                entry["tau_expected_se"] = None if g == "pooled" else e.get("tau_expected_se")
                entry["speed_se"] = e.get("speed_se")
                entry["speedup_se"] = 0.0 if method == baseline and entry["speedup"] is not None else e.get("speedup_se")
                row[g] = entry
            per_seed[str(seed)] = row
            ref = per_run.get((reference, temp, tree), {}).get(seed)
            if ref is not None and method not in (reference, baseline):
                d = bs.get("delta_pct") or {}
                deltas_tau.append((100 * (metrics["avg"]["tau"] / ref["avg"]["tau"] - 1), d.get("tau_se")))
                if metrics["avg"]["tau_expected"] is not None and ref["avg"]["tau_expected"] is not None:
                    deltas_exp.append((100 * (metrics["avg"]["tau_expected"] / ref["avg"]["tau_expected"] - 1),
                                       d.get("tau_expected_se")))
        delta = None
        if deltas_tau:
            delta = {"tau": mean_std([d[0] for d in deltas_tau], [d[1] for d in deltas_tau]),
                     "tau_expected": mean_std([d[0] for d in deltas_exp], [d[1] for d in deltas_exp])
                     if deltas_exp else None}
        all_recs = [r for recs in runs[key].values() for r in recs]
        out_runs.append({"method": method, "temperature": temp, "tree": tree,
                         "seeds": [int(s) for s in per_seed], "per_seed": per_seed,
                         "summary": combine_seeds(per_seed, keys_all), "delta_pct": delta,
                         "timing": timing_breakdown(all_recs)})
    return {"definitions": DEFINITIONS, "std_ddof": STD_DDOF,
            "bootstrap": {"resamples": int(n_boot), "seed": int(boot_seed),
                          "unit": "question (stratified by category group; same resample for every method)"},
            "baseline": baseline, "reference": reference, "groups": groups, "runs": out_runs}


def _pm(ms: Optional[dict], digits: int = 2, suffix: str = "") -> str:
    if not ms or ms.get("mean") is None:
        return "-"
    err = ms.get("se")
    return f"{ms['mean']:.{digits}f}{suffix}" + ("" if err is None else f" ± {err:.{digits}f}")


def run_line(run: dict) -> str:
    """One printed line per run, with the SAME tau as the tables (Avg of the groups)."""
    s = run["summary"]
    avg, ov, pooled = s.get("avg", {}), s.get("overall", {}), s.get("pooled", {})
    label = run["method"] + ("" if run["tree"] is None else f" {run['tree']}")
    parts = [f"{label:>18} T={run['temperature']:g} seeds={run['seeds']}:",
             f"Avg tau {_pm(avg.get('tau'))}"]
    if avg.get("tau_expected"):
        parts.append(f"(Rao-Blackwellised {_pm(avg.get('tau_expected'), 3)})")
    parts.append(f"[all steps pooled {_pm(pooled.get('tau'))}]")
    parts.append(f"tokens/s {_pm(ov.get('speed'), 1)}")
    if ov.get("speedup"):
        parts.append(f"speedup {_pm(ov.get('speedup'), 2, 'x')}")
    return "  ".join(parts)


def speed_sentence(run: dict, baseline_name: str = BASELINE) -> Optional[str]:
    """A plain sentence comparing a method's overall speed with plain decoding (None without a baseline)."""
    sp = (run["summary"].get("overall") or {}).get("speedup")
    if not sp or sp.get("mean") is None or run["method"] == baseline_name:
        return None
    x = sp["mean"]
    name = run["method"] + ("" if run["tree"] is None else f" on tree {run['tree']}")
    if x >= 1.0:
        return f"{name} generated {x:.2f}x as many tokens per second as plain decoding ({(x - 1) * 100:.0f}% faster)."
    return (f"{name} was {1 / x:.1f}x SLOWER than plain decoding ({x:.2f}x its tokens per second): "
            f"each cycle costs more than the tokens it gains.")


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description="Spec-Bench metrics (tau, tokens/s, speedup, errors) from answer files.")
    ap.add_argument("paths", nargs="+", help="answer JSONL files or folders of them")
    ap.add_argument("--baseline", default=BASELINE, help="method name of the autoregressive baseline")
    ap.add_argument("--reference", default=REFERENCE, help="method the Delta column compares with")
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples over questions")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    args = ap.parse_args(argv)
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        ap.error(f"paths: not found: {' '.join(missing)}")
    try:
        result = summarize(collect_runs(args.paths), baseline=args.baseline, reference=args.reference,
                           n_boot=args.bootstrap)
    except ValueError as e:
        print(f"evaluation.speed: {e}", file=sys.stderr)
        raise SystemExit(2)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        print("tau = Avg over category groups of mean accepted tokens per step; ± = bootstrap SE over questions")
        for r in result["runs"]:
            print(run_line(r))
        for r in result["runs"]:
            s = speed_sentence(r, args.baseline)
            if s:
                print(s)
        print(f"wrote {args.out}")
    else:
        print(text)
    return result


if __name__ == "__main__":
    main()
