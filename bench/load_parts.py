"""Where a table load's CPU time goes: each part of ``SparseTable.load`` timed alone.

One process, dim 8, row-wise AdaGrad: it fills a table with ``--keys`` keys
(``table_bench``'s keys), saves it with ``order="bucket"`` (what checkpoints
write), then times, each on its own, in the load's chunks:

* checksum: every saved file's bytes (already in memory) through XXH3 (what a
  save records, :mod:`tnrec._fileio.digest`), one thread, and through
  ``hashlib``'s sha256 for comparison;
* index: the keys of ``keys.npy`` put into a new table's reserved index
  (``rows_for(keys, new=True)``, the load's call), and the reserve itself;
* records: the columns written into the rows (``write_blocks``, the load's
  call), first into new memory, then again into the same rows.

Usage::

    NUMBA_CACHE_DIR=.numba_cache python bench/load_parts.py --keys 100m
    python bench/load_parts.py --keys 1m          # seconds

Run it on a quiet machine; the other processes' cores are printed. Files go to
a new directory under ``--dir`` (default /tmp), deleted at the end. This file
is never collected by pytest.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from machine_state import MachineWatch
from table_bench import parse_count, rank_to_key


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def timed(fn, *args) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """``(wall s, CPU s of this process)`` of ``fn(*args)``."""
    c, t = cpu_s(), time.perf_counter()
    fn(*args)
    return time.perf_counter() - t, cpu_s() - c


def main() -> None:
    from tnrec._fileio.digest import Xxh3
    from tnrec.table import AdaGrad, SparseTable, stream

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=parse_count, default=parse_count("100m"))
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    n, dim = args.keys, 8
    d = tempfile.mkdtemp(prefix="load_parts_", dir=args.dir)
    try:
        t = SparseTable(dim, AdaGrad(), name="parts")
        for lo in range(0, n, 1 << 20):
            t.pull_unchecked(rank_to_key(np.arange(lo, min(lo + (1 << 20), n))), True)
        t.save(os.path.join(d, "t"), order="bucket")
        del t
        path = os.path.join(d, "t")
        cols = stream.columns(dim, AdaGrad().state_arrays(dim))
        stride = max(c.start + c.width for c in cols)
        spans = list(stream._chunks(n, stride, stream.LOAD_CHUNK_BYTES))
        data = {c.name: np.load(os.path.join(path, f"{c.name}.npy")) for c in cols}
        keys = np.load(os.path.join(path, "keys.npy"))
        nbytes = keys.nbytes + sum(a.nbytes for a in data.values())
        rows: list[tuple[str, float, float]] = []
        with MachineWatch() as watch:

            def checksum(new: Callable[[], Any]) -> None:
                for arr in (keys, *data.values()):
                    h = new()
                    for a, b in spans:
                        h.update(arr[a:b].data)

            rows.append(("checksum: XXH3 (1 thread)", *timed(checksum, Xxh3)))
            rows.append(("checksum: sha256 (1 thread)", *timed(checksum, hashlib.sha256)))
            table = SparseTable(dim, AdaGrad(), name="parts")
            rows.append(("reserve index and rows", *timed(table.reserve, n)))
            rws: list[np.ndarray] = []

            def index() -> None:
                rws.extend(table.rows_for(keys[a:b], new=True) for a, b in spans)

            rows.append(("index: rows_for(new=True)", *timed(index)))
            blocks = [(c.start, data[c.name].reshape(n, c.width)) for c in cols]

            def records() -> None:
                for (a, b), r in zip(spans, rws, strict=True):
                    table.write_blocks(r, [(s, blk[a:b]) for s, blk in blocks])

            rows.append(("records: write_blocks, new memory", *timed(records)))
            rows.append(("records: write_blocks, again", *timed(records)))
        s = watch.state
        print(
            f"{n:,} keys, dim 8, AdaGrad; {nbytes / 1e9:.1f} GB of files; chunks of "
            f"{stream.LOAD_CHUNK_BYTES >> 20} MiB; other processes {s.other_cores:.2f} cores, "
            f"load average {s.load1_before:.2f} -> {s.load1_after:.2f}"
        )
        print("| part | wall s | CPU s |\n|---|---:|---:|")
        for name, wall, cpu in rows:
            print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
