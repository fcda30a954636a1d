"""The inputs of a run config: each day's (or glob's) files, checked to hold rows, and readers.

``data.train_days`` / ``data.test_days`` name directories under ``data.dir``
(``data.pattern`` in each, by default ``*.parquet``, ``*.csv``, ``*`` or
``*.tfrecord*`` by ``data.format``); ``data.train`` / ``data.test`` are files or globs. Every input
must match files that hold at least one row: :func:`check_inputs` checks them all
before training starts, and each error names the key and the pattern or day.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tnrec import _fileio
from tnrec.cli.config import RunConfig, make_columns
from tnrec.data import Reader, list_files, read_criteo, read_csv, read_parquet, read_tfrecord
from tnrec.data.tfrecord import compression_of, has_records
from tnrec.errors import ArgumentError, ConfigError, DataError

__all__ = ["DEFAULT_PATTERN", "check_inputs", "day_files", "input_files", "make_reader"]

DEFAULT_PATTERN = {
    "parquet": "*.parquet",
    "csv": "*.csv",
    "criteo": "*",
    "tfrecord": "*.tfrecord*",
}


def _expand(patterns: Sequence[str], label: str, error: type[ArgumentError]) -> list[str]:
    files: list[str] = []
    for p in patterns:
        try:
            matches = _fileio.glob(p)
        except OSError as e:
            raise DataError(f'{label}: cannot list "{p}": {e}') from None
        if not matches:
            raise error(f'{label}: pattern "{p}" matches no file.')
        files.extend(matches)
    return files


def _holds_rows(cfg: RunConfig, path: str) -> bool:
    """Whether ``path`` holds a row: Parquet metadata, TFRecord bytes, text past a CSV header."""
    d = cfg.data
    if d.format == "tfrecord":
        return has_records(path, compression_of(path, _compression(cfg)))
    if d.format == "parquet":
        try:
            with pq.ParquetFile(_fileio.input_source(path)) as f:
                return bool(f.metadata.num_rows > 0)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f'file "{path}": cannot be read as Parquet: {e}') from None
    try:
        size = _fileio.size(path)
        if d.format == "csv" and d.header and size:
            with _fileio.open_input(path) as f:
                return size > len(f.readline())
        return size > 0
    except OSError as e:
        raise DataError(f'file "{path}": cannot be read: {e.strerror or e}') from None


def _check_rows(
    cfg: RunConfig, files: Sequence[str], label: str, error: type[ArgumentError]
) -> None:
    if not any(_holds_rows(cfg, f) for f in files):
        shown = ", ".join(files[:3]) + (f", ... ({len(files)} files)" if len(files) > 3 else "")
        raise error(f"{label}: the input holds no rows (files: {shown}).")


def day_files(cfg: RunConfig, which: str, days: Sequence[str]) -> list[str]:
    """Return the files of ``days`` under ``data.dir`` (``data.pattern`` in each day's directory).

    Raises:
        ConfigError: a day matches no file (the error names the key and the day).
    """
    d = cfg.data
    if d.dir is None:
        raise RuntimeError(f"internal error: day_files({which!r}) without data.dir")
    pattern = d.pattern or DEFAULT_PATTERN[d.format]
    try:
        return list_files(d.dir, list(days), pattern)
    except DataError as e:
        raise ConfigError(f'{cfg.source}: "data.{which}_days": {e}') from None


def input_files(
    cfg: RunConfig,
    which: str,
    *,
    paths: Sequence[str] | None = None,
    days: Sequence[str] | None = None,
) -> list[str]:
    """Return the checked files of the ``train`` or ``test`` data (or of ``paths``, or ``days``).

    Args:
        cfg: the run config.
        which: ``"train"`` or ``"test"``.
        paths: files/globs given on the command line (``--data``) instead of the config's.
        days: days under ``data.dir`` instead of the config's.

    Raises:
        ConfigError: no such data in the config, a pattern or day matches no
            file, or the files hold no rows (the error names the key and the
            pattern or day).
        ArgumentError: the same for ``paths`` (named ``--data``).
        DataError: a Parquet file cannot be read (named).
    """
    d = cfg.data
    patterns = d.train if which == "train" else d.test
    config_days = d.train_days if which == "train" else d.test_days
    error: type[ArgumentError] = ConfigError
    if paths:
        label, error = "--data " + " ".join(paths), ArgumentError
        files = _expand(
            [p if _fileio.is_remote(p) else os.path.abspath(p) for p in paths], "--data", error
        )
    elif days or (not patterns and d.dir and config_days):
        days = list(days or config_days or [])
        label = f'{cfg.source}: "data.{which}_days" {", ".join(days)}'
        files = day_files(cfg, which, days)
    elif patterns:
        label = f'{cfg.source}: "data.{which}"'
        files = _expand(patterns, label, error)
    else:
        raise ConfigError(
            f'{cfg.source}: no {which} data: set "data.{which}" or "data.dir" and '
            f'"data.{which}_days" (or pass --data).'
        )
    _check_rows(cfg, files, label, error)
    return files


def check_inputs(cfg: RunConfig) -> None:
    """Check every input of the config now: each training day (or the train globs), the test data.

    Raises:
        ConfigError: as :func:`input_files`.
        DataError: as :func:`input_files`.
    """
    if cfg.data.train:
        input_files(cfg, "train")
    else:
        for dt in cfg.data.train_days or []:
            input_files(cfg, "train", days=[dt])
    if cfg.has_test:
        input_files(cfg, "test")


def make_reader(
    cfg: RunConfig,
    which: str,
    *,
    paths: Sequence[str] | None = None,
    days: Sequence[str] | None = None,
    shuffle: bool = False,
) -> Reader:
    """Return the reader of the ``train`` or ``test`` data (or of ``paths``, or of ``days``).

    The files are checked by :func:`input_files`; the reader takes
    ``data.on_bad_row``.

    Raises:
        ConfigError: as :func:`input_files`.
        ArgumentError: as :func:`input_files`.
        DataError: as :func:`input_files`.
    """
    d = cfg.data
    files = input_files(cfg, which, paths=paths, days=days)
    cols = make_columns(cfg)
    common: dict[str, Any] = dict(
        batch_size=cfg.train.batch_size,
        shuffle=shuffle,
        seed=cfg.seed,
        prefetch=d.prefetch,
        label=d.label,
        on_bad_row=d.on_bad_row,
    )
    if d.format == "parquet":
        return read_parquet(files, cols, **common)
    if d.format == "csv":
        return read_csv(files, cols, delimiter=d.delimiter, header=d.header, **common)
    if d.format == "tfrecord":
        return read_tfrecord(files, cols, compression=_compression(cfg), **common)
    return read_criteo(files, cols, **common)


def _compression(cfg: RunConfig) -> Any:
    """``data.compression`` as :func:`tnrec.data.read_tfrecord` takes it."""
    c = cfg.data.compression.lower()
    return None if c == "none" else c if c == "auto" else c.upper()
