"""The fast path: single-valued rows read without per-column Arrow tables."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tnrec._hashing import mix64_scalar
from tnrec.export.dictionary import find_rows, take_rows
from tnrec.feature_column import (
    CategoryColumn,
    NumericColumn,
    name_hash,
)
from tnrec.feature_column._hash import _fnv1a64
from tnrec.feature_column.arrow import _string_buffers

#
# Most requests hold one plain value per column: a str or int per categorical
# column, a number per numeric one. The fast path reads such rows without
# building an Arrow table per column: one Arrow array per kind of column (all
# values of all str columns, of all int columns, of all numeric columns), then
# one kernel hashes every categorical column into a key grid ``[S, B]`` (S
# categorical columns) with the readers' key function. It takes a batch only if
# each array has exactly the type the readers would see column by column
# (string, int64, int64/double, or all null) and every number is finite, so its
# keys and features equal the readers' bit for bit; anything else (lists,
# bytes, bools, numeric text, absent keys, bad values) returns None and the
# general path reads the rows, or names the bad value. A pyarrow Table or
# RecordBatch needs no conversion: its columns of each kind are concatenated
# and hashed from their buffers, under the same rules on types and values.


@dataclass(frozen=True)
class _FastPlan:
    """The columns the fast path reads, by kind; ``*_rows`` are their rows in the key grid."""

    num_sparse: int
    str_keys: tuple[str, ...]
    str_hashes: npt.NDArray[np.uint64]
    str_rows: npt.NDArray[np.int64]
    int_keys: tuple[str, ...]
    int_hashes: npt.NDArray[np.uint64]
    int_rows: npt.NDArray[np.int64]
    num_keys: tuple[str, ...]
    defaults: npt.NDArray[np.float64]  # [F, 1]
    transforms: tuple[tuple[slice | npt.NDArray[np.int64], NumericColumn], ...]


def _fast_plan(sparse: Sequence[Any], dense: Sequence[NumericColumn]) -> _FastPlan | None:
    """The fast path's plan, or None if a column is of a kind it does not read."""
    cats = [c for c in sparse if type(c) is CategoryColumn]
    if len(cats) != len(sparse) or any(c.dtype == "sign" for c in cats):
        return None  # sequences, bucketized and sign columns go the general way

    def of(dtype: str) -> tuple[tuple[str, ...], npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        at = [s for s, c in enumerate(cats) if c.dtype == dtype]
        hashes = [name_hash(cats[s].identity) for s in at]
        return tuple(cats[s].key for s in at), np.array(hashes, np.uint64), np.array(at, np.int64)

    groups: dict[tuple[Any, ...], list[int]] = {}  # columns with the same transforms
    for f, col in enumerate(dense):
        if col.transforms:
            groups.setdefault(col.transforms, []).append(f)
    transforms = tuple(
        (slice(f[0], f[-1] + 1) if f == list(range(f[0], f[-1] + 1)) else np.array(f), dense[f[0]])
        for f in groups.values()
    )
    return _FastPlan(
        len(sparse),
        *of("str"),
        *of("int"),
        tuple(c.key for c in dense),
        np.array([[c.default] for c in dense], np.float64).reshape(len(dense), 1),
        transforms,
    )


def _flat(rows: Any, keys: tuple[str, ...]) -> list[Any]:
    """The values of ``keys`` in every row: row-major for a list of dicts, else column-major."""
    if isinstance(rows, dict):
        return list(chain.from_iterable(rows[k] for k in keys))
    get: Callable[[Any], Any] = itemgetter(*keys)
    return list(map(get, rows) if len(keys) == 1 else chain.from_iterable(map(get, rows)))


def _fast_inputs(plan: _FastPlan, rows: Any) -> tuple[int, Any, Any, Any] | None:
    """``(B, keys[S, B], present[S, B], dense[B, F])`` of single-valued rows, or None."""
    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        B = rows.num_rows
        arrays = _arrow_kinds(plan, rows) if B > 0 else None
        if arrays is None:
            return None
        return _grid_and_dense(plan, B, False, *arrays)
    if type(rows) is list:  # of dicts holding every column (KeyError otherwise)
        B = len(rows)
        if B == 0 or set(map(type, rows)) != {dict}:
            return None
    elif type(rows) is dict:  # of equal-length lists
        lengths = {len(v) if type(v) is list else -1 for v in rows.values()}
        B = lengths.pop() if len(lengths) == 1 else -1
        if B <= 0:
            return None
    else:
        return None
    try:  # any failure (an absent key, a value Arrow refuses): the general path names it
        strs = pa.array(_flat(rows, plan.str_keys)) if plan.str_keys else None
        ints = pa.array(_flat(rows, plan.int_keys)) if plan.int_keys else None
        nums = pa.array(_flat(rows, plan.num_keys)) if plan.num_keys else None
    except Exception:
        return None
    return _grid_and_dense(plan, B, type(rows) is list, strs, ints, nums)


def _grid_and_dense(
    plan: _FastPlan,
    B: int,
    row_major: bool,
    strs: pa.Array | None,
    ints: pa.Array | None,
    nums: pa.Array | None,
) -> tuple[int, Any, Any, Any] | None:
    """:func:`_fast_inputs` from one array a kind of column (value ``j`` is ``b*C + c``
    row-major, else ``c*B + b``), or None where a type or value is for the general path."""
    keys = np.empty((plan.num_sparse, B), np.uint64)  # [S, B]
    present = np.empty((plan.num_sparse, B), np.bool_)  # [S, B]
    if strs is not None:
        if not (pa.types.is_string(strs.type) or pa.types.is_null(strs.type)):
            return None
        offs, data, valid = _string_buffers(strs)
        _hash_str_grid(
            offs, data, valid, plan.str_hashes, plan.str_rows, B, row_major, keys, present
        )
    if ints is not None:
        if not (pa.types.is_int64(ints.type) or pa.types.is_null(ints.type)):
            return None
        valid = np.asarray(ints.is_valid().to_numpy(zero_copy_only=False), np.bool_)
        vals = ints.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        _hash_int_grid(
            vals.view(np.uint64), valid, plan.int_hashes, plan.int_rows, B, row_major, keys, present
        )
    dense = _fast_dense(plan, nums, B, row_major)
    return None if dense is None else (B, keys.view(np.int64), present, dense)


def _arrow_kinds(plan: _FastPlan, rows: pa.Table | pa.RecordBatch) -> tuple[Any, Any, Any] | None:
    """``(strs, ints, nums)``: a Table's or RecordBatch's columns of each kind concatenated,
    column after column, read from their buffers; None unless every column the model reads
    is there once with a type the list path takes (string, int64, int64/double, or null)."""
    out = []
    for keys, types, to in (
        (plan.str_keys, (pa.string(),), pa.string()),
        (plan.int_keys, (pa.int64(),), pa.int64()),
        (plan.num_keys, (pa.int64(), pa.float64()), pa.float64()),
    ):
        arrays = []
        for key in keys:
            at = rows.schema.get_field_index(key)  # -1: absent, or there twice
            if at < 0:
                return None
            col = rows.column(at)
            if isinstance(col, pa.ChunkedArray):
                col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            if not (pa.types.is_null(col.type) or col.type in types):
                return None
            arrays.append(col if col.type == to else col.cast(to, safe=False))
        out.append(
            None if not arrays else pa.concat_arrays(arrays) if len(arrays) > 1 else arrays[0]
        )
    return out[0], out[1], out[2]


def grid_rows(
    dictionary: tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]],
    index: tuple[npt.NDArray[np.int64], int],
    grid: tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]],
    rows: slice | npt.NDArray[np.int64],
    found: dict[Any, Any],
) -> npt.NDArray[np.float32]:
    """``out[C*B, D]``: the dictionary row of every key of grid rows ``rows`` (zeros: no key).

    Single-valued columns pool to their one row (every combiner's factor for a
    bag of one is 1, and an empty bag is zeros), so the fast path reads each
    occurrence's row straight into the graph's input, without de-duplicating
    the keys and pooling a temporary matrix: the same floats, bit for bit.
    ``found`` memoizes the positions of a keys array over the same grid rows,
    so a deep and a wide table sharing their keys find each key once.

    Args:
        dictionary: one shard's ``(keys int64[n], weights float32[n, D])``, all keys.
        index: ``key_index`` of those keys.
        grid: the fast path's ``(keys int64[S, B], present bool[S, B])``.
        rows: the table's columns' rows of the grid, in its inputs' order (C rows).
        found: the call's memo of positions.
    """
    dict_keys, weights = dictionary
    grid_keys, present = grid
    memo = (id(dict_keys), id(rows) if isinstance(rows, np.ndarray) else "all")
    pos = found.get(memo)
    if pos is None:
        pos = find_rows(dict_keys, index, grid_keys[rows].reshape(-1))
        pos[~present[rows].reshape(-1)] = -1  # [C*B]; no key where no value
        found[memo] = pos
    out = np.empty((pos.shape[0], weights.shape[1]), np.float32)  # [C*B, D]
    take_rows(weights, pos, np.arange(pos.shape[0]), out)
    return out


def _fast_dense(plan: _FastPlan, nums: pa.Array | None, B: int, row_major: bool) -> Any:
    """``dense[B, F]`` float32 as the readers compute it, or None (a type or value to name)."""
    F = len(plan.num_keys)
    if nums is None:
        return np.zeros((B, 0), np.float32)
    t = nums.type
    if not (pa.types.is_int64(t) or pa.types.is_float64(t) or pa.types.is_null(t)):
        return None
    # ints to the nearest float64, as the readers cast them (safe=False); nulls to NaN
    x = np.asarray(nums.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False), np.float64)
    x = x.reshape(B, F).T if row_major else x.reshape(F, B)  # [F, B]
    if np.isinf(x).any():
        return None
    x = np.where(np.isnan(x), plan.defaults, x)  # [F, B], a new C-contiguous array
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for rows, col in plan.transforms:
            x[rows] = col.apply(x[rows])
        y = x.astype(np.float32)  # [F, B]
    if not np.isfinite(y).all():
        return None
    return np.ascontiguousarray(y.T)  # [B, F]


@nb.njit(nogil=True, cache=True)
def _hash_str_grid(
    str_offsets: np.ndarray,
    data: np.ndarray,
    valid: np.ndarray,
    col_hashes: np.ndarray,
    grid_rows: np.ndarray,
    B: int,
    row_major: bool,
    keys: np.ndarray,
    present: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Hash value ``j`` (``b*C + c`` row-major, else ``c*B + b``) of C str columns to ``keys``.

    The readers' key (:mod:`tnrec.feature_column._hash`): ``mix64(fnv1a64(utf8) ^ h_col)``;
    a null or empty string is no key.
    """
    C = col_hashes.shape[0]
    for c in range(C):
        g = grid_rows[c]
        for b in range(B):
            j = b * C + c if row_major else c * B + b
            lo, hi = str_offsets[j], str_offsets[j + 1]
            if valid[j] and hi > lo:
                present[g, b] = True
                keys[g, b] = mix64_scalar(_fnv1a64(data, lo, hi) ^ col_hashes[c])
            else:
                present[g, b] = False
                keys[g, b] = 0


@nb.njit(nogil=True, cache=True)
def _hash_int_grid(
    values: np.ndarray,
    valid: np.ndarray,
    col_hashes: np.ndarray,
    grid_rows: np.ndarray,
    B: int,
    row_major: bool,
    keys: np.ndarray,
    present: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Hash int values like :func:`_hash_str_grid`: ``mix64(mix64(uint64(v)) ^ h_col)``."""
    C = col_hashes.shape[0]
    for c in range(C):
        g = grid_rows[c]
        for b in range(B):
            j = b * C + c if row_major else c * B + b
            if valid[j]:
                present[g, b] = True
                keys[g, b] = mix64_scalar(mix64_scalar(values[j]) ^ col_hashes[c])
            else:
                present[g, b] = False
                keys[g, b] = 0
