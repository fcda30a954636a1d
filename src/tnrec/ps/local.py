"""The single-process parameter server: every table lives in this process."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import numpy.typing as npt
import torch

from tnrec.errors import NonFiniteError
from tnrec.table import SparseTable


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
        with show and click for the tables in ``stats``)."""
        out = {}
        for name, k in keys.items():
            table = self.tables[name]
            rows = table.pull_unchecked(k, create)  # [U, D]
            if name in stats:
                rows = np.hstack([rows, table.read_stats_unchecked(k)])  # [U, D + 2]
            out[name] = rows
        return out

    def push(
        self,
        keys: Mapping[str, npt.NDArray[np.int64]],
        grads: Mapping[str, npt.NDArray[np.float32]],
        show: Mapping[str, npt.NDArray[np.float32]],
        click: Mapping[str, npt.NDArray[np.float32]],
        active: Mapping[str, npt.NDArray[np.bool_]] | None = None,
    ) -> None:
        """Apply each table's optimizer once per key with the step's summed gradient.

        Tables absent from ``keys`` are not pushed; with ``active[t]`` only the
        marked keys of table ``t`` are.

        Raises:
            NonFiniteError: a gradient is NaN or infinite (nothing is pushed).
        """
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
