"""bench/parts_bench.py's creating pull: both lines timed, the process's settings restored."""

from __future__ import annotations

import os

import numpy as np
import torch

import tests.unit.bench_script  # noqa: F401  (puts bench/ on the path)

from parts_bench import creating_pull_us  # isort: skip


def test_the_creating_pull_times_both_lines_and_restores_the_settings(monkeypatch):
    monkeypatch.setenv("TNREC_TABLE_TEAM", "1")
    before = torch.get_num_threads()
    got = creating_pull_us(pulls=4, keys=4096)
    assert set(got) == {"on torch's team", "on the Python threads"}
    assert all(np.isfinite(v) and v > 0 for v in got.values())
    assert os.environ["TNREC_TABLE_TEAM"] == "1"  # the caller's setting, not the bench's
    assert torch.get_num_threads() == before
