"""Serving latency in process: ``Predictor.predict`` on raw rows next to the dense graph alone.

One command, one table::

    python bench/serve_bench.py                  # about a minute on the 2-core machine
    python bench/serve_bench.py --rows 100000 --duration 4 --form columns
    python bench/serve_bench.py --aot            # also the graph compiled ahead of time

It trains a zoo model (DeepFM by default) for one epoch on synthetic
Criteo-schema data (``tnrec.data.synthetic``: 13 numeric, 26 categorical
columns), exports it, and measures, with 1 torch thread:

* **Predictor**: ``predict`` on raw rows -- by default a list of dicts, the
  form an HTTP body decodes to (``--form columns``: a dict of lists,
  ``--form table``: a pyarrow Table) -- hashing, dictionary lookup, pooling and
  the dense graph, timed call by call;
* **graph**: the export's dense graph alone on the same rows, its inputs
  computed beforehand (the floor a Predictor call can reach), called as the
  Predictor calls it; for the exported program, also through
  ``ExportedProgram.module()``, which checks its arguments on every call (the
  Predictor calls it once, :class:`tnrec.serving.graph.FlatGraph`).

Each batch size cycles through ``--windows`` different slices of the held-out
rows, so a call does not see the previous call's rows in cache. The Predictor
and the graph alternate in ``--rounds`` rounds of ``--duration / rounds``
seconds each (at most ``--max-calls`` calls a round), after a warm-up, so a
change of the machine's load reaches both. p50/p99 are over the calls of all
rounds; rows/s is rows / time over all of them. The load average is printed
before and after: figures taken with a load average above ~1.2 on 2 cores
were taken beside other work. The timed calls also record the machine's state
(``machine_state.py``, printed under the table): the cores other processes kept
busy meanwhile; the table is marked when that passes the busy rule, and
``--strict`` refuses it instead.

``--http`` then runs the service benchmark, ``bench/serve_http_bench.py``
(``tnrec serve`` over HTTP on 127.0.0.1 with an open-loop client: latency at
fixed request rates, 1 and 2 workers, reloads under load, workers' memory);
the arguments after ``--http`` go to it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from machine_state import MachineWatch, add_strict_flag, check_runs

BATCHES = (1, 16, 256, 1024)


def make_export(workdir: str, rows: int, model_name: str) -> tuple[str, str]:
    """Train ``model_name`` one epoch on ``rows`` synthetic rows and export it.

    Returns:
        ``(export path, held-out Parquet file)``.
    """
    import torch

    import tnrec as tn
    from tnrec.data.synthetic import SyntheticConfig, generate
    from tnrec.models import build

    cfg = SyntheticConfig(rows_per_day=rows, num_days=1, test_rows=max(8192, rows // 10))
    gen = generate(os.path.join(workdir, "data"), cfg)
    cols = tn.data.criteo_columns()
    torch.manual_seed(0)
    model = build(model_name, cols)
    model.compile()
    files = [str(f) for day in gen.days for f in gen.train_files[day]]
    model.fit(tn.data.read_parquet(files, cols, batch_size=4096), verbose=0)
    return model.export(os.path.join(workdir, "export")), str(gen.test_files[0])


def _inputs(table: Any, form: str) -> Any:
    if form == "rows":
        return table.to_pylist()
    if form == "columns":
        return table.to_pydict()
    return table


def _time_calls(
    fn: Callable[[int], Any], n_windows: int, budget_s: float, max_calls: int
) -> list[float]:
    """Call ``fn(window)``, cycling windows, for ``budget_s`` (``max_calls`` at most); seconds."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_calls and time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn(len(times) % n_windows)
        times.append(time.perf_counter() - t0)
    return times


def in_process(
    export: str,
    data: str,
    batches: tuple[int, ...] = BATCHES,
    *,
    form: str = "rows",
    duration_s: float = 4.0,
    rounds: int = 4,
    windows: int = 8,
    max_calls: int = 20_000,
    aot: bool = False,
) -> list[dict[str, float]]:
    """Time ``Predictor.predict`` and the dense graph alone at each batch size.

    ``aot``: the Predictor's dense graph compiled ahead of time
    (``Predictor(export, aot=True)``; raises when it cannot be compiled).

    Returns:
        One dict a batch size: ``batch``, ``p50_ms``, ``p99_ms``, ``rows_per_s``
        (Predictor), ``graph_p50_ms``, ``graph_p99_ms``, ``graph_rows_per_s``, and for
        the exported graph ``module_p50_ms`` ... : the same graph called through
        ``ExportedProgram.module()``, which checks its arguments on every call (what
        :class:`tnrec.serving.graph.FlatGraph` calls once).
    """
    import torch

    from tnrec.serving import Predictor

    torch.set_num_threads(1)
    p = Predictor(export, aot=aot)
    if aot and p.graph_kind != "aot":
        raise SystemExit(f"--aot: the dense graph could not be compiled: {p.aot_error}")
    held_out = pq.read_table(data).select(p.required)
    module = getattr(p.graph, "module", None)  # the exported graph's checking module
    out = []
    for b in batches:
        if b * windows > held_out.num_rows:
            raise SystemExit(f"--windows {windows} x batch {b} > {held_out.num_rows} held-out rows")
        inputs = [_inputs(held_out.slice(w * b, b), form) for w in range(windows)]
        args = [p.graph_inputs(x) for x in inputs]
        want = [p.predict(x) for x in inputs]  # warm-up, and the answer the graph must give

        def predictor(w: int, inputs: list[Any] = inputs) -> Any:
            return p.predict(inputs[w])

        def graph(w: int, args: list[list[torch.Tensor]] = args) -> Any:
            with torch.no_grad():
                return p.graph(*args[w])

        def checked(w: int, args: list[list[torch.Tensor]] = args, module: Any = module) -> Any:
            with torch.no_grad():
                return module(*args[w])

        for w in range(windows):
            got = torch.sigmoid(graph(w)[0]).numpy()
            np.testing.assert_array_equal(got, want[w])  # the Predictor runs the same graph
        pt: list[float] = []
        gt: list[float] = []
        mt: list[float] = []
        for _ in range(rounds):
            gt += _time_calls(graph, windows, duration_s / rounds / 2, max_calls)
            pt += _time_calls(predictor, windows, duration_s / rounds / 2, max_calls)
            if module is not None:
                mt += _time_calls(checked, windows, duration_s / rounds / 4, max_calls)
        mod = _stats(mt, b, "module_") if mt else {}
        out.append({"batch": b, **_stats(pt, b, ""), **_stats(gt, b, "graph_"), **mod})
    return out


def _stats(times: list[float], batch: int, prefix: str) -> dict[str, float]:
    ms = np.array(times) * 1e3
    return {
        f"{prefix}p50_ms": float(np.percentile(ms, 50)),
        f"{prefix}p99_ms": float(np.percentile(ms, 99)),
        f"{prefix}rows_per_s": batch * len(ms) / (ms.sum() / 1e3),
        f"{prefix}calls": float(len(ms)),
    }


def print_in_process(results: list[dict[str, float]]) -> None:
    """Print the in-process figures as a markdown table."""
    print(
        "| batch | Predictor p50 ms | p99 ms | rows/s | graph p50 ms | p99 ms | rows/s "
        "| Predictor / graph rows/s | graph through module() p50 ms | calls |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        module = f"{r['module_p50_ms']:.3f}" if "module_p50_ms" in r else "-"
        print(
            f"| {r['batch']:.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
            f"{r['rows_per_s']:,.0f} | {r['graph_p50_ms']:.3f} | {r['graph_p99_ms']:.3f} | "
            f"{r['graph_rows_per_s']:,.0f} | {r['rows_per_s'] / r['graph_rows_per_s']:.0%} | "
            f"{module} | {r['calls']:.0f} + {r['graph_calls']:.0f} |"
        )


def _load() -> str:
    return "load average {:.2f} {:.2f} {:.2f} (1, 5, 15 min)".format(*os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=100_000, help="training rows (one day)")
    ap.add_argument("--model", default="deepfm", choices=["lr", "widedeep", "deepfm", "dcn"])
    ap.add_argument("--export", help="an existing Criteo-schema export (skips training)")
    ap.add_argument("--data", help="held-out Parquet rows for --export")
    ap.add_argument("--form", default="rows", choices=["rows", "columns", "table"])
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--duration", type=float, default=4.0, help="seconds a batch size")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--max-calls", type=int, default=20_000, help="at most, a round")
    ap.add_argument(
        "--http", nargs=argparse.REMAINDER, help="then the HTTP benchmark, with these arguments"
    )
    ap.add_argument(
        "--aot",
        action="store_true",
        help="also time the dense graph compiled ahead of time (needs a C++ compiler)",
    )
    add_strict_flag(ap)
    args = ap.parse_args()
    print(f"before: {_load()}")
    with tempfile.TemporaryDirectory() as d:
        if args.export:
            if not args.data:
                ap.error("--export needs --data")
            export, data = args.export, args.data
            what = f"export {export}"
        else:
            t0 = time.perf_counter()
            export, data = make_export(d, args.rows, args.model)
            what = (
                f"{args.model}, trained on {args.rows:,} synthetic Criteo-schema rows "
                f"({time.perf_counter() - t0:.0f} s with the export)"
            )
        tables = []
        for aot in (False, True) if args.aot else (False,):
            t0 = time.perf_counter()
            with MachineWatch() as watch:
                results = in_process(
                    export,
                    data,
                    tuple(args.batches),
                    form=args.form,
                    duration_s=args.duration,
                    rounds=args.rounds,
                    windows=args.windows,
                    max_calls=args.max_calls,
                    aot=aot,
                )
            kind = "compiled ahead of time" if aot else "the exported program"
            tables.append(
                (f"dense graph: {kind} ({time.perf_counter() - t0:.0f} s)", results, watch)
            )
    states = [(f"in-process table, {k}", w.state) for k, _, w in tables]
    check_runs(states, args.strict)
    print(f"\n{what}; in process, 1 torch thread, input: {args.form}")
    for kind, results, watch in tables:
        print(f"\n{kind}\n")
        print_in_process(results)
        print(f"\nduring the timed calls: {watch.state.summary()} (other processes' mean cores)")
    for line in check_runs(states, strict=False):
        print(line)
    print(f"after: {_load()}")
    if args.http is not None:
        here = os.path.dirname(os.path.abspath(__file__))
        cmd = [sys.executable, os.path.join(here, "serve_http_bench.py"), *args.http]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
