"""Small Criteo-like rows written as raw Criteo TSV, CSV and Parquet, generated per test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tnrec.data import CRITEO_CATEGORICAL, CRITEO_NUMERIC

Rows = dict[str, list[Any]]


def make_rows(n: int, seed: int = 0) -> Rows:
    """Return n Criteo rows: label 0/1, ints (some missing, some negative), hex categories."""
    rng = np.random.default_rng(seed)
    rows: Rows = {"label": [int(v) for v in rng.integers(0, 2, n)]}
    for k in CRITEO_NUMERIC:
        vals = rng.integers(-1, 1000, n)
        miss = rng.random(n) < 0.2
        rows[k] = [None if m else int(v) for v, m in zip(vals, miss, strict=True)]
    for j, k in enumerate(CRITEO_CATEGORICAL):
        vals = rng.integers(0, 5 + 10 * j, n)
        miss = rng.random(n) < 0.15
        rows[k] = [
            None if m else f"{int(v) * 2654435761 % 2**32:08x}"
            for v, m in zip(vals, miss, strict=True)
        ]
    return rows


def _field(v: Any, float_ints: bool) -> str:
    if v is None:
        return ""
    if isinstance(v, int) and float_ints:
        return f"{float(v)}"
    return str(v)


def write_text(path: Path, rows: Rows, *, sep: str, header: bool, float_ints: bool) -> Path:
    names = list(rows)
    n = len(rows[names[0]])
    lines = [sep.join(names)] if header else []
    for i in range(n):
        lines.append(sep.join(_field(rows[k][i], float_ints and k != "label") for k in names))
    path.write_text("".join(line + "\n" for line in lines))
    return path


def write_tsv(path: Path, rows: Rows) -> Path:
    """Raw Criteo: no header, tab-separated, ints as ints."""
    return write_text(path, rows, sep="\t", header=False, float_ints=False)


def write_csv(path: Path, rows: Rows) -> Path:
    """CSV with a header, ints written as floats (``1.0``) like the shared sample."""
    return write_text(path, rows, sep=",", header=True, float_ints=True)


def write_parquet(path: Path, rows: Rows, row_group_size: int | None = None) -> Path:
    table = pa.table(
        {k: pa.array(v, pa.string() if k.startswith("C") else pa.int64()) for k, v in rows.items()}
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def take_rows(rows: Rows, lo: int, hi: int) -> Rows:
    return {k: v[lo:hi] for k, v in rows.items()}
