"""bench/reader_bench.py: a short run end to end prints every line of its table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "reader_bench.py"
if str(SCRIPT.parent) not in sys.path:
    sys.path.insert(0, str(SCRIPT.parent))

from reader_bench import LINES  # noqa: E402  (bench/ put on the path above)


def test_a_short_run_prints_every_line_and_the_readers_own_figures():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "3", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(SCRIPT.parent)},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in LINES:
        (row,) = [line for line in lines if line.startswith(name + "  ")]
        ms = float(row[len(name) :].split()[0])
        assert 0 < ms < 10_000, row
    (own,) = [line for line in lines if line.startswith("threads 1: the reader alone")]
    assert " ms a batch; its thread holds the GIL about " in own
