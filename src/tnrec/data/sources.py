"""Raw row sources: read a :class:`Unit` from a given row as Arrow chunks.

Rows of a unit are numbered from 0 (Parquet: rows of its row groups in order;
text: physical lines of its byte range, bad and blank lines included), so
``(unit, row)`` is a resumable coordinate and ``file_index << 40 | row in file``
a global row id. The text source lives in :mod:`tnrec.data.text`.

Parquet files that pyarrow cannot read (a damaged footer, page or column
chunk) raise :class:`DataError` naming the file, and the row group for damage
found while reading, in both ``on_bad_row`` modes: a damaged file is not a bad
row, and a daily pipeline would rather be told than train on part of a day.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from tnrec import _fileio
from tnrec.data.files import Unit
from tnrec.errors import DataError

ROW_BITS = 40  # row ids: file_index << ROW_BITS | row in file


@dataclass
class Chunk:
    """Raw rows read from one unit."""

    table: pa.RecordBatch | pa.Table  # string columns for text, as stored for Parquet
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

    def row_group_rows(self, files: Sequence[str]) -> list[list[int]]:
        """Return the rows of every row group of every file (from the footers)."""
        out = []
        for p in files:
            md = _parquet(p).metadata
            out.append([md.row_group(g).num_rows for g in range(md.num_row_groups)])
        return out

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
            for rb in _batches(pf, unit.path, g, self.chunk_rows, fields):
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
        return pq.ParquetFile(_fileio.input_source(path))
    except (OSError, pa.ArrowException) as e:
        raise DataError(f'file "{path}": cannot be read as Parquet: {_one_line(e)}') from e


def _batches(
    pf: pq.ParquetFile, path: str, group: int, rows: int, fields: Sequence[str]
) -> Iterator[pa.RecordBatch]:
    """Yield the record batches of one row group, naming file and row group on damage."""
    it = pf.iter_batches(
        batch_size=rows, row_groups=[group], columns=list(fields), use_threads=False
    )
    while True:
        try:
            rb = next(it)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as e:
            raise DataError(
                f'file "{path}", row group {group}: cannot be read as Parquet '
                f"(damaged page or column chunk?): {_one_line(e)}"
            ) from e
        yield rb


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
