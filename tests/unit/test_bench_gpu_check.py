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

import numpy as np
import pytest
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


@pytest.mark.parametrize("optimizers", ["sgd", "adam"])
def test_the_equivalence_of_two_cpu_runs_is_exact(optimizers):
    diffs = gpu_check.equivalence(steps=3, batch=128, devices=("cpu", "cpu"), optimizers=optimizers)
    losses = [v for k, v in diffs.items() if "log loss" in k]
    assert len(losses) == 2 and losses[0] == losses[1] and 0.1 < losses[0] < 1.5
    assert len(diffs) == 7 and {v for k, v in diffs.items() if "log loss" not in k} == {0.0}
    ok, lines = gpu_check.equivalence_lines(diffs, optimizers)
    assert ok and len(lines) == 7


def test_the_equivalence_verdict_holds_sgd_to_every_difference_and_adam_to_the_gradients():
    diffs = {
        "first step's dense gradients (relative)": 1e-6,
        "first step's pushed row gradients (relative)": 1e-6,
        "predictions": 3e-3,  # Adam's sign noise
        "dense params": 2e-2,
        "table rows": 1e-3,
        "held-out log loss, first device": 0.5,
        "held-out log loss, second device": 0.50001,
    }
    assert gpu_check.equivalence_lines(diffs, "adam")[0]
    assert not gpu_check.equivalence_lines(diffs, "sgd")[0]
    assert not gpu_check.equivalence_lines({**diffs, "held-out log loss, second device": 0.51},
                                           "adam")[0]  # fmt: skip
    assert not gpu_check.equivalence_lines(
        {**diffs, "first step's dense gradients (relative)": 1e-3}, "adam"
    )[0]


def test_relative_differences_scale_by_the_first_arrays_largest_value():
    a = {"x": np.array([2.0, -4.0]), "y": np.zeros(3)}
    b = {"x": np.array([2.0, -4.1]), "y": np.full(3, 0.2)}
    assert gpu_check.relative(a, b) == pytest.approx(0.2 / 4.0)
    assert gpu_check.relative({"x": np.zeros(2)}, {"x": np.ones(2)}) == 1.0


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


def test_the_dense_only_step_trains_the_dense_part_and_keeps_the_inputs_gradient():
    batches = gpu_check.make_batches(2, 64, seed=3)
    step = gpu_check.DenseOnly(64, torch.device("cpu"))
    before = [p.detach().clone() for p in step.model.parameters()]
    for b in batches:
        step.train_step(b)
    after = list(step.model.parameters())
    assert before and all(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert step.emb.grad.shape == (64, gpu_check.COLUMNS * gpu_check.DIM)
    assert step.wide.grad.abs().sum() > 0


def test_the_ratios_read_one_batch_sizes_rows():
    def row(name, sps):
        return (16384, name, sps, 1.0, None, None, None, None)

    rows = [
        row("tnrec cpu pass 1", 100.0),
        ("", "  machine: quiet"),
        row("tnrec cpu pass 2", 200.0),
        row("tnrec cuda pass 1", 600.0),
        row("tnrec cuda pass 2", 800.0),
        row("EmbeddingBag cuda", 900.0),
        row("dense-only cuda", 720.0),
    ]
    line = gpu_check.ratios(rows)
    assert line.split()[0] == "16384"
    assert "cuda / cpu samples/s: pass 1 6.00x, pass 2 4.00x" in line, line
    assert "dense-only step on cuda: pass 1 1.20, pass 2 0.90" in line, line


def test_throughput_times_two_passes_and_the_baselines_on_the_last_device():
    rows = gpu_check.throughput(64, 2, 1, 1000, devices=("cpu",))
    table = [r for r in rows if len(r) > 2]
    names = [r[1] for r in table]
    assert names == ["tnrec cpu pass 1", "tnrec cpu pass 2", "EmbeddingBag cpu", "dense-only cpu"]
    for r in table:
        assert r[0] == 64 and r[2] > 0 and r[3] > 0
    for r in table[:2]:  # pull, push, transfer and rest add up to the step
        assert min(r[4:]) >= 0 and abs(sum(r[4:]) - r[3]) < 1e-6 * r[3] + 1e-9
    assert all(len(r) == 2 and "machine:" in r[1] for r in rows if len(r) == 2)


def test_the_w2_check_runs_two_workers_under_torchrun_and_matches_one_process():
    line = gpu_check.w2_check("cpu")
    assert line.startswith("W = 2 with gloo dense on the CPU"), line
    assert line.endswith(": ok") and "second groups ['gloo']" in line, line


def test_the_profile_lists_the_steps_ops():
    table = gpu_check.profile(64, steps=2, rows=10, device="cpu")
    assert "Self CPU" in table and "aten::" in table
