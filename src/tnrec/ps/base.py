"""The interface of a parameter server: what models, their loops and their files call on one."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from tnrec.table import SparseTable


class ParameterServer(Protocol):
    """Pull and push table rows for a step, and the few collectives a model needs.

    :class:`~tnrec.ps.LocalPS` (one process) and :class:`~tnrec.ps.ShardedPS`
    (every worker owns a shard of every table) implement it; ``Model.ps`` is
    one of them. Every worker calls every method, in the same order: in a
    single process the collectives are the identity.

    Example:
        >>> from tnrec.ps import LocalPS
        >>> from tnrec.table import SGD, SparseTable
        >>> ps: ParameterServer = LocalPS({"user": SparseTable(4, SGD(), name="user")})
        >>> ps.rank, ps.world_size
        (0, 1)
    """

    @property
    def rank(self) -> int:
        """This worker's rank."""
        ...

    @property
    def world_size(self) -> int:
        """The number of workers W."""
        ...

    @property
    def asynchronous(self) -> bool:
        """True for :class:`~tnrec.ps.asynchronous.AsyncPS`: steps take no collective."""
        ...

    @property
    def tables(self) -> dict[str, SparseTable]:
        """This worker's tables (its shard of each, when sharded), by name."""
        ...

    def pull(
        self,
        keys: Mapping[str, npt.NDArray[np.int64]],
        create: bool,
        stats: Collection[str] = (),
    ) -> dict[str, npt.NDArray[np.float32]]:
        """Return the rows of each table's unique ``keys`` (``float32[U, D]``).

        ``create`` adds missing keys (training); otherwise they read as zeros.
        The tables named in ``stats`` return ``float32[U, D + 2]``: each row,
        then the key's ``show`` and ``click`` as its owner holds them (0 for
        keys without a row).
        """
        ...

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
        """Apply each table's optimizer once per key of the preceding :meth:`pull`.

        ``keys`` are those of that pull; ``grads[t]`` is ``float32[U, D]``,
        ``show[t]`` and ``click[t]`` are ``float32[U]``. A table absent from
        ``keys`` is not pushed (every worker must leave out the same tables).
        ``active[t]`` (``bool[U]``), where given, marks the keys to apply: a
        key no worker marks is left as it is (no optimizer rule, no show or
        click, no marker); every worker must give ``active`` for the same tables.
        ``checked=True`` says the caller found every gradient of ``grads``
        finite (the training step's check): the PS does not read them for it again.
        """
        ...

    def all_reduce_sum(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Sum ``values`` over workers."""
        ...

    def all_gather(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Concatenate every worker's 1-D ``values`` in rank order."""
        ...

    def all_reduce_grads(
        self, params: list[torch.nn.Parameter], extra: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Sum the dense gradients of ``params`` and the small counts ``extra`` over workers."""
        ...

    def broadcast_parameters(self, tensors: list[torch.Tensor]) -> None:
        """Copy rank 0's values of ``tensors`` (parameters, buffers) to every worker."""
        ...

    def barrier(self, phase: str = "barrier") -> None:
        """Wait for every worker; ``phase`` names the wait in a timeout's error."""
        ...
