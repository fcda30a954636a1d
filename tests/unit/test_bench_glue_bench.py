"""bench/glue_bench.py: its hand-written step trains what ``train_step`` trains, and a short
run prints every line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "glue_bench.py"
if str(SCRIPT.parent) not in sys.path:
    sys.path.insert(0, str(SCRIPT.parent))

from glue_bench import LINES, micro_setup  # noqa: E402  (bench/ put on the path above)


def test_the_hand_step_trains_the_model_train_step_trains_bit_for_bit():
    batches, model, hand, _ = micro_setup(steps=4, seed=3)
    (table,) = model.tables.values()
    twin = hand.table
    keys = np.unique(np.concatenate([j.keys for b in batches for j in b.sparse.values()]))
    assert np.array_equal(table.pull(keys, create=False), twin.pull(keys, create=False))
    for b in batches:
        got = model.train_step(b)["loss"]
        assert hand(b) == got
    assert np.array_equal(table.pull(keys, create=False), twin.pull(keys, create=False))
    assert np.array_equal(table.read_stats_unchecked(keys), twin.read_stats_unchecked(keys))
    assert table.read_stats_unchecked(keys)[:, 0].sum() == sum(b.size * 2 for b in batches)
    for p, q in zip(model.lin.parameters(), hand.model.lin.parameters(), strict=True):
        assert torch.equal(p, q)
    # and both moved: the comparison is not of two untrained models
    assert not np.array_equal(table.pull(keys, create=False), table.initial_vectors(keys))


def test_a_short_run_prints_every_line():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "3", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(SCRIPT.parent)},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in (*LINES, "train_step - by hand"):
        (row,) = [line for line in lines if line.startswith(name + "  ")]
        ms = float(row[len(name) :].split()[0])
        assert (0 < ms < 10_000) if name in LINES else (-10_000 < ms < 10_000), row
    assert any(line.startswith("threads 1: load ") for line in lines)
