"""Streaming save and load of a table's rows, in bounded chunks.

A save in bucket order never copies the table. One pass over the index
groups the live slots by bucket (``int32`` slot numbers: 4 bytes a key);
then chunks of ``CHUNK_BYTES`` of rows are gathered straight from the row
store and appended to the column files (``keys.npy``, ``weights.npy``, the
optimizer's state, ``show`` ... ``marker``; the ``.npy`` headers are written
first, from the known row count), each file's XXH3 computed as it is
written (:mod:`tnrec._fileio.digest`). A writer thread writes chunk ``i``
while the next is gathered, so the disk and the gathering overlap. Memory
beyond the table: the slot order plus two chunks.

A load reads the column files in chunks of ``LOAD_CHUNK_BYTES``, the files of
a chunk at once on four threads (:class:`tnrec._fileio.RangeReader`:
``O_DIRECT`` where the file system takes it, so the disk's bytes reach the
buffers without a copy through the page cache), while the previous chunk's
keys are inserted and its records written straight into their rows in one
pass (all columns of a row at once, on the table's threads); the table
reserves its index and row chunks for the whole count first, so nothing is
rehashed as rows arrive. Memory beyond the table: three chunks' buffers
(``LOAD_CHUNK_BYTES`` each).
Read whole, each file's checksum (XXH3, or sha256 for files saved with it)
is computed as it streams by, on two hashing threads (a file always on the
same one), and compared at the end; read by
bucket (another number of workers), the files are verified first, then only
the selected buckets' byte ranges are read.
"""

from __future__ import annotations

import io
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numba as nb
import numpy as np
import numpy.typing as npt

from tnrec import _fileio
from tnrec._hashing import NUM_BUCKETS, bucket_of, mix64_scalar
from tnrec.errors import CheckpointError, ChecksumError
from tnrec.table._llvm import _prefetch_r
from tnrec.table.index import slot_key
from tnrec.table.rows import RowStore, prefetch_span, row_address, row_f32

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


class RowSink(Protocol):
    """What a load writes into (``tnrec.table.SparseTable``)."""

    def reserve(self, n: int) -> None: ...

    def __len__(self) -> int: ...

    def rows_for(self, keys: npt.NDArray[np.int64], new: bool = False) -> npt.NDArray[np.int32]: ...

    def write_blocks(
        self, rws: npt.NDArray[np.int32], blocks: list[tuple[int, np.ndarray]]
    ) -> None: ...


CHUNK_BYTES = 16 << 20
LOAD_CHUNK_BYTES = 64 << 20  # a load reads bigger chunks: its narrow columns' reads are
# 1/13th of a chunk each, and the disk serves 4 MB reads far faster than 1 MB ones
_AHEAD = 16  # rows prefetched ahead while gathering


@dataclass(frozen=True)
class Column:
    """One column file: its name, first record slot, width, dtype and whether it is 2-D."""

    name: str
    start: int
    width: int
    dtype: str  # "f4" or "i4"
    matrix: bool

    def shape(self, n: int) -> tuple[int, ...]:
        """The array's shape for ``n`` rows."""
        return (n, self.width) if self.matrix else (n,)


def columns(dim: int, state: list[tuple[str, int, str]]) -> list[Column]:
    """The record's columns after ``keys``: weights, the optimizer's state, the statistics."""
    out = [Column("weights", 0, dim, "f4", True)]
    col = dim
    for name, width, dtype in state:
        w = width or 1
        out.append(Column(name, col, w, "i4" if dtype == "int32" else "f4", bool(width)))
        col += w
    for name, dt in (("show", "f4"), ("click", "f4"), ("unseen_days", "i4"), ("marker", "i4")):
        out.append(Column(name, col, 1, dt, False))
        col += 1
    return out


def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header ``np.save`` writes for an array of ``dtype`` and ``shape``."""
    buf = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(np.dtype("<" + dtype))
    np.lib.format.write_array_header_1_0(
        buf, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue()


# ---------------------------------------------------------------------- kernels


@nb.njit(nogil=True, cache=True)
def _bucket_slot_order(
    slots: np.ndarray, lo: int, hi: int, starts: np.ndarray, out: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Write the live slots whose bucket is in ``[lo, hi)`` to ``out``, grouped by bucket
    (``starts[b]`` is bucket ``b``'s first position; advanced as slots are placed)."""
    nb_ = np.uint64(NUM_BUCKETS)
    n = 0
    for s in range(slots.shape[0]):
        if slots[s, 2] < 0:
            continue
        b = int(mix64_scalar(np.uint64(slot_key(slots, s))) % nb_)
        if lo <= b < hi:
            out[starts[b]] = s
            starts[b] += 1
            n += 1
    return n


@nb.njit(nogil=True, cache=True)
def _gather_chunk(
    slots: np.ndarray,
    order: np.ndarray,
    bases: np.ndarray,
    stride: int,
    shift: int,
    lmask: int,
    keys: np.ndarray,
    rec: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Copy the key and record of each slot in ``order``; slots ``2A`` and rows ``A``
    positions ahead are prefetched (both are scattered over memory)."""
    n = order.shape[0]
    A = _AHEAD
    for i in range(n):
        if i + 2 * A < n:
            _prefetch_r(slots.ctypes.data + np.int64(order[i + 2 * A]) * 12)
        if i + A < n:
            r = slots[order[i + A], 2]
            prefetch_span(row_address(bases, r, shift, lmask, stride), stride * 4, False)
        s = order[i]
        keys[i] = slot_key(slots, s)
        c = row_f32(bases, slots[s, 2], shift, lmask, stride)
        for j in range(stride):
            rec[i, j] = c[j]


# ---------------------------------------------------------------------- save


def bucket_order(
    slots: np.ndarray, bucket_rows: npt.NDArray[np.int64], lo: int, hi: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """Return the live slots of buckets ``[lo, hi)`` of an index grouped by bucket, and the
    offsets (``int64[NUM_BUCKETS + 1]``: bucket ``b`` is ``order[offsets[b]:offsets[b+1]]``);
    ``bucket_rows`` is the number of keys of each bucket."""
    counts = bucket_rows.copy()
    counts[:lo] = 0
    counts[hi:] = 0
    offsets = np.zeros(NUM_BUCKETS + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    order = np.empty(int(offsets[-1]), dtype=np.int32)
    n = _bucket_slot_order(slots, lo, hi, offsets[:-1].copy(), order)
    if n != order.shape[0]:
        raise RuntimeError(f"internal error: {n} slots in the buckets, counts say {order.shape[0]}")
    return order, offsets


def _chunk_rows(stride: int, nbytes: int | None = None) -> int:
    """Rows of a chunk: ``nbytes`` (``CHUNK_BYTES``) of keys and records."""
    return max(4096, (CHUNK_BYTES if nbytes is None else nbytes) // (8 + 4 * stride))


def _chunks(n: int, stride: int, nbytes: int | None = None) -> Iterator[tuple[int, int]]:
    rows = _chunk_rows(stride, nbytes)
    for a in range(0, n, rows):
        yield a, min(n, a + rows)


def write_columns(
    slots: np.ndarray, st: RowStore, tmp: str, order: npt.NDArray[np.int32], cols: list[Column]
) -> dict[str, str]:
    """Write ``keys.npy`` and one file per column of the rows of the slots in ``order``;
    return their XXH3 digests."""
    n = order.shape[0]
    names = ["keys", *(c.name for c in cols)]
    files = {name: _fileio.StreamFile(os.path.join(tmp, f"{name}.npy"), "xxh3") for name in names}
    try:
        files["keys"].write(npy_header("i8", (n,)))
        for c in cols:
            files[c.name].write(npy_header(c.dtype, c.shape(n)))
        with ThreadPoolExecutor(1, thread_name_prefix="tnrec-save") as pool:
            pending: Future[None] | None = None
            for a, b in _chunks(n, st.stride):
                keys = np.empty(b - a, np.int64)
                rec = np.empty((b - a, st.stride), np.float32)
                _gather_chunk(slots, order[a:b], *st.loc, keys, rec)
                if pending is not None:
                    pending.result()
                pending = pool.submit(_write_chunk, files, cols, keys, rec)
            if pending is not None:
                pending.result()
        sums = {}
        for name in names:
            sums[f"{name}.npy"] = files[name].close()
            _fileio.kill_point(f"file:{name}.npy")
        return sums
    except BaseException:
        for f in files.values():
            f.abort()
        raise


def _write_chunk(
    files: dict[str, _fileio.StreamFile], cols: list[Column], keys: np.ndarray, rec: np.ndarray
) -> None:
    files["keys"].write(keys.data)
    for c in cols:
        files[c.name].write(np.ascontiguousarray(rec[:, c.start : c.start + c.width]).data)


# ---------------------------------------------------------------------- load

_READ_THREADS = 4  # column files read at once
_DEPTH = 3  # buffers each column file's reader rotates through: the chunk read ahead, the
# chunk being inserted, and the chunk whose hashing may still be running


class _Reader:
    """One ``.npy`` column file read in chunks of rows (:class:`tnrec._fileio.RangeReader`),
    its checksum (the algorithm ``digest`` names) updated in file order when ``hashing``."""

    def __init__(
        self,
        path: str,
        dtype: str,
        shape: tuple[int, ...],
        digest: str | None,
        hashing: bool,
        max_rows: int,
    ) -> None:
        self.path = path
        try:
            there = _fileio.is_file(path)
        except OSError as e:
            raise CheckpointError(f"Cannot read {path}: {e}.") from None
        if not there:
            raise CheckpointError(
                f"Saved table file {path} is missing (it is listed in table.json)."
            )
        self.dtype = np.dtype("<" + dtype)
        self.width = int(np.prod(shape[1:], dtype=np.int64))
        self.row_bytes = self.width * self.dtype.itemsize
        head = self._header(path, dtype, shape, digest, hashing)
        self.offset = len(head)
        self.end = self.offset + shape[0] * self.row_bytes
        self.hash = _fileio.new_digest(digest, head) if hashing else None
        self.algorithm = _fileio.digest_algorithm(digest or "")
        try:
            self.size = _fileio.size(path)
            self.ranges = _fileio.RangeReader(path, max_rows * self.row_bytes, _DEPTH)
        except OSError as e:
            raise CheckpointError(f"Cannot read {path}: {e}.") from None

    @staticmethod
    def _header(
        path: str, dtype: str, shape: tuple[int, ...], digest: str | None, hashing: bool
    ) -> bytes:
        """Return the file's ``.npy`` header bytes, checked against ``dtype`` and ``shape``."""
        try:
            with _fileio.open_input(path) as f:
                try:
                    version = np.lib.format.read_magic(f)
                    read_header = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    got_shape, fortran, got_dtype = read_header(f)
                    problem = None
                    if got_shape != shape or fortran or got_dtype != np.dtype("<" + dtype):
                        problem = (
                            f"holds {got_dtype}{list(got_shape)}, expected {dtype}{list(shape)}"
                        )
                except Exception as e:  # numpy raises ValueError, SyntaxError, TokenError ...
                    problem = f"its .npy header cannot be read ({type(e).__name__})"
                if problem is None:
                    n = f.tell()
                    f.seek(0)
                    return f.read(n)
        except OSError as e:
            raise CheckpointError(f"Cannot read {path}: {e}.") from None
        if hashing and digest is not None and _fileio.digest_file(path, digest) != digest:
            raise ChecksumError(
                f"Saved table file {path} is corrupt: its {_fileio.digest_algorithm(digest)} "
                "does not match table.json."
            )
        raise CheckpointError(f"{path}: {problem}, as table.json says.")

    def read(self, a: int, b: int) -> np.ndarray:
        """Return rows ``[a, b)`` (``[b - a, width]``), a view valid for ``_DEPTH`` reads."""
        want = (b - a) * self.row_bytes
        try:
            got = self.ranges.read(self.offset + a * self.row_bytes, want)
        except OSError as e:
            raise CheckpointError(f"Cannot read {self.path}: {e}.") from None
        if got.shape[0] != want:
            raise ChecksumError(
                f"Saved table file {self.path} is corrupt: it is truncated (rows {a}..{b} are "
                f"missing), so its {self.algorithm} does not match table.json."
            )
        return got.view(self.dtype).reshape(b - a, self.width)

    def update(self, block: np.ndarray) -> None:
        """Add ``block`` (the next rows of the file) to the checksum."""
        if self.hash is not None:
            self.hash.update(block.data)

    def finish(self, digest: str, header_file: str) -> None:
        """Check the file held exactly the rows read and matches ``digest``."""
        if self.hash is not None and (self.size != self.end or self.hash.hexdigest() != digest):
            raise ChecksumError(
                f"Saved table file {self.path} is corrupt: its {self.algorithm} does not match "
                f"{header_file}."
            )

    def close(self) -> None:
        """Close the file."""
        if hasattr(self, "ranges"):
            self.ranges.close()


class _Hashers:
    """Hash the column files on ``n`` threads as chunks are read: each file always on the same
    thread (so its pieces are hashed in order), files spread over the threads by bytes a row."""

    def __init__(self, readers: dict[str, _Reader], n: int = 2) -> None:
        self.pools = [ThreadPoolExecutor(1, thread_name_prefix="tnrec-hash") for _ in range(n)]
        load = [0] * n
        self.home: dict[str, int] = {}
        for name in sorted(readers, key=lambda k: -readers[k].row_bytes):
            t = load.index(min(load))
            self.home[name] = t
            load[t] += readers[name].row_bytes
        self.readers = readers

    def submit(self, blocks: dict[str, np.ndarray]) -> list[Future[None]]:
        """Queue each file's block of one chunk; return the futures."""
        return [
            self.pools[self.home[name]].submit(self.readers[name].update, block)
            for name, block in blocks.items()
        ]

    def close(self) -> None:
        for p in self.pools:
            p.shutdown(wait=True)


def read_rows(
    table: RowSink,
    header: dict[str, Any],
    cols: list[Column],
    ranges: list[tuple[int, int]] | None,
    keep: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.bool_]] | None,
) -> tuple[int, float]:
    """Insert the saved rows of ``ranges`` (``None``: all, checksums checked as they stream by)
    that ``keep`` accepts into ``table``; return how many were inserted and the seconds spent
    inserting keys into the index (reserving it included).

    Four reader threads read chunk ``i + 1`` while chunk ``i``'s keys go into the
    index and chunk ``i - 1``'s records into their rows (on another thread), and
    two more threads hash the chunks already read.
    """
    d, n = header["_dir"], int(header["count"])
    hashing = ranges is None
    spans = [(0, n)] if ranges is None else ranges
    sums = header["files"]
    stride = max(c.start + c.width for c in cols)
    rows = _chunk_rows(stride, LOAD_CHUNK_BYTES)
    readers: dict[str, _Reader] = {}
    hashers = None
    try:
        readers["keys"] = _Reader(
            os.path.join(d, "keys.npy"), "i8", (n,), sums.get("keys.npy"), hashing, rows
        )
        for c in cols:
            f = f"{c.name}.npy"
            readers[c.name] = _Reader(
                os.path.join(d, f), c.dtype, c.shape(n), sums.get(f), hashing, rows
            )
        fresh = len(table) == 0  # a file's keys are unique: into an empty table all are new
        chunks = [
            (lo + a, lo + b)
            for lo, hi in spans
            for a, b in _chunks(hi - lo, stride, LOAD_CHUNK_BYTES)
        ]
        hashers = _Hashers(readers) if hashing else None
        hashed: list[list[Future[None]]] = []
        done = 0
        writing: Future[None] | None = None
        with (
            ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="tnrec-read") as io,
            ThreadPoolExecutor(1, thread_name_prefix="tnrec-rows") as writer,
        ):
            ahead = _read_chunk(io, readers, *chunks[0]) if chunks else {}
            t0 = time.perf_counter()  # the first chunk is read while the room is made
            table.reserve(sum(b - a for a, b in spans))
            index_s = time.perf_counter() - t0
            for i in range(len(chunks)):
                blocks = {name: f.result() for name, f in ahead.items()}
                if hashers is not None:
                    hashed.append(hashers.submit(blocks))
                if i + 1 < len(chunks):
                    # chunk i + 1 goes into the buffers of chunk i + 1 - DEPTH: hashed by now?
                    if hashed and i + 1 >= _DEPTH:
                        for fut in hashed[i + 1 - _DEPTH]:
                            fut.result()
                    ahead = _read_chunk(io, readers, *chunks[i + 1])
                keys = blocks["keys"][:, 0]
                parts = [(c.start, blocks[c.name]) for c in cols]
                sel = keep(keys) if keep is not None else None
                if sel is not None:
                    keys, parts = keys[sel], [(s, p[sel]) for s, p in parts]
                t0 = time.perf_counter()
                rws = table.rows_for(keys, new=fresh)
                index_s += time.perf_counter() - t0
                if writing is not None:
                    writing.result()
                writing = writer.submit(table.write_blocks, rws, parts)
                done += int(keys.shape[0])
            if writing is not None:
                writing.result()
        if hashers is not None:
            for futs in hashed:
                for fut in futs:
                    fut.result()
            fname = os.path.join(d, "table.json")
            for name, r in readers.items():
                r.finish(sums[f"{name}.npy"], fname)
        return done, index_s
    finally:
        if hashers is not None:
            hashers.close()
        for r in readers.values():
            r.close()


def _read_chunk(
    io: ThreadPoolExecutor, readers: dict[str, _Reader], a: int, b: int
) -> dict[str, Future[np.ndarray]]:
    """Start reading rows ``[a, b)`` of every file, the files at once on ``io``'s threads (the
    disk serves several requests in flight faster than one after another, most of all the
    narrow columns' megabyte reads): ``{name: future of block[b - a, width]}``."""
    return {name: io.submit(r.read, a, b) for name, r in readers.items()}


def bucket_ranges(
    offsets: npt.NDArray[np.int64], buckets: npt.NDArray[np.bool_]
) -> list[tuple[int, int]]:
    """Return the row ranges of the selected buckets (adjacent ones merged)."""
    out: list[tuple[int, int]] = []
    for b in np.flatnonzero(buckets):
        a, e = int(offsets[b]), int(offsets[b + 1])
        if a == e:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], e)
        else:
            out.append((a, e))
    return out


def bucket_filter(
    buckets: npt.NDArray[np.bool_],
) -> Callable[[npt.NDArray[np.int64]], npt.NDArray[np.bool_]]:
    """Return ``keys -> mask`` of the keys whose bucket is selected."""
    return lambda keys: buckets[bucket_of(keys)]
