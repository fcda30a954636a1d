"""The process group and the launcher's environment, read in exactly one place.

tnrec runs the same code in one process (the default: no process group, a
local parameter server) and on W workers launched by ``torchrun`` or any
launcher that sets torch.distributed's environment (Slurm, Kubeflow
PyTorchJob, Ray Train)::

    torchrun --nproc-per-node 2 -m tnrec.cli train --config run.toml
    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-endpoint HOST:29400 -m tnrec.cli train ...

Every worker is also a parameter server: :class:`PsStrategy` shards every
table over all workers (:mod:`tnrec.ps.sharded`). Model code never imports
torch.distributed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from tnrec.errors import ArgumentError, DistributedError
from tnrec.ps import LocalPS, ParameterServer
from tnrec.ps.comm import Comm
from tnrec.ps.sharded import ShardedPS
from tnrec.table import MemoryBudget, SparseTable, threads

DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class LaunchEnv:
    """What the launcher says about this process (``RANK``, ``WORLD_SIZE``, ...)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # workers on this machine, sharing its CPUs
    master_addr: str | None
    master_port: str | None


def launch_env(environ: dict[str, str] | None = None) -> LaunchEnv:
    """Read the launcher's environment; a plain process is rank 0 of 1.

    Raises:
        ArgumentError: a variable is malformed (the message names it).
    """
    env = os.environ if environ is None else environ

    def read_int(name: str, default: int) -> int:
        raw = env.get(name)
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise ArgumentError(
                f"Environment variable {name} must be an int. Received: {raw!r}."
            ) from None

    world = read_int("WORLD_SIZE", 1)
    rank = read_int("RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise ArgumentError(
            "Environment: RANK must be in [0, WORLD_SIZE). "
            f"Received: RANK={rank}, WORLD_SIZE={world}."
        )
    local_world = read_int("LOCAL_WORLD_SIZE", 1)
    if local_world < 1:
        raise ArgumentError(
            f"Environment variable LOCAL_WORLD_SIZE must be >= 1. Received: {local_world}."
        )
    return LaunchEnv(
        rank=rank,
        world_size=world,
        local_rank=read_int("LOCAL_RANK", 0),
        local_world_size=local_world,
        master_addr=env.get("MASTER_ADDR"),
        master_port=env.get("MASTER_PORT"),
    )


_current: PsStrategy | None = None


class PsStrategy:
    """Run on every worker the launcher started; each worker holds a shard of every table.

    Creating it initialises the process group from the launcher's environment
    (gloo on CPU; ``backend="nccl"`` where the dense network runs on GPUs --
    the tables stay in host memory) or, in a single process, does nothing. It
    becomes the current strategy: models built afterwards shard their tables
    over the workers, ``fit`` splits a reader per worker and keeps workers in
    step when their data is uneven. It also tells the tables how many workers
    share this machine (``LOCAL_WORLD_SIZE``), which divides their default
    thread count (:func:`tnrec.table.threads.set_local_workers`).

    Args:
        backend: torch.distributed backend.
        timeout_s: a collective that does not complete within this raises a
            :class:`~tnrec.errors.DistributedError` naming the rank and phase.
        memory_limit_bytes: the most bytes this worker's tables may hold
            together (index, rows, optimizer state, admission sketch). A pull
            or load that would pass it stops with
            :class:`~tnrec.errors.MemoryLimitError` before allocating, instead
            of the kernel killing the process; ``None``: no limit.

    Example:
        >>> import tnrec as tn
        >>> strategy = tn.distribute.PsStrategy()   # before the model; here rank 0 of 1
        >>> strategy.rank, strategy.world_size, strategy.is_distributed
        (0, 1, False)
        >>> # model = MyModel(); model.compile()     # tables sharded over the workers
        >>> # model.fit(tn.data.read_parquet(files, cols))  # each worker reads its part
        >>> strategy.shutdown()                      # end of the program
    """

    def __init__(
        self,
        backend: str = "gloo",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_limit_bytes: int | None = None,
    ) -> None:
        global _current
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ArgumentError(f"PsStrategy: `timeout_s` must be > 0. Received: {timeout_s!r}.")
        self.memory_budget = (
            MemoryBudget(memory_limit_bytes) if memory_limit_bytes is not None else None
        )
        self.env = launch_env()
        self.timeout_s = float(timeout_s)
        self.comm: Comm | None = None
        if self.env.world_size > 1:
            if not dist.is_initialized():
                _import_before_process_group()
                try:
                    dist.init_process_group(
                        backend,
                        init_method="env://",
                        rank=self.env.rank,
                        world_size=self.env.world_size,
                        timeout=timedelta(seconds=self.timeout_s),
                    )
                except (RuntimeError, ValueError) as e:
                    raise DistributedError(
                        f"rank {self.env.rank}/{self.env.world_size}: cannot join the process "
                        f"group at {self.env.master_addr}:{self.env.master_port}: {e}"
                    ) from e
            self.comm = Comm(self.timeout_s)
        # the table kernels' default thread count shares the machine's CPUs among its workers
        threads.set_local_workers(self.env.local_world_size)
        _current = self

    @property
    def rank(self) -> int:
        """This worker's rank."""
        return self.env.rank

    @property
    def world_size(self) -> int:
        """The number of workers W."""
        return self.env.world_size

    @property
    def is_distributed(self) -> bool:
        """True with more than one worker."""
        return self.comm is not None

    def make_ps(self, tables: dict[str, SparseTable]) -> ParameterServer:
        """Return the parameter server for ``tables`` (sharded when distributed)."""
        if self.memory_budget is not None:
            for table in tables.values():
                self.memory_budget.attach(table)
        if self.comm is None:
            return LocalPS(tables)
        return ShardedPS(tables, self.comm)

    def barrier(self) -> None:
        """Wait for every worker (no-op in one process)."""
        if self.comm is not None:
            self.comm.barrier("barrier")

    @contextmanager
    def scope(self) -> Iterator[PsStrategy]:
        """Make this the current strategy inside a ``with`` block."""
        global _current
        previous, _current = _current, self
        try:
            yield self
        finally:
            _current = previous

    def shutdown(self) -> None:
        """Leave the process group (end of the program)."""
        global _current
        if self.comm is not None and dist.is_initialized():
            dist.destroy_process_group()
        self.comm = None
        if _current is self:
            _current = None
            threads.set_local_workers(1)  # no strategy: this process is alone


def _import_before_process_group() -> None:
    """Import ``torch._dynamo`` now, before the process group exists.

    ``torch.optim`` imports it lazily, on the first optimizer; imported after
    ``init_process_group``, its ``torch.distributed._shard`` modules keep a
    reference to the default group, so :func:`dist.destroy_process_group`
    leaves Gloo's worker threads running until interpreter exit, where their
    teardown can abort the process ("terminate called without an active
    exception") after the program finished its work.
    """
    import torch._dynamo  # noqa: F401


def current_strategy() -> PsStrategy | None:
    """Return the strategy models use when they build their tables, if any."""
    return _current
