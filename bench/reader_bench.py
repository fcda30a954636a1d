"""What the Parquet reader costs a training step: ``fit`` over the reader against ``fit``
over the same batches in memory, and why.

    NUMBA_CACHE_DIR=.numba_cache python3 bench/reader_bench.py           # ~25 seconds
    python3 bench/reader_bench.py --threads 1,2 --repeats 3 --strict     # ~45 seconds

The micro model of ``compare.py`` (2 columns, dim 16, ``Linear(32, 1)``, batch
4096), its ids in one Parquet file (``fit_bench.write_data``), every row created
before the timing. In one process, each repeat runs every line once (repeats
interleaved), ms a step, median (min-max):

* ``train_step``: a loop of ``train_step`` over the reader's batches, read
  into memory beforehand;
* ``fit, batches in memory``: ``fit`` over that list;
* ``fit, reader``: ``fit`` over the reader as ``read_parquet`` builds it by
  default: 2 batches read ahead by a thread when torch's threads leave a core,
  else read inline (``tnrec.data.prefetch_depth``);
* ``fit, reader thread``: the same with ``prefetch=2`` (2 batches read ahead by
  a thread at any thread count);
* ``fit, reader inline``: the same with ``prefetch=0`` (read in the step's thread);
* ``train_step, reader thread beside``: the ``train_step`` loop while another
  thread of the process reads the file over and over;
* ``train_step, reader process beside``: the same with the reading in another
  process (no GIL shared).

Below the table: the reader alone (ms a batch, inline) and the time a batch
its thread holds the GIL, hand-overs included: the share of a pure-Python
loop's progress the reading thread takes from it, at a 0.5 ms switch
interval, divided by the batches it read meanwhile.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from machine_state import MachineWatch, add_strict_flag, check_runs, cpu_line

LINES = (
    "train_step",
    "fit, batches in memory",
    "fit, reader",
    "fit, reader thread",
    "fit, reader inline",
    "train_step, reader thread beside",
    "train_step, reader process beside",
)


def _reader(path: Path, prefetch: int | None) -> Any:
    import tnrec as tn
    from compare_data import B

    cols = [tn.feature_column.category_column(c) for c in ("c0", "c1")]
    return tn.data.read_parquet(str(path), cols, batch_size=B, prefetch=prefetch)


def _read_forever(path: Path, done: Callable[[], bool]) -> None:
    reader = _reader(path, 0)
    while not done():
        for _ in reader:
            if done():
                return


def _ms_a_step(fn: Callable[[], object], steps: int) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) / steps * 1e3


class Beside:
    """Reading the file over and over beside the step: in a thread, or in another process."""

    def __init__(self, path: Path, how: str) -> None:
        self.path, self.how = path, how
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Beside:
        if self.how == "thread":
            self.thread = threading.Thread(target=_read_forever, args=(self.path, self.stop.is_set))
            self.thread.start()
            time.sleep(0.2)
        else:
            cmd = [sys.executable, __file__, "--read-forever", str(self.path)]
            self.proc = subprocess.Popen(cmd)
            time.sleep(4.0)  # its imports and first read
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def gil_held_us(path: Path, seconds: float = 1.0) -> tuple[float, float]:
    """``(reader ms a batch alone, µs a batch its thread holds the GIL, hand-overs included)``
    (module docstring)."""
    reader = _reader(path, 0)
    n = sum(1 for _ in reader)
    alone_ms = _ms_a_step(lambda: sum(1 for _ in reader), n)

    def spin() -> int:
        t0, count = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            for _ in range(1000):
                pass
            count += 1
        return count

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        quiet = spin()
        stop, batches = threading.Event(), [0]

        def read() -> None:
            while not stop.is_set():
                for _ in reader:
                    batches[0] += 1
                    if stop.is_set():
                        return

        th = threading.Thread(target=read)
        th.start()
        t0 = time.perf_counter()
        beside = spin()
        wall = time.perf_counter() - t0
        stop.set()
        th.join()
    finally:
        sys.setswitchinterval(interval)
    share = max(0.0, 1.0 - beside / quiet)
    return alone_ms, share / max(batches[0] / wall, 1e-9) * 1e6


def run(threads: int, repeats: int, steps: int, root: Path) -> dict[str, Any]:
    """Every line of the table, ``repeats`` times interleaved, at ``threads`` torch threads."""
    import torch

    torch.set_num_threads(threads)
    from compare_impls import TnrecImpl
    from fit_bench import write_data
    from tnrec.table.warmup import warm

    warm()
    path = write_data(root, "micro", steps)
    model = TnrecImpl("micro").model
    memory = list(_reader(path, 0))
    model.fit(memory, epochs=1, verbose=0, pipeline=False)  # creates every row
    readers = {None: _reader(path, None), 2: _reader(path, 2), 0: _reader(path, 0)}
    n = len(memory)

    def steps_loop() -> None:
        for b in memory:
            model.train_step(b)

    def fit(data: Any) -> Callable[[], object]:
        return lambda: model.fit(data, epochs=1, verbose=0, pipeline=False)

    times: dict[str, list[float]] = {line: [] for line in LINES}
    with MachineWatch() as watch:
        for _ in range(repeats):
            times[LINES[0]].append(_ms_a_step(steps_loop, n))
            times[LINES[1]].append(_ms_a_step(fit(memory), n))
            for line, prefetch in ((LINES[2], None), (LINES[3], 2), (LINES[4], 0)):
                times[line].append(_ms_a_step(fit(readers[prefetch]), n))
            for line, how in ((LINES[5], "thread"), (LINES[6], "process")):
                with Beside(path, how):
                    times[line].append(_ms_a_step(steps_loop, n))
        alone_ms, gil_us = gil_held_us(path)
    return {"times": times, "alone_ms": alone_ms, "gil_us": gil_us, "state": watch.state}


def _cell(values: list[float]) -> str:
    return f"{np.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def add_run_args(p: argparse.ArgumentParser, steps_help: str) -> None:
    """``--threads``, ``--repeats``, ``--steps`` and ``--strict``: the arguments of a bench
    whose table has a column a torch thread count (this one and ``glue_bench.py``)."""
    p.add_argument("--threads", default="1", help="torch thread counts, e.g. 1,2 (default 1)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60, help=steps_help)
    add_strict_flag(p)


def print_by_threads(
    counts: list[int], rows: list[tuple[str, dict[int, list[float]]]], width: int
) -> None:
    """Print a header of ``counts`` and each ``(label, {threads: values})`` row as the
    median (min-max) of its values under each thread count, labels ``width`` wide."""
    header = "".join(f"{f'{t} thread' + ('s' if t > 1 else ''):>26s}" for t in counts)
    print(f"{'':{width}s}{header}")
    for label, values in rows:
        cells = "".join(f"{_cell(values[t]):>26s}" for t in counts)
        print(f"{label:{width}s}{cells}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_args(p, "batches of 4096 in the file")
    p.add_argument("--read-forever", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.read_forever is not None:  # the reader process of "reader process beside"
        parent = os.getppid()  # ends with the benchmark, even one killed before its cleanup
        _read_forever(Path(a.read_forever), lambda: os.getppid() != parent)
        return 0
    counts = [int(t) for t in a.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        results = {t: run(t, a.repeats, a.steps, Path(tmp)) for t in counts}
    notes = check_runs([(f"threads {t}", r["state"]) for t, r in results.items()], a.strict)
    print(f"machine: {cpu_line()}; {a.steps} batches of 4096, {a.repeats} repeats")
    print("ms a step, median (min-max) over the interleaved repeats; micro model, rows exist")
    rows = [(line, {t: r["times"][line] for t, r in results.items()}) for line in LINES]
    print_by_threads(counts, rows, 36)
    for t, r in results.items():
        print(
            f"threads {t}: the reader alone {r['alone_ms']:.3f} ms a batch; its thread holds "
            f"the GIL about {r['gil_us']:.0f} us a batch; {r['state'].summary()}"
        )
    for line in notes:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
