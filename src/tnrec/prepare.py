"""The batch-only part of a step's pull: bag layouts and per-table de-duplication.

:meth:`tnrec.Model.pull` runs in two parts. The first reads the batch and
nothing else -- no table, no dense parameter, no step state -- so the input
pipeline of ``fit`` (:mod:`tnrec.pipeline`) runs it for batch ``i + 1`` in a
background thread while step ``i`` computes::

    batch ──bag_layout──▶ keys[N], rows[N], offsets per column list   (prepare_batch)
          ──unique_inverse──▶ uniq[U], inverse[N] per table           (prepare_batch)
          ──(W > 1) uniq sent to their owners──▶ a Route              (make_router)
          ──ps.pull(uniq)──▶ rows[U, D] per table                     (Model.pull, after push i)

The second part (the owners' row gather and the exchange of the rows, the
temporary matrices, each layer's virtual ids) waits for step ``i``'s push,
since the rows it reads are the ones that push writes. Both parts compute
exactly what the unsplit pull computed, in the same order, so a pipelined
step is bit-identical to an inline one.

The input thread also computes ahead (:func:`prepare_ahead`) what the step
would compute later from the batch alone: each layer's one-key bags (for
its pooling) and each table's show and click (for its push). The step uses
them as they are, since they are the same arrays; show and click only if
the batch's click labels and weights are still the values they were
counted from.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tnrec.data import Batch
from tnrec.errors import ArgumentError
from tnrec.layers import EmbeddingFeatures
from tnrec.layers.embedding import BagLayout, bag_layout
from tnrec.ps import ParameterServer, ShardedPS, unique_inverse
from tnrec.ps.sharded import Route
from tnrec.ps.unique import show_click

Router = Callable[[Mapping[str, npt.NDArray[np.int64]]], Route]


@dataclass
class TablePart:
    """One table's share of a prepared batch.

    ``keys[inverse]`` lists every key occurrence of the table's layers, layer
    after layer and, inside a layer, column after column (``layouts[l]`` is
    layer ``l``'s :class:`~tnrec.layers.embedding.BagLayout`).
    """

    keys: npt.NDArray[np.int64]  # [U] unique keys, in order of first occurrence
    inverse: npt.NDArray[np.int64]  # [N] virtual id of every occurrence
    rows: npt.NDArray[np.int64]  # [N] batch row of every occurrence
    layouts: list[BagLayout]  # one per layer of the table, in the model's order


@dataclass
class Counts:
    """Show and click of a prepared batch's keys, and the values they were counted from.

    ``by_arrays`` holds the ``(show[U], click[U])`` of
    :func:`~tnrec.ps.unique.show_click` for each distinct pair of a table's
    ``inverse`` and ``rows`` arrays, keyed by the two arrays' ``id`` (tables
    over the same columns share the arrays, and so the counts).
    """

    label: npt.NDArray[np.float64]  # [B] the click label of every row
    weights: npt.NDArray[np.float32]  # [B] every row's weight (a copy)
    by_arrays: dict[tuple[int, int], tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]

    def counted_from(
        self, label: npt.NDArray[np.float64], weights: npt.NDArray[np.float32]
    ) -> bool:
        """Whether these counts were taken from this ``label`` and these ``weights``."""
        return np.array_equal(self.label, label) and np.array_equal(self.weights, weights)


@dataclass
class PreparedBatch:
    """What :func:`prepare_batch` computed for one batch, handed to :meth:`tnrec.Model.pull`.

    Attributes:
        batch: the batch it was made from (``Model.pull(batch)`` uses it only
            for this very object); None: the empty batch of a worker whose
            input ran out (the step makes it).
        tables: each table's :class:`TablePart`, in the model's table order.
        route: the sharded PS's :class:`~tnrec.ps.sharded.Route` of the keys,
            when the pipeline routed them ahead (W > 1); None: the pull routes.
        error: the exception preparing raised in the pipeline's
            thread; :meth:`tnrec.Model.pull` raises it, at the step it belongs
            to, with its message.
        shared: the layers' cache of what they compute from the batch alone
            (the ``shared`` of :meth:`~tnrec.layers.EmbeddingFeatures.prepare`),
            filled ahead by :func:`prepare_ahead`; the step's pull hands it to
            the layers.
        counts: each table's show and click, computed ahead by
            :func:`prepare_ahead` (None: not computed).

    Example:
        >>> # prepared = prepare_batch(model._table_layers, batch)
        >>> # prepared.tables["user"].keys   -> the batch's unique keys of table "user"
    """

    batch: Batch | None
    tables: dict[str, TablePart]
    route: Route | None = None
    error: BaseException | None = None
    shared: dict[Any, Any] = field(default_factory=dict)
    counts: Counts | None = None

    def keys(self) -> dict[str, npt.NDArray[np.int64]]:
        """Return each table's unique keys ``int64[U]``, by table name."""
        return {name: part.keys for name, part in self.tables.items()}


def prepare_batch(
    table_layers: Mapping[str, Sequence[EmbeddingFeatures]], batch: Batch
) -> PreparedBatch:
    """Lay out and de-duplicate ``batch``'s keys for every table (reads no table state).

    One layout per distinct column list, one de-duplication per distinct list
    of layouts: DeepFM's embedding and linear tables read the same columns, so
    their keys are gathered and de-duplicated once (the two tables share the
    arrays).

    Args:
        table_layers: the model's embedding layers grouped by table, in order.
        batch: the step's batch.

    Returns:
        The :class:`PreparedBatch` of ``batch``.

    Raises:
        ArgumentError: the batch lacks a column a layer needs, or a column's
            offsets do not match the batch's rows.
    """
    layouts: dict[tuple[str, ...], BagLayout] = {}
    dedup: dict[tuple[tuple[str, ...], ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    tables = {}
    for table, layers in table_layers.items():
        sig = tuple(tuple(c.key for c in layer.columns) for layer in layers)
        for cols, layer in zip(sig, layers, strict=True):
            if cols not in layouts:
                layouts[cols] = bag_layout(batch, cols, layer.name)
        lays = [layouts[cols] for cols in sig]
        if sig not in dedup:
            if len(lays) == 1:
                all_keys, occ_rows = lays[0].keys, lays[0].rows  # [N], [N]
            else:
                all_keys = np.concatenate([lay.keys for lay in lays])  # [N]
                occ_rows = np.concatenate([lay.rows for lay in lays])  # [N]
            uniq, inverse = unique_inverse(all_keys)  # [U], [N]
            dedup[sig] = (uniq, inverse, occ_rows)
        uniq, inverse, occ_rows = dedup[sig]
        tables[table] = TablePart(uniq, inverse, occ_rows, lays)
    return PreparedBatch(batch, tables)


def pull_rows(
    ps: ParameterServer, prepared: PreparedBatch, create: bool, stats: Collection[str]
) -> dict[str, npt.NDArray[np.float32]]:
    """Pull the rows of every table's unique keys of ``prepared`` (the state-reading part).

    Raises:
        Any exception the pipeline's thread got preparing this batch.
    """
    if prepared.error is not None:
        raise prepared.error
    keys = prepared.keys()
    if prepared.route is not None and isinstance(ps, ShardedPS):
        return ps.pull(keys, create, stats, route=prepared.route)
    return ps.pull(keys, create, stats) if stats else ps.pull(keys, create)


def prepared_for_pull(
    table_layers: Mapping[str, Sequence[EmbeddingFeatures]],
    batch: Batch,
    pending: PreparedBatch | None,
) -> PreparedBatch:
    """Return ``pending`` when it was made for this very ``batch``, else prepare ``batch`` here.

    ``pending`` is what ``fit``'s pipeline made for the step. When it routed
    its keys ahead, every worker's step must use that route (the other
    workers' pulls only exchange rows), so a batch prepared here takes it
    over -- which it can when it has the same unique keys (a ``train_step``
    that changes labels, weights or dense features, or the empty batch of a
    worker out of data).

    Raises:
        ArgumentError: the batch lacks a column a layer needs; or ``pending``
            was routed and ``batch`` has other keys.
    """
    if pending is not None and pending.batch is batch:
        return pending
    prepared = prepare_batch(table_layers, batch)
    route = pending.route if pending is not None else None
    if route is None:
        return prepared
    for name, part in prepared.tables.items():
        routed = route.keys.get(name, part.keys[:0])
        if not np.array_equal(part.keys, routed):
            raise ArgumentError(
                f'Model.pull: table "{name}" gets {part.keys.shape[0]} key(s) that are not the '
                f"{routed.shape[0]} key(s) of the batch fit handed to train_step; with W > 1 "
                "workers the pipelined fit has routed that batch's keys to their owners "
                "already. Pull the batch train_step received (or one with the same sparse "
                "features), or call fit(..., pipeline=False)."
            )
        part.keys = routed  # the very arrays routed: the pull and the push check identity
    prepared.route = route
    return prepared


def prepare_ahead(
    table_layers: Mapping[str, Sequence[EmbeddingFeatures]],
    prepared: PreparedBatch,
    label: npt.NDArray[np.float64],
    weights: npt.NDArray[np.float32],
    device: Any,
) -> None:
    """Compute ahead, into ``prepared``, what its step computes from the batch alone.

    The layers' one-key bags (:meth:`~tnrec.layers.EmbeddingFeatures.prepare_ahead`,
    for a model whose temporary matrices live on ``device``) go to
    ``prepared.shared``, and the show and click of every table whose layers
    are all trainable, from the batch's click ``label`` and ``weights``
    (``[B]`` each), to ``prepared.counts``. Reads no table state.
    """
    batch = prepared.batch
    if batch is None or prepared.error is not None:
        return
    by_arrays: dict[tuple[int, int], Any] = {}
    for table, layers in table_layers.items():
        part = prepared.tables[table]
        U = part.keys.shape[0]
        at = 0
        for layer, lay in zip(layers, part.layouts, strict=True):
            n = lay.keys.shape[0]
            layer.prepare_ahead(
                part.inverse[at : at + n], lay, batch.size, U, device, prepared.shared
            )
            at += n
        same = (id(part.inverse), id(part.rows))
        if all(layer.trainable for layer in layers) and same not in by_arrays:
            by_arrays[same] = show_click(part.inverse, part.rows, weights, label, U)  # [U], [U]
    prepared.counts = Counts(label, np.array(weights, np.float32), by_arrays)


def empty_prepared(table_layers: Mapping[str, Sequence[EmbeddingFeatures]]) -> PreparedBatch:
    """Return the prepared empty batch of a worker whose input ran out (no keys, no layouts)."""
    z = np.zeros(0, np.int64)
    return PreparedBatch(None, {name: TablePart(z, z, z, []) for name in table_layers})


def make_router(ps: ParameterServer) -> Router | None:
    """Return how the input thread routes a batch's keys to their owners, or None (one process).

    For a :class:`~tnrec.ps.ShardedPS`: its :meth:`~tnrec.ps.ShardedPS.route`
    on its own process group (created on the first call: a collective, which
    every worker makes at the same point). Any other PS routes nothing ahead.
    """
    if not isinstance(ps, ShardedPS):
        return None
    comm = ps.routing_comm()
    return lambda keys: ps.route(keys, comm)
