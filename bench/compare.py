"""tnrec vs TorchRec vs plain PyTorch: the same model on the same data, side by side.

Three implementations of each model, trained for one pass over the same batches:

* ``tnrec``: ``tnrec.Model`` over sparse tables (unbounded 64-bit keys, no
  collisions), row-wise AdaGrad (:class:`tnrec.optimizer.AdaGrad`);
* ``torchrec``: ``FusedEmbeddingBagCollection`` with EXACT_ROWWISE_ADAGRAD
  (``torchrec.optim.RowWiseAdagrad``, same ``lr`` and ``eps``); fixed tables,
  keys hashed into ``[0, rows)``;
* ``plain``: ``nn.EmbeddingBag(sparse=True)`` with row-wise AdaGrad written out
  (coalesce the sparse gradient, ``g2 += mean(g^2)``, ``w -= lr*g/(eps+sqrt(g2))``);
  the same fixed tables;
* ``dense``: the dense part alone on fixed inputs (no tables): ``step / dense``
  is the sparse machinery's overhead.

Models (``--models``): ``micro`` (2 columns x 1M uniform ids, one id a column,
dim 16, ``Linear(32, 1)`` + Adam, batch 4096), ``zipf`` (the same with Zipf
ids and 5% never-seen ids per batch: tnrec creates rows as it goes), ``deepfm``
(``tnrec.models.DeepFM``, MLP 400-400-400, dim 16, synthetic Criteo-schema
data from ``tnrec.data.synthetic``).

Every (model, implementation, repeat) runs in its own interpreter, repeats
interleaved (r0: tnrec, torchrec, plain, dense; r1: ...), so peak RSS is that
run's own and the neighbours' load hits every column alike. ``--threads 1,2``
runs the whole interleaved set once per thread count, one table each. Every
run records the machine's state (``machine_state.py``: load average, and the
cores other processes kept busy while it ran); the table prints them per row
and marks rows with a run taken on a busy machine, ``--strict`` refuses those
runs instead (exits with a message naming them). samples/s is
measured over the steps after ``--warmup``; AUC is on a held-out split after
the pass. Run ``bench/requirements-torchrec.sh`` first for the TorchRec column;
without TorchRec the other columns run and its row says why it was skipped.

    NUMBA_CACHE_DIR=.numba_cache python3 bench/compare.py    # all models, 5 repeats
    python3 bench/compare.py --models micro --repeats 3 --threads 1,2 --strict
    python3 bench/compare.py --split                         # also tnrec's per-part split
    python3 bench/compare.py --split-only                    # tnrec's per-part split only

The split also times tnrec's step against the dense-only step alternating in
one process: by ``train_step`` over a fresh model's pass and a second pass,
and the same through ``fit`` (what users run), with its input pipeline (the
next batch's layouts and de-duplication in the input thread) and without;
and over a third pass part by part (pull, forward with the loss, backward,
push, dense optimizer; the dense-only step has no pull and no push), which
shows where tnrec's time over the dense-only step goes.

This file is the command line and runs each child; the data is drawn in
``compare_data.py``, the implementations are in ``compare_impls.py``, one run
(timing, AUC, RSS, the split) is ``compare_run.py`` and the printed table is
``compare_report.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from compare_data import B, deepfm_data
from compare_impls import IMPLS
from compare_report import machine_runs, report
from compare_run import run_one
from machine_state import (
    MachineState,
    MachineWatch,
    add_strict_flag,
    check_runs,
    cpu_line,
    new_memory_ms_per_mib,
)


def _has_torchrec() -> str | None:
    r = subprocess.run(
        [sys.executable, "-c", "import torchrec, fbgemm_gpu"], capture_output=True, text=True
    )
    if r.returncode == 0:
        return None
    last = (r.stderr.strip().splitlines() or ["?"])[-1]
    return f"TorchRec not importable ({last}); run bench/requirements-torchrec.sh"


def _thread_counts(text: str) -> list[int]:
    """Parse ``--threads``: ``"1"`` or a comma list ``"1,2"``."""
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"--threads must be a positive int or a comma list of them. Received: {text!r}."
        )
    return list(dict.fromkeys(counts))


def _child(
    model: str, impl: str, a: argparse.Namespace, data: str, seed: int, threads: int
) -> dict[str, Any]:
    steps = a.steps if model != "deepfm" else a.deepfm_steps
    cmd = [
        sys.executable, __file__, "--child", "--model", model, "--impl", impl,
        "--threads", str(threads), "--steps", str(steps),
        "--test-steps", str(a.test_steps), "--warmup", str(a.warmup), "--data", data,
        "--seed", str(seed),
    ]  # fmt: skip
    if impl == "tnrec" and (a.split or a.split_only):
        cmd += ["--split", "--split-steps", str(a.split_steps)]
    env = dict(
        os.environ,
        NUMBA_NUM_THREADS=str(threads),
        OMP_NUM_THREADS=str(threads),
        TNREC_TABLE_THREADS=str(threads),
    )
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout_s)
    if r.returncode != 0:
        return {"model": model, "impl": impl, "error": r.stderr.strip()[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _run_set(
    a: argparse.Namespace, threads: int, models: list[str], impls: list[str], data_dir: str
) -> dict[str, dict[str, list[dict]]]:
    """Run every (model, repeat, implementation) at ``threads``, repeats interleaved."""
    repeats = 1 if a.split_only else a.repeats
    results: dict[str, dict[str, list[dict]]] = {m: {i: [] for i in impls} for m in models}
    t_start = time.time()
    for model in models:
        for r in range(repeats):
            for impl in impls:
                res = _child(model, impl, a, data_dir, r, threads)
                results[model][impl].append(res)
                msg = res.get("error", "").splitlines()[-1:] or [
                    f"{res['samples_per_s'] / 1e6:.3f} M samples/s; {_summary(res.get('machine'))}"
                ]
                print(f"[{time.time() - t_start:6.0f} s] threads {threads} {model} {impl} r{r}: "
                      f"{msg[0]}", file=sys.stderr, flush=True)  # fmt: skip
    return results


def _summary(machine: dict | None) -> str:
    return MachineState.from_dict(machine).summary() if machine else "machine state missing"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="micro,zipf,deepfm")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--threads",
        type=_thread_counts,
        default=[1],
        help="torch and numba threads per run; a comma list (1,2) runs everything once per count",
    )
    p.add_argument("--steps", type=int, default=60, help="training steps of micro/zipf")
    p.add_argument("--deepfm-steps", type=int, default=30)
    p.add_argument("--test-steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="steps not timed")
    p.add_argument("--split", action="store_true", help="also print tnrec's per-part split")
    p.add_argument("--split-only", action="store_true", help="tnrec with its split, 1 repeat")
    p.add_argument("--split-steps", type=int, default=20)
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--out", help="write every figure as JSON")
    add_strict_flag(p)
    # child mode
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    p.add_argument("--data", default="", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        a.threads = a.threads[0]  # the parent passes one count
        with MachineWatch() as watch:
            res = run_one(a)
        res["machine"] = watch.state.to_dict()
        print(json.dumps(res))
        return 0
    models = a.models.split(",")
    impls = ["tnrec"] if a.split_only else a.impls.split(",")
    skipped = _has_torchrec() if "torchrec" in impls else None
    if skipped:
        print(f"TorchRec column skipped: {skipped}", file=sys.stderr)
        impls = [i for i in impls if i != "torchrec"]
    data_dir = Path(tempfile.gettempdir()) / f"tnrec_compare_deepfm_{a.deepfm_steps}_{a.test_steps}"
    new_memory = [new_memory_ms_per_mib()]
    with MachineWatch() as whole:  # the children are waited for: their CPU is the bench's own
        if "deepfm" in models:
            deepfm_data(data_dir, a.deepfm_steps, a.test_steps)
        by_threads = {t: _run_set(a, t, models, impls, str(data_dir)) for t in a.threads}
    new_memory.append(new_memory_ms_per_mib())
    check_runs(
        [run for t, res in by_threads.items() for run in machine_runs(res, f"threads {t}: ")],
        a.strict,
    )
    import torch

    print(
        f"machine: {cpu_line()}, {os.cpu_count()} CPUs; "
        f"load average {whole.state.load1_before:.2f} before the benchmark, "
        f"{whole.state.load1_after:.2f} after, others {whole.state.other_cores:.2f} cores "
        "over it; new memory "
        f"{new_memory[0]:.2f} ms/MiB before, {new_memory[1]:.2f} after (machine_state."
        f"new_memory_ms_per_mib); torch {torch.__version__}; {a.steps} micro steps / "
        f"{a.deepfm_steps} DeepFM steps of {B}, {a.warmup} untimed"
    )
    for t, results in by_threads.items():
        print(f"\nthreads {t} (torch, numba, OpenMP and tnrec's tables, each run)")
        print(report(results, skipped))
    if a.out:
        doc: dict[str, Any] = {
            "args": vars(a),
            "machine": {**whole.state.to_dict(), "new_memory_ms_per_mib": new_memory},
        }
        doc["by_threads"] = {str(t): res for t, res in by_threads.items()}
        if len(by_threads) == 1:  # also the layout the file had before --threads took a list
            doc["results"] = by_threads[a.threads[0]]
        Path(a.out).write_text(json.dumps(doc, indent=1))
    failed = any(
        "error" in r
        for res in by_threads.values()
        for m in res.values()
        for rs in m.values()
        for r in rs
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
