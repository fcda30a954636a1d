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


def _tnrec_row(stdout: str) -> list[str]:
    return next(line for line in stdout.splitlines() if line.startswith("8 ")).split()


def test_quick_run_with_backed_memory_writes_it_before_the_fill_and_says_so():
    out = _run("--quick", "--no-torch", "--optimizers", "adagrad", "--backed-memory", "256")
    assert out.returncode == 0, out.stderr
    row = _tnrec_row(out.stdout)
    assert row[:3] == ["8", "20k", "adagrad"] and float(row[3]) > 0  # filled, Mkeys/s
    rss_before_mib, peak_mib = float(row[11]), float(row[12])
    # the 256 MiB were written (and freed before the table); RSS before is taken after
    # the write, and may hold a few MiB the process gained meanwhile
    assert peak_mib - rss_before_mib >= 256 - 32
    assert "wrote and freed 256 MiB just before its fill" in out.stdout
    plain = _tnrec_row(_run("--quick", "--no-torch", "--optimizers", "adagrad").stdout)
    assert float(plain[12]) - float(plain[11]) < 128


def test_negative_backed_memory_is_refused_by_name():
    out = _run("--quick", "--no-torch", "--backed-memory", "-1")
    assert out.returncode == 2
    assert "--backed-memory must be >= 0 (MiB). Received: -1" in out.stderr
