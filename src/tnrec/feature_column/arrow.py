"""Convert Arrow arrays of raw values to canonical values, then to keys or floats.

Every reader and the Predictor (through :mod:`tnrec.data.decode`) go through
these two functions, so a value hashes the same whatever input it came from:

* :func:`categorical_bags`: one Arrow column → a jagged bag of keys per row.
  Accepts int, float (integral values only), bool, string, binary,
  dictionary and list columns; text is parsed to the declared ``dtype``.
  A ``dtype="sign"`` column takes integers (int64 or uint64) or their decimal
  text and gives their 64 bits as keys, unhashed.
* :func:`numeric_values`: one Arrow column → float64 per row, missing filled
  with the column default, transforms applied.

Type problems that concern the whole column raise :class:`DataError` at once;
value problems (unparsable text) are returned as a per-row ``bad`` mask so the
reader can raise naming the row or skip it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from tnrec.errors import DataError
from tnrec.feature_column import _hash
from tnrec.feature_column.columns import (
    BucketizedColumn,
    CategoricalColumn,
    NumericColumn,
)

# Text accepted as a number when the fast Arrow cast fails on some value.
_FLOAT_RE = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$"


@dataclass(frozen=True)
class Bags:
    """The keys of one categorical column for B rows.

    ``keys[offsets[i]:offsets[i+1]]`` are row i's keys; ``bad`` flags rows whose
    text could not be parsed (None when there are none); ``missing`` counts rows
    with an empty bag.
    """

    keys: npt.NDArray[np.int64]  # [N]
    offsets: npt.NDArray[np.int64]  # [B+1]
    bad: npt.NDArray[np.bool_] | None  # [B]
    missing: int


def _valid(arr: pa.Array) -> npt.NDArray[np.bool_]:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=np.bool_)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)


def _string_buffers(
    arr: pa.Array,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Return (offsets[M+1] int64, data bytes, valid[M]) of a string/binary array."""
    t = arr.type
    if not (
        pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_string(t)
        or pa.types.is_large_binary(t)
    ):
        arr = arr.cast(pa.large_string())
        t = arr.type
    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    itemsize = 8 if wide else 4
    bufs = arr.buffers()
    offsets = np.frombuffer(
        bufs[1],
        dtype=np.int64 if wide else np.int32,
        count=len(arr) + 1,
        offset=arr.offset * itemsize,
    ).astype(np.int64)
    data = np.zeros(0, np.uint8) if bufs[2] is None else np.frombuffer(bufs[2], dtype=np.uint8)
    return offsets, data, _valid(arr)


def _flatten(arr: pa.Array, value_sep: str | None) -> tuple[npt.NDArray[np.int64], pa.Array, bool]:
    """Return (row_offsets[B+1], values[M], whether each row holds one value) for list,
    split-text or scalar columns."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr, pa.DictionaryArray):
        arr = arr.dictionary_decode()
    t = arr.type
    if value_sep is not None and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        arr = pc.split_pattern(arr, pattern=value_sep)
        t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
        row_offsets = np.zeros(len(arr) + 1, dtype=np.int64)
        np.cumsum(lengths, out=row_offsets[1:])
        values = arr.flatten()
        if isinstance(values, pa.DictionaryArray):
            values = values.dictionary_decode()
        return row_offsets, values, False
    return np.arange(len(arr) + 1, dtype=np.int64), arr, True


def _whole_int64(
    values: pa.Array,
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_], None] | None:
    """``(bits, present, None)`` of an int64 array without nulls, read from Arrow's own
    buffer (no cast, no fill, no copy); None for any other array."""
    if values.type != pa.int64() or values.null_count:
        return None
    vals = values.to_numpy(zero_copy_only=True)
    return vals.view(np.uint64), _valid(values), None


def _int_values(
    values: pa.Array, name: str, where: str
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_], npt.NDArray[np.bool_] | None]:
    """Canonical int64 (as uint64 bits), present and bad masks of raw values."""
    t = values.type
    whole = _whole_int64(values)
    if whole is not None:
        return whole
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        try:
            ints = pc.cast(values, pa.int64())
        except pa.ArrowInvalid as e:
            raise DataError(
                f'{where}column "{name}" (dtype="int"): values do not fit int64: {e}'
            ) from e
        present = _valid(ints)
        vals = ints.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return vals.view(np.uint64), present, None
    if pa.types.is_floating(t):
        x = pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)  # nulls -> NaN
        present = ~np.isnan(x)
        bad = present & ((x != np.floor(x)) | (np.abs(x) >= 2.0**63))
        ok = present & ~bad
        vals = np.where(ok, x, 0.0).astype(np.int64)
        return vals.view(np.uint64), ok, bad
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        offsets, data, valid = _string_buffers(values)
        vals_u, present, bad = _hash.parse_int_strings(offsets, data, valid)
        return vals_u, present, bad
    raise DataError(
        f'{where}column "{name}" is declared dtype="int" but its data has type {t}; '
        "expected integers, integral floats, or text."
    )


def _sign_values(
    values: pa.Array, name: str, where: str
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_], npt.NDArray[np.bool_] | None]:
    """The 64 bits of each sign (int64 as it is, uint64 reinterpreted), present and bad masks.

    A float is bad: a sign above 2**53 does not survive one, so a float column
    is read as no sign at all rather than as a rounded one.
    """
    t = values.type
    whole = _whole_int64(values)
    if whole is not None:
        return whole
    if pa.types.is_integer(t):
        signed = pa.types.is_signed_integer(t)
        ints = pc.cast(values, pa.int64() if signed else pa.uint64())  # widening, exact
        present = _valid(ints)
        vals = ints.fill_null(0).to_numpy(zero_copy_only=False)
        return vals.view(np.uint64), present, None
    if pa.types.is_floating(t):
        bad = _valid(values)
        return np.zeros(len(values), np.uint64), np.zeros(len(values), np.bool_), bad
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        offsets, data, valid = _string_buffers(values)
        return _hash.parse_int_strings(offsets, data, valid, True)
    raise DataError(
        f'{where}column "{name}" is declared dtype="sign" but its data has type {t}; '
        "expected int64 or uint64 integers, or their decimal text."
    )


def categorical_bags(
    column: CategoricalColumn,
    array: pa.Array | pa.ChunkedArray,
    *,
    value_sep: str | None = None,
    where: str = "",
) -> Bags:
    """Hash one column of raw values into a bag of keys per row.

    A null, empty string, NaN or empty list contributes no key; several values
    in a row (a list column, or text split on ``value_sep``) give several keys,
    duplicates kept, in order.

    Args:
        column: the categorical column (its ``dtype`` and identity decide the keys).
        array: B raw values (or lists of values).
        value_sep: split text values on this separator (multi-valued CSV fields).
        where: prefix for error messages, e.g. ``'file "a.csv": '``.

    Returns:
        The bags, with a per-row ``bad`` mask for unparsable text.

    Raises:
        DataError: the column's Arrow type cannot hold values of the declared dtype.
    """
    if isinstance(column, BucketizedColumn):
        x, _, bad = numeric_values(column, array, where=where)
        keys = bucket_keys(column, x)
        offs = np.arange(len(keys) + 1, dtype=np.int64)
        return Bags(keys, offs, bad if bad is not None and bad.any() else None, 0)
    row_offsets, values, scalar = _flatten(array, value_sep)
    col_hash = np.uint64(_hash.name_hash(column.identity))
    bad_values: npt.NDArray[np.bool_] | None = None
    if column.dtype == "str":
        t = values.type
        if pa.types.is_integer(t):
            values = pc.cast(values, pa.string())  # canonical decimal text
        elif not (
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_null(t)
        ):
            raise DataError(
                f'{where}column "{column.key}" is declared dtype="str" but its data has '
                f"type {t}; expected text, binary or integers."
            )
        offsets, data, valid = _string_buffers(values)
        keys_u, out_offsets = _hash.bags_str(
            row_offsets, offsets, data, valid, col_hash, column.max_length
        )
    else:
        if pa.types.is_null(values.type):
            values = values.cast(pa.int64())
        sign = column.dtype == "sign"
        read = _sign_values if sign else _int_values
        vals, present, bad_values = read(values, column.key, where)
        keys_u, out_offsets = _hash.bags_int(
            row_offsets, vals, present, col_hash, column.max_length, sign
        )
    bad = None
    if bad_values is not None and bad_values.any():
        bad = _hash.any_per_row(row_offsets, bad_values)
    if scalar:  # a row holds one key or none
        missing = len(out_offsets) - 1 - len(keys_u)
    else:
        missing = int(np.count_nonzero(out_offsets[1:] == out_offsets[:-1]))
    return Bags(keys_u.view(np.int64), out_offsets, bad, missing)


def numeric_values(
    column: NumericColumn | BucketizedColumn,
    array: pa.Array | pa.ChunkedArray,
    *,
    where: str = "",
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_] | None]:
    """Read one numeric column as float64, missing values replaced by the default.

    Null, empty text and NaN are missing; text that is not a number and
    infinities are bad. Transforms are NOT applied here (see
    :meth:`NumericColumn.apply`), so a bucketized column can bucket the result.

    Args:
        column: the numeric or bucketized column.
        array: B raw values (numbers or text).
        where: prefix for error messages.

    Returns:
        ``(x[B] float64, missing[B] bool, bad[B] bool or None)``; bad rows hold the default.

    Raises:
        DataError: the column's Arrow type is not numeric or text.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(array, pa.DictionaryArray):
        array = array.dictionary_decode()
    t = array.type
    bad: npt.NDArray[np.bool_] | None = None
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        empty = pc.equal(pc.utf8_length(array), 0)
        array = pc.if_else(empty, pa.scalar(None, t), array)
        try:
            floats = pc.cast(array, pa.float64())
        except pa.ArrowInvalid:
            good = pc.fill_null(pc.match_substring_regex(array, _FLOAT_RE), False)
            bad = _valid(array) & ~np.asarray(good.to_numpy(zero_copy_only=False), dtype=np.bool_)
            floats = pc.cast(pc.if_else(good, array, pa.scalar(None, t)), pa.float64())
    elif (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or (pa.types.is_decimal(t) or pa.types.is_null(t))
    ):
        floats = pc.cast(array, pa.float64())
    else:
        raise DataError(
            f'{where}column "{column.key}" is numeric but its data has type {t}; '
            "expected numbers or text."
        )
    x = np.array(floats.to_numpy(zero_copy_only=False), dtype=np.float64)  # [B], nulls -> NaN
    inf = np.isinf(x)
    if inf.any():
        bad = inf if bad is None else bad | inf
    missing = np.isnan(x)
    if bad is not None:
        missing &= ~bad
        x[bad] = column.default
    x[missing] = column.default
    return x, missing, bad


def bucket_keys(column: BucketizedColumn, x: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Hash the bucket index of every value of ``x`` (one key per row)."""
    buckets = column.bucket(x).astype(np.int64)
    row_offsets = np.arange(len(buckets) + 1, dtype=np.int64)
    present = np.ones(len(buckets), dtype=np.bool_)
    col_hash = np.uint64(_hash.name_hash(column.identity))
    keys, _ = _hash.bags_int(row_offsets, buckets.view(np.uint64), present, col_hash, 0)
    return keys.view(np.int64)


def hash_values(
    column: CategoricalColumn, values: pa.Array | list[object] | npt.ArrayLike
) -> npt.NDArray[np.int64]:
    """Return the key of every raw value (missing values give no key).

    A convenience over :func:`categorical_bags` for one value per entry, e.g.
    ``hash_values(category_column("item", dtype="str"), ["a", "b"])``.

    Raises:
        DataError: a value cannot be read as the column's dtype.
    """
    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    bags = categorical_bags(column, arr)
    if bags.bad is not None:
        row = int(np.flatnonzero(bags.bad)[0])
        raise DataError(
            f'column "{column.key}": value {arr[row].as_py()!r} at index {row} is not a '
            f"valid {column.dtype} value."
        )
    return bags.keys
