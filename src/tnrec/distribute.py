"""The process group, joined from the launcher's environment.

tnrec runs the same code in one process (the default: no process group, a
local parameter server) and on W workers started by torchrun (or TorchElastic,
Kubeflow PyTorchJob), Open MPI's ``mpirun``, MPICH / Intel MPI's ``mpiexec``
or Slurm's ``srun``; :func:`tnrec.launch.launch_env` reads which, in one place::

    torchrun --nproc-per-node 2 -m tnrec.cli train --config run.toml
    mpirun -np 8 -x MASTER_ADDR=host0 python -m tnrec.cli train --config run.toml
    srun --ntasks-per-node 2 python -m tnrec.cli train --config run.toml

Every worker is also a parameter server: :class:`PsStrategy` shards every
table over all workers (:mod:`tnrec.ps.sharded`). Model code never imports
torch.distributed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

from tnrec.errors import ArgumentError, DistributedError
from tnrec.launch import LaunchEnv as LaunchEnv  # re-exported: tnrec.distribute.LaunchEnv
from tnrec.launch import launch_env
from tnrec.ps import LocalPS, ParameterServer
from tnrec.ps.asynchronous import AsyncPS, init_rpc, shutdown_rpc
from tnrec.ps.comm import Comm
from tnrec.ps.dense import DENSE_BACKENDS as DENSE_BACKENDS  # re-exported
from tnrec.ps.dense import DenseComm
from tnrec.ps.dense import check_dense_backend as _check_dense_backend
from tnrec.ps.dense import dense_backend_for as dense_backend_for  # re-exported
from tnrec.ps.sharded import ShardedPS
from tnrec.table import MemoryBudget, SparseTable, threads

DEFAULT_TIMEOUT_S = 300.0


_current: PsStrategy | None = None


class PsStrategy:
    """Run on every worker the launcher started; each worker holds a shard of every table.

    Creating it initialises the process group from the launcher's environment
    (gloo: the tables stay in host memory, and so do the keys and rows they
    exchange; ``dense_backend`` is the dense part's) or, in a single process,
    does nothing. It
    becomes the current strategy: models built afterwards shard their tables
    over the workers, ``fit`` splits a reader per worker and keeps workers in
    step when their data is uneven. It also tells the tables how many workers
    share this machine (``LOCAL_WORLD_SIZE`` or the launcher's equivalent,
    :class:`~tnrec.launch.LaunchEnv`), which divides their default
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
        mode: ``"sync"`` (the default: every step is one exchange of all
            workers, and W workers train exactly what one would) or
            ``"async"`` (TensorNet's mode, :mod:`tnrec.ps.asynchronous`:
            owners serve pulls and apply pushes as they arrive, the dense
            parameters live on a dense server for the epoch, a worker never
            waits for a slower one and stops when its data ends; see
            ``docs/async.md``).
        staleness: async mode's bound ``k``: at most ``k`` of a worker's own
            steps have pushes not yet applied when it pulls. ``k = 0``
            forbids any stale read, which only the synchronous exchange
            gives, so it runs sync mode. Ignored in sync mode and in one process.
        dense_backend: the backend of the dense all-reduce and broadcasts:
            None (:func:`dense_backend_for` chooses by the model's device:
            ``backend`` for a CPU model, ``"nccl"`` for a CUDA one), ``"gloo"``
            or ``"nccl"``. Other than the ``backend`` group, it is a second
            process group, created at the first dense collective that needs
            it (:mod:`tnrec.ps.dense`); the sparse exchange stays on
            ``backend``. Async mode keeps the dense server on the host.

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
        mode: str = "sync",
        staleness: int = 4,
        dense_backend: str | None = None,
    ) -> None:
        global _current
        self.dense_backend = _check_dense_backend(dense_backend)
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ArgumentError(f"PsStrategy: `timeout_s` must be > 0. Received: {timeout_s!r}.")
        if mode not in ("sync", "async"):
            raise ArgumentError(
                f'PsStrategy: `mode` must be "sync" or "async". Received: mode={mode!r}.'
            )
        if not isinstance(staleness, int) or isinstance(staleness, bool) or staleness < 0:
            raise ArgumentError(
                f"PsStrategy: `staleness` must be an int >= 0. Received: staleness={staleness!r}."
            )
        self.mode = mode
        self.staleness = staleness
        self.memory_budget = (
            MemoryBudget(memory_limit_bytes) if memory_limit_bytes is not None else None
        )
        self.env = launch_env()
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.comm: Comm | None = None
        if self.env.world_size > 1:
            if not dist.is_initialized():
                _import_before_process_group()
                try:
                    dist.init_process_group(  # the address launch_env read, not env://'s
                        backend,
                        init_method=self.env.init_method,
                        rank=self.env.rank,
                        world_size=self.env.world_size,
                        timeout=timedelta(seconds=self.timeout_s),
                    )
                except (RuntimeError, ValueError) as e:
                    raise DistributedError(
                        f"rank {self.env.rank}/{self.env.world_size} ({self.env.launcher}): "
                        f"cannot join the process group at {self.env.init_method}: {e}"
                    ) from e
            self.comm = Comm(self.timeout_s)
            if self.asynchronous:
                init_rpc(self.comm, self.env.master_addr or "127.0.0.1", self.timeout_s)
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
    def asynchronous(self) -> bool:
        """True when steps run asynchronously: ``mode="async"``, ``staleness >= 1``, W > 1."""
        return self.mode == "async" and self.staleness > 0 and self.env.world_size > 1

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
        if self.asynchronous:
            return AsyncPS(tables, self.comm, self.staleness)
        return ShardedPS(tables, self.comm, DenseComm(self.comm, self.dense_backend, self.backend))

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
        if self.comm is not None and self.asynchronous:
            shutdown_rpc()
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
