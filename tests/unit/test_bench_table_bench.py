"""bench/table_bench.py: a quick run end to end, and ``--backed-memory``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "table_bench.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(SCRIPT.parent)},
    )


def _quick(out: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """Run a quick AdaGrad-only measurement; return its stdout and its one result."""
    done = _run("--quick", "--no-torch", "--optimizers", "adagrad", "--out", str(out), *args)
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(out.read_text())["results"]
    return done.stdout, result


def test_quick_run_with_backed_memory_writes_it_before_the_fill_and_says_so(tmp_path):
    stdout, res = _quick(tmp_path / "backed.json", "--backed-memory", "256")
    assert (res["dim"], res["keys"], res["backed_memory_mib"]) == (8, 20_000, 256)
    assert res["fill_mkeys_s"] > 0
    # the 256 MiB were written (and freed before the table); RSS before is taken after
    # the write, and may hold a few MiB the process gained meanwhile
    assert res["peak_rss_bytes"] - res["rss_before_bytes"] >= (256 - 32) << 20
    assert "wrote and freed 256 MiB just before its fill" in stdout
    _, plain = _quick(tmp_path / "plain.json")
    assert plain["backed_memory_mib"] == 0
    assert plain["peak_rss_bytes"] - plain["rss_before_bytes"] < 128 << 20


def test_negative_backed_memory_is_refused_by_name():
    out = _run("--quick", "--no-torch", "--backed-memory", "-1")
    assert out.returncode == 2
    assert "--backed-memory must be >= 0 (MiB). Received: -1" in out.stderr
