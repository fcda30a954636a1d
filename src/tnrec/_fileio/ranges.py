"""Byte ranges of one file read into a ring of buffers the reader owns.

A local file is opened with ``O_DIRECT`` where the file system takes it: the
bytes go from the disk into the buffer without passing through the page
cache, so the read spends no CPU time copying out of the cache (a buffered
read's copy is kernel time, which ``bench/scale_bench.py`` reports for a
load), and a table being loaded does not also fill the cache with its own
files while it takes that memory as rows.
``O_DIRECT`` needs the file offset, the length and the buffer address aligned
to the device's block, so a range is read from the aligned offset below it
into an aligned buffer, and the returned view starts ``offset % ALIGN`` bytes
in. A remote file, a file system without ``O_DIRECT`` (tmpfs) or a read it
refuses (``EINVAL``) falls back to ordinary buffered reads of the same ranges.
"""

from __future__ import annotations

import errno
import io
import os

import numpy as np

from tnrec._fileio.storage import is_remote, local, open_input

ALIGN = 4096  # the largest logical block size O_DIRECT asks alignment to


def aligned_empty(nbytes: int) -> np.ndarray:
    """A ``uint8[nbytes]`` array whose first byte is ``ALIGN``-aligned."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off : off + nbytes]


class RangeReader:
    """Reads ranges of up to ``max_bytes`` bytes of ``path``; each :meth:`read` returns a view
    of the next of ``depth`` buffers, valid until ``depth`` more reads have been made.

    Raises (every method): ``OSError`` as the OS does (the caller names the file).
    """

    def __init__(self, path: str, max_bytes: int, depth: int = 3) -> None:
        self.path = path
        self._fd: int | None = None
        self._f: io.BufferedReader | None = None
        if not is_remote(path) and hasattr(os, "O_DIRECT"):
            try:
                self._fd = os.open(local(path), os.O_RDONLY | os.O_DIRECT)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        if self._fd is None:
            self._f = open_input(path)
        span = -(-max_bytes // ALIGN) * ALIGN + ALIGN
        self._bufs = [aligned_empty(span) for _ in range(depth)]
        self._next = 0

    @property
    def direct(self) -> bool:
        """True while reads bypass the page cache."""
        return self._fd is not None

    def read(self, offset: int, length: int) -> np.ndarray:
        """Return ``uint8`` bytes ``[offset, offset + length)`` of the file (fewer at its end)."""
        buf = self._bufs[self._next]
        self._next = (self._next + 1) % len(self._bufs)
        if self._fd is not None:
            try:
                return self._read_direct(self._fd, buf, offset, length)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                os.close(self._fd)
                self._fd = None
                self._f = open_input(self.path)
        if self._f is None:
            raise ValueError(f"{self.path}: read after close")
        return _read_buffered(self._f, buf, offset, length)

    @staticmethod
    def _read_direct(fd: int, buf: np.ndarray, offset: int, length: int) -> np.ndarray:
        lo = offset - offset % ALIGN
        delta = offset - lo
        span = -(-(delta + length) // ALIGN) * ALIGN
        got = 0
        while got < span:
            n = os.preadv(fd, [buf[got:span].data], lo + got)
            if n == 0:
                break
            got += n
        end = min(delta + length, max(got, delta))
        return buf[delta:end]

    def close(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._f is not None:
            self._f.close()
            self._f = None


def _read_buffered(f: io.BufferedReader, buf: np.ndarray, offset: int, length: int) -> np.ndarray:
    """Read ``[offset, offset + length)`` of ``f`` into ``buf``; return the bytes read."""
    f.seek(offset)
    got = 0
    view = buf.data
    while got < length:
        n = f.readinto(view[got:length])
        if not n:
            break
        got += n
    return buf[:got]
