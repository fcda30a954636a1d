"""Memory you can see: rows, bytes and admission counters of every worker's tables, and peak RSS.

:func:`memory_report` gathers, in one collective, what each worker's shard of
every table holds (:meth:`tnrec.table.SparseTable.memory`) and each worker's
peak resident set size, and returns them per worker and combined::

    worker 0: [rss | table a: rows bytes ... | table b: rows bytes ...]
    worker 1: [rss | table a: rows bytes ... | table b: rows bytes ...]
                 \\__ one all_gather of W flat float64 arrays, rank order

Every worker must call it at the same point (it is a collective), also a
worker whose input ran out: ``Model.fit`` does so every ``log_every`` steps
and at the end of every epoch.
"""

from __future__ import annotations

import resource
import sys
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tnrec.table import SparseTable

__all__ = ["FIELDS", "format_memory", "memory_report", "memory_scalars", "peak_rss_bytes"]

# The per-worker figures of one table, in the order they travel; the keys of SparseTable.memory().
FIELDS = (
    "rows",
    "bytes",
    "index_bytes",
    "row_bytes",
    "weight_bytes",
    "state_bytes",
    "sketch_bytes",
    "sketch_fill",
    "keys_admitted",
    "keys_refused",
    "keys_evicted_cap",
)
COUNTERS = ("keys_admitted", "keys_refused", "keys_evicted_cap")


class _Gathers(Protocol):
    """What :func:`memory_report` needs of a parameter server."""

    @property
    def world_size(self) -> int: ...

    @property
    def tables(self) -> dict[str, SparseTable]: ...

    def all_gather(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...


def peak_rss_bytes() -> int:
    """Return this process's peak resident set size in bytes (0 when the system does not say).

    Reads ``VmHWM`` from ``/proc/self/status`` (Linux); elsewhere
    ``resource.getrusage`` (``ru_maxrss``: KiB on Linux, bytes on macOS).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # "VmHWM:   123456 kB"
    except (OSError, ValueError, IndexError):
        pass
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024


def _local_figures(tables: dict[str, SparseTable], names: list[str]) -> npt.NDArray[np.float64]:
    """This worker's flat array: peak RSS, then ``FIELDS`` of each table in ``names`` order."""
    out = [float(peak_rss_bytes())]
    for name in names:
        mem = tables[name].memory()
        out += [float(mem[f]) for f in FIELDS]
    return np.array(out, np.float64)


def _skew(rows: npt.NDArray[np.float64]) -> float:
    """Return max/mean of the rows per worker (1.0 for no rows: nothing is skewed)."""
    mean = float(rows.mean()) if rows.shape[0] else 0.0
    return float(rows.max()) / mean if mean > 0 else 1.0


def _table_report(per_worker: npt.NDArray[np.float64]) -> dict[str, Any]:
    """Combine one table's ``[W, len(FIELDS)]`` figures: totals, per worker, skew, counters."""
    col = {f: per_worker[:, i] for i, f in enumerate(FIELDS)}  # each [W]
    out: dict[str, Any] = {}
    for f in ("rows", "bytes", "index_bytes", "row_bytes", "weight_bytes", "state_bytes"):
        out[f] = int(col[f].sum())
    out["sketch_bytes"] = int(col["sketch_bytes"].sum())
    out["skew"] = _skew(col["rows"])
    out["sketch_fill"] = float(col["sketch_fill"].mean())
    for f in COUNTERS:
        out[f] = int(col[f].sum())
    out["per_worker"] = {
        f: [int(x) for x in col[f]] if f != "sketch_fill" else [float(x) for x in col[f]]
        for f in FIELDS
        if f not in COUNTERS
    }
    return out


def memory_report(ps: _Gathers) -> dict[str, Any]:
    """Gather every worker's table memory and peak RSS (one ``all_gather``; a collective).

    Args:
        ps: the model's parameter server (``model.ps``); every worker calls
            this at the same point, in the same order as its other collectives.

    Returns:
        ``{"world_size": W, "peak_rss_bytes": max over workers,
        "peak_rss_bytes_per_worker": [W], "tables": {name: {...}}}``; per table:
        ``rows``, ``bytes``, ``index_bytes``, ``row_bytes`` (``weight_bytes`` and
        ``state_bytes`` are parts of it), ``sketch_bytes`` summed over workers;
        ``skew`` (max / mean rows per worker); ``sketch_fill`` (mean over
        workers); ``keys_admitted``, ``keys_refused``, ``keys_evicted_cap``
        (cumulative since the tables were built, summed over workers); and
        ``per_worker``: each figure but the counters as a list in rank order.

    Raises:
        RuntimeError: the workers hold different numbers of tables (an internal error).

    Example:
        >>> from tnrec.ps import LocalPS
        >>> from tnrec.table import SGD, SparseTable
        >>> import numpy as np
        >>> t = SparseTable(4, SGD(), name="user")
        >>> _ = t.pull(np.arange(3, dtype=np.int64))
        >>> r = memory_report(LocalPS({"user": t}))
        >>> r["tables"]["user"]["rows"], r["tables"]["user"]["skew"]
        (3, 1.0)
    """
    tables = ps.tables
    names = sorted(tables)
    local = _local_figures(tables, names)
    W = ps.world_size
    every = ps.all_gather(local)
    if every.shape[0] != W * local.shape[0]:
        raise RuntimeError(
            f"internal error: memory_report gathered {every.shape[0]} figures from {W} workers, "
            f"expected {W} x {local.shape[0]} (do all workers hold the same tables?)"
        )
    grid = every.reshape(W, local.shape[0])  # [W, 1 + T * len(FIELDS)]
    rss = grid[:, 0]
    report: dict[str, Any] = {
        "world_size": W,
        "peak_rss_bytes": int(rss.max()),
        "peak_rss_bytes_per_worker": [int(x) for x in rss],
        "tables": {},
    }
    n = len(FIELDS)
    for i, name in enumerate(names):
        report["tables"][name] = _table_report(grid[:, 1 + i * n : 1 + (i + 1) * n])
    return report


def memory_scalars(report: dict[str, Any]) -> dict[str, float]:
    """Return TensorBoard scalars of a report: ``memory/peak_rss`` and ``memory/<table>/<figure>``.

    Per table: ``rows``, ``bytes``, ``skew``, ``sketch_fill`` and the three
    counters; ``memory/peak_rss`` is the largest worker's peak RSS in bytes.
    """
    out = {"memory/peak_rss": float(report["peak_rss_bytes"])}
    for name, t in report["tables"].items():
        for f in ("rows", "bytes", "skew", "sketch_fill", *COUNTERS):
            out[f"memory/{name}/{f}"] = float(t[f])
    return out


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # unreachable: GB is the last unit


def format_memory(report: dict[str, Any]) -> str:
    """Return a short line of a report: rows, bytes and skew of all tables, the largest peak RSS.

    Example:
        >>> format_memory({"peak_rss_bytes": 3 << 30, "world_size": 2, "tables": {
        ...     "a": {"rows": 1000, "bytes": 2 << 20, "skew": 1.25},
        ...     "b": {"rows": 24, "bytes": 1 << 10, "skew": 1.5}}})
        'rows 1,024, tables 2.0 MB, skew 1.50, peak RSS 3.0 GB'
    """
    tables = report["tables"].values()
    rows = sum(int(t["rows"]) for t in tables)
    size = sum(int(t["bytes"]) for t in tables)
    skew = max((float(t["skew"]) for t in tables), default=1.0)
    line = f"rows {rows:,}, tables {_fmt_bytes(size)}"
    if report.get("world_size", 1) > 1:
        line += f", skew {skew:.2f}"
    return line + f", peak RSS {_fmt_bytes(report['peak_rss_bytes'])}"
