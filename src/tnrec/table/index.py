"""The key -> row hash index: open addressing with linear probing, numba kernels.

Layout (``C`` = capacity, a power of two)::

    slots  int32[C, 3]   per slot: [low 32 bits of the key, high 32 bits, row]
                         row = its row id in the row store, or -1 for an empty slot

A slot's key and row sit side by side (12 bytes), so a lookup touches one
cache line of the index, not one in a key array and another in a row array.
Emptiness is marked by the row, never by the key, so every int64 value -- 0,
-1, INT64_MIN, INT64_MAX -- is a valid key. Collisions probe forward one slot
at a time from a key's home slot.

The index is laid out by bucket: with ``h = mix64(key)``, a key's bucket is
``h % 1024`` (:func:`tnrec._hashing.bucket_of`) and its home slot is
``bucket * (C / 1024) + (h / 1024) % (C / 1024)``, so the keys of one bucket
live in one contiguous 1/1024th of the index. A checkpoint stores its rows
bucket after bucket, so a load inserts into a region of a few megabytes at a
time instead of touching a new cache line (and page) of the whole index for
every key. Lookups of a training batch are as random as before. An index
smaller than 1024 slots (the batch-local hash sets) uses ``h % C``.
Deletion uses backward shift (Knuth's algorithm R), so there are no tombstones
and probe sequences never grow from deletes. The index is kept at most 3/4
full; growing rebuilds only this array (12 bytes a slot), never the rows.

Every kernel runs over whole key arrays and releases the GIL.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tnrec._hashing import NUM_BUCKETS, mix64_scalar
from tnrec.table import threads
from tnrec.table._llvm import _i32_ptr, _prefetch_w

MAX_LOAD_NUM = 3  # the index grows when count would exceed capacity * 3 / 4
MAX_LOAD_DEN = 4
MIN_CAPACITY = 1024
_AHEAD = 16  # keys whose home slot is prefetched ahead of the insert


def max_count(capacity: int) -> int:
    """Return how many keys an index of ``capacity`` slots holds before it grows."""
    return capacity * MAX_LOAD_NUM // MAX_LOAD_DEN


def capacity_for(count: int) -> int:
    """Return the smallest power-of-two capacity that holds ``count`` keys."""
    cap = MIN_CAPACITY
    while max_count(cap) < count:
        cap *= 2
    return cap


def new_index(capacity: int) -> np.ndarray:
    """Return an empty index of ``capacity`` slots (``int32[capacity, 3]``), filled on the
    table's threads: a big index is new memory, whose first write is most of its cost."""
    slots = np.empty((capacity, 3), dtype=np.int32)
    flat = slots.reshape(-1)
    threads.run(threads.slices(flat.shape[0]), lambda a, b: _fill_empty(flat[a:b]))
    return slots


@nb.njit(nogil=True, cache=True)
def _fill_empty(flat: np.ndarray) -> None:  # pragma: no cover - compiled
    """Write -1 to every int32 of ``flat``: key bytes too, though only the row marks empty."""
    for i in range(flat.shape[0]):
        flat[i] = -1


_BUCKET_BITS = 10
if NUM_BUCKETS != 1 << _BUCKET_BITS:  # pragma: no cover - a constant
    raise RuntimeError("internal error: the index layout assumes 1024 buckets")


@nb.njit(nogil=True, cache=True, inline="always")
def home(key: np.int64, mask: int) -> np.int64:  # pragma: no cover - compiled
    """Return the home slot of ``key`` in an index of ``mask + 1`` slots (a power of two):
    its bucket's region, then the hash's next bits within it."""
    return home_of_hash(mix64_scalar(np.uint64(key)), mask)


@nb.njit(nogil=True, cache=True, inline="always")
def home_of_hash(h: np.uint64, mask: int) -> np.int64:  # pragma: no cover - compiled
    """:func:`home` of a key whose ``mix64`` is ``h``."""
    m = np.uint64(mask)
    if m < np.uint64(NUM_BUCKETS - 1):
        return np.int64(h & m)
    per = m >> np.uint64(_BUCKET_BITS)  # slots a bucket, minus one
    b = h & np.uint64(NUM_BUCKETS - 1)
    return np.int64(b * (per + np.uint64(1)) + ((h >> np.uint64(_BUCKET_BITS)) & per))


_home = home


@nb.njit(nogil=True, cache=True, inline="always")
def key_lo(key: np.int64) -> np.int32:  # pragma: no cover - compiled
    """The low 32 bits of ``key`` as stored in a slot."""
    return np.int32(np.int64(key) & np.int64(0xFFFFFFFF))


@nb.njit(nogil=True, cache=True, inline="always")
def key_hi(key: np.int64) -> np.int32:  # pragma: no cover - compiled
    """The high 32 bits of ``key`` as stored in a slot."""
    return np.int32(np.int64(key) >> np.int64(32))


@nb.njit(nogil=True, cache=True, inline="always")
def slot_key(slots: np.ndarray, s: int) -> np.int64:  # pragma: no cover - compiled
    """The int64 key held by slot ``s``."""
    return (np.int64(slots[s, 1]) << np.int64(32)) | (np.int64(slots[s, 0]) & np.int64(0xFFFFFFFF))


@nb.njit(nogil=True, cache=True, inline="always")
def set_slot(
    slots: np.ndarray, s: np.int64, key: np.int64, row: int
) -> None:  # pragma: no cover - compiled
    slots[s, 0] = key_lo(key)
    slots[s, 1] = key_hi(key)
    slots[s, 2] = row


@nb.njit(nogil=True, cache=True, inline="always")
def probe(slots: np.ndarray, key: np.int64) -> np.int64:  # pragma: no cover - compiled
    """Return the slot holding ``key``, or the empty slot that ends its probe run.

    Reads the slots through a raw int32 pointer (``3 * s + field``): no
    wraparound or 2-D index arithmetic on the hottest loop of every lookup.
    """
    mask = slots.shape[0] - 1
    p = _i32_ptr(slots.ctypes.data)
    lo = key_lo(key)
    hi = key_hi(key)
    s = _home(key, mask)
    while True:
        b = s * 3
        if p[b + 2] < 0 or (p[b] == lo and p[b + 1] == hi):
            return s
        s = (s + 1) & mask


@nb.njit(nogil=True, cache=True, inline="always")
def find(slots: np.ndarray, key: np.int64) -> int:  # pragma: no cover - compiled
    """Return the row of ``key`` or -1."""
    return slots[probe(slots, key), 2]


@nb.njit(nogil=True, cache=True)
def lookup(
    slots: np.ndarray, keys: np.ndarray, out_rows: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Write the row of each key to ``out_rows`` (-1 when absent); return the absent count."""
    missing = 0
    for i in range(keys.shape[0]):
        r = find(slots, keys[i])
        out_rows[i] = r
        if r < 0:
            missing += 1
    return missing


@nb.njit(nogil=True, cache=True)
def insert_missing(
    slots: np.ndarray,
    keys: np.ndarray,
    out_rows: np.ndarray,
    start: int,
    count: int,
    limit: int,
    next_row: int,
    row_capacity: int,
    free_rows: np.ndarray,
    free_top: int,
) -> tuple[int, int, int, int, int]:  # pragma: no cover - compiled
    """Insert the absent keys of ``keys[start:]``, allocating rows; fill ``out_rows``.

    Rows come from the free list first (rows freed by eviction), then from the
    unused tail of the row store. The kernel stops early, before touching key
    ``i``, when the index would pass ``limit`` keys or no row is left; the
    caller grows the index or the row store and calls again from ``i``.

    Returns:
        ``(stop, count, next_row, free_top, created)``; ``stop == len(keys)``
        when every key was handled.
    """
    created = 0
    n = keys.shape[0]
    mask = slots.shape[0] - 1
    base = slots.ctypes.data
    for i in range(start, min(n, start + _AHEAD)):
        _prefetch_w(base + _home(keys[i], mask) * 12)
    for i in range(start, n):
        if i + _AHEAD < n:  # the home slot of a key ahead: index misses overlap
            a = base + _home(keys[i + _AHEAD], mask) * 12
            _prefetch_w(a)
            _prefetch_w(a + 11)
        key = keys[i]
        s = probe(slots, key)
        r = slots[s, 2]
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
        set_slot(slots, s, key, r)
        out_rows[i] = -2 - r  # marks "created in this call"; decoded by the caller
        count += 1
        created += 1
    return n, count, next_row, free_top, created


@nb.njit(nogil=True, cache=True)
def rehash(old: np.ndarray, new: np.ndarray) -> None:  # pragma: no cover - compiled
    """Insert every entry of the old index into the (empty) new one."""
    for s in range(old.shape[0]):
        if old[s, 2] >= 0:
            _reinsert(old, s, new)


@nb.njit(nogil=True, cache=True, inline="always")
def _reinsert(old: np.ndarray, s: int, new: np.ndarray) -> None:  # pragma: no cover - compiled
    """Copy the entry of old slot ``s`` to the first empty slot of its probe run in ``new``."""
    mask = new.shape[0] - 1
    t = _home(slot_key(old, s), mask)
    while new[t, 2] >= 0:
        t = (t + 1) & mask
    _copy_slot(old, s, new, t)


@nb.njit(nogil=True, cache=True, inline="always")
def _copy_slot(
    old: np.ndarray, s: int, new: np.ndarray, t: np.int64
) -> None:  # pragma: no cover - compiled
    new[t, 0] = old[s, 0]
    new[t, 1] = old[s, 1]
    new[t, 2] = old[s, 2]


@nb.njit(nogil=True, cache=True)
def rehash_regions(
    old: np.ndarray,
    new: np.ndarray,
    old_shift: int,
    new_shift: int,
    r0: int,
    r1: int,
    deferred: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Insert the entries held in the old index's regions ``[r0, r1)`` into the new one,
    region by region, slot after slot, without leaving the region (region ``r`` of an
    index is its slots ``s`` with ``s >> shift == r``).

    An entry whose new home is in another region than the old slot holding it
    (it had probed past its region's end) or whose probe would leave the new
    region is not inserted: its old slot goes to ``deferred`` (in slot order)
    for :func:`rehash_deferred`. Which entries those are depends on the regions
    only, so the new index does not depend on how the regions are shared out.
    Returns how many were deferred.
    """
    mask = new.shape[0] - 1
    nd = 0
    for s in range(r0 << old_shift, r1 << old_shift):
        r = old[s, 2]
        if r < 0:
            continue
        t = _home(slot_key(old, s), mask)
        g = t >> new_shift
        end = (g + 1) << new_shift
        if g != s >> old_shift:
            t = end
        while t < end and new[t, 2] >= 0:
            t += 1
        if t == end:
            deferred[nd] = s
            nd += 1
            continue
        _copy_slot(old, s, new, t)
    return nd


@nb.njit(nogil=True, cache=True)
def rehash_deferred(
    old: np.ndarray, new: np.ndarray, deferred: np.ndarray
) -> None:  # pragma: no cover - compiled
    """Insert the entries of the old slots ``deferred`` into the new index (probing across
    regions)."""
    for i in range(deferred.shape[0]):
        _reinsert(old, deferred[i], new)


@nb.njit(nogil=True, cache=True)
def delete(
    slots: np.ndarray, keys: np.ndarray, free_rows: np.ndarray, free_top: int
) -> tuple[int, int]:  # pragma: no cover - compiled
    """Delete ``keys`` (absent ones are ignored); push their rows on the free list.

    Returns:
        ``(deleted, free_top)``.
    """
    mask = slots.shape[0] - 1
    deleted = 0
    for i in range(keys.shape[0]):
        s = probe(slots, keys[i])
        r = slots[s, 2]
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
            if slots[j, 2] < 0:
                break
            home = _home(slot_key(slots, j), mask)
            if ((j - home) & mask) >= ((j - s) & mask):
                slots[s, 0] = slots[j, 0]
                slots[s, 1] = slots[j, 1]
                slots[s, 2] = slots[j, 2]
                s = j
        slots[s, 2] = -1
    return deleted, free_top


@nb.njit(nogil=True, cache=True)
def entries(
    slots: np.ndarray, out_keys: np.ndarray, out_rows: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Copy every (key, row) of the index to the outputs; return how many."""
    n = 0
    for s in range(slots.shape[0]):
        r = slots[s, 2]
        if r >= 0:
            out_keys[n] = slot_key(slots, s)
            out_rows[n] = r
            n += 1
    return n


@nb.njit(nogil=True, cache=True)
def entry_keys(slots: np.ndarray, out_keys: np.ndarray) -> int:  # pragma: no cover - compiled
    """Copy every key of the index to ``out_keys``; return how many."""
    n = 0
    for s in range(slots.shape[0]):
        if slots[s, 2] >= 0:
            out_keys[n] = slot_key(slots, s)
            n += 1
    return n


@nb.njit(nogil=True, cache=True)
def count_duplicates(keys: np.ndarray) -> int:  # pragma: no cover - compiled
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


# ---------------------------------------------------------------- inserting keys known to be new

REGIONS = 16  # fixed, so the layout an insert leaves does not depend on the thread count


@nb.njit(nogil=True, cache=True)
def homes_and_buckets(
    keys: np.ndarray, mask: int, homes: np.ndarray
) -> np.ndarray:  # pragma: no cover - compiled
    """Write the home slot of each key (index of ``mask + 1 >= 1024`` slots) to ``homes``;
    return how many keys each bucket gets (``int64[1024]``; region ``r`` of the index holds
    buckets ``[64 r, 64 r + 64)``)."""
    counts = np.zeros(NUM_BUCKETS, np.int64)
    for i in range(keys.shape[0]):
        h = mix64_scalar(np.uint64(keys[i]))
        homes[i] = home_of_hash(h, mask)
        counts[h & np.uint64(NUM_BUCKETS - 1)] += 1
    return counts


@nb.njit(nogil=True, cache=True, inline="always")
def _keys_of_regions(
    homes: np.ndarray, shift: int, r0: int, r1: int
) -> tuple[np.ndarray, int]:  # pragma: no cover - compiled
    """Return the positions of the keys whose home is in regions ``[r0, r1)``, in key
    order (the first ``m`` of the array), and ``m``."""
    n = homes.shape[0]
    mine = np.empty(n, np.int64)
    m = 0
    for i in range(n):  # branch-free: half the keys of a batch are another thread's
        mine[m] = i
        g = homes[i] >> shift
        m += (g >= r0) & (g < r1)
    return mine, m


@nb.njit(nogil=True, cache=True, inline="always")
def _prefetch_home(
    base: int, homes: np.ndarray, mine: np.ndarray, t: int
) -> None:  # pragma: no cover - compiled
    """Start fetching, for a write, the home slot of key ``mine[t]`` (both lines when it
    straddles two)."""
    a = base + homes[mine[t]] * 12
    _prefetch_w(a)
    _prefetch_w(a + 11)


@nb.njit(nogil=True, cache=True)
def insert_new_regions(
    slots: np.ndarray,
    keys: np.ndarray,
    homes: np.ndarray,
    r0: int,
    r1: int,
    shift: int,
    first_row: int,
    deferred: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Insert the keys whose home slot (``homes``) is in regions ``[r0, r1)``, in key order:
    key ``i`` gets row ``first_row + i``.

    A probe never leaves its region: a key whose run reaches the region's end
    is marked in ``deferred`` for :func:`insert_new_serial`, so threads given
    disjoint regions never touch the same slot, and the slots a region ends with
    depend only on its own keys. Returns the number of keys found already
    present (repeats: the caller decides).
    """
    mine, m = _keys_of_regions(homes, shift, r0, r1)
    base = slots.ctypes.data
    dups = 0
    for t in range(min(m, _AHEAD)):
        _prefetch_home(base, homes, mine, t)
    for t in range(m):
        if t + _AHEAD < m:
            _prefetch_home(base, homes, mine, t + _AHEAD)
        i = mine[t]
        s = homes[i]
        key = keys[i]
        end = ((s >> shift) + 1) << shift
        lo, hi = key_lo(key), key_hi(key)
        while True:
            if slots[s, 2] < 0:
                set_slot(slots, s, key, first_row + i)
                break
            if slots[s, 0] == lo and slots[s, 1] == hi:
                dups += 1
                break
            s += 1
            if s >= end:
                deferred[i] = True
                break
    return dups


@nb.njit(nogil=True, cache=True)
def find_or_insert_regions(
    slots: np.ndarray,
    keys: np.ndarray,
    homes: np.ndarray,
    r0: int,
    r1: int,
    shift: int,
    first_row: int,
    deferred: np.ndarray,
    rows: np.ndarray,
    where: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """:func:`insert_new_regions` for keys that may be present: a present key's row goes
    to ``rows[i]``; an absent one is inserted, holding ``first_row + i`` until
    :func:`number_new_rows` numbers it, with ``rows[i] = -1`` and its slot in
    ``where[i]``. Every live row is below ``first_row``, so a slot holding a row at
    or above it was inserted by this call: meeting its key again is a repeat.
    Returns the number of repeats.

    Its probe loop is :func:`insert_new_regions`'s plus the row tracking, kept
    apart: one loop for both, the tracking behind a flag, made a fill of new
    keys take more user time (CHANGELOG, stop 42).
    """
    mine, m = _keys_of_regions(homes, shift, r0, r1)
    base = slots.ctypes.data
    dups = 0
    for t in range(min(m, _AHEAD)):
        _prefetch_home(base, homes, mine, t)
    for t in range(m):
        if t + _AHEAD < m:
            _prefetch_home(base, homes, mine, t + _AHEAD)
        i = mine[t]
        s = homes[i]
        key = keys[i]
        end = ((s >> shift) + 1) << shift
        lo, hi = key_lo(key), key_hi(key)
        while True:
            r = slots[s, 2]
            if r < 0:
                set_slot(slots, s, key, first_row + i)
                rows[i] = -1
                where[i] = s
                break
            if slots[s, 0] == lo and slots[s, 1] == hi:
                rows[i] = r
                dups += r >= first_row
                break
            s += 1
            if s >= end:
                deferred[i] = True
                break
    return dups


@nb.njit(nogil=True, cache=True)
def find_or_insert_serial(
    slots: np.ndarray,
    keys: np.ndarray,
    first_row: int,
    deferred: np.ndarray,
    rows: np.ndarray,
    where: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """:func:`find_or_insert_regions` for the ``deferred`` keys (probing across regions)."""
    dups = 0
    for i in range(keys.shape[0]):
        if not deferred[i]:
            continue
        s = probe(slots, keys[i])
        r = slots[s, 2]
        if r >= 0:
            rows[i] = r
            dups += r >= first_row
        else:
            set_slot(slots, s, keys[i], first_row + i)
            rows[i] = -1
            where[i] = s
    return dups


@nb.njit(nogil=True, cache=True)
def number_new_rows(
    slots: np.ndarray, rows: np.ndarray, where: np.ndarray, first_row: int
) -> int:  # pragma: no cover - compiled
    """Give the keys :func:`find_or_insert_regions` inserted (``rows[i] < 0``) the rows
    ``first_row, first_row + 1, ...`` in key order, in ``rows`` and in their slots;
    return how many there were. A slot is written only when its row is not the
    ``first_row + i`` it holds already (every key before the first present one)."""
    r = first_row
    for i in range(rows.shape[0]):
        if rows[i] < 0:
            if r != first_row + i:
                slots[where[i], 2] = r
            rows[i] = r
            r += 1
    return r - first_row


@nb.njit(nogil=True, cache=True)
def insert_new_serial(
    slots: np.ndarray, keys: np.ndarray, first_row: int, deferred: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Insert the ``deferred`` keys (probing across regions); return the duplicates found."""
    dups = 0
    for i in range(keys.shape[0]):
        if not deferred[i]:
            continue
        s = probe(slots, keys[i])
        if slots[s, 2] >= 0:
            dups += 1
        else:
            set_slot(slots, s, keys[i], first_row + i)
    return dups
