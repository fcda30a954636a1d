"""Reader constructors: Parquet, CSV/TSV with a schema, raw Criteo TSV, TFRecord."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

from tnrec.data.decode import Schema, make_schema
from tnrec.data.files import expand_paths
from tnrec.data.reader import Reader
from tnrec.data.sources import ParquetSource
from tnrec.data.text import TextSource
from tnrec.data.tfrecord import TFRecordSource, Want, check_compression
from tnrec.errors import ArgumentError
from tnrec.feature_column import (
    BucketizedColumn,
    Column,
    EmbeddingColumn,
    SequenceCategoryColumn,
    Transform,
    category_column,
    log1p,
    numeric_column,
)

Paths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

CRITEO_LABEL = "label"
CRITEO_NUMERIC = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CATEGORICAL = tuple(f"C{i}" for i in range(1, 27))
CRITEO_FIELDS = (CRITEO_LABEL, *CRITEO_NUMERIC, *CRITEO_CATEGORICAL)


def criteo_columns(
    numeric_transform: Transform | Sequence[Transform] | None = log1p(),  # noqa: B008 - frozen
) -> list[Column]:
    """Return the Criteo feature columns: ``I1..I13`` numeric, then ``C1..C26``.

    The categorical fields are 8-hex-character hashes, declared ``dtype="str"``;
    the label field is ``label`` (:data:`CRITEO_LABEL`).

    Args:
        numeric_transform: applied to every ``I*`` column (default: signed
            ``log1p``; None for raw counts). Missing counts default to 0.

    Returns:
        13 numeric and 26 category columns, in field order.
    """
    cols: list[Column] = [numeric_column(k, 0.0, numeric_transform) for k in CRITEO_NUMERIC]
    cols.extend(category_column(k, dtype="str") for k in CRITEO_CATEGORICAL)
    return cols


def read_parquet(
    paths: Paths,
    columns: Sequence[Column],
    *,
    label: str | Sequence[str] | None = "label",
    weight: str | None = None,
    batch_size: int = 1024,
    shuffle: bool = False,
    seed: int = 0,
    shuffle_buffer_rows: int = 65536,
    prefetch: int | None = None,
    on_bad_row: Literal["raise", "skip"] = "raise",
    drop_last: bool = False,
) -> Reader:
    """Read Parquet files; list columns hold multi-valued and sequence features.

    Args:
        paths: files and glob patterns (see :func:`list_files` for day layouts).
        columns: feature columns (embedding columns are unwrapped).
        label: label field(s) (``Batch.labels`` columns, in order); None for none.
        weight: sample-weight field, or None.
        batch_size: rows per batch (the last batch of an epoch may be shorter).
        shuffle: shuffle the order of files (units) and, within windows of
            ``shuffle_buffer_rows`` rows, the rows; deterministic given ``seed``.
        seed: shuffle seed.
        shuffle_buffer_rows: the shuffle window (bounds memory).
        prefetch: batches read ahead by a background thread (0: read inline);
            None: 2 when a core is free for the thread (torch's threads leave
            one of this worker's CPUs), else inline (:func:`tnrec.data.prefetch_depth`).
        on_bad_row: ``"raise"`` a :class:`DataError` naming file, row and
            column, or ``"skip"`` the row and count it in
            ``reader.stats.bad_rows``. A file pyarrow cannot read (damaged
            footer, page or column chunk) raises, naming it, in both modes.
        drop_last: drop the last, shorter batch of an epoch.

    Returns:
        The reader.

    Raises:
        DataError: a pattern matches no file or a file is missing.
        ArgumentError, SpecError: an argument or column is invalid.
    """
    schema = make_schema(columns, label, weight)
    return Reader(
        expand_paths(paths),
        ParquetSource(),
        schema,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer_rows=shuffle_buffer_rows,
        prefetch=prefetch,
        on_bad_row=on_bad_row,
        drop_last=drop_last,
    )


def read_csv(
    paths: Paths,
    columns: Sequence[Column],
    *,
    delimiter: str = ",",
    header: bool = True,
    field_names: Sequence[str] | None = None,
    value_sep: str | None = None,
    label: str | Sequence[str] | None = "label",
    weight: str | None = None,
    batch_size: int = 1024,
    shuffle: bool = False,
    seed: int = 0,
    shuffle_buffer_rows: int = 65536,
    prefetch: int | None = None,
    on_bad_row: Literal["raise", "skip"] = "raise",
    drop_last: bool = False,
) -> Reader:
    """Read delimited text (CSV, or TSV with ``delimiter="\\t"``) with a schema.

    Every field is read as text and converted to its column's declared form
    (``"123"`` and ``"123.0"`` are the int 123). An empty field is missing.
    Each line is one row; a line with the wrong number of fields, an unclosed
    quote, a lone ``\\r``, or invalid UTF-8 or NUL in a field read is a bad row
    that costs only itself (see :mod:`tnrec.data.text`). A UTF-8 BOM is
    skipped. With ``header=True`` a 0-byte file is a :class:`DataError`.

    Args:
        paths: files and glob patterns.
        columns: feature columns.
        delimiter: field separator (one character).
        header: the first line of each file names the fields.
        field_names: the field names; required when ``header=False``, and
            replaces the header's names when given with ``header=True``.
        value_sep: separator of several values in one categorical field (e.g.
            ``"|"``); required when a column is a sequence column.
        label, weight, batch_size, shuffle, seed, shuffle_buffer_rows, prefetch,
        on_bad_row, drop_last: as in :func:`read_parquet`.

    Returns:
        The reader.

    Raises:
        DataError: a pattern matches no file or a file is missing (here); while
            reading, a bad row (unless skipped), or a file that is empty with
            ``header=True``, compressed, UTF-16 or has a header that is not UTF-8.
        ArgumentError, SpecError: an argument or column is invalid.
    """
    if not isinstance(delimiter, str) or len(delimiter) != 1:
        raise ArgumentError(
            f"read_csv: `delimiter` must be one character. Received: delimiter={delimiter!r}."
        )
    if not header and field_names is None:
        raise ArgumentError("read_csv: `field_names` is required when header=False.")
    if value_sep is not None and (not isinstance(value_sep, str) or not value_sep):
        raise ArgumentError(
            "read_csv: `value_sep` must be a non-empty str or None. "
            f"Received: value_sep={value_sep!r}."
        )
    if value_sep is None:
        for col in columns:
            base = col.categorical if isinstance(col, EmbeddingColumn) else col
            if isinstance(base, SequenceCategoryColumn):
                raise ArgumentError(
                    f'read_csv: column "{base.key}" is a sequence column; pass `value_sep` '
                    "(the separator of its values in a field)."
                )
    schema = make_schema(columns, label, weight)
    source = TextSource(delimiter=delimiter, header=header, field_names=field_names, quoting=True)
    return Reader(
        expand_paths(paths),
        source,
        schema,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer_rows=shuffle_buffer_rows,
        prefetch=prefetch,
        on_bad_row=on_bad_row,
        drop_last=drop_last,
        value_sep=value_sep,
    )


def read_criteo(
    paths: Paths,
    columns: Sequence[Column] | None = None,
    *,
    label: str | None = CRITEO_LABEL,
    batch_size: int = 1024,
    shuffle: bool = False,
    seed: int = 0,
    shuffle_buffer_rows: int = 65536,
    prefetch: int | None = None,
    on_bad_row: Literal["raise", "skip"] = "raise",
    drop_last: bool = False,
) -> Reader:
    """Read the raw Criteo format: no header, 40 tab-separated fields, empty = missing.

    Fields are ``label, I1..I13, C1..C26`` (:data:`CRITEO_FIELDS`); lines are
    not quoted (a ``"`` is a plain character) and an empty file has no rows.
    The Criteo test set has no label field; read it with
    ``read_csv(p, cols, delimiter="\\t", header=False, field_names=CRITEO_FIELDS[1:], label=None)``.

    Args:
        paths: files and glob patterns (e.g. ``"day_*"``).
        columns: feature columns over the Criteo fields (default:
            :func:`criteo_columns`).
        label, batch_size, shuffle, seed, shuffle_buffer_rows, prefetch,
        on_bad_row, drop_last: as in :func:`read_parquet`.

    Returns:
        The reader.
    """
    cols = criteo_columns() if columns is None else columns
    schema = make_schema(cols, label, None)
    source = TextSource(delimiter="\t", header=False, field_names=CRITEO_FIELDS, quoting=False)
    return Reader(
        expand_paths(paths),
        source,
        schema,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer_rows=shuffle_buffer_rows,
        prefetch=prefetch,
        on_bad_row=on_bad_row,
        drop_last=drop_last,
    )


def read_tfrecord(
    paths: Paths,
    columns: Sequence[Column],
    *,
    compression: Literal["GZIP", "ZLIB", "auto"] | None = None,
    label: str | Sequence[str] | None = "label",
    weight: str | None = None,
    batch_size: int = 1024,
    shuffle: bool = False,
    seed: int = 0,
    shuffle_buffer_rows: int = 65536,
    prefetch: int | None = None,
    on_bad_row: Literal["raise", "skip"] = "raise",
    drop_last: bool = False,
) -> Reader:
    """Read TFRecord files of ``tf.train.Example`` records, without TensorFlow.

    Each record is a row; the feature named like a column's key feeds it
    (``float_list`` / ``int64_list`` for numeric columns, labels and weights,
    ``bytes_list`` or ``int64_list`` for ``dtype="str"`` columns,
    ``int64_list`` for other categorical columns; a list gives one key per
    value). A feature a record lacks is missing, as a Parquet null is. Both
    CRCs of every record are checked; a record whose data CRC does not match,
    that is not a well-formed ``Example``, or whose feature has the wrong
    kind of list is a bad row. A damaged length or a file that ends inside a
    record raises in both modes, naming file and byte offset (see
    :mod:`tnrec.data.tfrecord`).

    Args:
        paths: files and glob patterns.
        columns: feature columns.
        compression: None (plain), ``"GZIP"`` or ``"ZLIB"`` (TensorFlow's
            ``compression_type``), or ``"auto"``: GZIP for names ending in
            ``.gz``, ZLIB for ``.zlib``, plain otherwise.
        label, weight, batch_size, shuffle, seed, shuffle_buffer_rows, prefetch,
        on_bad_row, drop_last: as in :func:`read_parquet`.

    Returns:
        The reader.

    Raises:
        DataError: a pattern matches no file or a file is missing (here); while
            reading, a bad row (unless skipped), damaged framing or
            compressed data, or a truncated file.
        ArgumentError, SpecError: an argument or column is invalid.
    """
    kind = check_compression(compression, "read_tfrecord")
    schema = make_schema(columns, label, weight)
    return Reader(
        expand_paths(paths),
        TFRecordSource(_wants(schema), kind),
        schema,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer_rows=shuffle_buffer_rows,
        prefetch=prefetch,
        on_bad_row=on_bad_row,
        drop_last=drop_last,
    )


def _wants(schema: Schema) -> dict[str, Want]:
    """What each field's column reads from a ``tf.train.Example`` feature."""
    wants: dict[str, Want] = {}
    for col in schema.sparse:
        if isinstance(col, BucketizedColumn):
            wants[col.key] = "number"
        else:
            wants[col.key] = "text" if col.dtype == "str" else "int"
    for name in (*(c.key for c in schema.dense), *schema.labels, schema.weight):
        if name is not None:
            wants[name] = "number"
    return wants
