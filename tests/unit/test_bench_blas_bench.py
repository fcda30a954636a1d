"""bench/blas_bench.py: a short run prints every line, with and without the BLAS call."""

from __future__ import annotations

from tests.unit.bench_script import row_ms, run_bench

from blas_bench import LINES  # isort: skip  (bench/ is put on the path by bench_script)


def test_a_short_run_prints_every_line():
    lines = run_bench("blas_bench.py", "--steps", "8", "--repeats", "1", "--read-every", "2")
    tables = [i for i, line in enumerate(lines) if line in ("median step:", "mean step:")]
    assert len(tables) == 2
    for table in (lines[tables[0] : tables[1]], lines[tables[1] :]):
        for label, *_ in LINES:
            assert 0 < row_ms(table, label) < 10_000, label
    assert any(line.startswith("threads 1: others at most ") for line in lines)
