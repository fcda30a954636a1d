"""Portable 64-bit key mixing and the key -> bucket function (the bottom layer: NumPy + numba).

``mix64`` is the splitmix64 finaliser (Steele, Lea, Flood 2014) on the key's
two's-complement bits. It is fixed forever: the hash index, the initial vector
of every key, the bucket of every key (and so which worker owns it and which
checkpoint file holds it) all depend on it. ``tests/unit/table/test_keyhash.py``
pins its outputs.

``bucket_of(key) = mix64(key) % NUM_BUCKETS`` with ``NUM_BUCKETS = 1024``.
Checkpoints are written per bucket range, so any number of workers can read
back exactly the buckets they own.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import numpy.typing as npt

from tnrec.errors import ArgumentError

NUM_BUCKETS = 1024

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@nb.njit(nogil=True, cache=True, inline="always")
def mix64_scalar(x: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """Mix one uint64 (splitmix64 finaliser); wraps modulo 2**64."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@nb.njit(nogil=True, cache=True)
def _mix64_array(keys: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in range(keys.shape[0]):
        out[i] = mix64_scalar(np.uint64(keys[i]))


@nb.njit(nogil=True, cache=True)
def _bucket_array(keys: np.ndarray, num_buckets: int, out: np.ndarray) -> None:  # pragma: no cover
    nbk = np.uint64(num_buckets)
    for i in range(keys.shape[0]):
        out[i] = np.int64(mix64_scalar(np.uint64(keys[i])) % nbk)


def _as_keys(keys: npt.ArrayLike, what: str) -> npt.NDArray[np.int64]:
    arr = np.asarray(keys)
    if arr.ndim != 1 or arr.dtype != np.int64:
        raise ArgumentError(
            f"`{what}` must be a 1-D int64 array. Received: dtype={arr.dtype}, shape={arr.shape}."
        )
    return np.ascontiguousarray(arr)


def mix64(keys: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """Return the splitmix64 finaliser of each key.

    Args:
        keys: ``int64[n]`` keys (read as their two's-complement bits).

    Returns:
        ``uint64[n]`` mixed values.

    Raises:
        ArgumentError: ``keys`` is not a 1-D int64 array.
    """
    k = _as_keys(keys, "keys")
    out = np.empty(k.shape[0], dtype=np.uint64)
    _mix64_array(k, out)
    return out


def bucket_of(keys: npt.ArrayLike, num_buckets: int = NUM_BUCKETS) -> npt.NDArray[np.int64]:
    """Return ``mix64(key) % num_buckets`` for each key.

    Args:
        keys: ``int64[n]`` keys.
        num_buckets: number of buckets; 1024 everywhere in tnrec.

    Returns:
        ``int64[n]`` bucket ids in ``[0, num_buckets)``.

    Raises:
        ArgumentError: ``keys`` is not a 1-D int64 array or ``num_buckets < 1``.
    """
    k = _as_keys(keys, "keys")
    if int(num_buckets) < 1:
        raise ArgumentError(f"`num_buckets` must be >= 1. Received: num_buckets={num_buckets}.")
    out = np.empty(k.shape[0], dtype=np.int64)
    _bucket_array(k, int(num_buckets), out)
    return out
