"""The row store: fixed-size chunks of float32 records, and the kernels over them.

One row is one record of ``stride = D + S + 4`` four-byte slots::

    [ w_0 .. w_{D-1} | state_0 .. state_{S-1} | show | click | unseen_days | marker ]
      float32          float32 (int32 where     float32 float32  int32         int32
                       the optimizer says)

``S`` is the optimizer's state width (:mod:`tnrec.table.optimizers`). Row ``r``
lives in chunk ``r >> shift`` at local row ``r & (chunk_rows - 1)``. Chunks are
allocated one at a time and never moved: growing the table never copies an
embedding and never needs twice its memory. Each chunk has an int32 view
sharing its memory for the integer slots.

The kernels do not index a numba typed List of chunks per row (a call into the
list's C implementation plus a reference-count round trip, which cost more than
the row's cache miss); they read ``bases``, an int64 array of the chunks' base
addresses, and reach a row through a raw float32 / int32 pointer to its first
slot (:func:`row_f32`, :func:`row_i32`; a ``numba.carray`` view of the chunk
cost more than the row's copy). The chunks themselves are owned by
:attr:`RowStore.chunks`; a chunk is never freed while the store lives.

Rows freed by eviction go on a free list and are reused first.
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np

from tnrec.table._llvm import _f32_ptr, _i32_ptr, _prefetch_r, _prefetch_w
from tnrec.table.index import count_duplicates, find, home, slot_key
from tnrec.table.init import init_weights
from tnrec.table.optimizers import (
    KIND_ADAGRAD,
    KIND_ADAM,
    KIND_FTRL,
    KIND_SGD,
    init_state,
    update_row,
)

_CHUNK_BYTES = 4 << 20
_INT32_MAX = 2147483647


class RowStore:
    """Chunks of rows plus the free list and a scratch bitmap (1 bit a row)."""

    def __init__(self, stride: int) -> None:
        self.stride = stride
        rows = 1024
        while rows * 2 * stride * 4 <= _CHUNK_BYTES and rows < (1 << 20):
            rows *= 2
        self.chunk_rows = rows
        self.shift = rows.bit_length() - 1
        self.lmask = rows - 1
        self.chunks: list[np.ndarray] = []  # owns the memory `bases` points into
        self.bases = np.zeros(0, dtype=np.int64)  # [chunks] base address of each chunk
        self.next_row = 0
        self.free_rows = np.empty(0, dtype=np.int32)
        self.free_top = 0
        self.bitmap = np.zeros(0, dtype=np.uint8)

    @property
    def capacity(self) -> int:
        """Rows allocated (used, free or not yet handed out)."""
        return len(self.chunks) * self.chunk_rows

    def add_chunk(self) -> None:
        """Allocate one more chunk of zeroed rows."""
        self.add_chunks(1)

    def add_chunks(self, k: int) -> None:
        """Allocate ``k`` more chunks of zeroed rows as one block of memory: a block of 4 MiB
        or more is one numpy asks the kernel to back with huge pages, so filling ``k`` chunks
        at once (a load) takes a page fault every 2 MiB instead of every 4 KiB; its pages are
        still zeroed by the kernel as they are first touched."""
        if k <= 0:
            return
        if self.capacity + k * self.chunk_rows > _INT32_MAX:
            raise RuntimeError("internal error: a table cannot hold more than 2**31 - 1 rows")
        slab = np.zeros((k * self.chunk_rows, self.stride), dtype=np.float32)
        blocks = [slab[i * self.chunk_rows : (i + 1) * self.chunk_rows] for i in range(k)]
        self.chunks.extend(blocks)
        self.bases = np.append(self.bases, np.array([b.ctypes.data for b in blocks], np.int64))
        need = self.capacity // 8
        if need > self.bitmap.shape[0]:  # doubled: adding k chunks copies O(k) bytes in all
            grown = np.zeros(max(need, 2 * self.bitmap.shape[0]), dtype=np.uint8)
            grown[: self.bitmap.shape[0]] = self.bitmap
            self.bitmap = grown

    def reserve_free_slots(self, n: int) -> None:
        """Make room on the free list for ``n`` more rows."""
        need = self.free_top + n
        if need > self.free_rows.shape[0]:
            grown = np.empty(max(need, 2 * self.free_rows.shape[0]), dtype=np.int32)
            grown[: self.free_top] = self.free_rows[: self.free_top]
            self.free_rows = grown

    @property
    def loc(self) -> tuple[np.ndarray, int, int, int]:
        """``(bases, stride, shift, lmask)``: what every row kernel needs to find a row."""
        return self.bases, self.stride, self.shift, self.lmask

    def nbytes(self) -> int:
        """Bytes held by chunks, free list and bitmap."""
        return self.capacity * self.stride * 4 + self.free_rows.nbytes + self.bitmap.nbytes


#: Keys (and rows) a kernel looks up or prefetches ahead of the one it works on: enough
#: misses in flight to cover a VM's memory latency, few enough to stay in L1.
_PREFETCH_AHEAD = 32

# ---------------------------------------------------------------------------
# Kernels. `bases` holds the chunks' addresses, `shift`/`lmask` locate a row,
# `stride` is the record width in 4-byte slots.
# A row pointer (`row_f32`, `row_i32`) is a numba raw pointer, typed `Any` here:
# numba ignores the annotations, which only document the arguments for mypy.


@nb.njit(nogil=True, cache=True, inline="always")
def prefetch_slot(slots: np.ndarray, key: np.int64) -> None:  # pragma: no cover - compiled
    """Start fetching the home slot of ``key`` (both lines when it straddles two)."""
    a = slots.ctypes.data + home(key, slots.shape[0] - 1) * 12
    _prefetch_r(a)
    _prefetch_r(a + 11)


@nb.njit(nogil=True, cache=True)
def lookup_rows(
    slots: np.ndarray, keys: np.ndarray, rows: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Write the row of each key to ``rows`` (-1 when absent); return the absent count.

    The home slots of the key ``_PREFETCH_AHEAD`` positions ahead are
    prefetched, so the index misses of consecutive keys overlap.
    """
    n = keys.shape[0]
    for i in range(min(n, _PREFETCH_AHEAD)):
        prefetch_slot(slots, keys[i])
    missing = 0
    for i in range(n):
        if i + _PREFETCH_AHEAD < n:
            prefetch_slot(slots, keys[i + _PREFETCH_AHEAD])
        r = find(slots, keys[i])
        rows[i] = r
        if r < 0:
            missing += 1
    return missing


@nb.njit(nogil=True, cache=True, inline="always")
def row_address(
    bases: np.ndarray, r: int, shift: int, lmask: int, stride: int
) -> int:  # pragma: no cover - compiled
    """Return the address of row ``r``'s first slot."""
    return bases[r >> shift] + np.int64(r & lmask) * stride * 4


@nb.njit(nogil=True, cache=True, inline="always")
def prefetch_span(a: int, nbytes: int, write: bool) -> None:  # pragma: no cover - compiled
    """Start fetching every cache line of ``[a, a + nbytes)`` (for a write or a read)."""
    end = a + nbytes - 1
    while a <= end:
        if write:
            _prefetch_w(a)
        else:
            _prefetch_r(a)
        a += 64
    if write:  # the last line, when the span starts inside a line and spills into one more
        _prefetch_w(end)
    else:
        _prefetch_r(end)


@nb.njit(nogil=True, cache=True, inline="always")
def prefetch_row(
    bases: np.ndarray, r: int, shift: int, lmask: int, stride: int
) -> None:  # pragma: no cover - compiled
    """Start fetching every cache line of row ``r`` (for an update that follows)."""
    prefetch_span(row_address(bases, r, shift, lmask, stride), stride * 4, True)


@nb.njit(nogil=True, cache=True, inline="always")
def row_f32(
    bases: np.ndarray, r: int, shift: int, lmask: int, stride: int
) -> Any:  # pragma: no cover - compiled
    """Return a float32 pointer to row ``r``'s slots (``c[j]`` is slot ``j``).

    A raw pointer, not a ``numba.carray`` view of the chunk: building the
    array struct cost ~17 ns a row, more than copying the row.
    """
    return _f32_ptr(row_address(bases, r, shift, lmask, stride))


@nb.njit(nogil=True, cache=True, inline="always")
def row_i32(
    bases: np.ndarray, r: int, shift: int, lmask: int, stride: int
) -> Any:  # pragma: no cover - compiled
    """Return an int32 pointer to row ``r``'s slots."""
    return _i32_ptr(row_address(bases, r, shift, lmask, stride))


@nb.njit(nogil=True, cache=True, inline="always")
def copy_weights(
    bases: np.ndarray, stride: int, shift: int, lmask: int, r: int, D: int, out: np.ndarray, i: int
) -> None:  # pragma: no cover - compiled
    """Copy row ``r``'s weights into ``out[i]`` (zeros when ``r < 0``)."""
    if r < 0:
        for j in range(D):
            out[i, j] = 0.0
    else:
        c = row_f32(bases, r, shift, lmask, stride)
        for j in range(D):
            out[i, j] = c[j]


@nb.njit(nogil=True, cache=True)
def gather(
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    rows: np.ndarray,
    D: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Copy the weights of ``rows`` into ``out[n, D]``; rows < 0 give zeros."""
    for i in range(rows.shape[0]):
        copy_weights(bases, stride, shift, lmask, rows[i], D, out, i)


@nb.njit(nogil=True, cache=True, inline="always")
def prefetch_row_r(
    bases: np.ndarray, r: int, shift: int, lmask: int, stride: int, D: int
) -> None:  # pragma: no cover - compiled
    """Start fetching the weights of row ``r`` (its first ``D`` slots) for reading."""
    prefetch_span(row_address(bases, r, shift, lmask, stride), D * 4, False)


@nb.njit(nogil=True, cache=True)
def lookup_gather(
    slots: np.ndarray,
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    keys: np.ndarray,
    rows: np.ndarray,
    out: np.ndarray,
    D: int,
) -> int:  # pragma: no cover
    """Find each key and copy its weights (zeros when absent); return the absent count.

    One software-pipelined pass: while key ``i``'s row is copied, key
    ``i + A`` is looked up (its slot was prefetched ``A`` keys ago) and its row
    prefetched, and key ``i + 2A``'s home slot is prefetched, so index misses
    and row misses are in flight together (``A = _PREFETCH_AHEAD``). This beat
    two passes (all lookups, then all copies) by about 15% at 10M keys.
    """
    n = keys.shape[0]
    A = _PREFETCH_AHEAD
    for i in range(min(n, 2 * A)):
        prefetch_slot(slots, keys[i])
    for i in range(min(n, A)):
        r = find(slots, keys[i])
        rows[i] = r
        if r >= 0:
            prefetch_row_r(bases, r, shift, lmask, stride, D)
    missing = 0
    for i in range(n):
        if i + 2 * A < n:
            prefetch_slot(slots, keys[i + 2 * A])
        j = i + A
        if j < n:
            rj = find(slots, keys[j])
            rows[j] = rj
            if rj >= 0:
                prefetch_row_r(bases, rj, shift, lmask, stride, D)
        r = rows[i]
        if r < 0:
            missing += 1
        copy_weights(bases, stride, shift, lmask, r, D, out, i)
    return missing


@nb.njit(nogil=True, cache=True)
def gather_below(
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    rows: np.ndarray,
    below: int,
    D: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Copy the weights of the ``rows`` under ``below`` into ``out`` (rows of keys that were
    present; the others are left to :func:`create_rows`), prefetching ``A`` rows ahead."""
    n = rows.shape[0]
    A = _PREFETCH_AHEAD
    for i in range(min(n, A)):
        if rows[i] < below:
            prefetch_row_r(bases, rows[i], shift, lmask, stride, D)
    for i in range(n):
        j = i + A
        if j < n and rows[j] < below:
            prefetch_row_r(bases, rows[j], shift, lmask, stride, D)
        r = rows[i]
        if r < below:
            copy_weights(bases, stride, shift, lmask, r, D, out, i)


@nb.njit(nogil=True, cache=True)
def gather_records(
    bases: np.ndarray, stride: int, shift: int, lmask: int, rows: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """Copy whole records of ``rows`` into ``out[n, stride]``."""
    W = out.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        c = row_f32(bases, r, shift, lmask, stride)
        for j in range(W):
            out[i, j] = c[j]


@nb.njit(nogil=True, cache=True)
def gather_slots(
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    rows: np.ndarray,
    start: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Copy slots ``start .. start + W - 1`` of ``rows`` into ``out[n, W]``."""
    W = out.shape[1]
    n = rows.shape[0]
    for i in range(min(n, _PREFETCH_AHEAD)):
        prefetch_row_r(bases, rows[i], shift, lmask, stride, start + W)
    for i in range(n):
        if i + _PREFETCH_AHEAD < n:
            prefetch_row_r(bases, rows[i + _PREFETCH_AHEAD], shift, lmask, stride, start + W)
        c = row_f32(bases, rows[i], shift, lmask, stride)
        for j in range(W):
            out[i, j] = c[start + j]


@nb.njit(nogil=True, cache=True)
def scatter_column(
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    rows: np.ndarray,
    start: int,
    block: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Write ``block[n, w]`` into slots ``start .. start + w - 1`` of ``rows``."""
    W = block.shape[1]
    for i in range(rows.shape[0]):
        c = row_f32(bases, rows[i], shift, lmask, stride)
        for j in range(W):
            c[start + j] = block[i, j]


@nb.njit(nogil=True, cache=True)
def scatter_records(
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    rows: np.ndarray,
    addrs: np.ndarray,
    starts: np.ndarray,
    widths: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Write whole records into ``rows`` from column blocks, one pass over the rows.

    Block ``k`` is a contiguous ``[n, widths[k]]`` array of 4-byte values at
    address ``addrs[k]``; it goes to slots ``starts[k] ..`` of each row. Each
    row is written once, so its cache line is fetched once, not once a column.
    """
    K = addrs.shape[0]
    for i in range(rows.shape[0]):
        c = row_i32(bases, rows[i], shift, lmask, stride)
        for k in range(K):
            w = widths[k]
            p = _i32_ptr(addrs[k] + np.int64(i) * w * 4)
            s = starts[k]
            for j in range(w):
                c[s + j] = p[j]


@nb.njit(nogil=True, cache=True)
def create_rows(
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    keys: np.ndarray,
    rows: np.ndarray,
    table_seed: np.uint64,
    init_kind: int,
    init_param: float,
    opt_kind: int,
    hp: np.ndarray,
    D: int,
    S: int,
    generation: np.int32,
    out: np.ndarray,
    dest: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Initialise new rows: weights from the initializer, fresh state and statistics.

    With ``dest`` (``int64[n]``, else empty) also copy row ``i``'s weights into
    ``out[dest[i]]``, while they are in cache.
    """
    copy = dest.shape[0] > 0
    w = np.empty(D, np.float32)  # the weights, drawn into an array the compiler can vectorise over
    for i in range(rows.shape[0]):
        r = rows[i]
        c = row_f32(bases, r, shift, lmask, stride)
        ci = row_i32(bases, r, shift, lmask, stride)
        init_weights(w, keys[i], table_seed, init_kind, init_param, D)
        for j in range(D):
            c[j] = w[j]
        if copy:
            o = dest[i]
            for j in range(D):
                out[o, j] = w[j]
        init_state(opt_kind, c, ci, hp, D, S)
        c[D + S] = 0.0
        c[D + S + 1] = 0.0
        ci[D + S + 2] = 0
        ci[D + S + 3] = generation


@nb.njit(nogil=True, cache=True)
def init_vectors(
    keys: np.ndarray,
    table_seed: np.uint64,
    init_kind: int,
    init_param: float,
    D: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Write each key's initial weights into ``out[n, D]`` (as :func:`create_rows` would)."""
    for i in range(keys.shape[0]):
        init_weights(out[i], keys[i], table_seed, init_kind, init_param, D)


@nb.njit(nogil=True, cache=True)
def count_row_duplicates(
    rows: np.ndarray, bitmap: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Return how many found rows (``>= 0``) repeat an earlier one; leave ``bitmap`` clear."""
    dup = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0:
            continue
        byte = r >> 3
        bit = np.uint8(1 << (r & 7))
        if bitmap[byte] & bit:
            dup += 1
        else:
            bitmap[byte] |= bit
    for i in range(rows.shape[0]):
        r = rows[i]
        if r >= 0:
            bitmap[r >> 3] = np.uint8(0)
    return dup


@nb.njit(nogil=True, cache=True)
def _count_non_finite(
    grads: np.ndarray, show: np.ndarray, click: np.ndarray
) -> int:  # pragma: no cover - compiled
    bad = 0
    D = grads.shape[1]
    for i in range(grads.shape[0]):
        finite = np.isfinite(show[i]) and np.isfinite(click[i])
        for j in range(D):
            if not np.isfinite(grads[i, j]):
                finite = False
                break
        if not finite:
            bad += 1
    return bad


@nb.njit(nogil=True, cache=True)
def check_lookup(
    slots: np.ndarray,
    keys: np.ndarray,
    grads: np.ndarray,
    show: np.ndarray,
    click: np.ndarray,
    rows: np.ndarray,
) -> tuple[int, int]:  # pragma: no cover
    """Find the row of each key of a push and count its faults; write nothing to the table.

    Runs on one slice of a push (see :mod:`tnrec.table.threads`); duplicates
    are counted over the whole push afterwards by :func:`count_row_duplicates`.

    Returns:
        ``(unknown, non_finite)`` key counts.
    """
    bad = _count_non_finite(grads, show, click)
    unknown = lookup_rows(slots, keys, rows)
    return unknown, bad


@nb.njit(nogil=True, cache=True)
def check_rows(
    grads: np.ndarray, show: np.ndarray, click: np.ndarray, rows: np.ndarray
) -> tuple[int, int]:  # pragma: no cover - compiled
    """:func:`check_lookup` for keys whose rows are already known (``-1``: unknown)."""
    bad = _count_non_finite(grads, show, click)
    unknown = 0
    for i in range(rows.shape[0]):
        if rows[i] < 0:
            unknown += 1
    return unknown, bad


@nb.njit(nogil=True, cache=True)
def count_key_duplicates(
    keys: np.ndarray, rows: np.ndarray, missing: int, bitmap: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Count the keys of a looked-up batch that repeat an earlier one.

    Present duplicates share a row (found with the row bitmap); the
    ``missing`` absent ones (``rows < 0``) go through a batch-local hash set,
    so a pull of existing keys pays no hash set of its own.
    """
    dup = count_row_duplicates(rows, bitmap)
    if missing:
        absent = np.empty(missing, dtype=np.int64)
        m = 0
        for i in range(keys.shape[0]):
            if rows[i] < 0:
                absent[m] = keys[i]
                m += 1
        dup += count_duplicates(absent)
    return dup


@nb.njit(nogil=True, cache=True, inline="always")
def _apply_one(
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    r: int,
    grads: np.ndarray,
    show: np.ndarray,
    click: np.ndarray,
    i: int,
    kind: int,
    hp: np.ndarray,
    D: int,
    S: int,
    gen: np.int32,
) -> None:  # pragma: no cover
    c = row_f32(bases, r, shift, lmask, stride)
    ci = row_i32(bases, r, shift, lmask, stride)
    update_row(kind, c, ci, grads, i, hp, D)
    c[D + S] += show[i]
    c[D + S + 1] += click[i]
    ci[D + S + 2] = 0
    ci[D + S + 3] = gen


@nb.njit(nogil=True, cache=True, inline="always")
def _apply_rows(
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    rows: np.ndarray,
    grads: np.ndarray,
    show: np.ndarray,
    click: np.ndarray,
    kind: int,
    hp: np.ndarray,
    D: int,
    S: int,
    gen: np.int32,
) -> None:  # pragma: no cover
    n = rows.shape[0]
    for i in range(min(n, _PREFETCH_AHEAD)):
        if rows[i] >= 0:
            prefetch_row(bases, rows[i], shift, lmask, stride)
    for i in range(n):
        if i + _PREFETCH_AHEAD < n and rows[i + _PREFETCH_AHEAD] >= 0:
            prefetch_row(bases, rows[i + _PREFETCH_AHEAD], shift, lmask, stride)
        r = rows[i]
        if r >= 0:
            _apply_one(bases, stride, shift, lmask, r, grads, show, click, i, kind, hp, D, S, gen)


@nb.njit(nogil=True, cache=True)
def apply_push(
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    rows: np.ndarray,
    grads: np.ndarray,
    show: np.ndarray,
    click: np.ndarray,
    kind: int,
    hp: np.ndarray,
    D: int,
    S: int,
    gen: np.int32,
) -> None:  # pragma: no cover
    """Apply the optimizer and the statistics to ``rows`` (validated by the caller).

    Rows found in the index are ``>= 0``; others are skipped. The row
    ``_PREFETCH_AHEAD`` positions ahead is prefetched: an update stores into
    a row that misses the cache, such stores fill the store buffer after a few
    rows, and without the prefetch the misses of consecutive rows hardly overlap.
    The loop is instantiated once per optimizer with ``kind`` a compile-time
    constant: with a run-time ``kind`` every row paid for all four rules'
    code (about twice the time of the rule itself).
    """
    if kind == KIND_ADAGRAD:
        _apply_rows(
            bases, stride, shift, lmask, rows, grads, show, click, KIND_ADAGRAD, hp, D, S, gen
        )
    elif kind == KIND_SGD:
        _apply_rows(bases, stride, shift, lmask, rows, grads, show, click, KIND_SGD, hp, D, S, gen)
    elif kind == KIND_ADAM:
        _apply_rows(bases, stride, shift, lmask, rows, grads, show, click, KIND_ADAM, hp, D, S, gen)
    else:
        _apply_rows(bases, stride, shift, lmask, rows, grads, show, click, KIND_FTRL, hp, D, S, gen)


@nb.njit(nogil=True, cache=True)
def lookup_apply(
    slots: np.ndarray,
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    keys: np.ndarray,
    grads: np.ndarray,
    show: np.ndarray,
    click: np.ndarray,
    kind: int,
    hp: np.ndarray,
    D: int,
    S: int,
    gen: np.int32,
) -> int:  # pragma: no cover - compiled
    """Unchecked push: find every key, then update the found rows; return the unknown count.

    Two passes, each prefetching ahead: all lookups, then the updates (the
    model's push reuses its pull's rows and skips the first pass).
    """
    n = keys.shape[0]
    rows = np.empty(n, dtype=np.int32)
    unknown = lookup_rows(slots, keys, rows)
    apply_push(bases, stride, shift, lmask, rows, grads, show, click, kind, hp, D, S, gen)
    return unknown


@nb.njit(nogil=True, cache=True)
def decay(
    slots: np.ndarray,
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    factor: float,
    delta_days: int,
    base: int,
) -> None:  # pragma: no cover
    """Multiply show/click by ``factor`` and age unseen days of every live row."""
    for s in range(slots.shape[0]):
        r = slots[s, 2]
        if r < 0:
            continue
        c = row_f32(bases, r, shift, lmask, stride)
        ci = row_i32(bases, r, shift, lmask, stride)
        c[base] = np.float32(np.float64(c[base]) * factor)
        c[base + 1] = np.float32(np.float64(c[base + 1]) * factor)
        days = int(ci[base + 2]) + delta_days
        ci[base + 2] = np.int32(min(days, _INT32_MAX))


@nb.njit(nogil=True, cache=True)
def select_evict(
    slots: np.ndarray,
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    base: int,
    use_show: bool,
    show_threshold: float,
    use_days: bool,
    max_days: int,
    combine_all: bool,
    out_keys: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Write the keys the policy deletes to ``out_keys``; return how many."""
    n = 0
    for s in range(slots.shape[0]):
        r = slots[s, 2]
        if r < 0:
            continue
        c = row_f32(bases, r, shift, lmask, stride)
        ci = row_i32(bases, r, shift, lmask, stride)
        low_show = use_show and c[base] < show_threshold
        stale = use_days and ci[base + 2] > max_days
        if combine_all:
            hit = (low_show or not use_show) and (stale or not use_days)
        else:
            hit = low_show or stale
        if hit:
            out_keys[n] = slot_key(slots, s)
            n += 1
    return n
