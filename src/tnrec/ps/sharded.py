"""The sharded parameter server: every worker owns the keys of its buckets, for every table.

Routing (fixed, portable, pinned by tests)::

    bucket(key) = mix64(key) % 1024        owner(key) = bucket(key) % W

One step, for all tables together (T tables, W workers):

    pull   1. each worker sorts its unique keys by owner, then table;
           2. all_to_all of counts  [W, T] int64;
           3. all_to_all of keys    (8 bytes a key);
           4. each owner de-duplicates what it received per table, pulls each key
              once, and all_to_all returns one row per requested key (4*D bytes).
    push   5. one all_to_all carries [grad (D floats), show, click] per key in the
              same order as the pull, so keys are not sent again; each owner sums
              the contributions for a key and applies the optimizer once.

Steps 1-3 and the owners' de-duplication read no table: :meth:`ShardedPS.route`
does them on their own, and ``fit``'s input pipeline runs it for the next
batch in its thread, on a process group of its own (:meth:`ShardedPS.routing_comm`),
while the step's pull (step 4) and push run on the default one.

A pull's ``stats`` tables return ``[row (D floats), show, click]`` per key
(step 4 sends D + 2 floats). A push's ``active`` tables carry one more float
per key (1 where the worker applies the key): the owner applies a key some
worker marked and leaves the others untouched.

Owners add gradients without further scaling (the loss is already divided by
the global batch weight) and show/click stay raw counts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from tnrec.errors import ArgumentError, NonFiniteError
from tnrec.ps.comm import Comm
from tnrec.ps.dense import DenseComm
from tnrec.ps.unique import unique_inverse
from tnrec.table import SparseTable, bucket_of

_NO_KEYS = np.zeros(0, np.int64)  # a table absent from a pull's or push's `keys`


def owner_of(keys: npt.NDArray[np.int64], world_size: int) -> npt.NDArray[np.int64]:
    """Return the worker that owns each key: ``(mix64(key) % 1024) % world_size``."""
    return bucket_of(keys) % world_size


@dataclass
class _Requested:
    """The requesting side of one table's pull, kept for the push."""

    keys: npt.NDArray[np.int64]  # [U] the keys pulled (the caller's array, for the push's check)
    order: npt.NDArray[np.int64]  # [U] the table's keys sorted by owner (stable)
    counts: npt.NDArray[np.int64]  # [W] keys sent to each owner


@dataclass
class _Owned:
    """The owning side of one table's pull, kept for the push."""

    keys: npt.NDArray[np.int64]  # [V] unique received keys
    inverse: npt.NDArray[np.int64]  # [R] received key -> index in keys
    counts: npt.NDArray[np.int64]  # [W] keys received from each worker


@dataclass
class Route:
    """Where one step's keys went: steps 1-3 of a pull, done (see the module docstring).

    Made by :meth:`ShardedPS.route` and consumed by the next
    :meth:`ShardedPS.pull` of the same keys, which only gathers and returns
    the rows; the push after that pull reuses it to send the gradients.
    """

    keys: dict[str, npt.NDArray[np.int64]]  # the caller's arrays, by table
    requested: dict[str, _Requested]
    owned: dict[str, _Owned]
    send_counts: npt.NDArray[np.int64]  # [W, T] keys sent to each owner, per table
    recv_counts: npt.NDArray[np.int64]  # [W, T] keys received from each worker, per table


class ShardedPS:
    """Pull/push rows of tables sharded over all workers (see the module docstring).

    Args:
        tables: this worker's shard of every table, by name (same names on every worker).
        comm: the collectives.
        dense: the dense part's collectives (default: on ``comm``, the host's).
    """

    asynchronous = False

    def __init__(
        self, tables: Mapping[str, SparseTable], comm: Comm, dense: DenseComm | None = None
    ) -> None:
        self.tables = dict(tables)
        self.comm = comm
        self.dense = dense if dense is not None else DenseComm(comm)
        self.rank = comm.rank
        self.world_size = comm.world_size
        self._names = sorted(self.tables)
        self._req: dict[str, _Requested] = {}
        self._own: dict[str, _Owned] = {}
        self._pulled = False  # a pull came before (a model without tables pulls none)
        self._routing: Comm | None = None

    def routing_comm(self) -> Comm:
        """Return the Comm :meth:`route` runs on in the input pipeline's thread.

        Its process group is created on the first call: a collective, which
        every worker makes at the same point (``fit`` does, at the start of
        its first pipelined epoch).
        """
        if self._routing is None:
            self._routing = self.comm.new_channel()
        return self._routing

    def owns(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Return which of ``keys`` this worker owns."""
        return owner_of(keys, self.world_size) == self.rank

    # ---------------------------------------------------------------- pull

    def route(self, keys: Mapping[str, npt.NDArray[np.int64]], comm: Comm | None = None) -> Route:
        """Send each table's unique ``keys`` to their owners (steps 1-3 of a pull).

        Reads no table and changes nothing of this PS, so it may run in another
        thread, for the next batch, while a step pulls and pushes -- on
        ``comm``, a Comm of its own process group (:meth:`routing_comm`); the
        default is this PS's own. Every worker routes the same number of
        times, in the same order, on the same Comm.
        """
        comm = self.comm if comm is None else comm
        W, names = self.world_size, self._names
        send_keys, send_counts = [], np.zeros((W, len(names)), np.int64)  # [W, T]
        requested = {}
        for t, name in enumerate(names):
            k = keys.get(name, _NO_KEYS)
            owner = owner_of(k, W)
            order = np.argsort(owner, kind="stable")
            counts = np.bincount(owner, minlength=W)
            requested[name] = _Requested(k, order, counts)
            send_counts[:, t] = counts
            send_keys.append((k[order], counts))
        # Flat send buffer grouped by destination, then table.
        flat = _group_by_dest([(ks, c) for ks, c in send_keys], W)
        recv_counts = (
            comm.all_to_all(
                torch.from_numpy(send_counts.reshape(-1)),
                [len(names)] * W,
                [len(names)] * W,
                "pull: exchange key counts",
            )
            .numpy()
            .reshape(W, len(names))
        )  # [W sources, T]
        recv_keys = comm.all_to_all(
            torch.from_numpy(flat),
            send_counts.sum(1).tolist(),
            recv_counts.sum(1).tolist(),
            "pull: exchange keys",
        ).numpy()
        # Owner side: per table, the received keys of every source, de-duplicated.
        segments = _split_by_source(recv_keys, recv_counts)  # [W][T] arrays
        owned = {}
        for t, name in enumerate(names):
            got = np.concatenate([segments[s][t] for s in range(W)])  # [R]
            uniq, inverse = unique_inverse(got)  # [V], [R]
            owned[name] = _Owned(uniq, inverse, recv_counts[:, t])
        return Route(dict(keys), requested, owned, send_counts, recv_counts)

    def pull(
        self,
        keys: Mapping[str, npt.NDArray[np.int64]],
        create: bool,
        stats: Collection[str] = (),
        route: Route | None = None,
    ) -> dict[str, npt.NDArray[np.float32]]:
        """Return the rows of each table's unique ``keys`` from their owners (``float32[U, D]``;
        ``[U, D + 2]`` with the owners' show and click for the tables in ``stats``).

        ``route`` is :meth:`route`'s of these very ``keys`` (the input pipeline
        routed them ahead); None routes them here first.
        """
        if route is None:
            route = self.route(keys)
        else:
            self._check_route(keys, route)
        W, names = self.world_size, self._names
        self._pulled = True
        self._req, self._own = route.requested, route.owned  # the push follows this pull
        send_counts, recv_counts = route.send_counts, route.recv_counts
        replies: list[list[np.ndarray]] = [[] for _ in range(W)]
        for t, name in enumerate(names):
            own = route.owned[name]
            table = self.tables[name]
            rows = table.pull_unchecked(own.keys, create)  # [V, D]
            if name in stats:
                rows = np.hstack([rows, table.read_stats_unchecked(own.keys)])  # [V, D + 2]
            per_key = rows[own.inverse]  # [R, D]
            at = 0
            for s in range(W):
                n = int(recv_counts[s, t])
                replies[s].append(per_key[at : at + n].reshape(-1))
                at += n
        reply_flat = np.concatenate([a for parts in replies for a in parts]).astype(np.float32)
        dims = np.array([self.tables[n].dim + 2 * (n in stats) for n in names], np.int64)
        got_rows = self.comm.all_to_all(
            torch.from_numpy(reply_flat),
            (recv_counts * dims).sum(1).tolist(),
            (send_counts * dims).sum(1).tolist(),
            "pull: return rows",
        ).numpy()
        return self._scatter_back(got_rows, send_counts, dims)

    def _check_route(self, keys: Mapping[str, npt.NDArray[np.int64]], route: Route) -> None:
        """Raise unless ``route`` was made for ``keys`` (the very arrays; empty ones may differ)."""
        for name in self._names:
            k, routed = keys.get(name, _NO_KEYS), route.keys.get(name, _NO_KEYS)
            if k is not routed and not (k.shape[0] == 0 == routed.shape[0]):
                raise RuntimeError(
                    f'internal error: table "{name}" (rank {self.rank}): the pull got '
                    f"{k.shape[0]} key(s) but a route of {routed.shape[0]} other key(s)"
                )

    def _scatter_back(
        self, flat: np.ndarray, send_counts: np.ndarray, widths: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Put rows received from owners (grouped by owner, then table) back in key order."""
        names, W = self._names, self.world_size
        out = {}
        for t, name in enumerate(names):
            req = self._req[name]
            w = int(widths[t])
            out[name] = np.empty((req.order.shape[0], w), np.float32)
        at = 0
        filled = {n: 0 for n in names}
        for d in range(W):
            for t, name in enumerate(names):
                n, w = int(send_counts[d, t]), int(widths[t])
                block = flat[at : at + n * w].reshape(n, w)
                at += n * w
                req = self._req[name]
                out[name][req.order[filled[name] : filled[name] + n]] = block
                filled[name] += n
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
        """Send each key's gradient and show/click to its owner, which applies them once.

        ``keys`` must be those of the preceding :meth:`pull`, in the same order:
        the gradients travel in the order the pull sent the keys, without the keys.
        Tables absent from ``keys`` are not pushed; for the tables in ``active``
        an owner applies only the keys some worker marked (every worker must
        leave out, and mark, the same tables).

        Raises:
            ArgumentError: ``keys`` differ from the preceding pull's (checked
                before anything is sent: a worker that pushes other keys raises
                here, and the others' push then fails at the collective timeout).
            NonFiniteError: a pushed gradient is NaN or infinite. The owners
                check the sums they apply whatever ``checked`` says: finite
                gradients can add up to an infinity.
        """
        self._check_push_keys(keys)
        W = self.world_size
        names = [n for n in self._names if n in keys]
        if not names:  # every worker leaves out the same tables: no exchange at all
            return
        masks = active if active is not None else {}
        parts = []
        for name in names:
            req = self._req[name]
            n = req.order.shape[0]
            D = self.tables[name].dim
            packed = np.empty((n, D + 2 + (name in masks)), np.float32)  # grad, show, click[, on]
            if n:
                packed[:, :D] = grads[name]
                packed[:, D] = show[name]
                packed[:, D + 1] = click[name]
                if name in masks:
                    packed[:, D + 2] = masks[name]
            parts.append((packed[req.order], req.counts))
        flat = _group_by_dest(parts, W)
        widths = np.array([self.tables[n].dim + 2 + (n in masks) for n in names], np.int64)
        send_counts = np.stack([self._req[n].counts for n in names], 1)  # [W, T]
        recv_counts = np.stack([self._own[n].counts for n in names], 1)  # [W, T]
        recv = self.comm.all_to_all(
            torch.from_numpy(flat),
            (send_counts * widths).sum(1).tolist(),
            (recv_counts * widths).sum(1).tolist(),
            "push: send gradients",
        ).numpy()
        blocks = _split_rows_by_source(recv, recv_counts, widths)  # [W][T] arrays [n, D+2]
        for t, name in enumerate(names):
            own = self._own[name]
            got = np.concatenate([blocks[s][t] for s in range(W)])  # [R, D + 2]
            summed = torch.zeros((own.keys.shape[0], got.shape[1]), dtype=torch.float32)
            summed.index_add_(0, torch.from_numpy(own.inverse), torch.from_numpy(got))
            acc = summed.numpy()  # [V, D + 2]
            D = self.tables[name].dim
            if not np.isfinite(acc).all():
                raise NonFiniteError(
                    f'Table "{name}" (rank {self.rank}): a pushed gradient is NaN or infinite.'
                )
            k = own.keys
            if name in masks:
                on = acc[:, D + 2] > 0  # [V] some worker applies the key
                k, acc = k[on], acc[on]
            self.tables[name].push_unchecked(
                k,
                np.ascontiguousarray(acc[:, :D]),
                np.ascontiguousarray(acc[:, D]),
                np.ascontiguousarray(acc[:, D + 1]),
            )

    def _check_push_keys(self, keys: Mapping[str, npt.NDArray[np.int64]]) -> None:
        """Raise unless ``keys`` are the preceding pull's, table by table.

        The model pushes the very arrays it pulled, so the check is one identity
        test a table; other arrays are compared whole (no per-key Python).
        """
        if not self._pulled:
            raise ArgumentError(
                f"ShardedPS.push (rank {self.rank}): no pull came before; push sends the "
                "gradients of the keys the preceding pull(keys, create) returned rows for."
            )
        unknown = sorted(set(keys) - set(self._names))
        if unknown:
            raise ArgumentError(
                f"ShardedPS.push (rank {self.rank}): `keys` names tables that were not pulled: "
                f"{unknown}. Tables: {self._names}."
            )
        for name in keys:
            pulled = self._req[name].keys  # [U]
            got = keys[name]
            if got is pulled:
                continue
            if got.shape != pulled.shape or not np.array_equal(got, pulled):
                raise ArgumentError(
                    f'Table "{name}" (rank {self.rank}): push got {got.shape[0]} key(s) that are '
                    f"not the {pulled.shape[0]} key(s) of the preceding pull, in its order; "
                    "push the keys pull returned rows for."
                )

    # ---------------------------------------------------------------- dense

    def all_reduce_sum(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Sum ``values`` over workers."""
        t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64).copy())
        return self.comm.all_reduce_sum(t, "all-reduce statistics").numpy()

    def all_gather(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Concatenate every worker's 1-D ``values`` in rank order (two all-reduces)."""
        sizes = np.zeros(self.world_size, np.float64)
        sizes[self.rank] = values.shape[0]
        sizes = self.all_reduce_sum(sizes).astype(np.int64)
        start = int(sizes[: self.rank].sum())
        buf = np.zeros(int(sizes.sum()), np.float64)
        buf[start : start + values.shape[0]] = values
        return self.all_reduce_sum(buf)

    def all_reduce_grads(
        self, params: list[torch.nn.Parameter], extra: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Sum every dense gradient, and small ``extra`` counts, over workers in one all-reduce
        (:meth:`tnrec.ps.dense.DenseComm.all_reduce_grads`)."""
        return self.dense.all_reduce_grads(params, extra)

    def broadcast_parameters(self, tensors: list[torch.Tensor]) -> None:
        """Copy rank 0's values of ``tensors`` (parameters, buffers) to every worker."""
        self.dense.broadcast_parameters(tensors)

    def barrier(self, phase: str = "barrier") -> None:
        """Wait for every worker."""
        self.comm.barrier(phase)


def _group_by_dest(parts: list[tuple[np.ndarray, np.ndarray]], W: int) -> np.ndarray:
    """Concatenate tables' owner-sorted arrays into one flat buffer grouped by owner, then table."""
    chunks = []
    starts = [np.concatenate([[0], np.cumsum(c)]) for _, c in parts]
    for d in range(W):
        for (arr, _), st in zip(parts, starts, strict=True):
            chunks.append(arr[st[d] : st[d + 1]].reshape(-1))
    if not chunks:
        return np.zeros(0, np.int64)
    return np.concatenate(chunks)


def _split_by_source(flat: np.ndarray, counts: np.ndarray) -> list[list[np.ndarray]]:
    """Split a buffer grouped by source, then table, into ``[source][table]`` arrays."""
    out, at = [], 0
    for s in range(counts.shape[0]):
        row = []
        for t in range(counts.shape[1]):
            n = int(counts[s, t])
            row.append(flat[at : at + n])
            at += n
        out.append(row)
    return out


def _split_rows_by_source(
    flat: np.ndarray, counts: np.ndarray, widths: np.ndarray
) -> list[list[np.ndarray]]:
    """Like :func:`_split_by_source` for rows of ``widths[t]`` floats."""
    out, at = [], 0
    for s in range(counts.shape[0]):
        row = []
        for t in range(counts.shape[1]):
            n, w = int(counts[s, t]), int(widths[t])
            row.append(flat[at : at + n * w].reshape(n, w))
            at += n * w
        out.append(row)
    return out
