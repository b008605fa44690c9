"""The paper's tables from :mod:`evaluation.speed` JSON, as Markdown (.md) and JSON (.json).

* **Table 1/2 layout** (one temperature, one tree): rows = methods (every method run in the JSON,
  the paper's order first); columns = tau per category group (MT-bench, Translation, Summarization,
  QA, Math, RAG), "Avg" (mean of the group columns, the ONE tau of :mod:`evaluation.speed`), its
  change over the reference (RRSw) in percent, mean tokens/s over all questions and the speedup over
  plain decoding. Cells are ``mean ± SE`` (bootstrap standard error over questions, paired across
  methods for the Delta column); the mean alone when the SE is unknown (a group with one question).
  Below it, when the engine reported them, the same layout for the Rao-Blackwellised tau (exact
  E[tokens per cycle | drafted tree] at every cycle of the same runs) and the time breakdown.
* **Table 3 layout**: rows = (temperature, tree), columns = methods, cells = Avg tau ± SE.

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

from evaluation.arguments import PAPER_METHODS

__all__ = ["METHOD_LABELS", "GROUP_LABELS", "PART_LABELS", "method_label", "order_methods", "table1", "tree_label", "render_speed_table",
           "render_table1", "render_timing", "table3", "render_table3", "main"]

#: display names; a verifier without an entry is shown by its registry name
METHOD_LABELS = {"rrsw": "RRSw", "traversal": "Traversal", "greedy": "Greedy", "univer": "UniVer",
                 "naive": "Autoregressive", "argmax": "Argmax (T=0)"}
GROUP_LABELS = {"mt_bench": "MT-bench", "translation": "Translation", "summarization": "Summarization",
                "qa": "QA", "math_reasoning": "Math", "rag": "RAG"}
PART_LABELS = {"draft": "Drafting", "target_forward": "Target forward", "target_laws": "Target laws",
               "verify": "Verification", "cache_update": "Cache update", "other": "Other"}


def method_label(m: str) -> str:
    return METHOD_LABELS.get(m, m)


def order_methods(methods) -> list[str]:
    """The paper's four in its order, then any other method sorted by name."""
    ms = list(dict.fromkeys(methods))
    return [m for m in PAPER_METHODS if m in ms] + sorted(m for m in ms if m not in PAPER_METHODS)


def _find(speed: dict, method: str, temperature: float, tree: Optional[str]) -> Optional[dict]:
    for r in speed["runs"]:
        if r["method"] == method and abs(float(r["temperature"]) - float(temperature)) < 1e-9 and (
                method == speed.get("baseline", "naive") or r["tree"] == tree):
            return r
    return None


def _cell(ms: Optional[dict], digits: int, suffix: str = "", sign: bool = False) -> str:
    if not ms or ms.get("mean") is None:
        return "-"
    fmt = f"{{:{'+' if sign else ''}.{digits}f}}"
    txt = fmt.format(ms["mean"]) + suffix
    if ms.get("se") is not None:
        txt += f" ± {ms['se']:.{digits}f}"
    return txt


def table1(speed: dict, temperature: Optional[float] = None, tree: Optional[str] = None,
           methods: Optional[Sequence[str]] = None, reference: Optional[str] = None) -> dict:
    """Structured Table 1/2 for one (temperature, tree); defaults: the first non-baseline run's.

    Args:
        methods: rows; default every non-baseline method of that configuration in the JSON.
        reference: the Delta column's method (default the JSON's ``reference``, ``rrsw``).

    Returns:
        ``{"temperature", "tree", "groups", "reference", "n_seeds", "n_questions": {group: int},
        "rows": [{"method", "n_seeds", "tau": {group: {mean,std,se}}, "avg_tau", "tau_expected": {...},
        "avg_tau_expected", "delta_pct", "delta_pct_expected", "tokens_per_s", "speedup", "timing"}],
        "baseline": {"tokens_per_s", "n_seeds"} | None}``.

    Raises:
        ValueError: no method run in the JSON.
    """
    base_name = speed.get("baseline", "naive")
    reference = reference or speed.get("reference", "rrsw")
    if temperature is None or tree is None:
        first = next((r for r in speed["runs"] if r["method"] != base_name), None)
        if first is None:
            raise ValueError("no method runs in the speed JSON")
        temperature = first["temperature"] if temperature is None else temperature
        tree = first["tree"] if tree is None else tree
    if methods is None:
        methods = order_methods(r["method"] for r in speed["runs"] if r["method"] != base_name
                                and abs(float(r["temperature"]) - float(temperature)) < 1e-9 and r["tree"] == tree)
    groups = list(speed["groups"])
    rows = []
    n_q: dict[str, int] = {}
    for m in methods:
        r = _find(speed, m, temperature, tree)
        if r is None:
            continue
        s = r["summary"]
        d = r.get("delta_pct") or {}
        for g in groups:
            seed0 = next(iter(r["per_seed"].values()), {})
            if g in seed0:
                n_q[g] = seed0[g]["n_questions"]
        rows.append({"method": m, "n_seeds": len(r["seeds"]),
                     "tau": {g: s[g]["tau"] for g in groups if g in s},
                     "avg_tau": s["avg"]["tau"],
                     "tau_expected": {g: s[g].get("tau_expected") for g in groups if g in s},
                     "avg_tau_expected": s["avg"].get("tau_expected"),
                     "delta_pct": d.get("tau"), "delta_pct_expected": d.get("tau_expected"),
                     "tokens_per_s": s["overall"]["speed"], "speedup": s["overall"]["speedup"],
                     "timing": r.get("timing")})
    b = _find(speed, base_name, temperature, None)
    baseline = None if b is None else {"tokens_per_s": b["summary"]["overall"]["speed"], "n_seeds": len(b["seeds"])}
    return {"temperature": float(temperature), "tree": tree, "groups": groups, "reference": reference,
            "n_seeds": max([r["n_seeds"] for r in rows] or [0]), "n_questions": n_q, "rows": rows,
            "baseline": baseline, "bootstrap": speed.get("bootstrap")}


def _tau_table(t: dict, key: str, avg_key: str, delta_key: str, speed: bool = True) -> list[str]:
    heads = ([GROUP_LABELS.get(g, g) for g in t["groups"]]
             + ["Avg τ", f"Δ vs {method_label(t['reference'])}"] + (["Tokens/s", "Speedup"] if speed else []))
    lines = ["| Method | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for row in t["rows"]:
        cells = [_cell(row[key].get(g), 2) for g in t["groups"]]
        cells.append(_cell(row[avg_key], 2))
        cells.append("-" if row["method"] == t["reference"] else _cell(row[delta_key], 1, "%", sign=True))
        if speed:
            cells.append(_cell(row["tokens_per_s"], 1))
            cells.append(_cell(row["speedup"], 2, "x"))
        lines.append(f"| {method_label(row['method'])} | " + " | ".join(cells) + " |")
    return lines


def render_timing(t: dict) -> str:
    """Markdown of the time breakdown of Table 1's rows ('' when no row has engine timing)."""
    rows = [r for r in t["rows"] if r.get("timing")]
    if not rows:
        return ""
    parts = [p for p in PART_LABELS if any(p in r["timing"]["seconds"] for r in rows)]
    extra = sorted({p for r in rows for p in r["timing"]["seconds"]} - set(parts))
    parts += extra
    lines = ["Where the time goes (engine per-part timing, share of the timed parts; summed over all turns)", "",
             "| Method | " + " | ".join(PART_LABELS.get(p, p) for p in parts) + " | Timed s | Wall s |",
             "|---|" + "---:|" * (len(parts) + 2)]
    for r in rows:
        tm = r["timing"]
        cells = [("-" if tm["share"].get(p) is None else f"{100 * tm['share'][p]:.0f}%") for p in parts]
        cells += [f"{sum(tm['seconds'].values()):.1f}", f"{tm['wall_time']:.1f}"]
        lines.append(f"| {method_label(r['method'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_table1(t: dict, note: Optional[str] = None) -> str:
    """Markdown of :func:`table1`'s result: title, the sampled-tau table, footer; then (when present) the
    Rao-Blackwellised table and the time breakdown. Ends in a newline."""
    nq = t.get("n_questions") or {}
    nq_txt = ", ".join(f"{GROUP_LABELS.get(g, g)} {n}" for g, n in nq.items())
    title = (f"Temperature {t['temperature']:g}, tree {tree_label(t)}: τ = mean accepted tokens per decoding step "
             f"(accepted draft tokens + 1), per category group; Avg = mean of the groups")
    lines = ([f"**{note}**", ""] if note else []) + [title, ""]
    if t.get("coincide"):
        lines += [f"**{t['coincide']}**", ""]
    lines += _tau_table(t, "tau", "avg_tau", "delta_pct")
    lines.append("")
    b = t["baseline"]
    base_txt = ("no plain-decoding baseline" if b is None else
                f"plain decoding (autoregressive) {_cell(b['tokens_per_s'], 1)} tokens/s")
    boot = t.get("bootstrap") or {}
    any_se = any((row["avg_tau"] or {}).get("se") is not None for row in t["rows"])
    err_txt = (f"± = bootstrap standard error over questions ({boot.get('resamples', '?')} resamples, stratified "
               f"by group, paired across methods for Δ)" if any_se else
               "no errors shown: a group has fewer than 2 questions (nothing to resample)")
    lines.append(f"Questions per group: {nq_txt or '-'}; seeds: {t['n_seeds']}; {base_txt}; {err_txt}.")
    stds = [(row["method"], (row["avg_tau"] or {}).get("std")) for row in t["rows"]]
    if t["n_seeds"] > 1 and any(s is not None for _, s in stds):
        lines.append("Std of Avg τ over seeds (ddof=1): " + ", ".join(
            f"{method_label(m)} {s:.3f}" for m, s in stds if s is not None) + ".")
    if any(row["avg_tau_expected"] for row in t["rows"]):
        lines += ["", "Rao-Blackwellised τ of the same runs: at every cycle the exact E[tokens per cycle | drafted "
                      "tree] from the verifier's outcome law (same definitions; agrees with τ above within errors)",
                  ""]
        lines += _tau_table(t, "tau_expected", "avg_tau_expected", "delta_pct_expected", speed=False)
    timing = render_timing(t)
    if timing:
        lines += ["", timing.rstrip("\n")]
    return "\n".join(lines) + "\n"


def tree_label(t: dict) -> str:
    """``2x5``, or ``auto (8 nodes, depth 3: [[0], [0, 0], ...])`` for a fitted tree with its choices."""
    choices = t.get("tree_choices")
    if not choices:
        return str(t["tree"])
    depth = max(len(c) for c in choices)
    return f"{t['tree']} ({len(choices)} nodes, depth {depth}: {choices})"


def render_speed_table(t: dict, note: Optional[str] = None) -> str:
    """Markdown of the speed table: :func:`table1`'s result on the speed tree, tokens/s and speedup
    over plain decoding (interleaved with it question by question), τ for reference. Ends in a newline."""
    lines = ([f"**{note}**", ""] if note else [])
    from eagle.tree.dynamic import is_dynamic_tree

    where = ("the tree fitted to this machine" if t["tree"] == "auto" else
             "an EAGLE-2 dynamic tree (its shape chosen each cycle from the draft laws)" if is_dynamic_tree(t["tree"])
             else "the speed tree")
    lines += [f"Speed on {where}: temperature {t['temperature']:g}, tree {tree_label(t)}", "",
              "| Method | Avg τ | Tokens/s | Speedup |", "|---|---:|---:|---:|"]
    b = t["baseline"]
    if b is not None:
        lines.append(f"| plain decoding | 1.00 | {_cell(b['tokens_per_s'], 1)} | 1.00x |")
    for row in t["rows"]:
        lines.append(f"| {method_label(row['method'])} | {_cell(row['avg_tau'], 2)} | {_cell(row['tokens_per_s'], 1)} | "
                     f"{_cell(row['speedup'], 2, 'x')} |")
    lines += ["", "Speedup = tokens/s over plain decoding's on the same questions (± bootstrap SE over questions); "
                  "the verifiers are compared in Table 1, on the paper's tree."]
    return "\n".join(lines) + "\n"


def table3(speed: dict, methods: Optional[Sequence[str]] = None) -> dict:
    """Structured Table 3: ``{"methods", "rows": [{"temperature", "tree", "avg_tau": {method: {mean,std,se}},
    "n_seeds": {method: int}}]}`` over every (temperature, tree) with at least one method run."""
    base = speed.get("baseline", "naive")
    if methods is None:
        methods = order_methods(r["method"] for r in speed["runs"] if r["method"] != base)
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
    lines = ["Avg τ (mean of the category groups) by temperature and tree; ± = bootstrap SE over questions", "",
             "| Temperature | Tree | " + " | ".join(method_label(m) for m in t["methods"]) + " |",
             "|---:|---|" + "---:|" * len(t["methods"])]
    for row in t["rows"]:
        cells = [_cell(row["avg_tau"].get(m), 2) for m in t["methods"]]
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
    ap.add_argument("--methods", nargs="+", default=None, help="rows (default: every method in the JSON)")
    ap.add_argument("--note", default=None, help="a bold line above Table 1 (e.g. 'SMOKE RUN')")
    ap.add_argument("--out-prefix", default=None,
                    help="write PREFIX1.md/.json and PREFIX3.md/.json (e.g. runs/x/table -> runs/x/table1.md)")
    args = ap.parse_args(argv)
    speed = json.loads(Path(args.speed_json).read_text(encoding="utf-8"))
    t1 = table1(speed, args.temperature, args.tree, args.methods)
    md1 = render_table1(t1, args.note)
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
