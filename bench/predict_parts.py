"""Where a ``Predictor.predict`` call's time goes: each part of the fast path timed alone.

One process, 1 torch thread. It trains and exports DeepFM as
``bench/serve_bench.py`` does (or takes ``--export`` and ``--data``), then
times, on ``--batch`` held-out rows given as a list of dicts (the form an HTTP
body decodes to), cycling through ``--windows`` slices, the median of
``--calls`` calls of:

* gathering the string values, and the numeric values, from the dicts into a
  list each (``serving.fast._flat``);
* ``pa.array`` of the strings, and of the numbers;
* for comparison, ways the fast path does not take: ``pa.array`` of the
  strings typed ``pa.string()``; the strings gathered and converted in one
  pass from an iterator, without the list; the dicts read as one struct array
  of their type;
* the numeric features (``serving.fast._fast_dense``), the hashing of the
  strings (``serving.fast._hash_str_grid``);
* the whole key grid and features (``serving.fast._fast_inputs``, the above
  together), the same from the rows as a pyarrow Table, the lookups and
  pooling (``Predictor._values``);
* the dense graph alone (as the Predictor calls it), and ``predict`` whole.

Usage::

    NUMBA_CACHE_DIR=.numba_cache python bench/predict_parts.py      # about 30 s
    python bench/predict_parts.py --batch 1 --calls 5000

Run it on a quiet machine; the other processes' cores are printed. This file is
never collected by pytest.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from machine_state import MachineWatch
from serve_bench import make_export


def median_ms(fn: Callable[[int], Any], windows: int, calls: int) -> float:
    """Median ms of ``fn(window)`` over ``calls`` calls, cycling windows."""
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn(i % windows)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main() -> None:
    import torch

    from tnrec.feature_column.arrow import _string_buffers
    from tnrec.serving import Predictor
    from tnrec.serving.fast import _fast_dense, _fast_inputs, _flat, _hash_str_grid

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000, help="training rows (one day)")
    ap.add_argument("--export", help="an existing Criteo-schema export (skips training)")
    ap.add_argument("--data", help="held-out Parquet rows for --export")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--calls", type=int, default=300, help="timed calls a part")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        if args.export:
            if not args.data:
                ap.error("--export needs --data")
            export, data = args.export, args.data
        else:
            export, data = make_export(d, args.rows, "deepfm")
        p = Predictor(export)
        plan = p._fast
        if plan is None:
            raise SystemExit(f"{export}: the Predictor has no fast path for this model")
        B, W = args.batch, args.windows
        held_out = pq.read_table(data).select(p.required)
        if B * W > held_out.num_rows:
            raise SystemExit(f"--windows {W} x --batch {B} > {held_out.num_rows} held-out rows")
        tables = [held_out.slice(w * B, B) for w in range(W)]
        rows = [t.to_pylist() for t in tables]
        strs = [_flat(r, plan.str_keys) for r in rows]
        nums = [_flat(r, plan.num_keys) for r in rows]
        str_arrays = [pa.array(s) for s in strs]
        num_arrays = [pa.array(n) for n in nums]
        struct = pa.array(rows[0]).type
        fast = [_fast_inputs(plan, r) for r in rows]
        graph_args = [p.graph_inputs(r) for r in rows]
        get_strs = itemgetter(*plan.str_keys)
        S = plan.num_sparse
        keys = np.empty((S, B), np.uint64)
        present = np.empty((S, B), np.bool_)

        def hash_strings(w: int) -> None:
            offs, buf, valid = _string_buffers(str_arrays[w])
            _hash_str_grid(offs, buf, valid, plan.str_hashes, plan.str_rows, B, True, keys, present)

        def graph(w: int) -> Any:
            with torch.no_grad():
                return p.graph(*graph_args[w])

        parts: list[tuple[str, Callable[[int], Any]]] = [
            ("gather the strings from the dicts", lambda w: _flat(rows[w], plan.str_keys)),
            ("gather the numbers from the dicts", lambda w: _flat(rows[w], plan.num_keys)),
            (f"pa.array of the {len(strs[0]):,} strings", lambda w: pa.array(strs[w])),
            (f"pa.array of the {len(nums[0]):,} numbers", lambda w: pa.array(nums[w])),
            ("  (pa.array of the strings, typed pa.string())",
             lambda w: pa.array(strs[w], pa.string())),
            ("  (gather the strings and pa.array them from an iterator, no list)",
             lambda w: pa.array(chain.from_iterable(map(get_strs, rows[w])), pa.string(),
                                size=len(strs[w]))),
            ("  (the dicts as one struct array, typed)", lambda w: pa.array(rows[w], struct)),
            ("numeric features (_fast_dense)", lambda w: _fast_dense(plan, num_arrays[w], B, True)),
            ("hash the strings (_hash_str_grid)", hash_strings),
            ("key grid and features, whole (_fast_inputs)", lambda w: _fast_inputs(plan, rows[w])),
            ("key grid and features of a pyarrow Table (_fast_inputs)",
             lambda w: _fast_inputs(plan, tables[w])),
            ("lookups and pooling (Predictor._values)", lambda w: p._values(fast[w][1:3], B)),
            ("dense graph alone", graph),
            ("predict, whole", lambda w: p.predict(rows[w])),
        ]  # fmt: skip
        for _, fn in parts:  # warm-up
            fn(0)
        with MachineWatch() as watch:
            results = [(name, median_ms(fn, W, args.calls)) for name, fn in parts]
        s = watch.state
        print(
            f"DeepFM export, batch {B} as a list of dicts, {W} windows, median of "
            f"{args.calls} calls; other processes {s.other_cores:.2f} cores, "
            f"load average {s.load1_before:.2f} -> {s.load1_after:.2f}"
        )
        print("| part | ms |\n|---|---:|")
        for name, ms in results:
            print(f"| {name} | {ms:.3f} |")


if __name__ == "__main__":
    main()
