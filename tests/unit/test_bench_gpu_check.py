"""bench/gpu_check.py: one clear line and exit 0 without CUDA; its parts, run on the CPU.

The CUDA branch cannot run here (no GPU): where CUDA is available the script
must print its table instead. The equivalence and the step's split are run
CPU against CPU, so a broken harness fails here, not first on a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import gpu_check  # noqa: E402


def test_the_script_says_no_cuda_device_and_exits_0_or_prints_its_table():
    out = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--batches", "4096", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    if not torch.cuda.is_available():  # this machine
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert len(lines) == 1 and lines[0].startswith("no CUDA device"), out.stdout
        assert lines[0] == gpu_check.no_cuda_line()
        return
    assert gpu_check.HEADER in out.stdout, out.stdout + out.stderr  # a CUDA machine: not run here
    assert "50-step equivalence" in out.stdout


def test_the_equivalence_of_two_cpu_runs_is_exact():
    diffs = gpu_check.equivalence(steps=3, batch=128, devices=("cpu", "cpu"))
    assert diffs == {"predictions": 0.0, "dense params": 0.0, "table rows": 0.0}


def test_the_split_times_the_host_parts_and_restores_what_it_wrapped():
    import tnrec.model

    cpu = torch.device("cpu")
    model = gpu_check.deepfm(cpu)
    batches = gpu_check.make_batches(3, 64, seed=3)
    to_device = tnrec.model.to_device
    with gpu_check.split(model, cpu) as spent:
        step_s = gpu_check.timed_steps(model.train_step, batches, 1, lambda: None)
        assert tnrec.model.to_device is not to_device
    assert step_s > 0 and spent["pull"] > 0 and spent["push"] > 0 and spent["transfer"] > 0
    assert tnrec.model.to_device is to_device and "pull" not in vars(model.ps)


def test_a_row_of_the_table_lines_up_with_the_header(capsys):
    gpu_check.print_row((4096, "tnrec DeepFM cuda", 1e6, 4.1, 1.0, 0.5, 0.25, 2.35))
    gpu_check.print_row((4096, "EmbeddingBag cuda", 1e6, 4.1, None, None, None, None))
    full, bag = capsys.readouterr().out.splitlines()
    assert len(full) == len(bag) == len(gpu_check.HEADER)
    assert full.split()[-4:] == ["1.0", "0.5", "0.2", "2.4"] and bag.split()[-4:] == ["-"] * 4
