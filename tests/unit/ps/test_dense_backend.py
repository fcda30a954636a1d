"""The dense all-reduce's backend: ``dense_backend_for`` and ``PsStrategy(dense_backend=)``.

Only the choice is built (the NCCL group is not): these test the rule and the
refusals, on the CPU.
"""

import pytest
import torch

import tnrec as tn
from tnrec.distribute import PsStrategy, dense_backend_for
from tnrec.errors import ArgumentError


@pytest.mark.parametrize(
    ("device", "requested", "backend", "want"),
    [
        ("cpu", None, "gloo", "gloo"),
        (torch.device("cpu"), None, "mpi", "mpi"),  # None: the strategy's own backend
        ("cuda", None, "gloo", "nccl"),  # chosen automatically for a CUDA model
        (torch.device("cuda", 1), None, "gloo", "nccl"),
        ("cpu", "gloo", "gloo", "gloo"),
        ("cuda:0", "gloo", "gloo", "gloo"),  # asked for: gloo reduces CUDA tensors too
        ("cuda:0", "nccl", "gloo", "nccl"),
    ],
    ids=["cpu", "cpu-mpi", "cuda", "cuda:1", "cpu-gloo", "cuda-gloo", "cuda-nccl"],
)
def test_the_choice_rule(device, requested, backend, want):
    assert dense_backend_for(device, requested, backend) == want


def test_nccl_for_a_cpu_model_is_refused():
    with pytest.raises(ArgumentError, match=r"`dense_backend` 'nccl' reduces CUDA tensors only"):
        dense_backend_for("cpu", "nccl")


@pytest.mark.parametrize("bad", ["NCCL", "mpi", "", 1], ids=["NCCL", "mpi", "empty", "int"])
def test_a_bad_dense_backend_names_the_argument(bad):
    match = rf'`dense_backend` must be None, "gloo" or "nccl"\. Received: dense_backend={bad!r}\.'
    with pytest.raises(ArgumentError, match=match):
        dense_backend_for("cuda", bad)
    with pytest.raises(ArgumentError, match=match):
        PsStrategy(dense_backend=bad)


@pytest.mark.parametrize("requested", [None, "gloo", "nccl"], ids=["None", "gloo", "nccl"])
def test_the_strategy_keeps_the_value_in_one_process(requested):
    strategy = tn.distribute.PsStrategy(dense_backend=requested)
    try:
        assert strategy.dense_backend == requested and not strategy.is_distributed
    finally:
        strategy.shutdown()


def test_nccl_with_several_workers_is_refused_before_joining(monkeypatch):
    """The NCCL group is not built: refused, not ignored, before any process group."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # nothing listens: joining would fail differently
    with pytest.raises(ArgumentError, match=r"NCCL process group .* not build yet \(2 workers\)"):
        PsStrategy(dense_backend="nccl")
    assert not torch.distributed.is_initialized()
