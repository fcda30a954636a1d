"""The single-process parameter server: every table lives in this process."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import wait

import numpy as np
import numpy.typing as npt
import torch

from tnrec.errors import NonFiniteError
from tnrec.table import SparseTable
from tnrec.table import threads as table_threads

#: Whether :meth:`LocalPS.pull` pulls some of a step's tables in a second thread while this
#: one pulls the others: ``None`` (the default) when a core is left for it (torch's threads
#: plus the table kernels' fit in this worker's CPUs, :func:`tnrec.table.threads.cpus_per_worker`),
#: no table counts against a :class:`~tnrec.table.MemoryBudget` (whose check sums every
#: table), and the second thread's share holds at least :data:`BESIDE_MIN_KEYS` keys;
#: ``True`` whenever two tables have keys and none has a budget; ``False`` never.
PULL_TABLES_BESIDE: bool | None = None

#: The keys below which the default pulls every table in this thread: the slice below which
#: the table kernels themselves stay in one thread (:data:`tnrec.table.threads.MIN_SLICE`),
#: too little work to pay for handing it to another.
BESIDE_MIN_KEYS = table_threads.MIN_SLICE


class LocalPS:
    """Pull and push rows of local tables; the interface a sharded PS replaces.

    Every call carries all tables of one step at once (a sharded PS turns each
    call into one exchange for all tables). Keys are unique per table, as the
    model's de-duplication guarantees.

    Args:
        tables: the tables by name.

    Example:
        >>> from tnrec.table import SparseTable, SGD
        >>> ps = LocalPS({"user": SparseTable(4, SGD(), name="user")})
        >>> ps.pull({"user": np.array([1, 2], dtype=np.int64)}, create=True)["user"].shape
        (2, 4)
    """

    rank = 0
    world_size = 1
    asynchronous = False

    def __init__(self, tables: Mapping[str, SparseTable]) -> None:
        self.tables = dict(tables)

    def pull(
        self,
        keys: Mapping[str, npt.NDArray[np.int64]],
        create: bool,
        stats: Collection[str] = (),
    ) -> dict[str, npt.NDArray[np.float32]]:
        """Return the rows of each table's unique keys (``float32[U, D]``; ``[U, D + 2]``
        with show and click for the tables in ``stats``).

        Where a core is free, a share of the tables is pulled in a second thread
        meanwhile (:data:`PULL_TABLES_BESIDE`); the rows are the same either way.
        """
        side = self._side_share(keys)
        if not side:
            return self._pull_tables(list(keys), keys, create, stats)
        # The tables share no state: each is pulled by one thread, with the same rows
        # and values as one after the other.
        ahead = table_threads.side_thread().submit(self._pull_tables, side, keys, create, stats)
        try:
            out = self._pull_tables([n for n in keys if n not in side], keys, create, stats)
        except BaseException:
            wait([ahead])  # no table is still being pulled when the caller sees the error
            raise
        out.update(ahead.result())
        return {name: out[name] for name in keys}

    def _pull_tables(
        self,
        names: Sequence[str],
        keys: Mapping[str, npt.NDArray[np.int64]],
        create: bool,
        stats: Collection[str],
    ) -> dict[str, npt.NDArray[np.float32]]:
        out = {}
        for name in names:
            table, k = self.tables[name], keys[name]
            rows = table.pull_unchecked(k, create)  # [U, D]
            if name in stats:
                rows = np.hstack([rows, table.read_stats_unchecked(k)])  # [U, D + 2]
            out[name] = rows
        return out

    def _side_share(self, keys: Mapping[str, npt.NDArray[np.int64]]) -> list[str]:
        """The tables a pull of ``keys`` hands to the second thread (see
        :data:`PULL_TABLES_BESIDE`): the largest table stays here, each other one goes to
        the thread with fewer keys so far; empty when the pull stays in this thread."""
        if PULL_TABLES_BESIDE is False:
            return []
        sized = sorted(((k.shape[0], name) for name, k in keys.items() if k.shape[0]), reverse=True)
        if len(sized) < 2 or any(self.tables[n].memory_budget is not None for _, n in sized):
            return []
        here, there, side = 0, 0, []
        for n, name in sized:
            if here <= there:
                here += n
            else:
                there += n
                side.append(name)
        if PULL_TABLES_BESIDE is None and (
            there < BESIDE_MIN_KEYS or not table_threads.spare_core(torch.get_num_threads())
        ):
            return []
        return side

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
        """Apply each table's optimizer once per key with the step's summed gradient.

        Tables absent from ``keys`` are not pushed; with ``active[t]`` only the
        marked keys of table ``t`` are. ``checked=True``: the caller found every
        gradient finite, and they are not checked again.

        Raises:
            NonFiniteError: a gradient is NaN or infinite (nothing is pushed;
                not checked with ``checked=True``).
        """
        if not checked:
            for name in keys:
                if not np.isfinite(grads[name]).all():
                    raise NonFiniteError(
                        f'Table "{name}": the step produced a NaN or infinite embedding gradient '
                        "(check the loss and learning rates); no table was updated."
                    )
        for name, k in keys.items():
            g, s, c = grads[name], show[name], click[name]
            mask = active.get(name) if active is not None else None
            if mask is not None and not mask.all():
                k, g, s, c = k[mask], g[mask], s[mask], c[mask]
            self.tables[name].push_unchecked(k, g, s, c)

    def all_reduce_grads(
        self, params: list[torch.nn.Parameter], extra: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Sum dense gradients and ``extra`` over workers; nothing to do in one process."""
        return extra

    def broadcast_parameters(self, tensors: list[torch.Tensor]) -> None:
        """Copy rank 0's values to every worker; nothing to do in one process."""

    def barrier(self, phase: str = "barrier") -> None:
        """Wait for every worker; nothing to do in one process."""

    def all_gather(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Concatenate every worker's ``values`` in rank order; the identity in one process."""
        return values

    def all_reduce_sum(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Sum ``values`` over workers; the identity in one process."""
        return values
