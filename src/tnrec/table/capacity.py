"""Row caps per bucket and the worker's memory budget.

A table counts its rows per bucket (``bucket_of(key)``, 1024 buckets). With
``EvictionPolicy(max_rows=N)`` each bucket has a share of ``N``
(:func:`bucket_caps`); a push that leaves a bucket above its share evicts it
down to its low water mark (:func:`select_cap_victims`). Buckets are the unit
because owners hold whole buckets: the rule gives the same rows on any number
of workers.

:class:`MemoryBudget` is a byte limit shared by the tables of one worker
(``PsStrategy(memory_limit_bytes=...)``). A table checks it before it
allocates rows or grows its index, and refuses with
:class:`~tnrec.errors.MemoryLimitError` instead of letting the kernel kill
the process.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import numba as nb
import numpy as np
import numpy.typing as npt

from tnrec._hashing import NUM_BUCKETS, mix64_scalar
from tnrec.errors import ArgumentError, MemoryLimitError
from tnrec.table.index import slot_key
from tnrec.table.rows import RowStore, row_f32, row_i32


class BudgetedTable(Protocol):
    """What a :class:`MemoryBudget` reads from a table (``tnrec.table.SparseTable``)."""

    name: str
    memory_budget: MemoryBudget | None

    def stats(self) -> Any: ...


def bucket_caps(max_rows: int) -> npt.NDArray[np.int64]:
    """Return each bucket's share of ``max_rows`` (they sum to ``max_rows``)."""
    caps = np.full(NUM_BUCKETS, max_rows // NUM_BUCKETS, dtype=np.int64)
    caps[: max_rows % NUM_BUCKETS] += 1
    return caps


@nb.njit(nogil=True, cache=True)
def bucket_counts(keys: np.ndarray, out: np.ndarray, sign: int) -> None:  # pragma: no cover
    """Add ``sign`` to ``out[bucket_of(key)]`` for every key."""
    nb_ = np.uint64(NUM_BUCKETS)
    for i in range(keys.shape[0]):
        out[int(mix64_scalar(np.uint64(keys[i])) % nb_)] += sign


@nb.njit(nogil=True, cache=True)
def set_bits(bitmap: np.ndarray, rows: np.ndarray, on: bool) -> None:  # pragma: no cover
    """Set (``on``) or clear the bit of every row ``>= 0`` in ``bitmap``."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0:
            continue
        bit = np.uint8(1 << (r & 7))
        if on:
            bitmap[r >> 3] |= bit
        else:
            bitmap[r >> 3] &= ~bit


@nb.njit(nogil=True, cache=True)
def _candidates(
    slots: np.ndarray,
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    base: int,
    buckets: np.ndarray,
    protected: np.ndarray,
    out_keys: np.ndarray,
    out_bucket: np.ndarray,
    out_show: np.ndarray,
    out_unseen: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Collect every unprotected row of ``buckets``; return how many.

    The index is laid out by bucket (:mod:`tnrec.table.index`): a key of
    bucket ``b`` has its home in the ``C / 1024`` slots from ``b * C / 1024``
    and, by linear probing, sits there or further on in the occupied run that
    crosses the region's end. Walking the region and then that run meets every
    key of ``b`` exactly once, without reading the rest of the index.
    """
    n = 0
    C = slots.shape[0]
    mask = C - 1
    per = C // NUM_BUCKETS
    nb_ = np.uint64(NUM_BUCKETS)
    for bi in range(buckets.shape[0]):
        b = buckets[bi]
        first = b * per
        for t in range(first, first + C):
            s = t & mask
            r = slots[s, 2]
            if r < 0:
                if t >= first + per:
                    break
                continue
            if protected[r >> 3] & np.uint8(1 << (r & 7)):
                continue
            key = slot_key(slots, s)
            if int(mix64_scalar(np.uint64(key)) % nb_) != b:
                continue
            c = row_f32(bases, r, shift, lmask, stride)
            ci = row_i32(bases, r, shift, lmask, stride)
            out_keys[n] = key
            out_bucket[n] = b
            out_show[n] = c[base]
            out_unseen[n] = ci[base + 2]
            n += 1
    return n


def select_cap_victims(
    slots: np.ndarray,
    store: RowStore,
    base: int,
    bucket_rows: npt.NDArray[np.int64],
    over: npt.NDArray[np.bool_],
    excess: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Return the keys to evict: ``excess[b]`` rows of each bucket flagged in ``over``.

    Order within a bucket: lowest decayed show, then most unseen days, then
    smallest key. Rows marked in the store's bitmap (the pushed batch) are
    never chosen, so a bucket may stay above its low water mark. ``base`` is the
    record slot of ``show``; ``bucket_rows`` the table's rows per bucket.
    """
    n = int(bucket_rows[over].sum())
    keys = np.empty(n, np.int64)
    bucket = np.empty(n, np.int64)
    show = np.empty(n, np.float32)
    unseen = np.empty(n, np.int32)
    which = np.flatnonzero(over)
    m = _candidates(slots, *store.loc, base, which, store.bitmap, keys, bucket, show, unseen)
    keys, bucket, show, unseen = keys[:m], bucket[:m], show[:m], unseen[:m]
    order = np.lexsort((keys, -unseen.astype(np.int64), show, bucket))
    bucket = bucket[order]
    starts = np.searchsorted(bucket, np.arange(NUM_BUCKETS))
    rank = np.arange(m) - starts[bucket]
    return keys[order][rank < excess[bucket]]


class MemoryBudget:
    """A byte limit shared by the tables of one worker.

    Args:
        limit_bytes: the most bytes the tables together may hold (index, rows,
            optimizer state, sketch).

    Example:
        >>> from tnrec.table import SGD, SparseTable
        >>> budget = MemoryBudget(1 << 30)
        >>> t = SparseTable(4, SGD(), name="user")
        >>> budget.attach(t)
        >>> budget.used() == t.stats().bytes_held
        True
    """

    def __init__(self, limit_bytes: int) -> None:
        if not (isinstance(limit_bytes, int) and not isinstance(limit_bytes, bool)) or (
            limit_bytes <= 0
        ):
            raise ArgumentError(
                f"`memory_limit_bytes` must be an int > 0. Received: {limit_bytes!r}."
            )
        self.limit_bytes = limit_bytes
        self._tables: weakref.WeakSet[BudgetedTable] = weakref.WeakSet()

    def attach(self, table: BudgetedTable) -> None:
        """Count ``table`` against this budget (and check its growth from now on)."""
        self._tables.add(table)
        table.memory_budget = self

    def used(self) -> int:
        """Bytes held by the attached tables."""
        return sum(t.stats().bytes_held for t in self._tables)

    def check(self, table: BudgetedTable, extra: int, what: str) -> None:
        """Raise :class:`MemoryLimitError` if ``extra`` more bytes would pass the limit."""
        used = self.used()
        if used + extra > self.limit_bytes:
            mib = 1 << 20
            raise MemoryLimitError(
                f'Table "{table.name}": {what} needs {extra / mib:.1f} MiB more, but the '
                f"tables of this worker hold {used / mib:.1f} MiB of the "
                f"{self.limit_bytes / mib:.1f} MiB memory limit (memory_limit_bytes). "
                "Nothing was changed. Cap the tables (EvictionPolicy(max_rows=...)), admit "
                "fewer keys (AdmissionPolicy(min_show=...)), add workers or raise the limit."
            )
