"""bench/glue_bench.py: its hand-written step trains what ``train_step`` trains, and a short
run prints every line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.unit.bench_script import row_ms, run_bench

from glue_bench import LINES, micro_setup  # isort: skip  (bench/ is put on the path by bench_script)


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
    lines = run_bench("glue_bench.py", "--steps", "3", "--repeats", "1")
    for name in LINES:
        assert 0 < row_ms(lines, name) < 10_000, name
    assert -10_000 < row_ms(lines, "train_step - by hand") < 10_000
    assert any(line.startswith("threads 1: load ") for line in lines)


def test_rows_steps_on_the_first_rows_of_each_batch_and_is_checked():
    lines = run_bench("glue_bench.py", "--steps", "3", "--repeats", "1", "--rows", "16")
    assert any("3 batches of 16" in line for line in lines)
    for name in LINES:
        assert 0 < row_ms(lines, name) < 10_000, name
    with pytest.raises(AssertionError, match=r"--rows must be in \[1, 4096\]; got 0"):
        run_bench("glue_bench.py", "--rows", "0")
