"""What NumPy's BLAS threads cost the training steps beside torch's threads.

    NUMBA_CACHE_DIR=.numba_cache python3 bench/blas_bench.py            # ~30 seconds
    python3 bench/blas_bench.py --threads 1,2 --repeats 3 --strict

The micro model of ``compare.py`` (2 columns, dim 16, ``Linear(32, 1)``, Adam,
batch 4096, every row created before the timing), trained through ``fit`` with
the metrics ``auc``, ``logloss`` and ``ctr``, which a callback reads every
``--read-every`` steps as a terminal's progress bar reads them (5 times a
second). Each line runs in a process of its own, repeats interleaved, ms a
step, median and mean over the steps (each repeat's), then the median
(min-max) over the repeats:

* ``metrics read``: the metrics as tnrec computes them (NumPy sums,
  :mod:`tnrec._numeric`);
* ``metrics read, then a @ a``: after each reading, a ``@`` of two float64
  vectors as long as the AUC's histogram (131,072 values), which NumPy hands
  to its BLAS, as a training script's own NumPy would (and as the AUC's
  result did when it summed with ``@``);
* ``... OPENBLAS_NUM_THREADS=1``: the same, with OpenBLAS kept to the calling
  thread (the variable is read when NumPy is imported).

OpenBLAS's worker threads keep spinning for a while after a call they took
part in; where torch's threads fill the cores, they take a core from the
step. The machine's state is recorded around each process
(``machine_state.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from machine_state import MachineState, MachineWatch, check_runs, cpu_line
from reader_bench import add_run_args, print_by_threads

#: (label, a @ a after each reading, OPENBLAS_NUM_THREADS=1)
LINES = (
    ("metrics read", False, False),
    ("metrics read, then a @ a", True, False),
    ("... OPENBLAS_NUM_THREADS=1", True, True),
)


def child(threads: int, steps: int, read_every: int, blas: bool) -> dict[str, Any]:
    """Train the micro model through ``fit``, reading the metrics every ``read_every`` steps
    (and with ``blas`` a ``@`` after each reading); return each step's ms."""
    import torch

    import tnrec as tn
    from glue_bench import micro_setup
    from tnrec.table.warmup import warm

    torch.set_num_threads(threads)
    warm()
    batches, model, _, _ = micro_setup(steps)
    model.compile(
        torch.optim.Adam(model.parameters(), 1e-3),
        loss="binary_crossentropy_from_logits",
        metrics=["auc", "logloss", "ctr"],
    )
    auc = next(m for h in model.heads for m in h.metrics if m.name == "auc")
    a = np.random.default_rng(0).random(auc.state().shape[0] // 2)
    times: list[float] = []

    class Timed(tn.callbacks.Callback):
        t0 = 0.0

        def on_train_batch_begin(self, step: int, logs: Any = None) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, step: int, logs: Any = None) -> None:
            if step % read_every == 0:
                self.model._metric_logs(reduce=False)  # what ProgressBar.update is given
                if blas:
                    float(a @ a)
            times.append(1e3 * (time.perf_counter() - self.t0))

    with MachineWatch() as watch:
        model.fit(batches, callbacks=[Timed()], verbose=0)
    return {"ms": times[5:], "state": watch.state.to_dict()}


def run(a: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Every line's (median, mean) step ms per repeat at ``threads``, and the runs' states."""
    out: dict[str, Any] = {"median": {}, "mean": {}, "states": []}
    for label, *_ in LINES:
        out["median"][label], out["mean"][label] = [], []
    for _ in range(a.repeats):
        for label, blas, one in LINES:
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            if one:
                env["OPENBLAS_NUM_THREADS"] = "1"
            cmd = [sys.executable, __file__, "--child", str(threads), "--steps", str(a.steps)]
            cmd += ["--read-every", str(a.read_every)] + (["--blas"] if blas else [])
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            out["median"][label].append(float(np.median(r["ms"])))
            out["mean"][label].append(float(np.mean(r["ms"])))
            out["states"].append((f"threads {threads} {label}", MachineState.from_dict(r["state"])))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_args(p, "batches of 4096 a process")
    p.add_argument("--read-every", type=int, default=5, help="steps between metric readings")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--blas", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child, a.steps, a.read_every, a.blas)))
        return 0
    counts = [int(t) for t in a.threads.split(",")]
    results = {t: run(a, t) for t in counts}
    notes = check_runs([s for r in results.values() for s in r["states"]], a.strict)
    print(f"machine: {cpu_line()}; {a.steps} batches of 4096, {a.repeats} repeats")
    print(
        f"ms a step through fit, metrics read every {a.read_every} steps; each repeat's median "
        "(then mean) step, median (min-max) over the repeats; micro model, rows exist"
    )
    for stat in ("median", "mean"):
        print(f"{stat} step:")
        rows = [(label, {t: r[stat][label] for t, r in results.items()}) for label, *_ in LINES]
        print_by_threads(counts, rows, 30)
    for t, r in results.items():
        others = max(s.other_cores for _, s in r["states"])
        load = max(s.load1_max for _, s in r["states"])
        print(f"threads {t}: others at most {others:.2f} cores, load at most {load:.2f}")
    for line in notes:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
