"""The key -> row hash index: open addressing with linear probing, numba kernels.

Layout (``C`` = capacity, a power of two)::

    slot_keys  int64[C]   the key held by each slot
    slot_rows  int32[C]   its row id in the row store, or -1 for an empty slot

Emptiness is marked in ``slot_rows``, never in ``slot_keys``, so every int64
value -- 0, -1, INT64_MIN, INT64_MAX -- is a valid key. A key's home slot is
``mix64(key) & (C - 1)``; collisions probe forward one slot at a time.
Deletion uses backward shift (Knuth's algorithm R), so there are no tombstones
and probe sequences never grow from deletes. The index is kept at most 3/4
full; growing rebuilds only these two arrays (12 bytes a slot), never the rows.

Every kernel runs over whole key arrays and releases the GIL.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tnrec.table.keyhash import mix64_scalar

MAX_LOAD_NUM = 3  # the index grows when count would exceed capacity * 3 / 4
MAX_LOAD_DEN = 4
MIN_CAPACITY = 1024


def max_count(capacity: int) -> int:
    """Return how many keys an index of ``capacity`` slots holds before it grows."""
    return capacity * MAX_LOAD_NUM // MAX_LOAD_DEN


def capacity_for(count: int) -> int:
    """Return the smallest power-of-two capacity that holds ``count`` keys."""
    cap = MIN_CAPACITY
    while max_count(cap) < count:
        cap *= 2
    return cap


def new_index(capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Return empty ``(slot_keys, slot_rows)`` arrays of ``capacity`` slots."""
    return np.zeros(capacity, dtype=np.int64), np.full(capacity, -1, dtype=np.int32)


@nb.njit(nogil=True, cache=True, inline="always")
def home(key, mask):  # pragma: no cover - compiled
    """Return the home slot of ``key`` in an index of ``mask + 1`` slots."""
    return np.int64(mix64_scalar(np.uint64(key)) & np.uint64(mask))


_home = home


@nb.njit(nogil=True, cache=True, inline="always")
def find(slot_keys, slot_rows, key):  # pragma: no cover - compiled
    """Return the row of ``key`` or -1."""
    mask = slot_keys.shape[0] - 1
    s = _home(key, mask)
    while True:
        r = slot_rows[s]
        if r < 0:
            return -1
        if slot_keys[s] == key:
            return r
        s = (s + 1) & mask


@nb.njit(nogil=True, cache=True)
def lookup(slot_keys, slot_rows, keys, out_rows):  # pragma: no cover - compiled
    """Write the row of each key to ``out_rows`` (-1 when absent); return the absent count."""
    missing = 0
    for i in range(keys.shape[0]):
        r = find(slot_keys, slot_rows, keys[i])
        out_rows[i] = r
        if r < 0:
            missing += 1
    return missing


@nb.njit(nogil=True, cache=True)
def insert_missing(
    slot_keys,
    slot_rows,
    keys,
    out_rows,
    start,
    count,
    limit,
    next_row,
    row_capacity,
    free_rows,
    free_top,
):  # pragma: no cover - compiled
    """Insert the absent keys of ``keys[start:]``, allocating rows; fill ``out_rows``.

    Rows come from the free list first (rows freed by eviction), then from the
    unused tail of the row store. The kernel stops early, before touching key
    ``i``, when the index would pass ``limit`` keys or no row is left; the
    caller grows the index or the row store and calls again from ``i``.

    Returns:
        ``(stop, count, next_row, free_top, created)``; ``stop == len(keys)``
        when every key was handled.
    """
    mask = slot_keys.shape[0] - 1
    created = 0
    n = keys.shape[0]
    for i in range(start, n):
        key = keys[i]
        s = _home(key, mask)
        while True:
            r = slot_rows[s]
            if r < 0 or slot_keys[s] == key:
                break
            s = (s + 1) & mask
        if r >= 0:
            out_rows[i] = r
            continue
        if count >= limit:
            return i, count, next_row, free_top, created
        if free_top > 0:
            free_top -= 1
            r = free_rows[free_top]
        elif next_row < row_capacity:
            r = next_row
            next_row += 1
        else:
            return i, count, next_row, free_top, created
        slot_keys[s] = key
        slot_rows[s] = r
        out_rows[i] = -2 - r  # marks "created in this call"; decoded by the caller
        count += 1
        created += 1
    return n, count, next_row, free_top, created


@nb.njit(nogil=True, cache=True)
def rehash(old_keys, old_rows, new_keys, new_rows):  # pragma: no cover - compiled
    """Insert every entry of the old index into the (empty) new one."""
    mask = new_keys.shape[0] - 1
    for s in range(old_keys.shape[0]):
        r = old_rows[s]
        if r < 0:
            continue
        key = old_keys[s]
        t = _home(key, mask)
        while new_rows[t] >= 0:
            t = (t + 1) & mask
        new_keys[t] = key
        new_rows[t] = r


@nb.njit(nogil=True, cache=True)
def delete(slot_keys, slot_rows, keys, free_rows, free_top):  # pragma: no cover - compiled
    """Delete ``keys`` (absent ones are ignored); push their rows on the free list.

    Returns:
        ``(deleted, free_top)``.
    """
    mask = slot_keys.shape[0] - 1
    deleted = 0
    for i in range(keys.shape[0]):
        key = keys[i]
        s = _home(key, mask)
        while True:
            r = slot_rows[s]
            if r < 0 or slot_keys[s] == key:
                break
            s = (s + 1) & mask
        if r < 0:
            continue
        free_rows[free_top] = r
        free_top += 1
        deleted += 1
        # Backward shift: pull later entries of the probe run into the hole
        # unless their home lies cyclically in (hole, j].
        j = s
        while True:
            j = (j + 1) & mask
            if slot_rows[j] < 0:
                break
            home = _home(slot_keys[j], mask)
            if ((j - home) & mask) >= ((j - s) & mask):
                slot_keys[s] = slot_keys[j]
                slot_rows[s] = slot_rows[j]
                s = j
        slot_rows[s] = -1
    return deleted, free_top


@nb.njit(nogil=True, cache=True)
def entries(slot_keys, slot_rows, out_keys, out_rows):  # pragma: no cover - compiled
    """Copy every (key, row) of the index to the outputs; return how many."""
    n = 0
    for s in range(slot_keys.shape[0]):
        r = slot_rows[s]
        if r >= 0:
            out_keys[n] = slot_keys[s]
            out_rows[n] = r
            n += 1
    return n


@nb.njit(nogil=True, cache=True)
def count_duplicates(keys):  # pragma: no cover - compiled
    """Return how many entries of ``keys`` repeat an earlier one (batch-local hash set)."""
    n = keys.shape[0]
    cap = 16
    while cap < 2 * n:
        cap *= 2
    mask = cap - 1
    seen_keys = np.empty(cap, dtype=np.int64)
    used = np.zeros(cap, dtype=np.bool_)
    dups = 0
    for i in range(n):
        key = keys[i]
        s = _home(key, mask)
        while used[s] and seen_keys[s] != key:
            s = (s + 1) & mask
        if used[s]:
            dups += 1
        else:
            used[s] = True
            seen_keys[s] = key
    return dups
