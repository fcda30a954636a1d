"""De-duplicate a batch's keys into the virtual ids of the temporary matrix."""

from __future__ import annotations

import numba as nb
import numpy as np
import numpy.typing as npt

from tnrec._hashing import mix64_scalar
from tnrec.table._llvm import _prefetch_w

#: How many keys ahead :func:`_unique_inverse` hashes a key and prefetches its slot.
PREFETCH_AHEAD = 16
_RING = 64  # the homes hashed ahead and not yet probed: a power of two > PREFETCH_AHEAD


@nb.njit(nogil=True, cache=True)
def _unique_inverse(
    keys: np.ndarray, ids: np.ndarray, uniq: np.ndarray, inverse: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Fill ``uniq`` (first occurrences) and ``inverse``; return the unique count.

    ``ids`` (zeros, a power of two > the key count) is the hash set: a slot
    holds ``u + 1`` for unique key ``u``, 0 when empty, and the key itself is
    read back from ``uniq``. A slot is 4 bytes and the unique keys are few
    and compact, so the probes stay in cache. Key ``i + PREFETCH_AHEAD`` is
    hashed, and its home slot prefetched, while key ``i`` is probed (a ring
    of ``_RING`` homes), so the probes do not wait on the cache one after another.
    """
    mask = np.uint64(ids.shape[0] - 1)
    n = keys.shape[0]
    homes = np.empty(_RING, np.uint64)
    last = _RING - 1
    base, size = ids.ctypes.data, ids.itemsize
    for i in range(min(PREFETCH_AHEAD, n)):
        h = mix64_scalar(np.uint64(keys[i])) & mask
        homes[i] = h
        _prefetch_w(base + size * np.int64(h))
    u = 0
    for i in range(n):
        j = i + PREFETCH_AHEAD
        if j < n:
            h = mix64_scalar(np.uint64(keys[j])) & mask
            homes[j & last] = h
            _prefetch_w(base + size * np.int64(h))
        k = keys[i]
        s = homes[i & last]
        while True:
            v = ids[s]
            if v == 0:
                ids[s] = u + 1
                uniq[u] = k
                inverse[i] = u
                u += 1
                break
            if uniq[v - 1] == k:
                inverse[i] = v - 1
                break
            s = (s + np.uint64(1)) & mask
    return u


def unique_inverse(
    keys: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Return ``(uniq[U], inverse[N])`` with ``uniq[inverse] == keys``.

    ``uniq`` keeps the order of first occurrence (a batch-local hash set, O(N),
    no sort). ``inverse`` holds the *virtual ids*: row numbers in the
    temporary matrix.

    Example:
        >>> u, inv = unique_inverse(np.array([9, 4, 9, 7], dtype=np.int64))
        >>> u.tolist(), inv.tolist()
        ([9, 4, 7], [0, 1, 0, 2])
    """
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    n = keys.shape[0]
    cap = 16
    while cap < 2 * n:
        cap *= 2
    ids = np.zeros(cap, dtype=np.int32 if n < 2**31 - 1 else np.int64)
    uniq = np.empty(n, dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    u = _unique_inverse(keys, ids, uniq, inverse)
    return uniq[:u], inverse


@nb.njit(nogil=True, cache=True)
def _show_click(
    inverse: np.ndarray,
    occ_rows: np.ndarray,
    weights: np.ndarray,
    label: np.ndarray,
    show: np.ndarray,
    click: np.ndarray,
) -> None:  # pragma: no cover - compiled
    U = show.shape[0]
    s = np.zeros(U, dtype=np.float64)
    c = np.zeros(U, dtype=np.float64)
    for k in range(inverse.shape[0]):
        r = occ_rows[k]
        w = np.float64(weights[r])
        v = inverse[k]
        s[v] += w
        c[v] += w * label[r]
    for u in range(U):
        show[u] = np.float32(s[u])
        click[u] = np.float32(c[u])


def show_click(
    inverse: npt.NDArray[np.int64],
    occ_rows: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float32],
    label: npt.NDArray[np.float64],
    num_unique: int,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Return each unique key's ``(show[U], click[U])`` for the push.

    ``show[u] = sum of weights[row]`` and ``click[u] = sum of weights[row] *
    label[row]`` over the occurrences of key ``u`` (``inverse[k] == u``, from
    batch row ``occ_rows[k]``), summed in float64 in occurrence order and
    rounded to float32 -- the same numbers as two ``np.bincount`` calls, in
    one pass without the ``[N]`` float64 temporaries.
    """
    show = np.empty(num_unique, dtype=np.float32)
    click = np.empty(num_unique, dtype=np.float32)
    _show_click(
        np.ascontiguousarray(inverse, dtype=np.int64),
        np.ascontiguousarray(occ_rows, dtype=np.int64),
        np.ascontiguousarray(weights, dtype=np.float32),
        np.ascontiguousarray(label, dtype=np.float64),
        show,
        click,
    )
    return show, click
