"""Naming a bad value: the row, the column and what was expected."""

from __future__ import annotations

import numbers
import reprlib
from typing import Any

import numpy as np
import pyarrow as pa

from tnrec.errors import DataError
from tnrec.feature_column import (
    BucketizedColumn,
    Column,
    NumericColumn,
)

_INT64 = (-(2**63), 2**63)
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


def _as_list(values: Any) -> list[Any]:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.to_pylist()
    return values.tolist() if hasattr(values, "tolist") else list(values)


_SIGN = (-(2**63), 2**64)
_SIGN_EXPECTED = "a 64-bit sign: an int in [-2**63, 2**64) (or its text), a list of them, or None"


def _expected(col: Column) -> str:
    if isinstance(col, (NumericColumn, BucketizedColumn)):
        return "a number (int or float), numeric text, or None"
    if getattr(col, "dtype", None) == "str":
        return "a str (or an int), a list of them, or None"
    if getattr(col, "dtype", None) == "sign":
        return _SIGN_EXPECTED
    return "an int (or its text), a list of them, or None"


def sign_bits(values: list[Any]) -> list[Any]:
    """Python ints of a sign column as uint64 values (negative ones plus 2**64), so one
    column may hold both halves of the 64-bit range; anything else as it is."""

    def bits(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [bits(x) for x in v]
        if isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
            return int(v) % 2**64 if _SIGN[0] <= int(v) < _SIGN[1] else v
        return v

    return [bits(v) for v in values]


def _kind(v: Any) -> str | None:
    if v is None or (isinstance(v, float) and v != v):
        return None
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, numbers.Real):
        return "number"
    if isinstance(v, (str, bytes)):
        return "text"
    if isinstance(v, (list, tuple, np.ndarray)):
        return "list"
    return "other"


def _problem(v: Any, scalar: bool, expected: str) -> str | None:
    """What a value cannot be on its own (not just unlike its neighbours), or None."""
    kind = _kind(v)
    if kind == "other":
        return expected
    if expected == _SIGN_EXPECTED and kind == "number":
        ok = isinstance(v, numbers.Integral) and _SIGN[0] <= int(v) < _SIGN[1]
        return None if ok else expected
    if isinstance(v, numbers.Integral) and kind == "number":
        ok = _INT64[0] <= int(v) < _INT64[1]
        return None if ok else "an int in the int64 range [-2**63, 2**63) or a float"
    if kind == "list":
        if scalar:
            return f"{expected}; not a list"
        for x in v:
            why = "a single value, not a nested list" if _kind(x) == "list" else None
            why = why or _problem(x, True, expected)
            if why:
                return f"{why} (in a list)"
    return None


_KIND = {"number": "a number", "text": "text", "bool": "a bool"}


def _first_bad(col: Column, values: list[Any]) -> tuple[int, Any, str] | None:
    """The first value pyarrow or the column cannot read: ``(row, value, expected)``."""
    scalar = isinstance(col, (NumericColumn, BucketizedColumn))
    for i, v in enumerate(values):
        why = _problem(v, scalar, _expected(col))
        if why:
            return i, v, why
    shapes = [(i, _kind(v) == "list") for i, v in enumerate(values) if _kind(v) is not None]
    for i, is_list in shapes:
        j, first = shapes[0]
        if is_list != first:
            what = "a list" if first else "a single value"
            return i, values[i], f"{what} like row {j} (a column holds lists or single values)"
    kinds: list[tuple[int, Any, str]] = []  # (row, value, kind), list items included
    for i, v in enumerate(values):
        for x in v if _kind(v) == "list" else [v]:
            kind = _kind(x)
            if kind is not None:
                kinds.append((i, x, kind))
    present = {k for _, _, k in kinds}
    if len(present) > 1:
        text = not scalar and getattr(col, "dtype", None) == "str"
        usual = "text" if text else "number"
        want = usual if usual in present else kinds[0][2]
        j = next(i for i, _, k in kinds if k == want)
        i, x, _ = next(t for t in kinds if t[2] != want)
        return i, x, f"{_KIND[want]} like row {j} (a column holds one kind of value)"
    return None


def _row_error(col: Column, row: int, value: Any, expected: str) -> DataError:
    return DataError(
        f'Predictor.predict: row {row}, column "{col.key}": expected {expected}. '
        f"Received: {_repr.repr(value)} ({type(value).__name__})."
    )


def _value_error(col: Column, values: list[Any], e: Exception) -> DataError:
    found = _first_bad(col, values)
    if found is not None:
        return _row_error(col, *found)
    return DataError(f'Predictor.predict: column "{col.key}": cannot read its values: {e}.')
