"""The batch-only part of a step's pull: bag layouts and per-table de-duplication.

:meth:`tnrec.Model.pull` runs in two parts. The first reads the batch and
nothing else -- no table, no dense parameter, no step state -- so the input
pipeline of ``fit`` (:mod:`tnrec.pipeline`) runs it for batch ``i + 1`` in a
background thread while step ``i`` computes::

    batch ──bag_layout──▶ keys[N], rows[N], offsets per column list   (prepare_batch)
          ──unique_inverse──▶ uniq[U], inverse[N] per table           (prepare_batch)
          ──ps.pull(uniq)──▶ rows[U, D] per table                     (Model.pull, after push i)

The second part (the pull of the rows, the temporary matrices, each layer's
virtual ids) waits for step ``i``'s push, since the rows it reads are the
ones that push writes. Both parts compute exactly what the unsplit pull
computed, in the same order, so a pipelined step is bit-identical to an
inline one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tnrec.data import Batch
from tnrec.layers import EmbeddingFeatures
from tnrec.layers.embedding import BagLayout, bag_layout
from tnrec.ps import ParameterServer, unique_inverse


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
class PreparedBatch:
    """What :func:`prepare_batch` computed for one batch, handed to :meth:`tnrec.Model.pull`.

    Attributes:
        batch: the batch it was made from (``Model.pull(batch)`` uses it only
            for this very object).
        tables: each table's :class:`TablePart`, in the model's table order.
        error: the exception preparing raised in the pipeline's
            thread; :meth:`tnrec.Model.pull` raises it, at the step it belongs
            to, with its message.

    Example:
        >>> # prepared = prepare_batch(model._table_layers, batch)
        >>> # prepared.tables["user"].keys   -> the batch's unique keys of table "user"
    """

    batch: Batch
    tables: dict[str, TablePart]
    error: BaseException | None = None

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
    return ps.pull(keys, create, stats) if stats else ps.pull(keys, create)
