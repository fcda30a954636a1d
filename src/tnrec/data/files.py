"""Input files: globs, day-partitioned layouts, and the work units a split hands out."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tnrec import _fileio
from tnrec.errors import ArgumentError, DataError

_GLOB_CHARS = set("*?[")


def expand_paths(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Expand files and glob patterns, in order (each pattern's matches sorted).

    Args:
        paths: one path or pattern, or a list of them; local, or URIs of a
            storage backend (``s3://bucket/day/*.parquet``, see
            :mod:`tnrec._fileio.storage`).

    Returns:
        The files; a file matched twice is kept once, at its first place.

    Raises:
        DataError: a pattern matches nothing, a plain path is not a file, or
            the storage cannot be listed (after its retries).
    """
    if isinstance(paths, (str, os.PathLike)):
        items = [os.fspath(paths)]
    else:
        items = [os.fspath(p) for p in paths]
    if not items:
        raise DataError("No input files: `paths` is empty.")
    out: list[str] = []
    for p in items:
        try:
            if _GLOB_CHARS & set(p):
                matches = _fileio.glob(p)
                if not matches:
                    raise DataError(f"No files matched pattern: {p}")
                out.extend(matches)
            elif _fileio.is_file(p):
                out.append(p)
            else:
                raise DataError(f"Input file not found: {p}")
        except OSError as e:
            raise DataError(f"Cannot list input files {p}: {e}") from None
    return list(dict.fromkeys(out))


def list_files(
    data_dir: str | os.PathLike[str],
    days: str | Sequence[str] | None = None,
    pattern: str = "*.parquet",
) -> list[str]:
    """List the files of a day-partitioned layout ``data_dir/<day>/<pattern>``.

    Like TensorNet's ``list_files(datapath, days, match_pattern)``.

    Args:
        data_dir: the root holding one directory per day (e.g. ``2024-05-10``),
            a local path or a URI (``s3://bucket/data``).
        days: one day or several, in the order to read; None: every day
            directory, sorted.
        pattern: glob of the files inside a day directory.

    Returns:
        The files, day by day, each day's files sorted.

    Raises:
        DataError: ``data_dir`` or a day is missing, or a day has no matching file.
    """
    root = os.fspath(data_dir)
    try:
        return _list_days(root, days, pattern)
    except OSError as e:
        raise DataError(f"Cannot list the days of {root}: {e}") from None


def _list_days(root: str, days: str | Sequence[str] | None, pattern: str) -> list[str]:
    if not _fileio.is_dir(root):
        raise DataError(f"Data directory not found: {root}")
    if days is None:
        day_list = [name for name, is_dir in _fileio.list_dir(root) if is_dir]
        if not day_list:
            raise DataError(f"No day directories in {root}")
    else:
        day_list = [days] if isinstance(days, str) else list(days)
    out: list[str] = []
    for day in day_list:
        day_dir = _fileio.join(root, str(day))
        full = _fileio.join(day_dir, pattern)
        if not _fileio.is_dir(day_dir):
            raise DataError(f"Day {day!r} not found: no directory {day_dir} (pattern {full})")
        matches = _fileio.glob(full)
        if not matches:
            raise DataError(f"No files matched pattern: {full}")
        out.extend(matches)
    return out


@dataclass(frozen=True)
class Unit:
    """A piece of input one worker reads: a file, row groups, a byte range or a record stride.

    ``byte_range`` is nominal; the text source moves both ends to line starts,
    so consecutive ranges of one file are disjoint and cover every line.
    ``stride = (part, parts)`` holds the records ``i`` of the file with
    ``i % parts == part`` (TFRecord), its row ``k`` being record ``part + k * parts``.
    """

    file_index: int
    path: str
    row_groups: tuple[int, ...] | None = None  # Parquet: these row groups only
    byte_range: tuple[int, int] | None = None  # text: [lo, hi) of the file
    stride: tuple[int, int] | None = None  # records: (part, parts)

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready description (for fingerprints and messages)."""
        out: dict[str, Any] = {
            "file": self.file_index,
            "row_groups": None if self.row_groups is None else list(self.row_groups),
            "bytes": None if self.byte_range is None else list(self.byte_range),
        }
        if self.stride is not None:
            out["stride"] = list(self.stride)
        return out


def check_split(rank: object, world_size: object) -> tuple[int, int]:
    """Validate ``rank`` and ``world_size``.

    Raises:
        ArgumentError: ``world_size < 1`` or ``rank`` outside ``[0, world_size)``.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)):
        raise ArgumentError(
            f"`world_size` must be an int >= 1. Received: world_size={world_size!r}."
        )
    if world_size < 1:
        raise ArgumentError(
            f"`world_size` must be an int >= 1. Received: world_size={world_size!r}."
        )
    if (
        isinstance(rank, bool)
        or not isinstance(rank, (int, np.integer))
        or not 0 <= rank < world_size
    ):
        raise ArgumentError(
            f"`rank` must be an int in [0, world_size={world_size}). Received: rank={rank!r}."
        )
    return int(rank), int(world_size)


def split_units(
    files: Sequence[str],
    kind: Literal["parquet", "text", "records"],
    rank: int,
    world_size: int,
    *,
    row_group_counts: Sequence[int] | None = None,
    data_bounds: Sequence[tuple[int, int]] | None = None,
) -> list[Unit]:
    """Return the units of worker ``rank`` among ``world_size``.

    With at least as many files as workers, files go round-robin. With fewer,
    Parquet files are cut into row groups, text files into ``world_size``
    byte ranges each and record files (TFRecord) into ``world_size`` record
    strides each, and those pieces go round-robin. Parts are disjoint and
    cover every row; a worker may get nothing.

    Args:
        files: all input files, in order.
        kind: ``"parquet"``, ``"text"`` or ``"records"``.
        rank: this worker.
        world_size: number of workers W.
        row_group_counts: Parquet only (needed when fewer files than workers).
        data_bounds: text only: ``(first data byte, file size)`` per file.

    Returns:
        This worker's units, in file order.
    """
    if len(files) >= world_size:
        return [Unit(i, files[i]) for i in range(rank, len(files), world_size)]
    pieces: list[Unit] = []
    for i, path in enumerate(files):
        if kind == "parquet":
            if row_group_counts is None:
                raise RuntimeError("internal error: row_group_counts missing")
            pieces.extend(Unit(i, path, row_groups=(g,)) for g in range(row_group_counts[i]))
        elif kind == "records":
            pieces.extend(Unit(i, path, stride=(p, world_size)) for p in range(world_size))
        else:
            if data_bounds is None:
                raise RuntimeError("internal error: data_bounds missing")
            lo, hi = data_bounds[i]
            edges = [lo + (hi - lo) * p // world_size for p in range(world_size + 1)]
            pieces.extend(
                Unit(i, path, byte_range=(edges[p], edges[p + 1])) for p in range(world_size)
            )
    return pieces[rank::world_size]
