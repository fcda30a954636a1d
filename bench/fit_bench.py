"""tnrec's ``fit`` over the Parquet reader against TorchRec's steady step, micro and Zipf ids.

``bench/compare.py`` times steps over batches built beforehand. This one times
what a user runs: ``model.fit(tn.data.read_parquet(...), epochs=2)`` on the
micro/Zipf models of ``compare.py`` (2 columns, dim 16, ``Linear(32, 1)``,
row-wise AdaGrad, Adam, batch 4096), the ids written to one Parquet file:

* **epoch 1** starts from empty tables, so every step creates the rows of its
  new keys (micro: almost every key; Zipf: the rare ones); the process's
  one-time start-up (the table's and the reader's numba kernels loaded from
  the cache, the reader's first open) is done before it, and the step's
  other kernels (batch layout, de-duplication, show and click, one-key
  pooling) load in its first step;
* **epoch 2** reads the same file again: every row exists (steady state).

samples/s of an epoch is its rows over its wall time, reading, hashing and
de-duplication included; ``pipeline=False`` is the same loop without
``fit``'s input pipeline. The baseline is TorchRec's ``FusedEmbeddingBagCollection``
steady state (its second pass over the batches, prebuilt, hashing outside the
timed step, as in ``compare.py``) -- the figure the issue's ratios are taken
against. Every run is its own interpreter, repeats interleaved (r0: every
configuration, then r1, ...), and records the machine's state
(``machine_state.py``): a run marked ``*`` was taken while other processes
kept a core busy; ``--strict`` refuses such figures.

    NUMBA_CACHE_DIR=.numba_cache python3 bench/fit_bench.py               # ~4 minutes
    python3 bench/fit_bench.py --models micro --threads 1,2 --repeats 3 --strict
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

import numpy as np

from machine_state import MachineState, MachineWatch, add_strict_flag, check_runs, cpu_line, mark

CONFIGS = ("tnrec", "tnrec-nopipe", "torchrec")


def write_data(root: Path, model: str, steps: int) -> Path:
    """Write the ``model``'s training batches of ``compare.py`` as ids in one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from compare_data import B, micro_batches

    path = root / f"{model}_{steps}.parquet"
    if path.exists():
        return path
    train, _, _ = micro_batches(model, steps, 0)
    # the reader hashes ids itself: write small int64 ids drawn like the batches' keys
    # (their keys are 64-bit hashes already); a key's id is its rank among the keys
    keys = np.concatenate([np.concatenate([b.sparse[c].keys for b in train]) for c in ("c0", "c1")])
    _, ids = np.unique(keys, return_inverse=True)
    n = len(train) * B
    table = pa.table(
        {
            "c0": ids[:n].astype(np.int64),
            "c1": ids[n:].astype(np.int64),
            "label": np.concatenate([b.labels[:, 0] for b in train]).astype(np.float32),
        }
    )
    pq.write_table(table, path, row_group_size=16 * B)
    return path


def run_child(a: argparse.Namespace) -> dict[str, Any]:
    """One configuration in this process: the figures of each epoch (or TorchRec's pass)."""
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    import tnrec as tn
    from compare_data import B, micro_batches
    from compare_impls import TnrecImpl, TorchrecImpl

    out: dict[str, Any] = {"config": a.config, "model": a.model, "threads": a.threads}
    if a.config == "torchrec":
        train, _, _ = micro_batches(a.model, a.steps, 0)
        impl = TorchrecImpl(a.model, train[0])
        for epoch in (1, 2):
            times = []
            for b in train:
                impl.inputs(b)  # hashing outside the timed step, as compare.py
                t0 = time.perf_counter()
                impl.train_step(b)
                times.append(time.perf_counter() - t0)
                impl.forget(b)
            out[f"epoch{epoch}_samples_per_s"] = B * len(times) / sum(times)
        return out

    class EpochClock(tn.callbacks.Callback):
        def __init__(self) -> None:
            self.t0 = 0.0
            self.walls: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.walls.append(time.perf_counter() - self.t0)

    model = TnrecImpl(a.model).model
    cols = model.embedding_layers()[0].columns
    reader = tn.data.read_parquet(a.data, [c.categorical for c in cols], batch_size=B)
    # One-time start-up outside the epochs, as TorchRec's figure has none: the table
    # kernels and the reader's hashing kernels loaded from numba's cache (about 0.25 s,
    # a third of a 60-step first epoch), pyarrow's first open of the file.
    from tnrec.table.warmup import warm

    warm()
    for _ in reader:
        break
    clock = EpochClock()
    model.fit(reader, epochs=2, callbacks=[clock], verbose=0, pipeline=a.config == "tnrec")
    rows = a.steps * B
    for epoch, wall in enumerate(clock.walls, start=1):
        out[f"epoch{epoch}_samples_per_s"] = rows / wall
    return out


def _child(cfg: str, model: str, threads: int, data: Path, a: argparse.Namespace, r: int) -> dict:
    cmd = [
        sys.executable, __file__, "--child", "--config", cfg, "--model", model,
        "--threads", str(threads), "--steps", str(a.steps), "--data", str(data), "--seed", str(r),
    ]  # fmt: skip
    env = dict(
        os.environ,
        NUMBA_NUM_THREADS=str(threads),
        OMP_NUM_THREADS=str(threads),
        TNREC_TABLE_THREADS=str(threads),
    )
    with MachineWatch() as watch:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout_s)
    if p.returncode != 0:
        return {"config": cfg, "error": p.stderr.strip()[-1500:]}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["machine"] = watch.state.to_dict()
    return res


def _median_range(values: list[float]) -> str:
    if not values:
        return "-"
    v = np.array(values) / 1e3
    return f"{np.median(v):7.1f} ({v.min():.1f}-{v.max():.1f})"


def report(results: dict[tuple[str, int], dict[str, list[dict]]]) -> list[str]:
    """The table, one row a (model, threads, configuration)."""
    lines = [
        "k samples/s: median (min-max) over the repeats; vs TorchRec = this epoch's samples/s "
        "over TorchRec's steady state (its second pass) in the same repeat, median (min-max)",
        "",
        f"{'model':6s} {'thr':>3s} {'config':13s} {'epoch 1 (creates rows)':>24s} "
        f"{'epoch 2 (rows exist)':>24s} {'e1 vs TorchRec':>18s} {'e2 vs TorchRec':>18s} "
        f"{'others':>6s}",
    ]
    for (model, threads), by_cfg in results.items():
        base = [r.get("epoch2_samples_per_s") for r in by_cfg.get("torchrec", [])]
        for cfg, runs in by_cfg.items():
            ok = [r for r in runs if "error" not in r]
            if len(ok) < len(runs):
                lines.append(f"{model:6s} {threads:3d} {cfg:13s} error: {runs[0].get('error', '')}")
                continue
            e1 = [r["epoch1_samples_per_s"] for r in ok]
            e2 = [r["epoch2_samples_per_s"] for r in ok]
            ratios = []
            for epoch in (e1, e2):
                rs = [x / b for x, b in zip(epoch, base, strict=False) if b]
                ratios.append(f"{np.median(rs):5.2f}x ({min(rs):.2f}-{max(rs):.2f})" if rs else "-")
            states = [MachineState.from_dict(r["machine"]) for r in ok]
            busy = "*" if any(mark(s) for s in states) else ""
            others = float(np.median([s.other_cores for s in states]))
            lines.append(
                f"{model:6s} {threads:3d} {cfg:13s} {_median_range(e1):>24s} "
                f"{_median_range(e2) + busy:>24s} {ratios[0]:>18s} {ratios[1]:>18s} "
                f"{others:6.2f}"
            )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="micro,zipf")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--threads", default="1,2", help="a comma list: each count is one set")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60, help="batches of 4096 an epoch")
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--out", help="write every figure as JSON")
    add_strict_flag(p)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        a.threads = int(a.threads)
        print(json.dumps(run_child(a)))
        return 0
    root = Path(tempfile.gettempdir()) / "tnrec_fit_bench"
    root.mkdir(exist_ok=True)
    configs = a.configs.split(",")
    threads = [int(t) for t in a.threads.split(",")]
    results: dict[tuple[str, int], dict[str, list[dict]]] = {}
    runs: list[tuple[str, MachineState | None]] = []
    load_before = os.getloadavg()[0]
    t_start = time.time()
    for model in a.models.split(","):
        data = write_data(root, model, a.steps)
        for t in threads:
            by_cfg = results.setdefault((model, t), {c: [] for c in configs})
            for r in range(a.repeats):
                for cfg in configs:
                    res = _child(cfg, model, t, data, a, r)
                    by_cfg[cfg].append(res)
                    state = MachineState.from_dict(res["machine"]) if "machine" in res else None
                    runs.append((f"{model} threads {t} {cfg} r{r}", state))
                    what = res.get("error", "").splitlines()[-1:] or [
                        f"{res['epoch1_samples_per_s'] / 1e3:.0f} / "
                        f"{res['epoch2_samples_per_s'] / 1e3:.0f} k samples/s; "
                        f"{state.summary() if state else ''}"
                    ]
                    print(f"[{time.time() - t_start:5.0f} s] {model} t{t} {cfg} r{r}: {what[0]}",
                          file=sys.stderr, flush=True)  # fmt: skip
    notes = check_runs(runs, a.strict)
    print(
        f"machine: {cpu_line()}, {os.cpu_count()} CPUs; load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after; {a.steps} steps of 4096 an epoch, {a.repeats} repeats"
    )
    print("\n".join(report(results)))
    for line in notes:
        print(line)
    if a.out:
        flat = {f"{m} {t}": v for (m, t), v in results.items()}
        Path(a.out).write_text(json.dumps({"args": vars(a), "results": flat}, indent=1))
    failed = any("error" in r for v in results.values() for rs in v.values() for r in rs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
