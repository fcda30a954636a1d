"""Numba kernels that turn canonical feature values into 64-bit keys.

The key of one value is a pure, portable function of (column identity,
canonical value); it is part of the feature-spec format (``HASH_NAME``) and
must never change for a given name, since saved tables are indexed by it::

    mix64(x)   = splitmix64 finalizer on uint64, wrapping:
                 z = x + 0x9E3779B97F4A7C15
                 z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
                 z = (z ^ (z >> 27)) * 0x94D049BB133111EB
                 z ^ (z >> 31)
    fnv1a64(b) = FNV-1a 64 over the bytes b: h = 0xCBF29CE484222325;
                 for each byte: h = (h ^ byte) * 0x100000001B3
    h_col      = fnv1a64(utf8(identity))   identity = embedding_share or column key

    dtype="int": key = mix64(mix64(uint64(value)) ^ h_col)
    dtype="str": key = mix64(fnv1a64(utf8(value)) ^ h_col)
    dtype="sign": key = the value's 64 bits (a feature sign, not hashed)

Keys are the uint64 results reinterpreted as int64. ``mix64`` is the table
layer's mixer (``tnrec.table.mix64``, the one routing keys to buckets).

Every kernel works on whole arrays (Arrow buffers viewed as NumPy), compiled
with ``nogil`` so a prefetch thread runs them in parallel with training.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
import numpy.typing as npt

from tnrec._hashing import mix64_scalar as _mix64

HASH_NAME = "splitmix64-fnv1a64/1"

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_INT64_MAX = np.uint64(0x7FFFFFFFFFFFFFFF)


@numba.njit(nogil=True, cache=True)
def _fnv1a64(data: npt.NDArray[np.uint8], start: int, stop: int) -> np.uint64:
    h = _FNV_OFFSET
    for i in range(start, stop):
        h = (h ^ np.uint64(data[i])) * _FNV_PRIME
    return h


@functools.lru_cache(maxsize=4096)
def name_hash(identity: str) -> int:
    """Return ``fnv1a64(utf8(identity))``, the column-identity part of every key (cached:
    a reader hashes the same few names for every chunk)."""
    data = np.frombuffer(identity.encode("utf-8"), dtype=np.uint8)
    return int(_fnv1a64(data, 0, data.shape[0]))


def fnv1a64(value: bytes) -> int:
    """Return FNV-1a 64 of ``value`` as an unsigned int (the str-value hash)."""
    data = np.frombuffer(value, dtype=np.uint8)
    return int(_fnv1a64(data, 0, data.shape[0]))


@numba.njit(nogil=True, cache=True)
def _one_present_each(row_offsets: npt.NDArray[np.int64], present: npt.NDArray[np.bool_]) -> bool:
    """Whether every row of ``row_offsets`` holds exactly one value and it is present (one
    branch-free pass, once the rows hold as many values as there are rows)."""
    n_rows = row_offsets.shape[0] - 1
    first = row_offsets[0]
    if row_offsets[n_rows] - first != n_rows:  # also keeps present[first + r] in bounds
        return False
    off = 0
    for r in range(n_rows):
        off |= (row_offsets[r + 1] - row_offsets[r]) ^ 1
        off |= 1 - np.int64(present[first + r])
    return off == 0


@numba.njit(nogil=True, cache=True)
def _int_keys(values: npt.NDArray[np.uint64], col_hash: np.uint64) -> npt.NDArray[np.uint64]:
    """The key of each int value, ``mix64(mix64(value) ^ col_hash)``, in one pass."""
    keys = np.empty(values.shape[0], dtype=np.uint64)
    for i in range(values.shape[0]):
        keys[i] = _mix64(_mix64(values[i]) ^ col_hash)
    return keys


@numba.njit(nogil=True, cache=True)
def bags_int(
    row_offsets: npt.NDArray[np.int64],
    values: npt.NDArray[np.uint64],
    present: npt.NDArray[np.bool_],
    col_hash: np.uint64,
    max_length: int,
    raw: bool = False,
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """Hash int values grouped in rows; keep the last ``max_length`` (<=0: all).

    ``row_offsets[B+1]`` delimit each row's values; ``present[M]`` is False for a
    missing value (it contributes no key). With ``raw`` the values are signs and
    are the keys as they are. Returns ``keys[N]`` and ``offsets[B+1]``.
    """
    n_rows = row_offsets.shape[0] - 1
    if _one_present_each(row_offsets, present):  # a scalar column without missing values
        first = row_offsets[0]
        scalars = values[first : first + n_rows]
        keys = scalars.copy() if raw else _int_keys(scalars, col_hash)
        return keys, np.arange(n_rows + 1, dtype=np.int64)
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    for r in range(n_rows):
        c = 0
        for j in range(row_offsets[r], row_offsets[r + 1]):
            if present[j]:
                c += 1
        if max_length > 0 and c > max_length:
            c = max_length
        offsets[r + 1] = offsets[r] + c
    keys = np.empty(offsets[n_rows], dtype=np.uint64)
    for r in range(n_rows):
        # Walk the row backwards so truncation keeps the most recent values.
        pos = offsets[r + 1] - 1
        j = row_offsets[r + 1] - 1
        while pos >= offsets[r]:
            if present[j]:
                keys[pos] = values[j] if raw else _mix64(_mix64(values[j]) ^ col_hash)
                pos -= 1
            j -= 1
    return keys, offsets


@numba.njit(nogil=True, cache=True)
def bags_str(
    row_offsets: npt.NDArray[np.int64],
    str_offsets: npt.NDArray[np.int64],
    data: npt.NDArray[np.uint8],
    valid: npt.NDArray[np.bool_],
    col_hash: np.uint64,
    max_length: int,
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """Hash UTF-8 strings grouped in rows; null or empty strings give no key.

    ``str_offsets[M+1]`` and ``data`` are an Arrow string array's buffers (the
    offsets already shifted to the array's slice), ``valid[M]`` its validity.
    """
    n_rows = row_offsets.shape[0] - 1
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    for r in range(n_rows):
        c = 0
        for j in range(row_offsets[r], row_offsets[r + 1]):
            if valid[j] and str_offsets[j + 1] > str_offsets[j]:
                c += 1
        if max_length > 0 and c > max_length:
            c = max_length
        offsets[r + 1] = offsets[r] + c
    keys = np.empty(offsets[n_rows], dtype=np.uint64)
    for r in range(n_rows):
        pos = offsets[r + 1] - 1
        j = row_offsets[r + 1] - 1
        while pos >= offsets[r]:
            if valid[j] and str_offsets[j + 1] > str_offsets[j]:
                h = _fnv1a64(data, str_offsets[j], str_offsets[j + 1])
                keys[pos] = _mix64(h ^ col_hash)
                pos -= 1
            j -= 1
    return keys, offsets


@numba.njit(nogil=True, cache=True)
def parse_int_strings(
    str_offsets: npt.NDArray[np.int64],
    data: npt.NDArray[np.uint8],
    valid: npt.NDArray[np.bool_],
    sign: bool = False,
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Parse decimal integers written as text: ``-12``, ``+7``, ``123``, ``123.0``.

    The canonical int of ``"123.000"`` is 123; any other fraction, a sign alone,
    spaces, exponents or a value outside int64 is unparsable. With ``sign``
    (64-bit feature signs) the range is ``[-2**63, 2**64)`` and no fraction is
    accepted, not even ``.0``. Null or empty text is missing. Returns
    ``values[M]`` (the 64 bits as uint64), ``present[M]`` and ``bad[M]``.
    """
    m = str_offsets.shape[0] - 1
    values = np.zeros(m, dtype=np.uint64)
    present = np.zeros(m, dtype=np.bool_)
    bad = np.zeros(m, dtype=np.bool_)
    for j in range(m):
        start = str_offsets[j]
        stop = str_offsets[j + 1]
        if not valid[j] or stop == start:
            continue
        i = start
        neg = False
        if data[i] == 45 or data[i] == 43:  # '-' or '+'
            neg = data[i] == 45
            i += 1
        acc = np.uint64(0)
        digits = 0
        ok = True
        while i < stop and 48 <= data[i] <= 57:
            d = np.uint64(data[i] - 48)
            if acc > (np.uint64(0xFFFFFFFFFFFFFFFF) - d) // np.uint64(10):
                ok = False
                break
            acc = acc * np.uint64(10) + d
            digits += 1
            i += 1
        if ok and not sign and i < stop and data[i] == 46:  # '.', then zeros only
            i += 1
            while i < stop and data[i] == 48:
                i += 1
        if not ok or digits == 0 or i != stop:
            bad[j] = True
            continue
        limit = _INT64_MAX + np.uint64(1) if neg else _INT64_MAX
        if acc > limit and not (sign and not neg):
            bad[j] = True
            continue
        values[j] = (np.uint64(0) - acc) if neg else acc
        present[j] = True
    return values, present, bad


@numba.njit(nogil=True, cache=True)
def any_per_row(
    row_offsets: npt.NDArray[np.int64], flags: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """Return ``out[B]``: True where any of the row's values is flagged."""
    n_rows = row_offsets.shape[0] - 1
    out = np.zeros(n_rows, dtype=np.bool_)
    for r in range(n_rows):
        for j in range(row_offsets[r], row_offsets[r + 1]):
            if flags[j]:
                out[r] = True
                break
    return out
