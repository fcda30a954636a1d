"""Asynchronous training's parameter server: owners serve pulls and apply pushes as they arrive.

``PsStrategy(mode="async", staleness=k)`` with ``k >= 1`` on W > 1 workers
makes an :class:`AsyncPS`. Every worker is still the owner of the same
buckets as in synchronous mode (``owner(key) = (mix64(key) % 1024) % W``),
so checkpoints are the same files and load in either mode on any W. What
changes is who waits for whom:

* **Sparse pull.** A worker sends each owner the keys it owns (one
  ``torch.distributed.rpc`` call per owner, all tables together) and the
  owner's RPC thread answers from its tables at once. No other worker's
  progress is involved.
* **Sparse push** is fire-and-forget: one RPC per owner carries
  ``[grad, show, click]`` per key; the owner applies it (its own optimizer
  rule, show/click, admission, caps) when it arrives, under the table's lock,
  so a row is never read or written half-updated.
* **Staleness k** bounds this worker's own pushes in flight: before the pull
  of its step ``s`` a worker waits until every push of its steps ``<= s - k - 1``
  has been applied by the owners. At most ``k`` of its steps' pushes are
  outstanding when it pulls (:attr:`AsyncPS.max_outstanding` records the most
  seen). Other workers' pushes are applied whenever they arrive: nothing bounds
  how far behind a slow worker another one reads, which is what lets a fast
  worker run at its own pace. ``k = 0`` (no stale read at all) is only what
  the synchronous exchange gives, so ``PsStrategy`` runs sync mode for it.
* **Dense parameters** live on a dense parameter server for the length of an
  epoch (TensorNet's dense table): all trainable dense parameters, flattened,
  split into W contiguous ranges, one per worker, each with its own instance
  of the model's dense optimizer. A step sends each range owner its slice of
  this worker's gradient and the learning rate; the owner applies one
  optimizer step (Hogwild per range: no averaging, a worker's gradient is a
  step) and returns the range's new weights, which the worker copies into its
  model. A worker waits for the owners' RPC threads, never for another
  worker's step.

:meth:`AsyncPS.begin_epoch` starts the dense server from the model's
parameters and optimizer state (identical on every worker) and
:meth:`AsyncPS.end_epoch` quiesces: every worker's pushes applied, then every
worker copies the dense server's weights and optimizer state back into its
model and optimizer. Between epochs the model is an ordinary one: evaluate,
save, export and load run as in sync mode (their collectives on the process
group, their pulls through the owners' RPC threads).

The collectives (all-reduce, barrier, broadcast) run on the gloo process group
as in sync mode; they are for the epoch's edges, never inside an async step.
RPC arguments travel as tensors; the calls' own framing is torch's (between
the job's workers, never read back from a file).
"""

from __future__ import annotations

import inspect
import itertools
import os
import socket
import threading
import warnings
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed.rpc as rpc

from tnrec.errors import ArgumentError, DistributedError, NonFiniteError
from tnrec.ps.comm import Comm
from tnrec.ps.sharded import ShardedPS, owner_of
from tnrec.table import SparseTable

_SERVERS: dict[int, AsyncPS] = {}  # this process's async PSs by id (the same ids on every worker)
_ids = itertools.count()


def _name(rank: int) -> str:
    return f"tnrec{rank}"


def init_rpc(comm: Comm, host: str, timeout_s: float, threads: int = 4) -> None:
    """Start torch.distributed.rpc on every worker (a collective over ``comm``).

    Rank 0 takes a free port on ``host`` (the launcher's master address) and
    broadcasts it; every worker joins the RPC group there.
    """
    port = torch.zeros(1, dtype=torch.int64)
    if comm.rank == 0:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
            port[0] = s.getsockname()[1]
    comm.broadcast(port, "async mode: share the RPC port")
    where = f"[{host}]" if ":" in host else host
    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{where}:{int(port[0])}",
        num_worker_threads=threads,
        rpc_timeout=timeout_s,
        _transports=["uv"],
        _channels=["basic"],
    )
    # torchrun tells rendezvous to join its agent's store; this rendezvous has its own, on rank 0
    agent_store = os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    try:
        with warnings.catch_warnings():  # rpc's own use of the gloo group warns of its API
            warnings.filterwarnings("ignore", message="You are using a Backend")
            rpc.init_rpc(
                _name(comm.rank),
                rank=comm.rank,
                world_size=comm.world_size,
                rpc_backend_options=options,
            )
    except (RuntimeError, ValueError) as e:
        raise DistributedError(
            f"rank {comm.rank}/{comm.world_size}: cannot start async mode's RPC group at "
            f"tcp://{where}:{int(port[0])}: {e}"
        ) from e
    finally:
        if agent_store is not None:
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = agent_store


def shutdown_rpc() -> None:
    """Leave the RPC group (waits for every worker's outstanding calls)."""
    rpc.shutdown(graceful=True)


class PushWindow:
    """This worker's pushes in flight, by step: what a pull waits for (``staleness``)."""

    def __init__(self) -> None:
        self._steps: deque[tuple[int, list[tuple[int, Any]]]] = deque()  # (step, [(dest, fut)])
        self.max_outstanding = 0

    def add(self, step: int, futures: list[tuple[int, Any]]) -> None:
        """Record the futures of step ``step``'s pushes (``(owner, future)`` pairs)."""
        self._steps.append((step, futures))

    def wait_before(self, oldest_allowed: int, wait: Any) -> None:
        """Wait (``wait(future, owner, phase)``) for every push of the steps before
        ``oldest_allowed``; then note how many steps still have pushes unapplied."""
        while self._steps and self._steps[0][0] < oldest_allowed:
            step, futures = self._steps.popleft()
            for dest, fut in futures:
                wait(fut, dest, f"push of step {step + 1}")
        self.max_outstanding = max(self.max_outstanding, self.outstanding())

    def outstanding(self) -> int:
        """The steps with a push not yet applied."""
        return sum(1 for _, fs in self._steps if not all(f.done() for _, f in fs))


class _DenseShard:
    """One worker's range of the flattened dense parameters and its optimizer."""

    def __init__(self, values: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        self.param = values
        self.optimizer = optimizer
        self.lock = threading.Lock()

    def step(self, grad: torch.Tensor, lr: float) -> torch.Tensor:
        with self.lock:
            if self.param.numel():
                self.param.grad = grad
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.optimizer.step()
            return self.param.detach().clone()


class AsyncPS:
    """Pull/push rows through their owners without waiting for other workers (module docstring).

    Args:
        tables: this worker's shard of every table, by name (same names on every worker).
        comm: the process group's collectives (for the epoch's edges).
        staleness: ``k >= 1``, the most of this worker's steps whose pushes may
            be outstanding when it pulls.
    """

    asynchronous = True

    def __init__(self, tables: Mapping[str, SparseTable], comm: Comm, staleness: int) -> None:
        self.tables = dict(tables)
        self.comm = comm
        self.rank = comm.rank
        self.world_size = comm.world_size
        self.staleness = int(staleness)
        self.timeout_s = comm.timeout_s
        self._collectives = ShardedPS(tables, comm)
        self._names = sorted(self.tables)
        self._locks = {n: threading.Lock() for n in self._names}
        self._id = next(_ids)
        _SERVERS[self._id] = self
        self._pulled: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._window = PushWindow()
        self.steps = 0  # pushes this worker made
        self.pushes_applied = 0  # other workers' pushes this worker applied as an owner
        self._dense: _DenseShard | None = None
        self._bounds: list[int] = []

    # ---------------------------------------------------------------- owner side

    def _serve_pull(
        self, keys: list[torch.Tensor], create: bool, stats: list[str]
    ) -> list[torch.Tensor]:
        out = []
        for name, k in zip(self._names, keys, strict=True):
            out.append(torch.from_numpy(self._pull_own(name, k.numpy(), create, name in stats)))
        return out

    def _pull_own(
        self, name: str, keys: npt.NDArray[np.int64], create: bool, stats: bool
    ) -> npt.NDArray[np.float32]:
        table = self.tables[name]
        with self._locks[name]:
            rows = table.pull_unchecked(keys, create)  # [n, D]
            if stats:
                rows = np.hstack([rows, table.read_stats_unchecked(keys)])  # [n, D + 2]
        return rows

    def _apply_push(
        self, names: list[str], keys: list[torch.Tensor], packed: list[torch.Tensor]
    ) -> None:
        for name, k, block in zip(names, keys, packed, strict=True):
            self._push_own(name, k.numpy(), block.numpy())
        self.pushes_applied += 1

    def _push_own(
        self, name: str, keys: npt.NDArray[np.int64], block: npt.NDArray[np.float32]
    ) -> None:
        """Apply one worker's ``[grad | show | click | on?]`` rows of ``keys``."""
        table = self.tables[name]
        D = table.dim
        if block.shape[1] == D + 3:  # an `active` column: only the marked keys
            on = block[:, D + 2] > 0
            keys, block = keys[on], block[on]
        if not keys.shape[0]:
            return
        with self._locks[name]:
            present = table.contains(keys)
            if not present.all():  # evicted by a cap between this worker's pull and its push
                keys, block = keys[present], block[present]
            table.push_unchecked(
                np.ascontiguousarray(keys),
                np.ascontiguousarray(block[:, :D]),
                np.ascontiguousarray(block[:, D]),
                np.ascontiguousarray(block[:, D + 1]),
            )

    # ---------------------------------------------------------------- pull

    def _wait(self, fut: Any, dest: int, phase: str) -> Any:
        try:
            return fut.wait()
        except (RuntimeError, ValueError) as e:
            raise DistributedError(
                f"rank {self.rank}/{self.world_size}: async {phase} with rank {dest} failed or "
                f"did not complete within {self.timeout_s:g} s (a worker may have crashed or "
                f"stalled): {e}"
            ) from e

    def _wait_pushes(self, oldest_allowed: int) -> None:
        """Wait until every push of this worker's steps before ``oldest_allowed`` is applied."""
        self._window.wait_before(oldest_allowed, self._wait)

    def pull(
        self,
        keys: Mapping[str, npt.NDArray[np.int64]],
        create: bool,
        stats: Collection[str] = (),
    ) -> dict[str, npt.NDArray[np.float32]]:
        """Return the rows of each table's unique ``keys`` from their owners (``float32[U, D]``;
        ``[U, D + 2]`` with the owners' show and click for the tables in ``stats``).

        In training (``create``) it first waits until at most ``staleness`` of
        this worker's steps have pushes not yet applied.
        """
        if create:
            self._wait_pushes(self.steps - self.staleness)
        W, names = self.world_size, self._names
        routed = {}
        for name in names:
            k = keys.get(name, np.zeros(0, np.int64))
            owner = owner_of(k, W)
            order = np.argsort(owner, kind="stable")
            starts = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=W))])
            routed[name] = (k, order, starts)
        self._pulled = routed
        stat_list = [n for n in names if n in stats]
        futures = []
        for dest in range(W):
            if dest == self.rank:
                continue
            parts = [torch.from_numpy(k[o[s[dest] : s[dest + 1]]]) for k, o, s in routed.values()]
            if any(p.shape[0] for p in parts):
                fut = rpc.rpc_async(
                    _name(dest), _remote_pull, args=(self._id, parts, create, stat_list)
                )
                futures.append((dest, fut))
        out = {}
        for name, (k, order, starts) in routed.items():
            width = self.tables[name].dim + 2 * (name in stats)
            out[name] = np.empty((k.shape[0], width), np.float32)
            mine = order[starts[self.rank] : starts[self.rank + 1]]
            if mine.shape[0]:
                out[name][mine] = self._pull_own(name, k[mine], create, name in stats)
        for dest, fut in futures:
            rows = self._wait(fut, dest, "pull")
            for name, r in zip(names, rows, strict=True):
                k, order, starts = routed[name]
                if r.shape[0]:
                    out[name][order[starts[dest] : starts[dest + 1]]] = r.numpy()
        return out

    # ---------------------------------------------------------------- push

    def push(
        self,
        keys: Mapping[str, npt.NDArray[np.int64]],
        grads: Mapping[str, npt.NDArray[np.float32]],
        show: Mapping[str, npt.NDArray[np.float32]],
        click: Mapping[str, npt.NDArray[np.float32]],
        active: Mapping[str, npt.NDArray[np.bool_]] | None = None,
        *,
        checked: bool = False,
    ) -> None:
        """Send each key's gradient and show/click to its owner; do not wait for it.

        The keys of this worker's own buckets are applied here and now; the
        others travel in one RPC per owner, applied when they arrive. ``keys``
        must be those of the preceding :meth:`pull`. ``checked=True``: the
        caller found every gradient finite, and they are not checked again.

        Raises:
            ArgumentError: ``keys`` differ from the preceding pull's.
            NonFiniteError: a pushed gradient is NaN or infinite (nothing sent;
                not checked with ``checked=True``).
        """
        names = [n for n in self._names if n in keys]
        masks = active if active is not None else {}
        packed = {}
        for name in names:
            k, order, starts = self._pulled.get(name, (None, None, None))
            got = keys[name]
            if k is None or not (got is k or np.array_equal(got, k)):
                raise ArgumentError(
                    f'Table "{name}" (rank {self.rank}): push got keys that are not those of '
                    "the preceding pull, in its order; push the keys pull returned rows for."
                )
            if not checked and not np.isfinite(grads[name]).all():
                raise NonFiniteError(
                    f'Table "{name}" (rank {self.rank}): a pushed gradient is NaN or infinite.'
                )
            D = self.tables[name].dim
            block = np.empty((k.shape[0], D + 2 + (name in masks)), np.float32)
            block[:, :D] = grads[name]
            block[:, D] = show[name]
            block[:, D + 1] = click[name]
            if name in masks:
                block[:, D + 2] = masks[name]
            packed[name] = (k[order], block[order])
        futures = []
        for dest in range(self.world_size):
            sent, sent_keys, parts = [], [], []
            for name in names:
                lo, hi = self._pulled[name][2][dest : dest + 2]
                if hi > lo:
                    sent.append(name)
                    sent_keys.append(packed[name][0][lo:hi])
                    parts.append(packed[name][1][lo:hi])
            if not sent:
                continue
            if dest == self.rank:
                for name, k, part in zip(sent, sent_keys, parts, strict=True):
                    self._push_own(name, k, part)
            else:
                args = (
                    self._id,
                    sent,
                    [torch.from_numpy(k) for k in sent_keys],
                    [torch.from_numpy(p) for p in parts],
                )
                futures.append((dest, rpc.rpc_async(_name(dest), _remote_push, args=args)))
        self._window.add(self.steps, futures)
        self.steps += 1

    @property
    def max_outstanding(self) -> int:
        """The most of this worker's steps whose pushes were not all applied at a pull."""
        return self._window.max_outstanding

    def wait_pushes(self) -> None:
        """Wait until every push this worker made has been applied by its owner."""
        self._wait_pushes(self.steps + 1)

    # ---------------------------------------------------------------- dense

    def begin_epoch(
        self, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer
    ) -> None:
        """Start this worker's range of the dense server from ``params`` and ``optimizer``.

        A collective: every worker calls it with its identical model before
        its first async step of the epoch.

        Raises:
            ArgumentError: the optimizer has several parameter groups, or a
                state that is not one value per parameter element (or a scalar),
                or the model is not on the CPU (the dense server is on the host).
        """
        check_on_host(params)
        if len(optimizer.param_groups) != 1:
            raise ArgumentError(
                "async mode: the dense optimizer must have one parameter group (the dense "
                f"server splits the flattened parameters); it has {len(optimizer.param_groups)}."
            )
        sizes = [p.numel() for p in params]
        total = sum(sizes)
        self._bounds = [total * r // self.world_size for r in range(self.world_size + 1)]
        lo, hi = self._bounds[self.rank], self._bounds[self.rank + 1]
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).float() for p in params]) if params else None
        values = (flat[lo:hi] if flat is not None else torch.zeros(0)).clone()
        shard = torch.nn.Parameter(values)
        hyper = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        shard_opt = type(optimizer)([shard], **_constructor_args(optimizer, hyper))
        state = _flat_state(optimizer, params)
        if state:
            shard_opt.state[shard] = {
                k: (v[lo:hi].clone() if per_element else v.clone())
                for k, (v, per_element) in state.items()
            }
        self._dense = _DenseShard(shard, shard_opt)
        self.comm.barrier("async mode: start the dense server")

    def dense_step(self, params: list[torch.nn.Parameter], lr: float) -> None:
        """Send this worker's dense gradient to the range owners; copy back their new weights."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads]) if grads else torch.zeros(0)
        futures = []
        own = None
        for dest in range(self.world_size):
            lo, hi = self._bounds[dest], self._bounds[dest + 1]
            if hi == lo:
                continue
            part = flat[lo:hi].clone()
            if dest == self.rank:
                own = (lo, part)
            else:
                futures.append(
                    (dest, lo, rpc.rpc_async(_name(dest), _remote_dense, args=(self._id, part, lr)))
                )
        new = torch.empty_like(flat)
        if own is not None:
            lo, part = own
            new[lo : lo + part.shape[0]] = self._dense_shard().step(part, lr)
        for dest, lo, fut in futures:
            got = self._wait(fut, dest, "dense step")
            new[lo : lo + got.shape[0]] = got
        _unflatten_into(new, params)

    def _dense_shard(self) -> _DenseShard:
        if self._dense is None:
            raise DistributedError(
                f"rank {self.rank}: an async step reached this worker's dense server before the "
                "epoch started it (every worker must train the same epochs)."
            )
        return self._dense

    def _dense_state(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        shard = self._dense_shard()
        with shard.lock:
            state = shard.optimizer.state.get(shard.param, {})
            return shard.param.detach().clone(), {
                k: v.detach().clone() for k, v in state.items() if isinstance(v, torch.Tensor)
            }

    def end_epoch(self, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
        """Quiesce: every push applied, then the dense server's state copied into the model.

        A collective, once every worker has taken its last step of the epoch
        (however many that was). Afterwards every worker holds the same dense
        parameters and optimizer state, and no RPC is in flight.
        """
        self.wait_pushes()
        self.comm.barrier("async mode: every worker's pushes applied")
        futures = [
            (d, rpc.rpc_async(_name(d), _remote_dense_state, args=(self._id,)))
            for d in range(self.world_size)
            if d != self.rank
        ]
        by_rank = {self.rank: self._dense_state()}
        for d, fut in futures:
            by_rank[d] = self._wait(fut, d, "read the dense server")
        parts = [by_rank[d] for d in range(self.world_size)]
        _unflatten_into(torch.cat([w for w, _ in parts]), params)
        _set_state(optimizer, params, _merge_states(parts))
        self.comm.barrier("async mode: stop the dense server")
        self._dense = None

    # ---------------------------------------------------------------- collectives

    def all_reduce_sum(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Sum ``values`` over workers (a collective on the process group)."""
        return self._collectives.all_reduce_sum(values)

    def all_gather(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Concatenate every worker's 1-D ``values`` in rank order (a collective)."""
        return self._collectives.all_gather(values)

    def all_reduce_grads(
        self, params: list[torch.nn.Parameter], extra: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Sum dense gradients and ``extra`` over workers (a collective; async steps use
        :meth:`dense_step` instead)."""
        return self._collectives.all_reduce_grads(params, extra)

    def broadcast_parameters(self, tensors: list[torch.Tensor]) -> None:
        """Copy rank 0's values of ``tensors`` to every worker (a collective)."""
        self._collectives.broadcast_parameters(tensors)

    def barrier(self, phase: str = "barrier") -> None:
        """Wait for every worker."""
        self.comm.barrier(phase)

    def close(self) -> None:
        """Forget this PS in the process's registry (after every worker stopped calling it)."""
        _SERVERS.pop(self._id, None)


# ---------------------------------------------------------------- RPC entry points


def check_on_host(params: list[torch.nn.Parameter]) -> None:
    """Refuse dense parameters off the CPU: async mode's dense server is on the host.

    Raises:
        ArgumentError: a parameter is on another device (named).
    """
    off_host = sorted({str(p.device) for p in params if p.device.type != "cpu"})
    if off_host:
        raise ArgumentError(
            f"async mode keeps the dense server on the host; the model is on {off_host}. "
            'Train a model on a device in sync mode (PsStrategy(mode="sync")).'
        )


def _server(ps_id: int) -> AsyncPS:
    ps = _SERVERS.get(ps_id)
    if ps is None:
        raise RuntimeError(
            f"async PS {ps_id} does not exist on this worker (built in another order?)"
        )
    return ps


def _remote_pull(
    ps_id: int, keys: list[torch.Tensor], create: bool, stats: list[str]
) -> list[torch.Tensor]:
    return _server(ps_id)._serve_pull(keys, create, stats)


def _remote_push(
    ps_id: int, names: list[str], keys: list[torch.Tensor], packed: list[torch.Tensor]
) -> None:
    _server(ps_id)._apply_push(names, keys, packed)


def _remote_dense(ps_id: int, grad: torch.Tensor, lr: float) -> torch.Tensor:
    return _server(ps_id)._dense_shard().step(grad, lr)


def _remote_dense_state(ps_id: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return _server(ps_id)._dense_state()


# ---------------------------------------------------------------- dense state


def _constructor_args(optimizer: torch.optim.Optimizer, hyper: dict[str, Any]) -> dict[str, Any]:
    """The group's hyperparameters that ``type(optimizer)``'s constructor takes."""
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return {k: v for k, v in hyper.items() if k in accepted}


def _flat_state(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]
) -> dict[str, tuple[torch.Tensor, bool]]:
    """The optimizer's state of ``params``, flattened: ``{key: (values, per element)}``.

    A per-element state (Adam's moments) is concatenated over the parameters
    in order, zeros where a parameter has none yet; a scalar (a step count)
    is taken from the first parameter that has it.

    Raises:
        ArgumentError: a state is neither per element nor a scalar.
    """
    keys: dict[str, None] = {}
    for p in params:
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                keys.setdefault(k)
    out: dict[str, tuple[torch.Tensor, bool]] = {}
    for key in keys:
        scalar, pieces = None, []
        for p in params:
            v = optimizer.state.get(p, {}).get(key)
            if v is not None and v.dim() > 0 and v.shape == p.shape:
                pieces.append(v.detach().reshape(-1).float())
            elif v is not None and v.numel() == 1:
                scalar = v.detach() if scalar is None else scalar
            elif v is None:
                pieces.append(torch.zeros(p.numel()))
            else:
                raise ArgumentError(
                    f"async mode: the dense optimizer's state {key!r} has shape "
                    f"{tuple(v.shape)} for a parameter of shape {tuple(p.shape)}; the dense "
                    "server splits the parameters element-wise, so it takes optimizers whose "
                    "state is one value per element or a scalar (SGD, Adam, AdaGrad, RMSprop)."
                )
        if scalar is not None:
            out[key] = (scalar, False)
        else:
            out[key] = (torch.cat(pieces) if pieces else torch.zeros(0), True)
    return out


def _merge_states(
    parts: list[tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> dict[str, tuple[torch.Tensor, bool]]:
    """Join the ranges' optimizer states into the flattened state of every parameter."""
    held = [(w.numel(), st) for w, st in parts if w.numel()]
    if not held or not held[0][1]:
        return {}
    merged = {}
    for key, first in held[0][1].items():
        if first.dim() > 0 and first.numel() == held[0][0]:
            merged[key] = (torch.cat([st[key].reshape(-1) for _, st in held]), True)
        else:
            merged[key] = (first, False)
    return merged


def _set_state(
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    state: dict[str, tuple[torch.Tensor, bool]],
) -> None:
    """Give every parameter its slice of a flattened state (:func:`_flat_state`'s inverse)."""
    if not state:
        return
    at = 0
    for p in params:
        n = p.numel()
        optimizer.state[p] = {
            k: (v[at : at + n].view_as(p).to(p.dtype).clone() if per_element else v.clone())
            for k, (v, per_element) in state.items()
        }
        at += n


def _unflatten_into(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
    """Copy consecutive slices of ``flat`` into ``params``."""
    at = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[at : at + n].view_as(p))
            at += n
