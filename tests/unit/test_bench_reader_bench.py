"""bench/reader_bench.py: a short run end to end prints every line of its table."""

from __future__ import annotations

from tests.unit.bench_script import row_ms, run_bench

from reader_bench import LINES  # isort: skip  (bench/ is put on the path by bench_script)


def test_a_short_run_prints_every_line_and_the_readers_own_figures():
    lines = run_bench("reader_bench.py", "--steps", "3", "--repeats", "1")
    for name in LINES:
        assert 0 < row_ms(lines, name) < 10_000, name
    (own,) = [line for line in lines if line.startswith("threads 1: the reader alone")]
    assert " ms a batch; its thread holds the GIL about " in own
