"""De-duplicate a batch's keys into the virtual ids of the temporary matrix."""

from __future__ import annotations

import numba as nb
import numpy as np
import numpy.typing as npt

from tnrec.table.keyhash import mix64_scalar


@nb.njit(nogil=True, cache=True)
def _unique_inverse(keys, uniq, inverse):  # pragma: no cover - compiled
    n = keys.shape[0]
    cap = 16
    while cap < 2 * n:
        cap *= 2
    mask = np.uint64(cap - 1)
    slot_key = np.empty(cap, dtype=np.int64)
    slot_id = np.full(cap, -1, dtype=np.int64)
    u = 0
    for i in range(n):
        k = keys[i]
        s = mix64_scalar(np.uint64(k)) & mask
        while True:
            v = slot_id[s]
            if v < 0:
                slot_key[s] = k
                slot_id[s] = u
                uniq[u] = k
                inverse[i] = u
                u += 1
                break
            if slot_key[s] == k:
                inverse[i] = v
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
    uniq = np.empty(keys.shape[0], dtype=np.int64)
    inverse = np.empty(keys.shape[0], dtype=np.int64)
    u = _unique_inverse(keys, uniq, inverse)
    return uniq[:u], inverse
