"""The dense all-reduce's backend: ``dense_backend_for``, ``PsStrategy(dense_backend=)`` and
the process group ``DenseComm`` sums on.

These run on the CPU: a real one-worker gloo group for the second-group path,
and, for a CUDA model's NCCL group, which needs a GPU, the choice alone.
"""

import numpy as np
import pytest
import torch

import tnrec as tn
from tnrec.distribute import PsStrategy, dense_backend_for
from tnrec.errors import ArgumentError
from tnrec.ps.comm import Comm
from tnrec.ps.dense import DenseComm


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


@pytest.fixture
def one_process_group(tmp_path):
    """A real gloo process group of one worker (a file store: no network)."""
    torch.distributed.init_process_group(
        "gloo", store=torch.distributed.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        yield Comm(30.0)
    finally:
        torch.distributed.destroy_process_group()


def test_a_cpu_model_sums_on_the_strategys_group_unless_gloo_is_asked_for(one_process_group):
    comm = one_process_group
    default = DenseComm(comm)
    assert default.channel(torch.device("cpu")) == (comm, torch.device("cpu"))
    assert default.groups() == {}
    asked = DenseComm(comm, "gloo")
    second, where = asked.channel(torch.device("cpu"))
    assert second is not comm and where == torch.device("cpu")
    assert asked.channel(torch.device("cpu"))[0] is second  # created once
    assert list(asked.groups()) == ["gloo"]
    # the collectives run on it: one worker's sum and broadcast are its own values
    lin = torch.nn.Linear(3, 2)
    lin(torch.ones(4, 3)).sum().backward()
    want = [p.grad.clone() for p in lin.parameters()]
    flags = asked.all_reduce_grads(list(lin.parameters()), np.array([1.0, 0.0, 2.0]))
    assert flags.tolist() == [1.0, 0.0, 2.0]
    for p, g in zip(lin.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
    before = [p.detach().clone() for p in lin.parameters()]
    asked.broadcast_parameters(list(lin.parameters()))
    for p, b in zip(lin.parameters(), before, strict=True):
        torch.testing.assert_close(p.detach(), b, rtol=0, atol=0)
    with pytest.raises(ArgumentError, match=r"'nccl' reduces CUDA tensors only"):
        DenseComm(comm, "nccl").channel(torch.device("cpu"))


class _RecordingComm:
    """Stands in for a Comm where no GPU can make an NCCL group: records what it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def new_channel(self, backend: str = "gloo") -> str:
        self.asked.append(backend)
        return f"{backend} group"


@pytest.mark.parametrize(
    ("requested", "want"),
    [(None, ("nccl group", "cuda:1")), ("nccl", ("nccl group", "cuda:1")),
     ("gloo", ("gloo group", "cpu"))],
    ids=["None", "nccl", "gloo"],
)  # fmt: skip
def test_a_cuda_model_sums_on_a_second_group_on_its_device(requested, want):
    comm = _RecordingComm()
    dense = DenseComm(comm, requested)  # type: ignore[arg-type]
    group, where = dense.channel(torch.device("cuda", 1))
    assert (group, str(where)) == want
    dense.channel(torch.device("cuda", 1))
    assert comm.asked == [want[0].split()[0]]  # one group, created at the first use


def test_async_mode_refuses_a_model_off_the_host():
    from tnrec.ps.asynchronous import check_on_host

    check_on_host(list(torch.nn.Linear(2, 2).parameters()))
    on_meta = list(torch.nn.Linear(2, 2, device="meta").parameters())  # any device but the CPU
    with pytest.raises(
        ArgumentError, match=r"dense server on the host; the model is on \['meta'\]"
    ):
        check_on_host(on_meta)
