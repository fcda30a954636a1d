"""Turn one Arrow chunk of raw rows into a hashed :class:`Batch`.

The same function serves every reader (and the predictor): the canonical
conversions live in :mod:`tnrec.feature_column.arrow`; this module resolves the
reader's columns and assembles the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tnrec.data.batch import Batch, Jagged
from tnrec.errors import ArgumentError, DataError, SpecError
from tnrec.feature_column import (
    BucketizedColumn,
    CategoricalColumn,
    CategoryColumn,
    Column,
    EmbeddingColumn,
    NumericColumn,
    SequenceCategoryColumn,
    categorical_bags,
    numeric_values,
)


@dataclass(frozen=True)
class Schema:
    """The columns a reader produces, resolved from the user's feature columns.

    ``sparse`` are the categorical columns (one jagged entry each, in order),
    ``dense`` the numeric ones (one column of ``Batch.dense`` each, in order).
    """

    sparse: tuple[CategoricalColumn, ...]
    dense: tuple[NumericColumn, ...]
    labels: tuple[str, ...]
    weight: str | None

    @property
    def fields(self) -> tuple[str, ...]:
        """Every raw field the reader needs, without repeats."""
        names = [c.key for c in self.sparse] + [c.key for c in self.dense] + list(self.labels)
        if self.weight is not None:
            names.append(self.weight)
        return tuple(dict.fromkeys(names))

    def empty_batch(self) -> Batch:
        """Return a batch with no rows and this schema's columns."""
        return Batch.empty(
            [c.key for c in self.sparse],
            [c.key for c in self.dense],
            self.labels,
            weights=self.weight is not None,
        )


def make_schema(
    columns: Sequence[Column],
    label: str | Sequence[str] | None,
    weight: str | None,
) -> Schema:
    """Resolve feature columns (embedding columns unwrapped, repeats merged).

    Args:
        columns: feature columns; the same key may appear twice only with the
            same definition (e.g. two embedding columns over one category column).
        label: label field name(s), or None for unlabelled input.
        weight: sample-weight field name, or None.

    Returns:
        The schema.

    Raises:
        SpecError: two different columns share a key.
        ArgumentError: ``label`` / ``weight`` are not field names or collide with a column.
    """
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Sequence):
        raise ArgumentError(
            f"`columns` must be a list of feature columns. Received: columns={columns!r}."
        )
    seen: dict[str, CategoricalColumn | NumericColumn] = {}
    for col in columns:
        base = col.categorical if isinstance(col, EmbeddingColumn) else col
        if not isinstance(
            base, (CategoryColumn, SequenceCategoryColumn, BucketizedColumn, NumericColumn)
        ):
            raise ArgumentError(f"`columns` must hold feature columns. Received: {col!r}.")
        if base.key in seen and seen[base.key] != base:
            raise SpecError(
                f'Column "{base.key}" is declared twice with different settings: '
                f"{seen[base.key]!r} and {base!r}."
            )
        seen[base.key] = base
    if label is None:
        labels: tuple[str, ...] = ()
    elif isinstance(label, str):
        labels = (label,)
    else:
        labels = tuple(label)
    for name in (*labels, weight):
        if name is None:
            continue
        if not isinstance(name, str) or not name:
            raise ArgumentError(
                f"`label` and `weight` must be field names (non-empty str). Received: {name!r}."
            )
        if name in seen:
            raise ArgumentError(
                f'Field "{name}" is both a feature column and a label/weight; '
                "a label must not be a feature."
            )
    sparse = tuple(c for c in seen.values() if not isinstance(c, NumericColumn))
    dense = tuple(c for c in seen.values() if isinstance(c, NumericColumn))
    return Schema(sparse, dense, labels, weight)  # type: ignore[arg-type]


@dataclass
class Decoded:
    """A decoded chunk: all rows (bad ones included), which are bad, and counts."""

    batch: Batch
    bad: npt.NDArray[np.bool_] | None  # [B]
    first_bad: tuple[int, str] | None  # (row in chunk, what is wrong)
    missing: dict[str, int] = field(default_factory=dict)


def _describe(arr: pa.Array, row: int, name: str, what: str) -> str:
    try:
        raw = arr[row].as_py()
    except Exception:  # pragma: no cover - only for the message
        raw = "?"
    return f'column "{name}": value {raw!r} is not {what}'


def decode(
    schema: Schema,
    table: pa.RecordBatch | pa.Table,
    row_ids: npt.NDArray[np.int64],
    *,
    value_sep: str | None = None,
    where: str = "",
) -> Decoded:
    """Hash one chunk of raw rows.

    Args:
        schema: the reader's columns.
        table: B raw rows holding every field of ``schema.fields``.
        row_ids: ``int64[B]`` global row ids of these rows.
        value_sep: split text categorical values on it (multi-valued CSV fields).
        where: error-message prefix naming the file.

    Returns:
        The batch of all B rows and the bad-row mask (None when all are good).

    Raises:
        DataError: a field is absent or has a type its column cannot read.
    """
    n = table.num_rows
    names = set(table.schema.names)
    for f in schema.fields:
        if f not in names:
            raise DataError(f'{where}has no field "{f}" (it has {sorted(names)}).')
    bad: npt.NDArray[np.bool_] | None = None
    first_bad: tuple[int, str] | None = None
    missing: dict[str, int] = {}

    def note_bad(mask: npt.NDArray[np.bool_] | None, arr: pa.Array, name: str, what: str) -> None:
        nonlocal bad, first_bad
        if mask is None or not mask.any():
            return
        bad = mask.copy() if bad is None else bad | mask
        row = int(np.argmax(mask))
        if first_bad is None or row < first_bad[0]:
            first_bad = (row, _describe(arr, row, name, what))

    sparse: dict[str, Jagged] = {}
    for col in schema.sparse:
        arr = table.column(col.key)
        bags = categorical_bags(col, arr, value_sep=value_sep, where=where)
        kind = "a number" if isinstance(col, BucketizedColumn) else f"a valid {col.dtype} value"
        note_bad(bags.bad, arr, col.key, kind)
        missing[col.key] = bags.missing
        sparse[col.key] = Jagged(bags.keys, bags.offsets)

    dense = np.empty((n, len(schema.dense)), dtype=np.float32)  # [B, F]
    for i, ncol in enumerate(schema.dense):
        arr = table.column(ncol.key)
        x, miss, nbad = numeric_values(ncol, arr, where=where)
        note_bad(nbad, arr, ncol.key, "a finite number")
        missing[ncol.key] = int(np.count_nonzero(miss))
        dense[:, i] = ncol.apply(x)

    targets = (*schema.labels, *((schema.weight,) if schema.weight else ()))
    values = np.empty((n, len(targets)), dtype=np.float32)  # [B, L (+1)]
    for i, name in enumerate(targets):
        arr = table.column(name)
        x, miss, nbad = numeric_values(NumericColumn(name, 0.0), arr, where=where)
        note_bad(nbad, arr, name, "a finite number")
        note_bad(miss, arr, name, "present (labels and weights must not be missing)")
        values[:, i] = x
    n_labels = len(schema.labels)
    batch = Batch(
        sparse=sparse,
        dense=dense,
        dense_names=tuple(c.key for c in schema.dense),
        labels=np.ascontiguousarray(values[:, :n_labels]),
        label_names=schema.labels,
        weights=values[:, n_labels].copy() if schema.weight else None,
        row_ids=np.asarray(row_ids, dtype=np.int64),
    )
    return Decoded(batch, bad, first_bad, missing)


def to_batch(
    data: pa.Table | pa.RecordBatch | Mapping[str, Sequence[object]],
    columns: Sequence[Column],
    *,
    label: str | Sequence[str] | None = None,
    weight: str | None = None,
    value_sep: str | None = None,
) -> Batch:
    """Hash in-memory raw rows exactly as the readers do (row ids 0..B-1).

    Args:
        data: an Arrow table/record batch or a dict of equal-length lists.
        columns: feature columns.
        label: label field name(s), if any.
        weight: sample-weight field name, if any.
        value_sep: separator of multi-valued text fields.

    Returns:
        The batch.

    Raises:
        DataError: a field is absent or a value cannot be read (naming the row).
    """
    schema = make_schema(columns, label, weight)
    table = data if isinstance(data, (pa.Table, pa.RecordBatch)) else pa.table(dict(data))
    d = decode(schema, table, np.arange(table.num_rows, dtype=np.int64), value_sep=value_sep)
    if d.first_bad is not None:
        raise DataError(f"row {d.first_bad[0]}: {d.first_bad[1]}.")
    return d.batch
