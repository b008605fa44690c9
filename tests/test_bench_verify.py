"""The verification benchmark runs end to end on a small row and reports every method."""
from evaluation import bench_verify


def test_bench_rows_and_table():
    rows = bench_verify.bench(quick=True, devices=["cpu"], trees={"2x2": "2x2"}, vocabs=(64,))
    assert len(rows) == 1
    r = rows[0]
    for m in bench_verify.METHODS:
        assert r[f"{m}_kernel_ms"] > 0 and r[f"{m}_step_ms"] > 0
    assr = r["univer_kernel_ms"] / r["rrsw_kernel_ms"]
    assert abs(r["univer_over_rrsw_kernel"] - assr) < 1e-12
    table = bench_verify.format_table(rows)
    assert "2x2" in table and "UniVer/RRSw step" in table
