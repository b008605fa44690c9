"""Time one verification step of every registered method.

    python -m evaluation.bench_verify [--quick] [--out runs/bench_verify.json]

Every verifier the registry lists for temperature > 0 (``available_verifiers(temperature=1.0)``:
the built-ins, ``univer_patch``, installed plugins and ``--plugin`` modules). Trees 2x5, 3x3,
mc_sim_7b_63 and balanced(2,7) (255 nodes); V in {32000, 152064}; float32 on CPU
(and CUDA when available). Laws are random and peaked: target = softmax(2.5 randn), draft =
softmax(target logits + 1.0 randn) (a draft that roughly agrees with the target, as a trained head
does); children are drawn with each method's own rule (:func:`eagle.rules.draw_children`).
Two timings per row: ``kernel`` (allocation + decision, inputs trusted: ``validate=False``) and
``step`` (the whole ``verify`` call, including :func:`~eagle.verify.checks.check_tree_inputs`).
The table prints the ratio UniVer / RRSw per row; the JSON holds every number.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from tqdm import tqdm

import univer_patch  # noqa: F401  (registers the verifiers)
from eagle.rules import draw_children
from eagle.tree import balanced, build_tree
from eagle.verify import available_verifiers, get_verifier, load_plugin

#: the methods at import time; :func:`bench` re-reads the registry (plugins loaded later count)
METHODS = tuple(available_verifiers(temperature=1.0))
TREES = {"2x5": "2x5", "3x3": "3x3", "mc_sim_7b_63": "mc_sim_7b_63", "255": balanced(2, 7)}
VOCABS = (32000, 152064)


def make_instance(tree, V: int, rule: str, device: str, seed: int):
    """Random peaked laws on ``tree`` and children drawn with ``rule``.

    Returns ``(parents [N], tokens [N], target [N, V], draft [N, V])`` (float32 on ``device``).
    """
    tb = build_tree(tree)
    n = tb.num_nodes
    g = torch.Generator().manual_seed(seed)
    logits = 2.5 * torch.randn(n, V, generator=g)
    target = torch.softmax(logits, -1)
    draft = torch.softmax(logits + 1.0 * torch.randn(n, V, generator=g), -1)
    tokens = torch.zeros(n, dtype=torch.long)
    for v in range(n):
        ch = tb.children[v]
        if ch:
            drawn = draw_children(draft[v: v + 1], len(ch), rule, generator=g)[0]
            assert bool((drawn >= 0).all())
            tokens[list(ch)] = drawn
    return tb.parents.to(device), tokens.to(device), target.to(device), draft.to(device)


def _once(fn, device: str) -> float:
    """Milliseconds of one call: CUDA events on a GPU (recorded around the call, read after the end
    event completes; a verify call ends in a host sync anyway), ``perf_counter`` on the CPU."""
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def bench(quick: bool = False, devices=None, trees=None, vocabs=None):
    """Time every method on every (device, tree, V) row.

    Methods are timed round-robin (one call of each method per round, ``reps`` rounds per coin
    sequence) so that load changes on a shared machine hit all methods alike; each number is the
    median over rounds, averaged over the coin sequences (1 quick, 4 otherwise).

    Args:
        trees: {name: tree choices} (default :data:`TREES`); vocabs: vocabulary sizes (default :data:`VOCABS`).

    Returns:
        One dict per row: ``{method}_kernel_ms`` / ``{method}_step_ms`` (milliseconds) and the
        ratios ``univer_over_rrsw_kernel`` / ``univer_over_rrsw_step``.
    """
    trees = trees or TREES
    methods = tuple(available_verifiers(temperature=1.0))
    devices = devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    reps = 3 if quick else 7
    rows = []
    jobs = [(d, t, V) for d in devices for t in trees for V in (vocabs or VOCABS)]
    for device, tname, V in tqdm(jobs, desc="bench_verify"):
        row = {"device": device, "tree": tname, "V": V}
        instances = {}  # one instance per drafting rule, shared by the methods of that rule
        for name in methods:
            rule = get_verifier(name).drafting
            if rule not in instances:
                instances[rule] = make_instance(trees[tname], V, rule, device, seed=1000 + len(instances))
        ks = {m: [] for m in methods}
        ss = {m: [] for m in methods}
        for rep_seed in range(1 if quick else 4):  # several coin sequences: different paths
            calls = {}
            for name in methods:
                ver = get_verifier(name)
                parents, tokens, target, draft = instances[ver.drafting]
                gen = torch.Generator(device=device).manual_seed(rep_seed)  # on the laws' device
                calls[name] = (
                    lambda ver=ver, a=(parents, tokens, target, draft), g=gen: ver.verify(*a, g, validate=False),
                    lambda ver=ver, a=(parents, tokens, target, draft), g=gen: ver.verify(*a, g))
                calls[name][0](), calls[name][1]()  # warm-up (caches, allocator)
            kt = {m: [] for m in methods}
            st = {m: [] for m in methods}
            for _ in range(reps):
                for name in methods:
                    kt[name].append(_once(calls[name][0], device))
                    st[name].append(_once(calls[name][1], device))
            for name in methods:
                ks[name].append(statistics.median(kt[name]))
                ss[name].append(statistics.median(st[name]))
        for name in methods:
            row[f"{name}_kernel_ms"] = statistics.mean(ks[name])
            row[f"{name}_step_ms"] = statistics.mean(ss[name])
        del instances
        row["univer_over_rrsw_kernel"] = row["univer_kernel_ms"] / row["rrsw_kernel_ms"]
        row["univer_over_rrsw_step"] = row["univer_step_ms"] / row["rrsw_step_ms"]
        rows.append(row)
    return rows


def format_table(rows) -> str:
    methods = [m for m in available_verifiers(temperature=1.0) if rows and f"{m}_kernel_ms" in rows[0]]
    head = ["device", "tree", "V"] + [f"{m} k/step ms" for m in methods] + ["UniVer/RRSw kernel", "UniVer/RRSw step"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        cells = [r["device"], r["tree"], str(r["V"])]
        cells += [f"{r[m + '_kernel_ms']:.2f}/{r[m + '_step_ms']:.2f}" for m in methods]
        cells += [f"{r['univer_over_rrsw_kernel']:.2f}", f"{r['univer_over_rrsw_step']:.2f}"]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (well under a minute on 2 cores)")
    ap.add_argument("--out", default="runs/bench_verify.json", help="JSON output path")
    ap.add_argument("--device", action="append", help="cpu and/or cuda (default: cpu, plus cuda if available)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = leave torch's default)")
    ap.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                    help="import MODULE first (it registers more verifiers); repeatable")
    args = ap.parse_args(argv)
    for module in args.plugin:
        load_plugin(module)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rows = bench(args.quick, args.device)
    print(format_table(rows))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"quick": args.quick, "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
