"""The paper's tables from :mod:`evaluation.speed` JSON, as Markdown (.md) and JSON (.json).

* **Table 1/2 layout** (one temperature, one tree): rows = methods (RRSw, Traversal, Greedy, UniVer);
  columns = tau per category group (MT-bench, Translation, Summarization, QA, Math, RAG), the average
  tau ("Avg": mean of the category columns), its change over RRSw in percent
  (``100 * (avg / avg_rrsw - 1)``, from the seed means), mean tokens/s over all questions and the
  speedup over the autoregressive baseline (``naive``). A footer gives the baseline's tokens/s.
* **Table 3 layout**: rows = (temperature, tree), columns = methods, cells = average tau.

Cells are ``mean ± std`` (population std over seeds, ddof=0) when a run has several seeds, else the
mean alone. tau with 2 decimals, tokens/s with 1, speedup with 2 and a trailing ``x``.

Command line::

    python -m evaluation.tables runs/specbench/speed.json --temperature 1.0 --tree 2x5 \\
        --out-prefix runs/specbench/table
    # writes table1.md/.json (and table3.md/.json), prints Table 1
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["METHOD_LABELS", "GROUP_LABELS", "DEFAULT_METHODS", "table1", "render_table1", "table3",
           "render_table3", "main"]

DEFAULT_METHODS = ("rrsw", "traversal", "greedy", "univer")
METHOD_LABELS = {"rrsw": "RRSw", "traversal": "Traversal", "greedy": "Greedy", "univer": "UniVer",
                 "naive": "Autoregressive"}
GROUP_LABELS = {"mt_bench": "MT-bench", "translation": "Translation", "summarization": "Summarization",
                "qa": "QA", "math_reasoning": "Math", "rag": "RAG"}


def _find(speed: dict, method: str, temperature: float, tree: Optional[str]) -> Optional[dict]:
    for r in speed["runs"]:
        if r["method"] == method and abs(float(r["temperature"]) - float(temperature)) < 1e-9 and (
                method == speed.get("baseline", "naive") or r["tree"] == tree):
            return r
    return None


def _cell(ms: Optional[dict], digits: int, n_seeds: int, suffix: str = "") -> str:
    if not ms or ms.get("mean") is None:
        return "-"
    if n_seeds > 1:
        return f"{ms['mean']:.{digits}f} ± {ms['std']:.{digits}f}{suffix}"
    return f"{ms['mean']:.{digits}f}{suffix}"


def table1(speed: dict, temperature: Optional[float] = None, tree: Optional[str] = None,
           methods: Sequence[str] = DEFAULT_METHODS, reference: str = "rrsw") -> dict:
    """Structured Table 1/2 for one (temperature, tree); defaults: the first non-baseline run's.

    Returns:
        ``{"temperature", "tree", "groups", "rows": [{"method", "n_seeds", "tau": {group: {mean,std}},
        "avg_tau", "delta_pct", "tokens_per_s", "speedup"}], "baseline": {"tokens_per_s", "n_seeds"} | None}``
        (missing methods are left out).
    """
    base_name = speed.get("baseline", "naive")
    if temperature is None or tree is None:
        first = next((r for r in speed["runs"] if r["method"] != base_name), None)
        if first is None:
            raise ValueError("no method runs in the speed JSON")
        temperature = first["temperature"] if temperature is None else temperature
        tree = first["tree"] if tree is None else tree
    groups = list(speed["groups"])
    rows = []
    for m in methods:
        r = _find(speed, m, temperature, tree)
        if r is None:
            continue
        s = r["summary"]
        rows.append({"method": m, "n_seeds": len(r["seeds"]),
                     "tau": {g: s[g]["tau"] for g in groups if g in s},
                     "avg_tau": s["avg"]["tau"], "tokens_per_s": s["overall"]["speed"],
                     "speedup": s["overall"]["speedup"], "delta_pct": None})
    ref = next((row for row in rows if row["method"] == reference), None)
    if ref is not None:
        for row in rows:
            if row is not ref:
                row["delta_pct"] = 100.0 * (row["avg_tau"]["mean"] / ref["avg_tau"]["mean"] - 1.0)
    b = _find(speed, base_name, temperature, None)
    baseline = None if b is None else {"tokens_per_s": b["summary"]["overall"]["speed"], "n_seeds": len(b["seeds"])}
    return {"temperature": float(temperature), "tree": tree, "groups": groups, "reference": reference,
            "rows": rows, "baseline": baseline}


def render_table1(t: dict) -> str:
    """Markdown of :func:`table1`'s result (title line, table, footer line), ending in a newline."""
    heads = ([GROUP_LABELS.get(g, g) for g in t["groups"]]
             + ["Avg τ", f"Δ vs {METHOD_LABELS.get(t['reference'], t['reference'])}", "Tokens/s", "Speedup"])
    lines = [f"Temperature {t['temperature']:g}, tree {t['tree']}: τ = tokens per target forward",
             "",
             "| Method | " + " | ".join(heads) + " |",
             "|---|" + "---:|" * len(heads)]
    for row in t["rows"]:
        n = row["n_seeds"]
        cells = [_cell(row["tau"].get(g), 2, n) for g in t["groups"]]
        cells.append(_cell(row["avg_tau"], 2, n))
        cells.append("-" if row["delta_pct"] is None else f"{row['delta_pct']:+.1f}%")
        cells.append(_cell(row["tokens_per_s"], 1, n))
        cells.append(_cell(row["speedup"], 2, n, "x"))
        lines.append(f"| {METHOD_LABELS.get(row['method'], row['method'])} | " + " | ".join(cells) + " |")
    lines.append("")
    b = t["baseline"]
    base_txt = ("no autoregressive baseline" if b is None else
                f"autoregressive baseline {_cell(b['tokens_per_s'], 1, b['n_seeds'])} tokens/s")
    n_seeds = max([r["n_seeds"] for r in t["rows"]] or [1])
    lines.append(f"Avg = mean of the category columns; {base_txt}; ± = std over {n_seeds} seed(s) (ddof=0).")
    return "\n".join(lines) + "\n"


def table3(speed: dict, methods: Sequence[str] = DEFAULT_METHODS) -> dict:
    """Structured Table 3: ``{"methods", "rows": [{"temperature", "tree", "avg_tau": {method: {mean,std}},
    "n_seeds": {method: int}}]}`` over every (temperature, tree) with at least one method run."""
    configs = sorted({(float(r["temperature"]), r["tree"]) for r in speed["runs"]
                      if r["method"] in methods and r["tree"] is not None}, key=lambda c: (c[0], str(c[1])))
    rows = []
    for temp, tree in configs:
        taus, seeds = {}, {}
        for m in methods:
            r = _find(speed, m, temp, tree)
            if r is not None:
                taus[m] = r["summary"]["avg"]["tau"]
                seeds[m] = len(r["seeds"])
        rows.append({"temperature": temp, "tree": tree, "avg_tau": taus, "n_seeds": seeds})
    return {"methods": list(methods), "rows": rows}


def render_table3(t: dict) -> str:
    """Markdown of :func:`table3`'s result, ending in a newline."""
    lines = ["Average τ by temperature and tree", "",
             "| Temperature | Tree | " + " | ".join(METHOD_LABELS.get(m, m) for m in t["methods"]) + " |",
             "|---:|---|" + "---:|" * len(t["methods"])]
    for row in t["rows"]:
        cells = [_cell(row["avg_tau"].get(m), 2, row["n_seeds"].get(m, 1)) for m in t["methods"]]
        lines.append(f"| {row['temperature']:g} | {row['tree']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _write(prefix: Path, name: str, md: str, data: dict) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}{name}.md").write_text(md, encoding="utf-8")
    Path(f"{prefix}{name}.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(description="Paper-style tables from evaluation.speed JSON.")
    ap.add_argument("speed_json")
    ap.add_argument("--temperature", type=float, default=None, help="Table 1: temperature (default: first run's)")
    ap.add_argument("--tree", default=None, help="Table 1: tree (default: first run's)")
    ap.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    ap.add_argument("--out-prefix", default=None,
                    help="write PREFIX1.md/.json and PREFIX3.md/.json (e.g. runs/x/table -> runs/x/table1.md)")
    args = ap.parse_args(argv)
    speed = json.loads(Path(args.speed_json).read_text(encoding="utf-8"))
    t1 = table1(speed, args.temperature, args.tree, args.methods)
    md1 = render_table1(t1)
    t3 = table3(speed, args.methods)
    md3 = render_table3(t3)
    if args.out_prefix:
        _write(Path(args.out_prefix), "1", md1, t1)
        _write(Path(args.out_prefix), "3", md3, t3)
    print(md1)
    if len(t3["rows"]) > 1:
        print(md3)
    return md1


if __name__ == "__main__":
    main()
