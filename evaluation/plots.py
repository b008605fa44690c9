"""Plots from :mod:`evaluation.speed` JSON (PNG, matplotlib Agg backend).

* :func:`plot_tau_vs_depth`: average tau against tree depth, one line per (method, tree family),
  at one temperature. Depth is read from the tree name: ``KxD`` -> D (family ``Kx*``), ``chainD`` -> D
  (family ``chain``), ``mc_sim_7b_63`` -> 5 (family ``mc_sim_7b_63``). Run e.g. trees 2x1..2x5 or
  chain1..chain6 to fill it.
* :func:`plot_tau_vs_temperature`: average tau against temperature, one line per method, one tree.

Error bars are the std over seeds (ddof=0).

Command line::

    python -m evaluation.plots runs/specbench/speed.json --out-dir runs/specbench/plots
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from evaluation.tables import DEFAULT_METHODS, METHOD_LABELS  # noqa: E402

__all__ = ["tree_depth", "plot_tau_vs_depth", "plot_tau_vs_temperature", "main"]


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


def plot_tau_vs_depth(speed: dict, out_path, temperature: Optional[float] = None,
                      methods: Sequence[str] = DEFAULT_METHODS) -> Path:
    """Average tau vs tree depth (see the module docstring); returns the PNG path."""
    runs = [r for r in speed["runs"] if r["method"] in methods and r["tree"] is not None]
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
        series.setdefault((r["method"], fam), []).append((depth, t["mean"], t["std"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for (method, fam), pts in sorted(series.items()):
        pts.sort()
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    label=f"{METHOD_LABELS.get(method, method)} ({fam})")
    ax.set_xlabel("tree depth (draft steps)")
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_title(f"τ vs depth, temperature {temperature:g}" if temperature is not None else "τ vs depth")
    return _save(fig, ax, out_path, legend=bool(series))


def plot_tau_vs_temperature(speed: dict, out_path, tree: Optional[str] = None,
                            methods: Sequence[str] = DEFAULT_METHODS) -> Path:
    """Average tau vs temperature for one tree (default: the first method run's); returns the PNG path."""
    runs = [r for r in speed["runs"] if r["method"] in methods and r["tree"] is not None]
    if tree is None and runs:
        tree = runs[0]["tree"]
    fig, ax = plt.subplots(figsize=(6, 4))
    any_line = False
    for m in methods:
        pts = sorted((float(r["temperature"]), r["summary"]["avg"]["tau"]["mean"], r["summary"]["avg"]["tau"]["std"])
                     for r in runs if r["method"] == m and r["tree"] == tree)
        if pts:
            any_line = True
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                        label=METHOD_LABELS.get(m, m))
    ax.set_xlabel("temperature")
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_title(f"τ vs temperature, tree {tree}")
    return _save(fig, ax, out_path, legend=any_line)


def _save(fig, ax, out_path, legend: bool) -> Path:
    """Grid, optional legend, write the PNG (parent folders created), close the figure."""
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: Optional[Sequence[str]] = None) -> list[Path]:
    ap = argparse.ArgumentParser(description="tau vs tree depth and tau vs temperature plots (PNG).")
    ap.add_argument("speed_json")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--temperature", type=float, default=None, help="for tau vs depth")
    ap.add_argument("--tree", default=None, help="for tau vs temperature")
    ap.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    args = ap.parse_args(argv)
    speed = json.loads(Path(args.speed_json).read_text(encoding="utf-8"))
    out = [plot_tau_vs_depth(speed, Path(args.out_dir) / "tau_vs_depth.png", args.temperature, args.methods),
           plot_tau_vs_temperature(speed, Path(args.out_dir) / "tau_vs_temperature.png", args.tree, args.methods)]
    for p in out:
        print(f"wrote {p}")
    return out


if __name__ == "__main__":
    main()
