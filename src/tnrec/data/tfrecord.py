"""TFRecord files of ``tf.train.Example`` records, read without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little-endian) | uint32 masked CRC32C of the length bytes
    | data (length bytes)          | uint32 masked CRC32C of the data

optionally compressed as a whole (``compression="GZIP"`` or ``"ZLIB"``, as
TensorFlow's ``TFRecordOptions`` write it). Rows are records: a row's number
is the record's index in its file, bad records included, so ``(unit, row)``
is a resumable coordinate as for the other formats. The data is a
``tf.train.Example`` decoded by the numba kernels of
:mod:`tnrec.data._tfexample` (why not ``protobuf``: see there).

**Features to columns.** The feature named like a column's key feeds it:

* a numeric or bucketized column, a label or a weight takes one value from a
  ``float_list`` or an ``int64_list`` (an int becomes the nearest float64, as
  from Parquet);
* a ``dtype="str"`` column takes a ``bytes_list`` (the bytes hash as they are)
  or an ``int64_list`` (hashed as decimal text, like a Parquet int column);
* every other categorical column takes an ``int64_list``; for
  ``dtype="sign"`` its 64 bits are the key, so a uint64 sign that
  TensorFlow stored as a negative int64 is the same key as from Parquet.

Each value of a list is one key, so a list serves multi-hot and sequence
columns. A feature absent from a record, a ``Feature`` with no list, or an
empty list is missing, as a Parquet null is: no key, the numeric default, or
a bad row for a label or weight.

**Bad rows** (raised as :class:`DataError` naming file, record and feature,
or skipped and counted with ``on_bad_row="skip"``):

* the data's CRC32C does not match;
* the data is not a well-formed ``Example`` (a varint or a length runs past
  its message, an unknown wire type);
* a feature's list is of a kind its column does not take (a ``float_list``
  for a ``dtype="int"`` column), or a numeric field holds several values.

**Files** (raise in both modes, naming the file and the byte offset): a
length whose CRC32C does not match (the framing is lost, so no later record
can be found), a file that ends inside a record, and damaged compressed
data. A 0-byte file holds no records.

**Splits.** With at least as many files as workers, files go round-robin.
With fewer, the records of each file are dealt round-robin (record ``i`` to
part ``i % W``): every part reads the whole file's framing, but checks the
CRC of and decodes only its own records.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import IO, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tnrec import _fileio
from tnrec.data import _tfexample as tfx
from tnrec.data import _tfframe as tff
from tnrec.data.files import Unit
from tnrec.data.sources import Chunk
from tnrec.errors import ArgumentError, DataError

Compression = Literal["GZIP", "ZLIB"] | None
COMPRESSIONS = (None, "GZIP", "ZLIB", "auto")
Want = Literal["number", "int", "text"]
_WANT = {"number": tfx.WANT_NUMBER, "int": tfx.WANT_INT, "text": tfx.WANT_TEXT}
_KIND_NAME = {tfx.BYTES: "bytes_list", tfx.FLOAT: "float_list", tfx.INT64: "int64_list"}
_TAKES = {
    tfx.WANT_NUMBER: "one value of a float_list or an int64_list (a numeric column)",
    tfx.WANT_INT: "an int64_list (an int column)",
    tfx.WANT_TEXT: 'a bytes_list or an int64_list (a dtype="str" column)',
}


def check_compression(compression: object, where: str) -> str | None:
    """Validate ``compression``; return it (``""`` and ``"none"`` read as None).

    Raises:
        ArgumentError: it is not None, ``"GZIP"``, ``"ZLIB"`` or ``"auto"``.
    """
    if compression in ("", "none", "NONE"):
        return None
    if isinstance(compression, str) and compression.upper() in ("GZIP", "ZLIB"):
        return compression.upper()
    if compression is None or compression == "auto":
        return compression  # type: ignore[return-value]
    raise ArgumentError(
        f'{where}: `compression` must be None, "GZIP", "ZLIB" or "auto". '
        f"Received: compression={compression!r}."
    )


def compression_of(path: str, compression: str | None) -> str | None:
    """Return the compression of ``path``: ``"auto"`` is GZIP for ``*.gz``, ZLIB for ``*.zlib``."""
    if compression != "auto":
        return compression
    name = path.lower()
    if name.endswith(".gz"):
        return "GZIP"
    if name.endswith(".zlib"):
        return "ZLIB"
    return None


def _zlib_blocks(f: IO[bytes], path: str, block_bytes: int) -> Iterator[bytes]:
    d = zlib.decompressobj()
    while not d.eof:
        raw = f.read(block_bytes)
        if not raw:
            raise DataError(f'file "{path}": the ZLIB stream ends early (truncated file).')
        out = d.decompress(raw)
        if out:
            yield out


def _gzip_blocks(f: IO[bytes], block_bytes: int) -> Iterator[bytes]:
    with gzip.GzipFile(fileobj=f, mode="rb") as g:
        while True:
            out = g.read(block_bytes)
            if not out:
                return
            yield out


def _plain_blocks(f: IO[bytes], block_bytes: int) -> Iterator[bytes]:
    while True:
        out = f.read(block_bytes)
        if not out:
            return
        yield out


def byte_blocks(
    path: str, compression: str | None, block_bytes: int
) -> Generator[bytes, None, None]:
    """Yield the (decompressed) bytes of a file in blocks.

    Raises:
        DataError: the file cannot be read, or its compressed data is damaged
            or truncated (naming the file).
    """
    try:
        f = _fileio.open_input(path)
    except OSError as e:
        raise DataError(f'file "{path}": cannot be read: {e}') from e
    with f:
        if _fileio.size(path) == 0:
            return
        try:
            if compression == "GZIP":
                yield from _gzip_blocks(f, block_bytes)
            elif compression == "ZLIB":
                yield from _zlib_blocks(f, path, block_bytes)
            else:
                yield from _plain_blocks(f, block_bytes)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise DataError(
                f'file "{path}": its {compression} data is damaged or truncated: {e}'
            ) from e
        except OSError as e:
            raise DataError(f'file "{path}": cannot be read: {e}') from e


def has_records(path: str, compression: str | None) -> bool:
    """Whether the file holds any (decompressed) bytes, i.e. the start of a record.

    Raises:
        DataError: as :func:`byte_blocks`.
    """
    blocks = byte_blocks(path, compression, 16)
    try:
        return bool(next(blocks, b""))
    finally:
        blocks.close()


class _Framed:
    """Records found in a block: their data offsets in ``buf``, lengths and file indices."""

    def __init__(
        self,
        buf: npt.NDArray[np.uint8],
        starts: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        first: int,
        offset: int,
    ) -> None:
        self.buf = buf
        self.starts = starts  # [R] data offset in buf
        self.lengths = lengths  # [R]
        self.first = first  # file index of the first record
        self.offset = offset  # stream offset of buf[0]


def frame_records(path: str, compression: str | None, block_bytes: int) -> Iterator[_Framed]:
    """Yield the records of a file, block by block, their framing checked.

    Raises:
        DataError: a length's CRC does not match, or the file ends inside a
            record (naming the file and the byte offset).
    """
    where = "uncompressed byte" if compression else "byte"
    pending: list[npt.NDArray[np.uint8]] = []  # bytes not yet framed, from stream `offset`
    have, need = 0, 0  # their size; the size the next record needs
    offset, index = 0, 0  # stream offset of pending's first byte, file index of its record
    for raw in byte_blocks(path, compression, max(block_bytes, 1)):
        pending.append(np.frombuffer(raw, dtype=np.uint8))
        have += len(raw)
        if have < need:  # a long record: gather its blocks, join them once
            continue
        buf = np.concatenate(pending)  # writable: one compiled kernel for all
        cap = buf.size // 16 + 1
        starts = np.empty(cap, dtype=np.int64)
        lengths = np.empty(cap, dtype=np.int64)
        count, used, status, need = tff.frame(buf, starts, lengths, tff.CRC_TABLES)
        if status == tff.BAD_LENGTH_CRC:
            raise DataError(_bad_length(path, buf, used, offset + used, index + count, where))
        if count:
            yield _Framed(buf, starts[:count], lengths[:count], index, offset)
        pending, have = ([buf[used:]], buf.size - used) if used < buf.size else ([], 0)
        offset += used
        index += count
    carry = np.concatenate(pending) if pending else np.zeros(0, dtype=np.uint8)
    if carry.size:
        if carry.size >= 12:  # the length is readable
            count, used, status, need = tff.frame(
                carry, np.empty(1, np.int64), np.empty(1, np.int64), tff.CRC_TABLES
            )
            if status == tff.BAD_LENGTH_CRC:
                raise DataError(_bad_length(path, carry, 0, offset, index, where))
            expect = f"{need} bytes" if need < tff.HUGE else "more bytes than any file holds"
        else:
            expect = "a 12-byte header"
        raise DataError(
            f'file "{path}": truncated at {where} {offset + carry.size}: record {index} '
            f"starts at {where} {offset} and needs {expect}, but only {carry.size} remain."
        )


def _bad_length(
    path: str, buf: npt.NDArray[np.uint8], at: int, offset: int, index: int, where: str
) -> str:
    hint = ""
    if offset == 0 and bytes(buf[:2]) == b"\x1f\x8b":
        hint = ' It starts like gzip data: pass compression="GZIP".'
    elif offset == 0 and buf[0] == 0x78:
        hint = ' It may be ZLIB data: pass compression="ZLIB".'
    return (
        f'file "{path}": record {index} at {where} {offset}: the CRC32C of its length does '
        "not match; the file is damaged there (no later record can be found) or is not a "
        f"TFRecord file.{hint}"
    )


def _select(unit: Unit, framed: _Framed, start_row: int) -> tuple[npt.NDArray[np.int64], int]:
    """Return the framed records of the unit from ``start_row`` on, and the unit rows framed."""
    index = framed.first + np.arange(framed.starts.size, dtype=np.int64)  # [R] file index
    end = framed.first + framed.starts.size
    if unit.stride is None:
        return np.flatnonzero(index >= start_row), end
    part, parts = unit.stride
    mine = (index % parts == part) & (index // parts >= start_row)
    return np.flatnonzero(mine), max(0, (end - part + parts - 1) // parts)


class TFRecordSource:
    """TFRecord files of ``tf.train.Example`` records (see the module doc).

    Args:
        wants: per field, what its column reads: ``"number"``, ``"int"`` or ``"text"``.
        compression: None, ``"GZIP"``, ``"ZLIB"``, or ``"auto"`` (by file name).
        block_bytes: bytes read (and decompressed) at a time.
    """

    kind = "tfrecord"

    def __init__(
        self, wants: Mapping[str, Want], compression: str | None, block_bytes: int = 4 << 20
    ) -> None:
        self.wants = dict(wants)
        self.compression = compression
        self.block_bytes = block_bytes

    def split_info(self, files: Sequence[str]) -> dict[str, object]:
        """Return ``{}``: records are dealt round-robin without reading the files first."""
        return {}

    def read(self, unit: Unit, start_row: int, fields: Sequence[str]) -> Iterator[Chunk]:
        """Yield the unit's records from ``start_row`` on, one chunk per block read.

        Raises:
            DataError: the framing is damaged or truncated, or the file cannot
                be read (naming file and byte offset).
        """
        decoder = _Decoder(fields, [self.wants[f] for f in fields])
        compression = compression_of(unit.path, self.compression)
        for framed in frame_records(unit.path, compression, self.block_bytes):
            picked, end_row = _select(unit, framed, start_row)
            if not picked.size:
                continue
            table, good, dropped = decoder.decode(framed, picked, compression is not None)
            file_rows = framed.first + good  # [B]
            rows = file_rows if unit.stride is None else file_rows // unit.stride[1]
            yield Chunk(table, rows, file_rows, end_row, dropped)

    def locate(self, unit: Unit, file_row: int) -> str:
        """Name a row: ``file "x.tfrecord", record 12`` (0-based record of the file)."""
        return f'file "{unit.path}", record {file_row}'


class _Decoder:
    """Decode selected records of a block into Arrow columns of the wanted fields."""

    def __init__(self, fields: Sequence[str], wants: Sequence[Want]) -> None:
        self.fields = tuple(fields)
        encoded = [f.encode("utf-8") for f in fields]
        self.names = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
        self.name_offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self.name_offsets[1:])
        self.slots = tfx.name_slots(encoded)
        self.want = np.array([_WANT[w] for w in wants], dtype=np.int8)

    def decode(
        self, framed: _Framed, picked: npt.NDArray[np.int64], compressed: bool
    ) -> tuple[pa.Table, npt.NDArray[np.int64], list[tuple[int, str]]]:
        """Decode records ``picked`` of ``framed``.

        Returns:
            ``(table, good, dropped)``: the good records' fields, their indices
            in the block, and ``(file row, what is wrong)`` for the bad ones.
        """
        starts, lengths = framed.starts[picked], framed.lengths[picked]
        status, bad_field, detail, kind, spans, counts, sizes = tfx.index_records(
            framed.buf,
            starts,
            lengths,
            self.names,
            self.name_offsets,
            self.slots,
            self.want,
            tff.CRC_TABLES,
        )
        ok = status == tfx.OK
        rows = np.flatnonzero(ok).astype(np.int64)  # [G] into picked
        dropped = []
        where = "uncompressed byte" if compressed else "byte"
        for r in np.flatnonzero(~ok).tolist():
            at = framed.offset + int(starts[r]) - 12
            what = self._problem(int(status[r]), int(bad_field[r]), int(detail[r]))
            dropped.append((framed.first + int(picked[r]), f"{what} (record at {where} {at})"))
        columns = {}
        for f, name in enumerate(self.fields):
            columns[name] = self._column(framed.buf, f, kind, spans, counts, sizes, rows)
        table = pa.table(columns) if columns else pa.table({"_": pa.nulls(rows.size)})
        return table, picked[rows], dropped

    def _problem(self, status: int, field: int, detail: int) -> str:
        name = f'feature "{self.fields[field]}"' if field >= 0 else ""
        if status == tfx.BAD_CRC:
            return "the CRC32C of its data does not match (a damaged record)"
        if status == tfx.MALFORMED:
            inside = f"{name}: " if name else ""
            return f"{inside}not a well-formed tf.train.Example (at data byte {detail})"
        if status == tfx.WRONG_KIND:
            return (
                f"{name}: holds a {_KIND_NAME[detail]}; its column takes "
                f"{_TAKES[int(self.want[field])]}"
            )
        return f"{name}: holds {detail} values; a numeric column, label or weight takes one"

    def _column(
        self,
        buf: npt.NDArray[np.uint8],
        f: int,
        kind: npt.NDArray[np.int8],
        spans: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        sizes: npt.NDArray[np.int64],
        rows: npt.NDArray[np.int64],
    ) -> pa.Array:
        """Build field ``f`` of records ``rows`` as an Arrow array (arrays field-major)."""
        k, sp, c = kind[f], spans[f], counts[f]  # [R], [R, 2], [R]: contiguous rows
        n = c[rows]  # [G]
        offsets = np.zeros(rows.size + 1, dtype=np.int64)  # [G+1]
        np.cumsum(n, out=offsets[1:])
        want = int(self.want[f])
        if want == tfx.WANT_NUMBER:
            ints = np.zeros(rows.size, dtype=np.int64)
            bits = np.zeros(rows.size, dtype=np.uint32)
            tfx.fill_numbers(buf, k, sp, c, rows, ints, bits)
            is_float = k[rows] == tfx.FLOAT
            x = np.where(
                is_float, bits.view(np.float32).astype(np.float64), ints.astype(np.float64)
            )
            return pa.array(x, pa.float64(), mask=n != 1)
        if want == tfx.WANT_INT:
            values = np.zeros(int(offsets[-1]), dtype=np.int64)  # [N]
            tfx.fill_ints(buf, k, sp, rows, offsets, values)
            return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
        data = np.zeros(int(sizes[f][rows].sum()), dtype=np.uint8)
        ends = np.zeros(int(offsets[-1]) + 1, dtype=np.int64)  # [N+1]
        tfx.fill_text(buf, k, sp, rows, ends, data, tfx.INT64_MIN_TEXT)
        text = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), ends.size - 1, [None, pa.py_buffer(ends), pa.py_buffer(data)]
        )
        return pa.LargeListArray.from_arrays(pa.array(offsets), text)
