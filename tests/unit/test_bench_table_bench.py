"""bench/table_bench.py: a quick run end to end, and ``--backed-memory``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "table_bench.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(SCRIPT.parent)},
    )


def test_quick_run_with_backed_memory_fills_the_table_and_says_so():
    out = _run("--quick", "--no-torch", "--optimizers", "adagrad", "--backed-memory", "8")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("8 "))
    assert row.split()[:3] == ["8", "20k", "adagrad"] and float(row.split()[3]) > 0
    assert "wrote and freed 8 MiB just before its fill" in out.stdout


def test_negative_backed_memory_is_refused_by_name():
    out = _run("--quick", "--no-torch", "--backed-memory", "-1")
    assert out.returncode == 2
    assert "--backed-memory must be >= 0 (MiB). Received: -1" in out.stderr
