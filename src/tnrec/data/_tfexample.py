"""Numba kernels that decode ``tf.train.Example`` records (framing and CRC: ``_tfframe``).

**Why our own decoder.** ``tf.train.Example`` is four small messages::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }     # entry: key = 1, value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Decoding them needs a varint reader and a field skipper: a few hundred lines
of numba that run over a whole block of records at once (no Python per record
or per value), find the wanted features through a hash table of their names,
and write the values straight into Arrow-ready buffers. The ``protobuf``
package (installed here through ``onnx``, not a dependency of tnrec) would
need the ``example.proto`` descriptors built at run time, then a Python loop
over every record and every feature to move the values out of its message
objects: 130.5 us per Criteo record (39 features) for that loop alone,
against 12.6 us per record for the whole reader here, hashing included
(``python bench/data_bench.py``, quiet 2-core machine). TensorFlow is not a dependency at
all. The tests check these kernels against bytes encoded by ``protobuf``.

Wire-format rules followed (those of protobuf's parsers): unknown fields and
known fields with an unexpected wire type are skipped; a repeated embedded
message merges, so two ``features`` fields both add entries; a repeated map
key keeps its last value; a ``Feature`` holding several lists keeps the last
(protobuf's oneof rule; protobuf would concatenate two lists of the same
kind, which no writer produces). Both the packed and the unpacked encodings
of ``float_list`` and ``int64_list`` are read.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

from tnrec.data._tfframe import crc32c_span, mask_crc, u32_at

# Kinds of a Feature (its oneof field number; 0: no list).
BYTES, FLOAT, INT64 = 1, 2, 3
# What a field's column reads: one number, a list of int64, a list of text.
WANT_NUMBER, WANT_INT, WANT_TEXT = 0, 1, 2
# Record status.
OK, BAD_CRC, MALFORMED, WRONG_KIND, TOO_MANY = 0, 1, 2, 3, 4


@numba.njit(nogil=True, cache=True)
def _varint(buf: npt.NDArray[np.uint8], pos: int, end: int) -> tuple[int, int]:
    """Return ``(value as int64 bits, next position)``; position -1 when malformed."""
    value = 0
    shift = 0
    while pos < end and shift < 70:
        b = int(buf[pos])
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    return 0, -1


@numba.njit(nogil=True, cache=True)
def _skip(buf: npt.NDArray[np.uint8], pos: int, end: int, wire: int) -> int:
    """Skip one field's value of wire type ``wire``; -1 when malformed (groups included)."""
    if wire == 0:
        return _varint(buf, pos, end)[1]
    if wire == 1:
        return pos + 8 if pos + 8 <= end else -1
    if wire == 5:
        return pos + 4 if pos + 4 <= end else -1
    if wire == 2:
        ln, pos = _varint(buf, pos, end)
        if pos < 0 or ln < 0 or ln > end - pos:
            return -1
        return pos + ln
    return -1


@numba.njit(nogil=True, cache=True)
def _span(buf: npt.NDArray[np.uint8], pos: int, end: int) -> tuple[int, int]:
    """Read a length-delimited value's length; return ``(start, stop)``, stop -1 if malformed."""
    ln, pos = _varint(buf, pos, end)
    if pos < 0 or ln < 0 or ln > end - pos:
        return pos, -1
    return pos, pos + ln


_FNV_OFFSET = -3750763034362895579  # 0xCBF29CE484222325 as int64
_FNV_PRIME = 0x100000001B3


def name_slots(names: list[bytes]) -> npt.NDArray[np.int64]:
    """Return the open-addressing table of the wanted names: ``slots[h & (S-1)] = field``."""
    size = 1 << max(4, (2 * len(names)).bit_length())
    slots = np.full(size, -1, dtype=np.int64)
    for f, name in enumerate(names):
        h = 0xCBF29CE484222325
        for b in name:
            h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
        at = h & (size - 1)
        while slots[at] >= 0:
            at = (at + 1) & (size - 1)
        slots[at] = f
    return slots


@numba.njit(nogil=True, cache=True)
def _field_of(
    buf: npt.NDArray[np.uint8],
    lo: int,
    hi: int,
    names: npt.NDArray[np.uint8],
    name_offsets: npt.NDArray[np.int64],
    slots: npt.NDArray[np.int64],
) -> int:
    """Return the index of the wanted field named ``buf[lo:hi]``, or -1 (FNV-1a, probing)."""
    h = _FNV_OFFSET
    for i in range(lo, hi):
        h = (h ^ buf[i]) * _FNV_PRIME  # wraps mod 2**64, as the uint64 hash
    mask = slots.shape[0] - 1
    at = h & mask
    n = hi - lo
    while slots[at] >= 0:
        f = slots[at]
        a = name_offsets[f]
        if name_offsets[f + 1] - a == n:
            same = True
            for k in range(n):
                if names[a + k] != buf[lo + k]:
                    same = False
                    break
            if same:
                return f
        at = (at + 1) & mask
    return -1


@numba.njit(nogil=True, cache=True)
def _feature(buf: npt.NDArray[np.uint8], lo: int, hi: int) -> tuple[int, int, int]:
    """Parse a ``Feature``: ``(kind, list start, list stop)``; stop -1 when malformed."""
    kind, a, b = 0, 0, 0
    pos = lo
    while pos < hi:
        tag, pos = _varint(buf, pos, hi)
        if pos < 0:
            return 0, 0, -1
        if tag & 7 == 2 and 1 <= tag >> 3 <= 3:
            s, e = _span(buf, pos, hi)
            if e < 0:
                return 0, 0, -1
            kind, a, b = tag >> 3, s, e
            pos = e
        else:
            pos = _skip(buf, pos, hi, tag & 7)
            if pos < 0:
                return 0, 0, -1
    return kind, a, b


@numba.njit(nogil=True, cache=True)
def _entry(buf: npt.NDArray[np.uint8], lo: int, hi: int) -> tuple[int, int, int, int]:
    """Parse a map entry: ``(key start, key stop, value start, value stop)``; -1 stops if bad."""
    ka, kb, va, vb = lo, lo, lo, lo  # absent key: ""; absent value: an empty Feature
    pos = lo
    while pos < hi:
        tag, pos = _varint(buf, pos, hi)
        if pos < 0:
            return 0, -1, 0, -1
        if tag == (1 << 3) | 2 or tag == (2 << 3) | 2:
            s, e = _span(buf, pos, hi)
            if e < 0:
                return 0, -1, 0, -1
            if tag >> 3 == 1:
                ka, kb = s, e
            else:
                va, vb = s, e
            pos = e
        else:
            pos = _skip(buf, pos, hi, tag & 7)
            if pos < 0:
                return 0, -1, 0, -1
    return ka, kb, va, vb


@numba.njit(nogil=True, cache=True)
def _features(
    buf: npt.NDArray[np.uint8],
    lo: int,
    hi: int,
    names: npt.NDArray[np.uint8],
    name_offsets: npt.NDArray[np.int64],
    slots: npt.NDArray[np.int64],
    kind: npt.NDArray[np.int8],
    spans: npt.NDArray[np.int64],
    r: int,
) -> int:
    """Parse record ``r``'s ``Features`` into ``kind[:, r]`` and ``spans[:, r]``.

    Returns:
        -1 when well formed, else the position where it is malformed.
    """
    pos = lo
    while pos < hi:
        at = pos
        tag, pos = _varint(buf, pos, hi)
        if pos < 0:
            return at
        if tag != (1 << 3) | 2:
            pos = _skip(buf, pos, hi, tag & 7)
            if pos < 0:
                return at
            continue
        s, e = _span(buf, pos, hi)
        if e < 0:
            return at
        ka, kb, va, vb = _entry(buf, s, e)
        if kb < 0 or vb < 0:
            return at
        f = _field_of(buf, ka, kb, names, name_offsets, slots)
        if f >= 0:
            k, a, b = _feature(buf, va, vb)
            if b < 0:
                return at
            kind[f, r], spans[f, r, 0], spans[f, r, 1] = k, a, b
        pos = e
    return -1


@numba.njit(nogil=True, cache=True)
def _example(
    buf: npt.NDArray[np.uint8],
    lo: int,
    hi: int,
    names: npt.NDArray[np.uint8],
    name_offsets: npt.NDArray[np.int64],
    slots: npt.NDArray[np.int64],
    kind: npt.NDArray[np.int8],
    spans: npt.NDArray[np.int64],
    r: int,
) -> int:
    """Parse record ``r``'s ``Example``; return -1, or the position where it is malformed."""
    pos = lo
    while pos < hi:
        at = pos
        tag, pos = _varint(buf, pos, hi)
        if pos < 0:
            return at
        if tag != (1 << 3) | 2:
            pos = _skip(buf, pos, hi, tag & 7)
            if pos < 0:
                return at
            continue
        s, e = _span(buf, pos, hi)
        if e < 0:
            return at
        bad = _features(buf, s, e, names, name_offsets, slots, kind, spans, r)
        if bad >= 0:
            return bad
        pos = e
    return -1


_INT64_MIN = -(1 << 63)
INT64_MIN_TEXT = np.frombuffer(str(_INT64_MIN).encode(), dtype=np.uint8).copy()


@numba.njit(nogil=True, cache=True)
def _ndigits(v: int) -> int:
    """Length of the decimal text of int64 ``v`` (sign included)."""
    if v == _INT64_MIN:
        return 20
    n = 1
    if v < 0:
        n += 1
        v = -v
    while v >= 10:
        v //= 10
        n += 1
    return n


@numba.njit(nogil=True, cache=True)
def _write_decimal(
    v: int, out: npt.NDArray[np.uint8], at: int, min_text: npt.NDArray[np.uint8]
) -> int:
    """Write the decimal text of int64 ``v`` at ``out[at:]``; return the end."""
    if v == _INT64_MIN:
        out[at : at + 20] = min_text
        return at + 20
    n = _ndigits(v)
    end = at + n
    if v < 0:
        out[at] = 45  # "-"
        v = -v
    p = end - 1
    while True:
        out[p] = 48 + v % 10
        v //= 10
        p -= 1
        if v == 0:
            break
    return end


@numba.njit(nogil=True, cache=True)
def _count(
    buf: npt.NDArray[np.uint8], lo: int, hi: int, kind: int, text: bool
) -> tuple[int, int, bool]:
    """Count a list's values (and their text bytes); ``(count, bytes, well formed)``."""
    count, size = 0, 0
    pos = lo
    while pos < hi:
        tag, pos = _varint(buf, pos, hi)
        if pos < 0:
            return 0, 0, False
        wire = tag & 7
        value = tag >> 3 == 1  # field 1 holds the values; others are skipped
        if value and kind == INT64 and (wire == 0 or wire == 2):
            s, e = (pos, hi) if wire == 0 else _span(buf, pos, hi)
            if e < 0:
                return 0, 0, False
            while s < e:
                v, s = _varint(buf, s, e)
                if s < 0:
                    return 0, 0, False
                count += 1
                if text:
                    size += _ndigits(v)
                if wire == 0:
                    break
            pos = s
        elif value and kind == FLOAT and wire == 2:
            s, e = _span(buf, pos, hi)
            if e < 0 or (e - s) % 4:
                return 0, 0, False
            count += (e - s) // 4
            pos = e
        elif value and kind == FLOAT and wire == 5:
            if pos + 4 > hi:
                return 0, 0, False
            count += 1
            pos += 4
        elif value and kind == BYTES and wire == 2:
            s, e = _span(buf, pos, hi)
            if e < 0:
                return 0, 0, False
            count += 1
            size += e - s
            pos = e
        else:
            pos = _skip(buf, pos, hi, wire)
            if pos < 0:
                return 0, 0, False
    return count, size, True


@numba.njit(nogil=True, cache=True)
def _accepts(want: int, kind: int) -> bool:
    if kind == 0:
        return True
    if want == WANT_NUMBER:
        return kind == FLOAT or kind == INT64
    if want == WANT_INT:
        return kind == INT64
    return kind == BYTES or kind == INT64


@numba.njit(nogil=True, cache=True)
def index_records(
    buf: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    names: npt.NDArray[np.uint8],
    name_offsets: npt.NDArray[np.int64],
    slots: npt.NDArray[np.int64],
    want: npt.NDArray[np.int8],
    t: npt.NDArray[np.int64],
) -> tuple[
    npt.NDArray[np.int8],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int8],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]:
    """Check and index R records: where each wanted feature's list is, and its size.

    Returns:
        ``(status[R], bad_field[R], detail[R], kind[F, R], spans[F, R, 2],
        counts[F, R], sizes[F, R])``: the record status (``OK``, ``BAD_CRC``,
        ``MALFORMED`` with the record offset in ``detail``, ``WRONG_KIND``
        with the kind read in ``detail``, ``TOO_MANY`` with the count), the
        field at fault, and per field the list's kind, byte span, value count
        and text bytes (text fields).
    """
    n_rec, n_fields = starts.shape[0], want.shape[0]
    status = np.zeros(n_rec, dtype=np.int8)
    bad_field = np.full(n_rec, -1, dtype=np.int64)
    detail = np.zeros(n_rec, dtype=np.int64)
    kind = np.zeros((n_fields, n_rec), dtype=np.int8)  # field-major: one field's column
    spans = np.zeros((n_fields, n_rec, 2), dtype=np.int64)  # is contiguous for the fills
    counts = np.zeros((n_fields, n_rec), dtype=np.int64)
    sizes = np.zeros((n_fields, n_rec), dtype=np.int64)
    for r in range(n_rec):
        s = starts[r]
        e = s + lengths[r]
        if mask_crc(crc32c_span(buf, s, e, t)) != u32_at(buf, e):
            status[r] = BAD_CRC
            continue
        bad = _example(buf, s, e, names, name_offsets, slots, kind, spans, r)
        if bad >= 0:
            status[r], detail[r] = MALFORMED, bad - s
            continue
        for f in range(n_fields):
            k = kind[f, r]
            if k == 0:
                continue
            c, size, ok = _count(buf, spans[f, r, 0], spans[f, r, 1], k, want[f] == WANT_TEXT)
            if not ok:
                status[r], detail[r], bad_field[r] = MALFORMED, spans[f, r, 0] - s, f
                break
            counts[f, r], sizes[f, r] = c, size
            if not _accepts(want[f], k):
                status[r], detail[r], bad_field[r] = WRONG_KIND, k, f
                break
            if want[f] == WANT_NUMBER and c > 1:
                status[r], detail[r], bad_field[r] = TOO_MANY, c, f
                break
    return status, bad_field, detail, kind, spans, counts, sizes


@numba.njit(nogil=True, cache=True)
def fill_ints(
    buf: npt.NDArray[np.uint8],
    kind: npt.NDArray[np.int8],
    spans: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    out: npt.NDArray[np.int64],
) -> None:
    """Write the int64 values of one field of records ``rows`` at ``out[offsets[g]:]``."""
    for g in range(rows.shape[0]):
        r = rows[g]
        if kind[r] != INT64:
            continue
        at = offsets[g]
        pos, hi = spans[r, 0], spans[r, 1]
        while pos < hi:
            tag, pos = _varint(buf, pos, hi)
            wire = tag & 7
            if tag >> 3 == 1 and (wire == 0 or wire == 2):
                s, e = (pos, hi) if wire == 0 else _span(buf, pos, hi)
                while s < e:
                    out[at], s = _varint(buf, s, e)
                    at += 1
                    if wire == 0:
                        break
                pos = s
            else:
                pos = _skip(buf, pos, hi, wire)


@numba.njit(nogil=True, cache=True)
def fill_text(
    buf: npt.NDArray[np.uint8],
    kind: npt.NDArray[np.int8],
    spans: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    value_offsets: npt.NDArray[np.int64],
    data: npt.NDArray[np.uint8],
    min_text: npt.NDArray[np.uint8],
) -> None:
    """Write one text field of records ``rows``: each value's bytes (ints as decimal text).

    ``value_offsets`` (``[N + 1]``, zeroed) receives the end of each value in ``data``.
    """
    j, d = 0, 0
    for g in range(rows.shape[0]):
        r = rows[g]
        k = kind[r]
        if k == 0:
            continue
        pos, hi = spans[r, 0], spans[r, 1]
        while pos < hi:
            tag, pos = _varint(buf, pos, hi)
            wire = tag & 7
            if tag >> 3 == 1 and k == BYTES and wire == 2:
                s, e = _span(buf, pos, hi)
                for i in range(s, e):  # short values: a loop beats a slice copy
                    data[d] = buf[i]
                    d += 1
                j += 1
                value_offsets[j] = d
                pos = e
            elif tag >> 3 == 1 and k == INT64 and (wire == 0 or wire == 2):
                s, e = (pos, hi) if wire == 0 else _span(buf, pos, hi)
                while s < e:
                    v, s = _varint(buf, s, e)
                    d = _write_decimal(v, data, d, min_text)
                    j += 1
                    value_offsets[j] = d
                    if wire == 0:
                        break
                pos = s
            else:
                pos = _skip(buf, pos, hi, wire)


@numba.njit(nogil=True, cache=True)
def fill_numbers(
    buf: npt.NDArray[np.uint8],
    kind: npt.NDArray[np.int8],
    spans: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    ints: npt.NDArray[np.int64],
    float_bits: npt.NDArray[np.uint32],
) -> None:
    """Write the one value of a numeric field of records ``rows`` (where there is one).

    An int64 goes to ``ints[g]``, a float's 32 bits to ``float_bits[g]``.
    """
    for g in range(rows.shape[0]):
        r = rows[g]
        if counts[r] != 1:
            continue
        k = kind[r]
        pos, hi = spans[r, 0], spans[r, 1]
        while pos < hi:
            tag, pos = _varint(buf, pos, hi)
            wire = tag & 7
            if tag >> 3 == 1 and k == INT64 and (wire == 0 or wire == 2):
                s, e = (pos, hi) if wire == 0 else _span(buf, pos, hi)
                if e == s:  # an empty packed run
                    pos = e
                    continue
                ints[g] = _varint(buf, s, e)[0]
                break
            if tag >> 3 == 1 and k == FLOAT and (wire == 2 or wire == 5):
                if wire == 2:
                    s, e = _span(buf, pos, hi)
                    if e == s:
                        pos = e
                        continue
                    pos = s
                float_bits[g] = u32_at(buf, pos)
                break
            pos = _skip(buf, pos, hi, wire)
