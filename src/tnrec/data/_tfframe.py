"""TFRecord framing in numba: CRC32C and finding whole records in a block.

**CRC32C** (Castagnoli, reflected polynomial ``0x82F63B78``) is computed with a
slicing-by-8 table (no installed package provides it; numbers in
``bench/data_bench.py``). TFRecord stores it masked:
``((crc >> 15) | (crc << 17)) + 0xA282EAD8`` (mod 2**32).
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

# Framing status.
FRAMED_ALL, NEED_MORE, BAD_LENGTH_CRC = 0, 1, 2
HUGE = 1 << 62  # a length beyond any file


def _crc_tables() -> npt.NDArray[np.int64]:
    """Return the 8 slicing tables of CRC32C, ``int64[8, 256]``."""
    c = np.arange(256, dtype=np.int64)
    for _ in range(8):
        c = np.where(c & 1, (c >> 1) ^ 0x82F63B78, c >> 1)
    tables = np.empty((8, 256), dtype=np.int64)
    tables[0] = c
    for k in range(1, 8):
        prev = tables[k - 1]
        tables[k] = (prev >> 8) ^ tables[0][prev & 0xFF]
    return tables


CRC_TABLES = _crc_tables()


@numba.njit(nogil=True, cache=True)
def crc32c_span(buf: npt.NDArray[np.uint8], lo: int, hi: int, t: npt.NDArray[np.int64]) -> int:
    crc = 0xFFFFFFFF
    i = lo
    while i + 8 <= hi:
        one = crc ^ (
            int(buf[i]) | (int(buf[i + 1]) << 8) | (int(buf[i + 2]) << 16) | (int(buf[i + 3]) << 24)
        )
        crc = (
            t[7, one & 0xFF]
            ^ t[6, (one >> 8) & 0xFF]
            ^ t[5, (one >> 16) & 0xFF]
            ^ t[4, (one >> 24) & 0xFF]
            ^ t[3, buf[i + 4]]
            ^ t[2, buf[i + 5]]
            ^ t[1, buf[i + 6]]
            ^ t[0, buf[i + 7]]
        )
        i += 8
    while i < hi:
        crc = t[0, (crc ^ buf[i]) & 0xFF] ^ (crc >> 8)
        i += 1
    return crc ^ 0xFFFFFFFF


@numba.njit(nogil=True, cache=True)
def mask_crc(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@numba.njit(nogil=True, cache=True)
def u32_at(buf: npt.NDArray[np.uint8], at: int) -> int:
    return (
        int(buf[at]) | (int(buf[at + 1]) << 8) | (int(buf[at + 2]) << 16) | (int(buf[at + 3]) << 24)
    )


def masked_crc32c(data: bytes) -> int:
    """Return TFRecord's masked CRC32C of ``data``."""
    buf = np.frombuffer(data, dtype=np.uint8).copy()  # writable, as the reader passes
    return int(mask_crc(crc32c_span(buf, 0, buf.shape[0], CRC_TABLES)))


def crc32c(data: bytes) -> int:
    """Return the CRC32C (Castagnoli) of ``data``."""
    buf = np.frombuffer(data, dtype=np.uint8).copy()  # writable, as the reader passes
    return int(crc32c_span(buf, 0, buf.shape[0], CRC_TABLES))


@numba.njit(nogil=True, cache=True)
def frame(
    buf: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    t: npt.NDArray[np.int64],
) -> tuple[int, int, int, int]:
    """Find the whole records at the start of ``buf``; check each length's CRC.

    A record is ``uint64 length | masked crc of length | data | masked crc of data``.

    Returns:
        ``(count, consumed, status, need)``: records found (their data
        offsets and lengths written to ``starts`` / ``lengths``), bytes they
        span, ``FRAMED_ALL`` / ``NEED_MORE`` / ``BAD_LENGTH_CRC`` (at byte
        ``consumed``), and for ``NEED_MORE`` the bytes the next record needs.
    """
    n = buf.shape[0]
    pos = 0
    count = 0
    while True:
        if pos == n:
            return count, pos, FRAMED_ALL, 0
        if pos + 12 > n:
            return count, pos, NEED_MORE, 12
        if mask_crc(crc32c_span(buf, pos, pos + 8, t)) != u32_at(buf, pos + 8):
            return count, pos, BAD_LENGTH_CRC, 0
        length = 0
        for k in range(7, -1, -1):
            length = (length << 8) | int(buf[pos + k])
        if buf[pos + 7] >= 0x40:  # 2**62 bytes or more: no file holds it
            length = HUGE
        if length > n - pos - 16:
            return count, pos, NEED_MORE, min(length + 16, HUGE)
        starts[count] = pos + 12
        lengths[count] = length
        count += 1
        pos += 16 + length
