"""Turn one Arrow chunk of raw rows into a hashed :class:`Batch`.

The same function serves every reader (and the predictor): the canonical
conversions live in :mod:`tnrec.feature_column.arrow`; this module resolves the
reader's columns and assembles the batch.

A row is bad (raised naming its row, or skipped by the readers) when, besides
what the conversions flag:

* a dense value, label or weight is not finite once converted to float32, the
  model's dtype (``1e308``, ``-1e39``; for a dense column, after its
  transforms, so ``1e308`` under ``log1p`` is fine);
* a numeric field holds the text ``nan`` (any case, signed). An empty field or
  null is the way to write a missing value; a float NaN in a Parquet column
  stays missing;
* an integer outside int64 sits in a ``dtype="int"`` column (a Parquet uint64
  value >= 2**63, like the text ``9223372036854775808``). Unsigned 64-bit ids
  hash as their decimal text with ``dtype="str"``, or are keys as they are
  with ``dtype="sign"``;
* a ``dtype="sign"`` column holds a float, text that is not a decimal integer,
  or an integer outside ``[-2**63, 2**64)``.

Integers read by a numeric column become the nearest float64 (pyarrow's safe
cast refuses integers beyond 2**53).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

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


def snippet(value: object, limit: int = 60) -> str:
    """Return ``repr(value)``, cut to about ``limit`` characters for error messages."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, (str, bytes)) else len(text)
    return f"{text[:limit]}... ({size} characters)"


def _describe(arr: pa.Array, row: int, name: str, what: str) -> str:
    try:
        raw = arr[row].as_py()
    except Exception:  # pragma: no cover - only for the message
        raw = "?"
    return f'column "{name}": value {snippet(raw)} is not {what}'


_EXPECTED = {
    "int": "a valid int value",
    "str": "a valid str value",
    "sign": "a 64-bit sign (an integer in [-2**63, 2**64) or its decimal text, not a float)",
}

# Text that pyarrow reads as NaN: "nan", "NaN", "-nan", "+NAN", "nan(123)".
_NAN_TEXT = r"^[+-]?[nN][aA][nN](\([^)]*\))?$"
_INT64_MAX = 2**63 - 1


def _plain(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Return one contiguous, dictionary-decoded array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr, pa.DictionaryArray):
        arr = arr.dictionary_decode()
    return arr


def _as_numeric_input(arr: pa.Array) -> pa.Array:
    """Return integer arrays as float64, each value rounded to the nearest float."""
    if pa.types.is_integer(arr.type):
        return pc.cast(arr, pa.float64(), safe=False)
    return arr


def _nan_text(arr: pa.Array) -> npt.NDArray[np.bool_] | None:
    """Return the rows whose text is a NaN spelling (None when there are none)."""
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return None
    hit = pc.fill_null(pc.match_substring_regex(arr, _NAN_TEXT), False)
    mask = np.asarray(hit.to_numpy(zero_copy_only=False), dtype=np.bool_)
    return mask if mask.any() else None


def _fit_int64(arr: pa.Array) -> tuple[pa.Array, npt.NDArray[np.bool_] | None]:
    """Null out uint64 values above int64's range; return the array and their rows."""
    t = arr.type
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    values = arr.flatten() if is_list else arr
    if isinstance(values, pa.DictionaryArray):
        values = values.dictionary_decode()
    if not pa.types.is_uint64(values.type):
        return arr, None
    big = pc.fill_null(pc.greater(values, pa.scalar(_INT64_MAX, pa.uint64())), False)
    fitted = pc.cast(pc.if_else(big, pa.scalar(None, pa.uint64()), values), pa.int64())
    big_np = np.asarray(big.to_numpy(zero_copy_only=False), dtype=np.bool_)  # [M]
    if not is_list:
        return fitted, big_np if big_np.any() else None
    parents = np.asarray(pc.list_parent_indices(arr).to_numpy(zero_copy_only=False))  # [M]
    rows = np.zeros(len(arr), dtype=np.bool_)  # [B]
    rows[parents[big_np]] = True
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)  # [B+1]
    np.cumsum(lengths, out=offsets[1:])
    rebuilt = pa.LargeListArray.from_arrays(pa.array(offsets), fitted)
    return rebuilt, rows if rows.any() else None


def _column_error(where: str, name: str, e: Exception) -> DataError:
    return DataError(f'{where}column "{name}": its values cannot be converted: {e}')


def _to_float32(
    x: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_] | None]:
    """Cast to float32; return the values (0 where not finite) and the non-finite rows."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(np.float32)  # [B]
    over = ~np.isfinite(y)
    if not over.any():
        return y, None
    y[over] = 0.0
    return y, over


def _finite_floats_into(arr: pa.Array, out: npt.NDArray[np.float32]) -> bool:
    """Write a float column without nulls into ``out`` as float32, read from Arrow's
    buffer, and return True when every value is finite there; False (``out`` to be
    written again) for any other column, which the general path reads and checks."""
    t = arr.type
    if arr.null_count or not (pa.types.is_float32(t) or pa.types.is_float64(t)):
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(out, arr.to_numpy(zero_copy_only=True), casting="same_kind")
    return bool(np.isfinite(out).all())


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
    names = set(table.schema.names)
    for f in schema.fields:
        if f not in names:
            raise DataError(f'{where}has no field "{f}" (it has {sorted(names)}).')
    bad = _BadRows()
    missing: dict[str, int] = {}
    sparse = _decode_sparse(schema, table, bad, missing, value_sep, where)
    dense = _decode_dense(schema, table, bad, missing, where)  # [B, F]
    values = _decode_targets(schema, table, bad, where)  # [B, L (+1)]
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
    return Decoded(batch, bad.mask, bad.first, missing)


class _BadRows:
    """The rows found bad so far in one chunk, and a description of the first one."""

    def __init__(self) -> None:
        self.mask: npt.NDArray[np.bool_] | None = None
        self.first: tuple[int, str] | None = None

    def note(self, mask: npt.NDArray[np.bool_] | None, arr: pa.Array, name: str, what: str) -> None:
        """Mark the rows of ``mask`` bad: column ``name`` must hold ``what`` there."""
        if mask is None or not mask.any():
            return
        self.mask = mask.copy() if self.mask is None else self.mask | mask
        row = int(np.argmax(mask))
        if self.first is None or row < self.first[0]:
            self.first = (row, _describe(arr, row, name, what))


def _decode_sparse(
    schema: Schema,
    table: pa.RecordBatch | pa.Table,
    bad: _BadRows,
    missing: dict[str, int],
    value_sep: str | None,
    where: str,
) -> dict[str, Jagged]:
    """Hash every categorical column to jagged keys."""
    sparse: dict[str, Jagged] = {}
    for col in schema.sparse:
        arr = _plain(table.column(col.key))
        if isinstance(col, BucketizedColumn):
            bad.note(_nan_text(arr), arr, col.key, "a number")
            given = _as_numeric_input(arr)
        elif col.dtype == "int":
            given, big = _fit_int64(arr)
            bad.note(big, arr, col.key, 'an int64 (unsigned 64-bit ids need dtype="str")')
        else:
            given = arr
        try:
            bags = categorical_bags(col, given, value_sep=value_sep, where=where)
        except pa.ArrowException as e:
            raise _column_error(where, col.key, e) from e
        kind = "a number" if isinstance(col, BucketizedColumn) else _EXPECTED[col.dtype]
        bad.note(bags.bad, arr, col.key, kind)
        missing[col.key] = bags.missing
        sparse[col.key] = Jagged(bags.keys, bags.offsets)
    return sparse


def _numbers(
    arr: pa.Array, col: NumericColumn, bad: _BadRows, where: str
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """A numeric field as float64 and its missing mask; NaN text and unreadable values bad."""
    try:
        x, miss, nbad = numeric_values(col, _as_numeric_input(arr), where=where)
    except pa.ArrowException as e:
        raise _column_error(where, col.key, e) from e
    nan = _nan_text(arr)
    bad.note(nan, arr, col.key, "a finite number")
    bad.note(nbad, arr, col.key, "a finite number")
    if nan is not None:
        miss &= ~nan
    return x, miss


def _decode_dense(
    schema: Schema,
    table: pa.RecordBatch | pa.Table,
    bad: _BadRows,
    missing: dict[str, int],
    where: str,
) -> npt.NDArray[np.float32]:
    """The dense features, transformed, as float32 ``[B, F]``; non-finite results bad."""
    dense = np.empty((table.num_rows, len(schema.dense)), dtype=np.float32)  # [B, F]
    for i, ncol in enumerate(schema.dense):
        arr = _plain(table.column(ncol.key))
        x, miss = _numbers(arr, ncol, bad, where)
        missing[ncol.key] = int(np.count_nonzero(miss))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            transformed = ncol.apply(x)  # [B] float64
        dense[:, i], over = _to_float32(transformed)
        after = " after the column's transforms" if ncol.transforms else ""
        bad.note(over, arr, ncol.key, f"finite as float32 (the model's dtype){after}")
    return dense


def _decode_targets(
    schema: Schema, table: pa.RecordBatch | pa.Table, bad: _BadRows, where: str
) -> npt.NDArray[np.float32]:
    """Labels, then the sample weight if any, as float32 ``[B, L (+1)]``; missing ones bad."""
    targets = (*schema.labels, *((schema.weight,) if schema.weight else ()))
    values = np.empty((table.num_rows, len(targets)), dtype=np.float32)  # [B, L (+1)]
    for i, name in enumerate(targets):
        arr = _plain(table.column(name))
        if _finite_floats_into(arr, values[:, i]):
            continue
        x, miss = _numbers(arr, NumericColumn(name, 0.0), bad, where)
        bad.note(miss, arr, name, "present (labels and weights must not be missing)")
        values[:, i], over = _to_float32(x)
        bad.note(over, arr, name, "finite as float32 (the model's dtype)")
    return values


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
        DataError: a field is absent, a value cannot be read (naming the row),
            or a list mixes types Arrow cannot hold in one column (naming it).
    """
    schema = make_schema(columns, label, weight)
    table = data if isinstance(data, (pa.Table, pa.RecordBatch)) else _table_of(data)
    d = decode(schema, table, np.arange(table.num_rows, dtype=np.int64), value_sep=value_sep)
    if d.first_bad is not None:
        raise DataError(f"row {d.first_bad[0]}: {d.first_bad[1]}.")
    return d.batch


def _table_of(data: Mapping[str, Sequence[object]]) -> pa.Table:
    """Build an Arrow table from a dict of lists, naming the column a value breaks."""
    arrays = {}
    for name, values in dict(data).items():
        try:
            arrays[name] = pa.array(values)
        except (OverflowError, pa.ArrowException) as e:
            raise DataError(
                f'column "{name}": values cannot form one Arrow column ({e}); expected '
                "numbers within int64/uint64, or text, of one kind per column."
            ) from e
    try:
        return pa.table(arrays)
    except pa.ArrowException as e:
        raise DataError(f"columns cannot form one table: {e}") from e
