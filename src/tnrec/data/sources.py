"""Raw row sources: read a :class:`Unit` from a given row as Arrow chunks.

Rows of a unit are numbered from 0 (Parquet: rows of its row groups in order;
text: physical lines of its byte range, bad and blank lines included), so
``(unit, row)`` is a resumable coordinate and ``file_index << 40 | row in file``
a global row id.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from tnrec.data.files import Unit
from tnrec.errors import DataError

ROW_BITS = 40  # row ids: file_index << ROW_BITS | row in file


@dataclass
class Chunk:
    """Raw rows read from one unit."""

    table: pa.RecordBatch
    rows: npt.NDArray[np.int64]  # [B] row index in the unit
    file_rows: npt.NDArray[np.int64]  # [B] row index in the file
    end_row: int  # the unit row after this chunk's last row
    dropped: list[tuple[int, str]] = field(default_factory=list)  # (file row, why) parser dropped


class Source(Protocol):
    """A file format: what a split needs, and how to read a unit."""

    kind: str

    def split_info(self, files: Sequence[str]) -> dict[str, object]:
        """Per-file facts ``split_units`` needs (row-group counts or data bounds)."""
        ...

    def read(self, unit: Unit, start_row: int, fields: Sequence[str]) -> Iterator[Chunk]:
        """Yield the unit's rows from ``start_row`` on."""
        ...

    def locate(self, unit: Unit, file_row: int) -> str:
        """Name a row for an error message: ``file "x", line 12``."""
        ...


class ParquetSource:
    """Parquet files (pyarrow); list columns hold multi-valued features."""

    kind = "parquet"

    def __init__(self, chunk_rows: int = 16384) -> None:
        self.chunk_rows = chunk_rows

    def split_info(self, files: Sequence[str]) -> dict[str, object]:
        """Return ``{"row_group_counts": [...]}``."""
        return {"row_group_counts": [_parquet(p).metadata.num_row_groups for p in files]}

    def read(self, unit: Unit, start_row: int, fields: Sequence[str]) -> Iterator[Chunk]:
        """Yield the unit's rows from ``start_row`` on, row group by row group."""
        pf = _parquet(unit.path)
        md = pf.metadata
        have = set(pf.schema_arrow.names)
        absent = [f for f in fields if f not in have]
        if absent:
            raise DataError(
                f'file "{unit.path}": has no field "{absent[0]}" (it has {sorted(have)}).'
            )
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        group_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        groups = unit.row_groups if unit.row_groups is not None else range(md.num_row_groups)
        unit_row = 0  # unit row of the next row read
        for g in groups:
            if start_row >= unit_row + sizes[g]:
                unit_row += sizes[g]
                continue
            skip = start_row - unit_row if start_row > unit_row else 0
            in_group = 0
            for rb in pf.iter_batches(
                batch_size=self.chunk_rows, row_groups=[g], columns=list(fields), use_threads=False
            ):
                n = rb.num_rows
                if skip >= n:
                    skip -= n
                    in_group += n
                    continue
                if skip:
                    rb = rb.slice(skip)
                    in_group += skip
                    skip = 0
                local = in_group + np.arange(rb.num_rows, dtype=np.int64)  # [B] row in group
                in_group += rb.num_rows
                yield Chunk(rb, unit_row + local, group_start[g] + local, unit_row + in_group)
            unit_row += sizes[g]

    def locate(self, unit: Unit, file_row: int) -> str:
        """Name a row: ``file "x.parquet", row 12`` (0-based row of the file)."""
        return f'file "{unit.path}", row {file_row}'


def _parquet(path: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise DataError(f'file "{path}": cannot be read as Parquet: {e}') from e


class _RangeFile(io.RawIOBase):
    """Bytes ``[lo, hi)`` of a file as a readable stream."""

    def __init__(self, path: str, lo: int, hi: int) -> None:
        super().__init__()
        self._f = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._f.seek(lo)
        self._left = hi - lo

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self._left)
        if n <= 0:
            return 0
        got = self._f.readinto(memoryview(b)[:n])
        self._left -= got
        return got

    def close(self) -> None:
        self._f.close()
        super().close()


def _line_start(f: io.BufferedReader, pos: int, lo: int, size: int) -> int:
    """Return the first line start at or after ``pos`` (``lo`` is a line start)."""
    if pos <= lo:
        return lo
    f.seek(pos - 1)
    at = pos - 1
    while at < size:
        block = f.read(1 << 16)
        i = block.find(b"\n")
        if i >= 0:
            return at + i + 1
        at += len(block)
        if not block:
            break
    return size


def _count_lines(f: io.BufferedReader, lo: int, hi: int) -> int:
    """Count ``\\n`` in bytes ``[lo, hi)``."""
    f.seek(lo)
    left = hi - lo
    total = 0
    while left > 0:
        block = f.read(min(left, 1 << 24))
        if not block:
            break
        total += int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8) == 10))
        left -= len(block)
    return total


class TextSource:
    """Delimited text (CSV, TSV, raw Criteo) read by pyarrow's CSV parser.

    Every field is read as text and converted by the feature columns, so a
    value parses the same as in every other format. Lines are rows (no quoted
    newlines); blank lines are rows whose fields are all missing.
    """

    kind = "text"

    def __init__(
        self,
        *,
        delimiter: str,
        header: bool,
        field_names: Sequence[str] | None,
        quoting: bool,
        chunk_bytes: int = 4 << 20,
    ) -> None:
        self.delimiter = delimiter
        self.header = header
        self.field_names = None if field_names is None else tuple(field_names)
        self.quoting = quoting
        self.chunk_bytes = chunk_bytes
        self._info: dict[str, tuple[tuple[str, ...], int, int]] = {}

    def _file_info(self, path: str) -> tuple[tuple[str, ...], int, int]:
        """Return (field names, first data byte, size) of a file (cached)."""
        if path in self._info:
            return self._info[path]
        size = os.path.getsize(path)
        names = self.field_names
        start = 0
        if self.header and size > 0:
            with open(path, "rb") as f:
                line = f.readline()
            start = len(line)
            if names is None:
                text = line.decode("utf-8", errors="replace").rstrip("\r\n")
                names = tuple(s.strip().strip('"') for s in text.split(self.delimiter))
        if names is None:
            raise RuntimeError("internal error: field names unknown")
        self._info[path] = (names, start, size)
        return self._info[path]

    def split_info(self, files: Sequence[str]) -> dict[str, object]:
        """Return ``{"data_bounds": [(first data byte, size), ...]}``."""
        return {"data_bounds": [self._file_info(p)[1:] for p in files]}

    def _bounds(self, unit: Unit) -> tuple[int, int, int]:
        """Return (lo, hi, lines before lo) of the unit, aligned to line starts."""
        _, start, size = self._file_info(unit.path)
        if unit.byte_range is None:
            return start, size, 0
        with open(unit.path, "rb") as f:
            lo = _line_start(f, unit.byte_range[0], start, size)
            hi = _line_start(f, unit.byte_range[1], start, size)
            base = _count_lines(f, start, lo) if lo > start else 0
        return lo, max(lo, hi), base

    def read(self, unit: Unit, start_row: int, fields: Sequence[str]) -> Iterator[Chunk]:
        """Yield the unit's lines from ``start_row`` on."""
        names, _, _ = self._file_info(unit.path)
        absent = [f for f in fields if f not in names]
        if absent:
            raise DataError(
                f'file "{unit.path}": has no field "{absent[0]}" (it has {list(names)}).'
            )
        lo, hi, base = self._bounds(unit)
        if lo >= hi:
            return
        dropped: list[tuple[int, str]] = []

        def on_invalid(row: pcsv.InvalidRow) -> str:
            # row.number is the 1-based line of the stream, counting skipped lines.
            what = f"expected {row.expected_columns} fields, got {row.actual_columns}: {row.text!r}"
            dropped.append((int(row.number) - 1, what))
            return "skip"

        stream = _RangeFile(unit.path, lo, hi)
        try:
            reader = pcsv.open_csv(
                stream,
                read_options=pcsv.ReadOptions(
                    column_names=list(names),
                    skip_rows=start_row,
                    use_threads=False,
                    block_size=self.chunk_bytes,
                ),
                parse_options=pcsv.ParseOptions(
                    delimiter=self.delimiter,
                    quote_char='"' if self.quoting else False,
                    invalid_row_handler=on_invalid,
                    ignore_empty_lines=False,
                ),
                convert_options=pcsv.ConvertOptions(
                    column_types={f: pa.string() for f in fields},
                    include_columns=list(fields),
                    strings_can_be_null=False,
                    quoted_strings_can_be_null=False,
                ),
            )
        except pa.ArrowInvalid as e:
            stream.close()
            raise DataError(f'file "{unit.path}": cannot be read as delimited text: {e}') from e
        emitted = 0
        seen_dropped = 0
        end = start_row  # unit row after the last good row yielded
        try:
            while True:
                try:
                    rb = reader.read_next_batch()
                except StopIteration:
                    break
                except pa.ArrowInvalid as e:
                    raise DataError(f'file "{unit.path}": cannot be parsed: {e}') from e
                # Line of the j-th good line: start_row + j + (dropped lines before it).
                bad = np.array(sorted(d[0] for d in dropped), dtype=np.int64)
                adjusted = bad - np.arange(len(bad)) - start_row  # good lines before each
                j = emitted + np.arange(rb.num_rows, dtype=np.int64)
                rows = start_row + j + np.searchsorted(adjusted, j, side="right")  # [B]
                emitted += rb.num_rows
                new = dropped[seen_dropped:]
                seen_dropped = len(dropped)
                if rb.num_rows:
                    end = int(rows[-1]) + 1
                yield Chunk(rb, rows, base + rows, end, [(base + r, w) for r, w in new])
            if len(dropped) > seen_dropped:  # bad lines after the last good one
                schema = pa.schema([(f, pa.string()) for f in fields])
                none = np.zeros(0, np.int64)
                empty = pa.RecordBatch.from_pylist([], schema=schema)
                yield Chunk(
                    empty, none, none, end, [(base + r, w) for r, w in dropped[seen_dropped:]]
                )
        finally:
            stream.close()

    def locate(self, unit: Unit, file_row: int) -> str:
        """Name a row: ``file "x.csv", line 12`` (1-based, header counted)."""
        _, start, _ = self._file_info(unit.path)
        return f'file "{unit.path}", line {file_row + (1 if start else 0) + 1}'
