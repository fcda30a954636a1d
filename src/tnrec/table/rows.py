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

Rows freed by eviction go on a free list and are reused first.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba import typed, types

from tnrec.table.index import find
from tnrec.table.init import init_weights
from tnrec.table.optimizers import init_state, update_row

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
        self.chunks = typed.List.empty_list(types.float32[:, ::1])
        self.ichunks = typed.List.empty_list(types.int32[:, ::1])
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
        if self.capacity + self.chunk_rows > _INT32_MAX:
            raise RuntimeError("internal error: a table cannot hold more than 2**31 - 1 rows")
        block = np.zeros((self.chunk_rows, self.stride), dtype=np.float32)
        self.chunks.append(block)
        self.ichunks.append(block.view(np.int32))
        grown = np.zeros(self.capacity // 8, dtype=np.uint8)
        grown[: self.bitmap.shape[0]] = self.bitmap
        self.bitmap = grown

    def reserve_free_slots(self, n: int) -> None:
        """Make room on the free list for ``n`` more rows."""
        need = self.free_top + n
        if need > self.free_rows.shape[0]:
            grown = np.empty(max(need, 2 * self.free_rows.shape[0]), dtype=np.int32)
            grown[: self.free_top] = self.free_rows[: self.free_top]
            self.free_rows = grown

    def nbytes(self) -> int:
        """Bytes held by chunks, free list and bitmap."""
        return self.capacity * self.stride * 4 + self.free_rows.nbytes + self.bitmap.nbytes


# ---------------------------------------------------------------------------
# Kernels. `chunks`/`ichunks` are the typed lists, `shift`/`lmask` locate a row.


@nb.njit(nogil=True, cache=True)
def gather(chunks, shift, lmask, rows, D, out):  # pragma: no cover - compiled
    """Copy the weights of ``rows`` into ``out[n, D]``; rows < 0 give zeros."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0:
            for j in range(D):
                out[i, j] = 0.0
        else:
            c = chunks[r >> shift]
            l = r & lmask
            for j in range(D):
                out[i, j] = c[l, j]


@nb.njit(nogil=True, cache=True)
def lookup_gather(
    slot_keys, slot_rows, chunks, shift, lmask, keys, rows, out, D
):  # pragma: no cover
    """Find each key and copy its weights (zeros when absent); return the absent count."""
    missing = 0
    for i in range(keys.shape[0]):
        r = find(slot_keys, slot_rows, keys[i])
        rows[i] = r
        if r < 0:
            missing += 1
            for j in range(D):
                out[i, j] = 0.0
        else:
            c = chunks[r >> shift]
            l = r & lmask
            for j in range(D):
                out[i, j] = c[l, j]
    return missing


@nb.njit(nogil=True, cache=True)
def gather_records(chunks, shift, lmask, rows, out):  # pragma: no cover - compiled
    """Copy whole records of ``rows`` into ``out[n, stride]``."""
    W = out.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        c = chunks[r >> shift]
        l = r & lmask
        for j in range(W):
            out[i, j] = c[l, j]


@nb.njit(nogil=True, cache=True)
def scatter_records(chunks, shift, lmask, rows, block):  # pragma: no cover - compiled
    """Write whole records ``block[n, stride]`` into ``rows``."""
    W = block.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        c = chunks[r >> shift]
        l = r & lmask
        for j in range(W):
            c[l, j] = block[i, j]


@nb.njit(nogil=True, cache=True)
def create_rows(
    chunks,
    ichunks,
    shift,
    lmask,
    keys,
    rows,
    table_seed,
    init_kind,
    init_param,
    opt_kind,
    hp,
    D,
    S,
    generation,
):  # pragma: no cover - compiled
    """Initialise new rows: weights from the initializer, fresh state and statistics."""
    for i in range(rows.shape[0]):
        r = rows[i]
        c = chunks[r >> shift]
        ci = ichunks[r >> shift]
        l = r & lmask
        init_weights(c, l, keys[i], table_seed, init_kind, init_param, D)
        init_state(opt_kind, c, ci, l, hp, D, S)
        c[l, D + S] = 0.0
        c[l, D + S + 1] = 0.0
        ci[l, D + S + 2] = 0
        ci[l, D + S + 3] = generation


@nb.njit(nogil=True, cache=True)
def validate_push(slot_keys, slot_rows, keys, grads, show, click, rows, bitmap):  # pragma: no cover
    """Find the row of each key and count the faults; write nothing to the table.

    Returns:
        ``(unknown, duplicate, non_finite)`` key counts.
    """
    unknown = 0
    dup = 0
    bad = 0
    D = grads.shape[1]
    for i in range(keys.shape[0]):
        finite = np.isfinite(show[i]) and np.isfinite(click[i])
        for j in range(D):
            if not np.isfinite(grads[i, j]):
                finite = False
                break
        if not finite:
            bad += 1
        r = find(slot_keys, slot_rows, keys[i])
        rows[i] = r
        if r < 0:
            unknown += 1
            continue
        byte = r >> 3
        bit = np.uint8(1 << (r & 7))
        if bitmap[byte] & bit:
            dup += 1
        else:
            bitmap[byte] |= bit
    for i in range(keys.shape[0]):
        r = rows[i]
        if r >= 0:
            bitmap[r >> 3] = np.uint8(0)
    return unknown, dup, bad


@nb.njit(nogil=True, cache=True, inline="always")
def _apply_one(
    chunks, ichunks, shift, lmask, r, grads, show, click, i, kind, hp, D, S, gen
):  # pragma: no cover
    c = chunks[r >> shift]
    ci = ichunks[r >> shift]
    l = r & lmask
    update_row(kind, c, ci, l, grads, i, hp, D)
    c[l, D + S] += show[i]
    c[l, D + S + 1] += click[i]
    ci[l, D + S + 2] = 0
    ci[l, D + S + 3] = gen


@nb.njit(nogil=True, cache=True)
def apply_push(
    chunks, ichunks, shift, lmask, rows, grads, show, click, kind, hp, D, S, gen
):  # pragma: no cover
    """Apply the optimizer and the statistics to ``rows`` (validated by the caller)."""
    for i in range(rows.shape[0]):
        _apply_one(
            chunks, ichunks, shift, lmask, rows[i], grads, show, click, i, kind, hp, D, S, gen
        )


@nb.njit(nogil=True, cache=True)
def lookup_apply(
    slot_keys,
    slot_rows,
    chunks,
    ichunks,
    shift,
    lmask,
    keys,
    grads,
    show,
    click,
    kind,
    hp,
    D,
    S,
    gen,
):  # pragma: no cover - compiled
    """Unchecked push: find each key and update it in one pass; return the unknown count."""
    unknown = 0
    for i in range(keys.shape[0]):
        r = find(slot_keys, slot_rows, keys[i])
        if r < 0:
            unknown += 1
            continue
        _apply_one(chunks, ichunks, shift, lmask, r, grads, show, click, i, kind, hp, D, S, gen)
    return unknown


@nb.njit(nogil=True, cache=True)
def decay(slot_rows, chunks, ichunks, shift, lmask, factor, delta_days, base):  # pragma: no cover
    """Multiply show/click by ``factor`` and age unseen days of every live row."""
    for s in range(slot_rows.shape[0]):
        r = slot_rows[s]
        if r < 0:
            continue
        c = chunks[r >> shift]
        ci = ichunks[r >> shift]
        l = r & lmask
        c[l, base] = np.float32(np.float64(c[l, base]) * factor)
        c[l, base + 1] = np.float32(np.float64(c[l, base + 1]) * factor)
        days = np.int64(ci[l, base + 2]) + delta_days
        ci[l, base + 2] = np.int32(min(days, 2147483647))


@nb.njit(nogil=True, cache=True)
def select_evict(
    slot_keys,
    slot_rows,
    chunks,
    ichunks,
    shift,
    lmask,
    base,
    use_show,
    show_threshold,
    use_days,
    max_days,
    combine_all,
    out_keys,
):  # pragma: no cover - compiled
    """Write the keys the policy deletes to ``out_keys``; return how many."""
    n = 0
    for s in range(slot_rows.shape[0]):
        r = slot_rows[s]
        if r < 0:
            continue
        c = chunks[r >> shift]
        ci = ichunks[r >> shift]
        l = r & lmask
        low_show = use_show and c[l, base] < show_threshold
        stale = use_days and ci[l, base + 2] > max_days
        if combine_all:
            hit = (low_show or not use_show) and (stale or not use_days)
        else:
            hit = low_show or stale
        if hit:
            out_keys[n] = slot_keys[s]
            n += 1
    return n
