"""Table layouts rendered from a hand-made speed JSON, compared as full Markdown strings."""
import json

import pytest

from evaluation import tables


def _ms(mean, std=0.0):
    return {"mean": mean, "std": std}


def _run(method, tree, taus, avg, speed, speedup, seeds=(0, 1), temperature=1.0):
    summary = {g: {"tau": _ms(*t), "speed": _ms(0.0), "speedup": None} for g, t in taus.items()}
    summary["avg"] = {"tau": _ms(*avg), "speed": _ms(0.0), "speedup": None}
    summary["overall"] = {"tau": _ms(*avg), "speed": _ms(*speed), "speedup": None if speedup is None else _ms(*speedup)}
    return {"method": method, "temperature": temperature, "tree": tree, "seeds": list(seeds), "per_seed": {},
            "summary": summary}


@pytest.fixture
def speed_json():
    return {"std_ddof": 0, "baseline": "naive", "groups": ["mt_bench", "qa"], "runs": [
        _run("naive", None, {"mt_bench": (1, 0), "qa": (1, 0)}, (1, 0), (20.04, 0.5), (1.0, 0.0)),
        _run("rrsw", "2x5", {"mt_bench": (3.0, 0.02), "qa": (2.0, 0.01)}, (2.5, 0.015), (30.0, 1.0), (1.5, 0.05)),
        _run("univer", "2x5", {"mt_bench": (3.3, 0.03), "qa": (2.1, 0.0)}, (2.7, 0.02), (33.33, 0.4), (1.663, 0.02)),
        _run("rrsw", "2x5", {"mt_bench": (1.5, 0)}, (1.5, 0), (1, 0), (1, 0), seeds=(0,), temperature=0.0),
        _run("univer", "3x3", {"mt_bench": (2.0, 0)}, (2.0, 0), (1, 0), (1, 0), seeds=(0,)),
    ]}


TABLE1 = """Temperature 1, tree 2x5: τ = tokens per target forward

| Method | MT-bench | QA | Avg τ | Δ vs RRSw | Tokens/s | Speedup |
|---|---:|---:|---:|---:|---:|---:|
| RRSw | 3.00 ± 0.02 | 2.00 ± 0.01 | 2.50 ± 0.01 | - | 30.0 ± 1.0 | 1.50 ± 0.05x |
| UniVer | 3.30 ± 0.03 | 2.10 ± 0.00 | 2.70 ± 0.02 | +8.0% | 33.3 ± 0.4 | 1.66 ± 0.02x |

Avg = mean of the category columns; autoregressive baseline 20.0 ± 0.5 tokens/s; ± = std over 2 seed(s) (ddof=0).
"""

TABLE3 = """Average τ by temperature and tree

| Temperature | Tree | RRSw | Traversal | Greedy | UniVer |
|---:|---|---:|---:|---:|---:|
| 0 | 2x5 | 1.50 | - | - | - |
| 1 | 2x5 | 2.50 ± 0.01 | - | - | 2.70 ± 0.02 |
| 1 | 3x3 | - | - | - | 2.00 |
"""


def test_table1_exact(speed_json):
    t = tables.table1(speed_json, 1.0, "2x5")
    assert [r["method"] for r in t["rows"]] == ["rrsw", "univer"]
    assert t["rows"][1]["delta_pct"] == pytest.approx(8.0)
    assert tables.render_table1(t) == TABLE1


def test_table1_defaults_to_first_method_run(speed_json):
    t = tables.table1(speed_json)
    assert (t["temperature"], t["tree"]) == (1.0, "2x5")


def test_table3_exact(speed_json):
    assert tables.render_table3(tables.table3(speed_json)) == TABLE3


def test_cli_writes_md_and_json(speed_json, tmp_path, capsys):
    p = tmp_path / "speed.json"
    p.write_text(json.dumps(speed_json))
    tables.main([str(p), "--temperature", "1", "--tree", "2x5", "--out-prefix", str(tmp_path / "out" / "table")])
    assert (tmp_path / "out" / "table1.md").read_text(encoding="utf-8") == TABLE1
    assert (tmp_path / "out" / "table3.md").read_text(encoding="utf-8") == TABLE3
    assert json.loads((tmp_path / "out" / "table1.json").read_text())["rows"][0]["method"] == "rrsw"
    assert TABLE1 in capsys.readouterr().out


def test_plots_write_png(speed_json, tmp_path):
    from evaluation import plots

    assert plots.tree_depth("2x5") == ("2x*", 5) and plots.tree_depth("chain3") == ("chain", 3)
    a = plots.plot_tau_vs_depth(speed_json, tmp_path / "d.png", temperature=1.0)
    b = plots.plot_tau_vs_temperature(speed_json, tmp_path / "t.png", tree="2x5")
    assert a.read_bytes()[:4] == b"\x89PNG" and b.read_bytes()[:4] == b"\x89PNG"
