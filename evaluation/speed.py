"""Spec-Bench metrics from answer files: tau, tokens/s, speedup; mean +- std over seeds.

Definitions (per run = one answer file = one method, temperature, tree and seed):

* **tau** (mean accepted tokens, "tokens per target forward") of a set of questions = mean over
  *all* decoding steps of those questions (all turns) of ``accept_lengths`` (accepted draft tokens
  + the bonus/correction token; 1 for the autoregressive baseline).
* **speed** of a question = ``sum(new_tokens) / sum(wall_time)`` over its turns (tokens/s);
  the speed of a set of questions = the mean of its questions' speeds.
* **speedup** = speed of the method / speed of the baseline (method ``"naive"``, same temperature, same
  seed when the baseline has that seed, else the baseline's mean over its seeds), for the same
  category group.

Groups: ``mt_bench`` (the eight MT-Bench sub-categories together), ``translation``,
``summarization``, ``qa``, ``math_reasoning``, ``rag`` (those present), plus

* ``overall``: the same definitions over all questions pooled (Spec-Bench's overall numbers);
* ``avg``: the plain mean of the groups' values (tau and speed; speedup = avg speed / baseline avg
  speed), i.e. a row average as in the paper's "Avg" column.

Across seeds every number is reported as mean and **population std (ddof=0)**; one seed gives std 0.

Output JSON (:func:`summarize`)::

    {"std_ddof": 0, "baseline": "naive", "groups": [...],
     "runs": [{"method", "temperature", "tree" (null for naive), "seeds": [...],
               "per_seed": {"<seed>": {"<group>": {"tau", "speed", "speedup", "n_questions",
                                                  "n_steps", "new_tokens", "wall_time"}}},
               "summary": {"<group>": {"tau": {"mean", "std"}, "speed": {...}, "speedup": {...}}}}]}

Command line::

    python -m evaluation.speed runs/specbench/answers --out runs/specbench/speed.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

from evaluation.questions import CATEGORY_GROUPS, category_group

__all__ = ["STD_DDOF", "load_answers", "flat_accept_lengths", "question_speed", "run_metrics", "mean_std",
           "collect_runs", "summarize", "main"]

STD_DDOF = 0
BASELINE = "naive"


def load_answers(path: os.PathLike | str) -> list[dict]:
    """Answer records of one JSONL file (blank and truncated lines skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def flat_accept_lengths(choice: dict) -> list[int]:
    """All ``accept_lengths`` of a choice: accepts per-turn lists (ours) or one flat list (Spec-Bench)."""
    flat: list[int] = []
    for a in choice.get("accept_lengths", []):
        if isinstance(a, (list, tuple)):
            flat.extend(int(x) for x in a)
        else:
            flat.append(int(a))
    return flat


def question_speed(choice: dict) -> float:
    """``sum(new_tokens) / sum(wall_time)`` of one answer (tokens/s)."""
    t = float(sum(choice["wall_time"]))
    return float(sum(choice["new_tokens"])) / t if t > 0 else float("nan")


def _group_stats(records: Sequence[dict]) -> dict:
    accepts: list[int] = []
    speeds: list[float] = []
    new_tokens = 0
    wall = 0.0
    for r in records:
        c = r["choices"][0]
        accepts.extend(flat_accept_lengths(c))
        speeds.append(question_speed(c))
        new_tokens += int(sum(c["new_tokens"]))
        wall += float(sum(c["wall_time"]))
    return {"tau": sum(accepts) / len(accepts) if accepts else float("nan"),
            "speed": sum(speeds) / len(speeds) if speeds else float("nan"),
            "n_questions": len(records), "n_steps": len(accepts), "new_tokens": new_tokens, "wall_time": wall}


def _order(groups: Iterable[str]) -> list[str]:
    g = set(groups)
    return [x for x in CATEGORY_GROUPS if x in g] + sorted(x for x in g if x not in CATEGORY_GROUPS)


def run_metrics(records: Sequence[dict]) -> dict[str, dict]:
    """Per-group metrics of one run (see the module docstring), keys: groups, ``overall``, ``avg``."""
    by_group: dict[str, list[dict]] = {}
    for r in records:
        by_group.setdefault(category_group(r["category"]), []).append(r)
    out = {g: _group_stats(by_group[g]) for g in _order(by_group)}
    cats = list(out)
    out["overall"] = _group_stats(records)
    out["avg"] = {"tau": sum(out[g]["tau"] for g in cats) / len(cats) if cats else float("nan"),
                  "speed": sum(out[g]["speed"] for g in cats) / len(cats) if cats else float("nan"),
                  "n_questions": out["overall"]["n_questions"], "n_steps": out["overall"]["n_steps"],
                  "new_tokens": out["overall"]["new_tokens"], "wall_time": out["overall"]["wall_time"]}
    return out


def mean_std(values: Sequence[float], ddof: int = STD_DDOF) -> dict:
    """``{"mean", "std"}`` of ``values`` (std with ``ddof``; 0.0 for a single value; NaN if empty)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"mean": float("nan"), "std": float("nan")}
    m = sum(vals) / len(vals)
    if len(vals) - ddof <= 0:
        return {"mean": m, "std": 0.0}
    var = sum((v - m) ** 2 for v in vals) / (len(vals) - ddof)
    return {"mean": m, "std": math.sqrt(var)}


def _answer_files(paths: Iterable[os.PathLike | str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(p.glob("*.jsonl")) if p.is_dir() else [p])
    return files


def collect_runs(paths: Iterable[os.PathLike | str]) -> dict[tuple, dict[int, list[dict]]]:
    """Read answer files (or folders of ``*.jsonl``) and group their records.

    Returns:
        ``{(method, temperature, tree): {seed: [records]}}``; method/temperature/tree/seed come from the
        records' metadata (tree is ``None`` for the baseline). Records of one question id appearing twice
        for the same key and seed are counted once (the first).
    """
    runs: dict[tuple, dict[int, list[dict]]] = {}
    seen: set[tuple] = set()
    for f in _answer_files(paths):
        for r in load_answers(f):
            method = r.get("method")
            if method is None:
                raise ValueError(f"{f}: answer lacks the 'method' metadata field")
            tree = None if method == BASELINE else r.get("tree")
            key = (method, float(r.get("temperature", float("nan"))), tree)
            seed = int(r.get("seed", 0))
            ident = key + (seed, r["question_id"])
            if ident in seen:
                continue
            seen.add(ident)
            runs.setdefault(key, {}).setdefault(seed, []).append(r)
    return runs


def _sort_key(key: tuple):
    method, temp, tree = key
    return (method != BASELINE, temp, "" if tree is None else str(tree), method)


def summarize(runs: dict[tuple, dict[int, list[dict]]], baseline: str = BASELINE) -> dict:
    """Metrics of every run, speedups against the baseline, mean/std over seeds (JSON-ready dict)."""
    per_run = {key: {seed: run_metrics(recs) for seed, recs in sorted(seeds.items())}
               for key, seeds in runs.items()}
    groups = _order({g for m in per_run.values() for s in m.values() for g in s if g not in ("overall", "avg")})
    keys_all = groups + ["overall", "avg"]
    out_runs = []
    for key in sorted(per_run, key=_sort_key):
        method, temp, tree = key
        base = per_run.get((baseline, temp, None))
        per_seed = {}
        for seed, metrics in per_run[key].items():
            row = {}
            for g, m in metrics.items():
                entry = dict(m)
                b_speed = None
                if base:
                    if seed in base and g in base[seed]:
                        b_speed = base[seed][g]["speed"]
                    else:
                        vals = [s[g]["speed"] for s in base.values() if g in s]
                        b_speed = sum(vals) / len(vals) if vals else None
                entry["speedup"] = (m["speed"] / b_speed) if b_speed else None
                row[g] = entry
            per_seed[str(seed)] = row
        summary = {}
        for g in keys_all:
            rows = [r[g] for r in per_seed.values() if g in r]
            if not rows:
                continue
            summary[g] = {k: mean_std([r[k] for r in rows if r[k] is not None]) if any(
                r[k] is not None for r in rows) else None for k in ("tau", "speed", "speedup")}
        out_runs.append({"method": method, "temperature": temp, "tree": tree,
                         "seeds": [int(s) for s in per_seed], "per_seed": per_seed, "summary": summary})
    return {"std_ddof": STD_DDOF, "baseline": baseline, "groups": groups, "runs": out_runs}


def _fmt(ms: Optional[dict], digits: int = 2) -> str:
    if not ms:
        return "-"
    return f"{ms['mean']:.{digits}f}+-{ms['std']:.{digits}f}"


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description="Spec-Bench metrics (tau, tokens/s, speedup) from answer files.")
    ap.add_argument("paths", nargs="+", help="answer JSONL files or folders of them")
    ap.add_argument("--baseline", default=BASELINE, help="method name of the autoregressive baseline")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    args = ap.parse_args(argv)
    result = summarize(collect_runs(args.paths), baseline=args.baseline)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        for r in result["runs"]:
            s = r["summary"].get("overall", {})
            print(f"{r['method']:>10} T={r['temperature']:g} tree={r['tree']} seeds={r['seeds']}: "
                  f"tau {_fmt(s.get('tau'))}  tokens/s {_fmt(s.get('speed'), 1)}  speedup {_fmt(s.get('speedup'))}")
        print(f"wrote {args.out}")
    else:
        print(text)
    return result


if __name__ == "__main__":
    main()
