"""A bench script run briefly from a test, and the rows of the table it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:  # the tests import the bench modules themselves too
    sys.path.insert(0, str(BENCH))


def run_bench(script: str, *args: str) -> list[str]:
    """Run ``bench/<script>`` with ``args``; assert it exits 0; return its stdout's lines."""
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(BENCH)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def row_ms(lines: list[str], name: str) -> float:
    """The first figure of the one row of ``lines`` labelled ``name``."""
    (row,) = [line for line in lines if line.startswith(name + "  ")]
    return float(row[len(name) :].split()[0])
