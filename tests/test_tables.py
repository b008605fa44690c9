"""Table layouts rendered from a hand-made speed JSON, compared as full Markdown strings; plots."""
import json

import pytest

from evaluation import tables


def _ms(mean, se=None, std=None):
    return {"mean": mean, "std": std, "se": se}


def _run(method, tree, taus, avg, speed, speedup, seeds=(0,), temperature=1.0, delta=None, expected=None,
         timing=None):
    summary = {g: {"tau": _ms(*t), "tau_expected": None if expected is None else _ms(*expected[g]),
                   "speed": _ms(0.0), "speedup": None} for g, t in taus.items()}
    summary["avg"] = {"tau": _ms(*avg), "tau_expected": None if expected is None else _ms(*expected["avg"]),
                      "speed": _ms(0.0), "speedup": None}
    summary["overall"] = {"tau": _ms(*avg), "speed": _ms(*speed), "speedup": None if speedup is None else _ms(*speedup)}
    per_seed = {str(s): {g: {"n_questions": 2} for g in taus} for s in seeds}
    return {"method": method, "temperature": temperature, "tree": tree, "seeds": list(seeds), "per_seed": per_seed,
            "summary": summary, "delta_pct": delta, "timing": timing}


@pytest.fixture
def speed_json():
    timing = {"seconds": {"draft": 3.0, "target_forward": 6.0, "verify": 0.5, "other": 0.5},
              "share": {"draft": 0.3, "target_forward": 0.6, "verify": 0.05, "other": 0.05}, "wall_time": 10.4}
    return {"std_ddof": 1, "baseline": "naive", "reference": "rrsw", "groups": ["mt_bench", "qa"],
            "bootstrap": {"resamples": 1000}, "runs": [
                _run("naive", None, {"mt_bench": (1,), "qa": (1,)}, (1,), (20.04, 0.5), (1.0, 0.0)),
                _run("rrsw", "2x5", {"mt_bench": (3.0, 0.02), "qa": (2.0, 0.01)}, (2.5, 0.015), (30.0, 1.0),
                     (1.5, 0.05), expected={"mt_bench": (2.9, 0.01), "qa": (2.05, 0.005), "avg": (2.475, 0.006)},
                     timing=timing),
                _run("univer", "2x5", {"mt_bench": (3.3, 0.03), "qa": (2.1, 0.0)}, (2.7, 0.02), (33.33, 0.4),
                     (1.663, 0.02), delta={"tau": _ms(8.0, 0.4), "tau_expected": _ms(7.5, 0.2)},
                     expected={"mt_bench": (3.2, 0.01), "qa": (2.12, 0.005), "avg": (2.66, 0.006)}),
                _run("rrsw", "2x5", {"mt_bench": (1.5,)}, (1.5,), (1,), (1,), temperature=0.0),
                _run("univer", "3x3", {"mt_bench": (2.0,)}, (2.0,), (1,), (1,)),
            ]}


TABLE1 = """**SMOKE RUN**

Temperature 1, tree 2x5: τ = mean accepted tokens per decoding step (accepted draft tokens + 1), per category group; Avg = mean of the groups

| Method | MT-bench | QA | Avg τ | Δ vs RRSw | Tokens/s | Speedup |
|---|---:|---:|---:|---:|---:|---:|
| RRSw | 3.00 ± 0.02 | 2.00 ± 0.01 | 2.50 ± 0.01 | - | 30.0 ± 1.0 | 1.50x ± 0.05 |
| UniVer | 3.30 ± 0.03 | 2.10 ± 0.00 | 2.70 ± 0.02 | +8.0% ± 0.4 | 33.3 ± 0.4 | 1.66x ± 0.02 |

Questions per group: MT-bench 2, QA 2; seeds: 1; plain decoding (autoregressive) 20.0 ± 0.5 tokens/s; ± = bootstrap standard error over questions (1000 resamples, stratified by group, paired across methods for Δ).

Rao-Blackwellised τ of the same runs: at every cycle the exact E[tokens per cycle | drafted tree] from the verifier's outcome law (same definitions; agrees with τ above within errors)

| Method | MT-bench | QA | Avg τ | Δ vs RRSw |
|---|---:|---:|---:|---:|
| RRSw | 2.90 ± 0.01 | 2.05 ± 0.01 | 2.48 ± 0.01 | - |
| UniVer | 3.20 ± 0.01 | 2.12 ± 0.01 | 2.66 ± 0.01 | +7.5% ± 0.2 |

Where the time goes (engine per-part timing, share of the timed parts; summed over all turns)

| Method | Drafting | Target forward | Verification | Other | Timed s | Wall s |
|---|---:|---:|---:|---:|---:|---:|
| RRSw | 30% | 60% | 5% | 5% | 10.0 | 10.4 |
"""

TABLE3 = """Avg τ (mean of the category groups) by temperature and tree; ± = bootstrap SE over questions

| Temperature | Tree | RRSw | UniVer |
|---:|---|---:|---:|
| 0 | 2x5 | 1.50 | - |
| 1 | 2x5 | 2.50 ± 0.01 | 2.70 ± 0.02 |
| 1 | 3x3 | - | 2.00 |
"""


def test_table1_exact(speed_json):
    t = tables.table1(speed_json, 1.0, "2x5")
    assert [r["method"] for r in t["rows"]] == ["rrsw", "univer"]
    assert tables.render_table1(t, "SMOKE RUN") == TABLE1


def test_table1_without_errors_says_why(speed_json):
    for r in speed_json["runs"]:
        for g in r["summary"].values():
            if g.get("tau"):
                g["tau"]["se"] = None
    md = tables.render_table1(tables.table1(speed_json, 1.0, "2x5"))
    assert "no errors shown: a group has fewer than 2 questions" in md and "| UniVer | 3.30 | 2.10 | 2.70 |" in md


def test_table1_defaults_and_unknown_methods(speed_json):
    speed_json["runs"].append(_run("my_rrsw_copy", "2x5", {"mt_bench": (3.0,), "qa": (2.0,)}, (2.5,), (1,), (1,)))
    t = tables.table1(speed_json)
    assert (t["temperature"], t["tree"]) == (1.0, "2x5")
    assert [r["method"] for r in t["rows"]] == ["rrsw", "univer", "my_rrsw_copy"]  # registry names, no edit
    assert "| my_rrsw_copy |" in tables.render_table1(t)


def test_table3_exact(speed_json):
    assert tables.render_table3(tables.table3(speed_json)) == TABLE3


def test_cli_writes_md_and_json(speed_json, tmp_path, capsys):
    p = tmp_path / "speed.json"
    p.write_text(json.dumps(speed_json))
    tables.main([str(p), "--temperature", "1", "--tree", "2x5", "--note", "SMOKE RUN",
                 "--out-prefix", str(tmp_path / "out" / "table")])
    assert (tmp_path / "out" / "table1.md").read_text(encoding="utf-8") == TABLE1
    assert (tmp_path / "out" / "table3.md").read_text(encoding="utf-8") == TABLE3
    assert json.loads((tmp_path / "out" / "table1.json").read_text())["rows"][0]["method"] == "rrsw"
    assert TABLE1 in capsys.readouterr().out


def test_plots_write_png_with_fixed_colours(speed_json, tmp_path):
    from evaluation import plots

    assert plots.tree_depth("2x5") == ("2x*", 5) and plots.tree_depth("chain3") == ("chain", 3)
    assert plots.method_color("univer") == plots.METHOD_COLORS["univer"]
    assert plots.method_color("my_rrsw_copy") == plots.method_color("my_rrsw_copy")  # stable for any name
    exact = {"groups": ["mt_bench", "qa"], "temperature": 1.0, "tree": "2x5", "n_contexts": 8, "rows": [
        {"method": m, "tau": {"mt_bench": _ms(2.0, 0.1), "qa": _ms(1.5, 0.1)}, "avg_tau": _ms(1.75, 0.07)}
        for m in ("rrsw", "univer")]}
    out = plots.main_job_plots(speed_json, tmp_path, exact, 1.0, "2x5")
    assert [p.name for p in out] == ["tau_by_group.png", "tau_expected_by_group.png", "exact_tau.png", "speedup.png",
                                     "time_breakdown.png"]
    a = plots.plot_tau_vs_depth(speed_json, tmp_path / "d.png", temperature=1.0)
    b = plots.plot_tau_vs_temperature(speed_json, tmp_path / "t.png", tree="2x5")
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in out + [a, b])


def test_speed_table_names_the_kind_of_speed_tree():
    """The speed table's title says which tree it timed: the fitted one ('auto'), an EAGLE-2 dynamic tree (the
    main job's default on the CPU) or another named tree."""
    from evaluation.tables import render_speed_table

    def title(tree, choices=None):
        t = {"temperature": 1.0, "tree": tree, "tree_choices": choices, "baseline": None, "rows": []}
        return render_speed_table(t).splitlines()[0]

    assert title("auto", [[0], [0, 0]]).startswith("Speed on the tree fitted to this machine: temperature 1, tree auto (2 nodes")
    assert "EAGLE-2 dynamic tree" in title("eagle2:nodes=5,depth=2,topk=3")
    assert title("chain3") == "Speed on the speed tree: temperature 1, tree chain3"
