"""Plots of the main job (PNG, matplotlib Agg backend), one fixed colour per method everywhere.

From :mod:`evaluation.speed` JSON (one temperature and tree, as Table 1):

* :func:`plot_tau_by_group`: tau per category group and Avg, one bar per method, error bars = the
  bootstrap SE over questions (none drawn where it is unknown);
* :func:`plot_speedup`: overall speedup over plain decoding per method (line at 1 = plain decoding);
* :func:`plot_time_breakdown`: stacked shares of drafting, target forward, target laws, verification,
  cache update and the rest, per method.

From :mod:`evaluation.exact_tau` JSON: :func:`plot_exact_tau` (exact expected tau per group, errors
over questions). Across runs: :func:`plot_tau_vs_depth` and :func:`plot_tau_vs_temperature`.

Colours: :func:`method_color` (fixed for the paper's methods; any other registered verifier gets a
colour from its name, the same in every plot and run).

Command line::

    python -m evaluation.plots runs/specbench/speed.json --exact runs/specbench/exact_tau.json --out-dir runs/specbench
"""
from __future__ import annotations

import argparse
import json
import re
import zlib
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from evaluation.tables import GROUP_LABELS, PART_LABELS, method_label, order_methods, table1  # noqa: E402

__all__ = ["METHOD_COLORS", "method_color", "tree_depth", "plot_tau_by_group", "plot_exact_tau", "plot_speedup",
           "plot_time_breakdown", "plot_tau_vs_depth", "plot_tau_vs_temperature", "main_job_plots", "main"]

METHOD_COLORS = {"naive": "#7f7f7f", "rrsw": "#1f77b4", "traversal": "#ff7f0e", "greedy": "#2ca02c",
                 "univer": "#d62728", "argmax": "#8c564b"}
_SPARE = ("#9467bd", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#8c6d31", "#843c39", "#7b4173")
PART_COLORS = {"draft": "#4c72b0", "target_forward": "#dd8452", "target_laws": "#937860", "verify": "#c44e52",
               "cache_update": "#8172b3", "other": "#bbbbbb"}


def method_color(method: str) -> str:
    """The method's colour: fixed for known names, else chosen by a stable hash of the name."""
    return METHOD_COLORS.get(method) or _SPARE[zlib.crc32(method.encode()) % len(_SPARE)]


def tree_depth(tree: str) -> tuple[str, int]:
    """``(family, depth)`` of a tree name; raises ``ValueError`` for names it cannot read."""
    s = str(tree).lower()
    m = re.fullmatch(r"(\d+)x(\d+)", s)
    if m:
        return f"{m.group(1)}x*", int(m.group(2))
    m = re.fullmatch(r"chain(\d+)", s)
    if m:
        return "chain", int(m.group(1))
    if s in ("mc_sim_7b_63", "eagle", "mc_sim_7b"):
        return "mc_sim_7b_63", 5
    raise ValueError(f"cannot read a depth from tree {tree!r}")


def _grouped_bars(ax, groups: list[str], series: list[tuple[str, list, list]], ylabel: str) -> None:
    """``series`` = [(method, values per group, SE per group or None)]; one bar per method per group."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (m, vals, errs) in enumerate(series):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ys = [float("nan") if v is None else v for v in vals]
        yerr = None
        if any(e is not None for e in errs):
            yerr = [0.0 if e is None else e for e in errs]
        ax.bar(xs, ys, width=width * 0.95, color=method_color(m), label=method_label(m),
               yerr=yerr, capsize=2 if yerr else 0, ecolor="black", error_kw={"linewidth": 0.8})
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20)
    ax.set_ylabel(ylabel)
    finite = [v for _, vals, _ in series for v in vals if v is not None]
    tops = [v + (e or 0.0) for _, vals, errs in series for v, e in zip(vals, errs) if v is not None]
    bottoms = [v - (e or 0.0) for _, vals, errs in series for v, e in zip(vals, errs) if v is not None]
    if finite:  # bars start at 0: a truncated axis exaggerates differences between methods
        hi = max(tops)
        ax.set_ylim(0.0, hi * 1.12 + 0.05)


def _vals(cells: dict, keys: list[str]):
    vals = [(cells.get(k) or {}).get("mean") for k in keys]
    errs = [(cells.get(k) or {}).get("se") for k in keys]
    return vals, errs


def _smoke(title: str, note: Optional[str]) -> str:
    """The title, prefixed with "SMOKE RUN" when the run carries a smoke-run note."""
    return f"SMOKE RUN (not a benchmark) — {title}" if note else title


def plot_tau_by_group(speed: dict, out_path, temperature: Optional[float] = None, tree: Optional[str] = None,
                      expected: bool = False, note: Optional[str] = None) -> Path:
    """Sampled (or, with ``expected=True``, Rao-Blackwellised) tau per group + Avg, per method, ± SE."""
    t = table1(speed, temperature, tree)
    keys = list(t["groups"])
    labels = [GROUP_LABELS.get(g, g) for g in keys] + ["Avg"]
    series = []
    for row in t["rows"]:
        cells = dict(row["tau_expected" if expected else "tau"])
        cells["avg"] = row["avg_tau_expected" if expected else "avg_tau"]
        vals, errs = _vals(cells, keys + ["avg"])
        series.append((row["method"], vals, errs))
    fig, ax = plt.subplots(figsize=(8, 4))
    _grouped_bars(ax, labels, series, "τ (tokens per target forward)")
    what = "Rao-Blackwellised τ" if expected else "τ"
    ax.set_title(_smoke(f"{what} per category group, T={t['temperature']:g}, tree {t['tree']} (± bootstrap SE)", note),
                 fontsize=9)
    return _save(fig, ax, out_path, legend=bool(series))


def plot_exact_tau(exact: dict, out_path, note: Optional[str] = None) -> Path:
    """Exact expected tau on shared contexts (:mod:`evaluation.exact_tau` JSON), per group + Avg, ± SE."""
    keys = list(exact["groups"])
    labels = [GROUP_LABELS.get(g, g) for g in keys] + ["Avg"]
    series = []
    for row in exact["rows"]:
        cells = dict(row["tau"])
        cells["avg"] = row["avg_tau"]
        vals, errs = _vals(cells, keys + ["avg"])
        series.append((row["method"], vals, errs))
    fig, ax = plt.subplots(figsize=(8, 4))
    _grouped_bars(ax, labels, series, "E[tokens per cycle]")
    ax.set_title(_smoke(f"Exact expected τ on {exact.get('n_contexts', '?')} shared contexts, "
                        f"T={exact.get('temperature', 0):g}, tree {exact.get('tree')} (± SE over questions)", note),
                 fontsize=9)
    return _save(fig, ax, out_path, legend=bool(series))


def plot_speedup(speed: dict, out_path, temperature: Optional[float] = None, tree: Optional[str] = None,
                 speed_tree: Optional[str] = None, note: Optional[str] = None) -> Path:
    """Overall speedup over plain decoding per method and tree (± bootstrap SE), dashed line at 1
    (in the legend, so it covers no bar); ``speed_tree`` adds that tree's runs (labelled by tree)."""
    t = table1(speed, temperature, tree)
    rows = [(r, t["tree"]) for r in t["rows"] if r["speedup"]]
    if speed_tree is not None:
        rows += [(r, speed_tree) for r in table1(speed, temperature, speed_tree)["rows"] if r["speedup"]]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4))
    for i, (r, tr) in enumerate(rows):
        se = r["speedup"].get("se")
        ax.bar(i, r["speedup"]["mean"], color=method_color(r["method"]), yerr=None if se is None else se,
               capsize=3, hatch="//" if tr != t["tree"] else None, edgecolor="white")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="plain decoding (1.0)")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{method_label(r['method'])}\n{tr}" for r, tr in rows], fontsize=8)
    ax.set_ylabel("speedup (tokens/s ÷ plain decoding)")
    ax.set_ylim(0.0, max([1.0] + [r["speedup"]["mean"] + (r["speedup"].get("se") or 0) for r, _ in rows]) * 1.15)
    ax.set_title(_smoke(f"Speedup over plain decoding, T={t['temperature']:g}", note), fontsize=9)
    return _save(fig, ax, out_path, legend=True)


def plot_time_breakdown(speed: dict, out_path, temperature: Optional[float] = None,
                        tree: Optional[str] = None, note: Optional[str] = None) -> Optional[Path]:
    """Stacked shares of the engine's timed parts per method; None when no run has timing."""
    t = table1(speed, temperature, tree)
    rows = [r for r in t["rows"] if r.get("timing")]
    if not rows:
        return None
    parts = [p for p in PART_LABELS if any(p in r["timing"]["share"] for r in rows)]
    parts += sorted({p for r in rows for p in r["timing"]["share"]} - set(parts))
    fig, ax = plt.subplots(figsize=(7, 4))
    bottoms = [0.0] * len(rows)
    for p in parts:
        vals = [100 * (r["timing"]["share"].get(p) or 0.0) for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottoms, color=PART_COLORS.get(p), label=PART_LABELS.get(p, p))
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([method_label(r["method"]) for r in rows])
    for lab, r in zip(ax.get_xticklabels(), rows):
        lab.set_color(method_color(r["method"]))
    ax.set_ylabel("% of timed seconds")
    ax.set_ylim(0, 100)
    ax.set_title(_smoke(f"Where the time goes, T={t['temperature']:g}, tree {t['tree']}", note), fontsize=9)
    return _save(fig, ax, out_path, legend=True, legend_out=True)


def plot_tau_vs_depth(speed: dict, out_path, temperature: Optional[float] = None,
                      methods: Optional[Sequence[str]] = None) -> Path:
    """Avg tau against tree depth, one line per (method, tree family), at one temperature."""
    base = speed.get("baseline", "naive")
    runs = [r for r in speed["runs"] if r["method"] != base and r["tree"] is not None
            and (methods is None or r["method"] in methods)]
    if temperature is None and runs:
        temperature = runs[0]["temperature"]
    series: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    for r in runs:
        if abs(float(r["temperature"]) - float(temperature)) > 1e-9:
            continue
        try:
            fam, depth = tree_depth(r["tree"])
        except ValueError:
            continue
        t = r["summary"]["avg"]["tau"]
        series.setdefault((r["method"], fam), []).append((depth, t["mean"], t.get("se") or 0.0))
    fig, ax = plt.subplots(figsize=(6, 4))
    for (method, fam), pts in sorted(series.items()):
        pts.sort()
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    color=method_color(method), label=f"{method_label(method)} ({fam})")
    ax.set_xlabel("tree depth (draft steps)")
    ax.set_ylabel("Avg τ (tokens per target forward)")
    ax.set_title(f"τ vs depth, temperature {temperature:g}" if temperature is not None else "τ vs depth")
    return _save(fig, ax, out_path, legend=bool(series))


def plot_tau_vs_temperature(speed: dict, out_path, tree: Optional[str] = None,
                            methods: Optional[Sequence[str]] = None) -> Path:
    """Avg tau against temperature for one tree (default: the first method run's)."""
    base = speed.get("baseline", "naive")
    runs = [r for r in speed["runs"] if r["method"] != base and r["tree"] is not None
            and (methods is None or r["method"] in methods)]
    if tree is None and runs:
        tree = runs[0]["tree"]
    fig, ax = plt.subplots(figsize=(6, 4))
    any_line = False
    for m in order_methods(r["method"] for r in runs):
        pts = sorted((float(r["temperature"]), r["summary"]["avg"]["tau"]["mean"],
                      r["summary"]["avg"]["tau"].get("se") or 0.0) for r in runs if r["method"] == m and r["tree"] == tree)
        if pts:
            any_line = True
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                        color=method_color(m), label=method_label(m))
    ax.set_xlabel("temperature")
    ax.set_ylabel("Avg τ (tokens per target forward)")
    ax.set_title(f"τ vs temperature, tree {tree}")
    return _save(fig, ax, out_path, legend=any_line)


def _save(fig, ax, out_path, legend: bool, legend_out: bool = False) -> Path:
    """Grid, optional legend, write the PNG (parent folders created), close the figure."""
    ax.grid(alpha=0.3, axis="y")
    if legend:
        if legend_out:
            ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
        else:
            ax.legend(fontsize=8)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main_job_plots(speed: dict, out_dir, exact: Optional[dict] = None, temperature: Optional[float] = None,
                   tree: Optional[str] = None, note: Optional[str] = None,
                   speed_tree: Optional[str] = None) -> list[Path]:
    """Every plot of the main job into ``out_dir``: tau_by_group.png, tau_expected_by_group.png (when the
    engine reported expected tau), exact_tau.png (with ``exact``), speedup.png (both trees),
    time_breakdown.png. ``note`` (a smoke run's) marks every title."""
    out_dir = Path(out_dir)
    paths = [plot_tau_by_group(speed, out_dir / "tau_by_group.png", temperature, tree, note=note)]
    t = table1(speed, temperature, tree)
    if any(r["avg_tau_expected"] for r in t["rows"]):
        paths.append(plot_tau_by_group(speed, out_dir / "tau_expected_by_group.png", temperature, tree, expected=True,
                                       note=note))
    if exact is not None:
        paths.append(plot_exact_tau(exact, out_dir / "exact_tau.png", note=note))
    if any(r["speedup"] for r in t["rows"]) or speed_tree is not None:
        paths.append(plot_speedup(speed, out_dir / "speedup.png", temperature, tree, speed_tree=speed_tree, note=note))
    tb = plot_time_breakdown(speed, out_dir / "time_breakdown.png", temperature, tree, note=note)
    if tb is not None:
        paths.append(tb)
    return paths


def main(argv: Optional[Sequence[str]] = None) -> list[Path]:
    ap = argparse.ArgumentParser(description="Main-job plots (PNG) from evaluation.speed / exact_tau JSON.")
    ap.add_argument("speed_json")
    ap.add_argument("--exact", default=None, help="evaluation.exact_tau JSON (adds exact_tau.png)")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--tree", default=None)
    ap.add_argument("--across-runs", action="store_true", help="also tau vs depth and tau vs temperature")
    args = ap.parse_args(argv)
    speed = json.loads(Path(args.speed_json).read_text(encoding="utf-8"))
    exact = json.loads(Path(args.exact).read_text(encoding="utf-8")) if args.exact else None
    out = main_job_plots(speed, args.out_dir, exact, args.temperature, args.tree)
    if args.across_runs:
        out += [plot_tau_vs_depth(speed, Path(args.out_dir) / "tau_vs_depth.png", args.temperature),
                plot_tau_vs_temperature(speed, Path(args.out_dir) / "tau_vs_temperature.png", args.tree)]
    for p in out:
        print(f"wrote {p}")
    return out


if __name__ == "__main__":
    main()
