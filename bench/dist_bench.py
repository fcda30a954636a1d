"""Distributed step of DeepFM on W = 1 and 2 workers: time split and bytes on the wire.

One command, one table::

    python bench/dist_bench.py                  # about 2 minutes on the 2-core machine
    python bench/dist_bench.py --steps 20 --batch 4096 --worlds 1 2

Each worker runs ``tnrec.models.DeepFM`` (26 categorical Criteo-like columns
with Zipf ids, dim 16, MLP 400-400-400, 13 dense features) on its own batch
of ``--batch`` rows per step, with one intra-op thread, under ``torchrun`` on
127.0.0.1 (gloo). Per step: exchange (time inside all_to_all: key counts,
keys, rows, gradients), all-reduce (loss normaliser, dense gradients,
statistics), and the rest of pull, forward/backward and push, measured on
rank 0. Bytes are what rank 0 sent to other workers in all_to_all calls,
against the minimum the design allows: 8 bytes per key sent to another
owner, 4*D bytes per row returned to another worker, 4*D + 8 per pushed key
to another owner; the dense all-reduce (ring: 2*(W-1)/W of its size) is
listed apart. Each world's run records the machine's state (``machine_state.py``):
"others" is the cores other processes kept busy during it, ``*`` marks a run
taken on a busy machine, ``--strict`` refuses the figures instead.

Then each world trains ``fit`` unpipelined and pipelined on fresh models over
the same lazily made batches and prints a second table: per-phase times
(read+hash, dedup, route, pull, push, compute), the input time, what the steps
waited for it and the share of it the pipeline hid (``pipeline_phases.py``;
``--no-pipeline`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np
import torch

from machine_state import MachineState, MachineWatch, add_strict_flag, check_runs, mark
from pipeline_phases import measure, print_table
from torchrun import torchrun_command

NUM_CAT, NUM_DENSE, DIM = 26, 13, 16


def _batches(rank: int, steps: int, batch: int, seed: int = 0):
    """Hashed Criteo-like batches: each column draws Zipf ids from its own key space."""
    from tnrec.data.batch import Batch, Jagged
    from tnrec.table import mix64

    rng = np.random.default_rng(seed * 1000 + rank)
    out = []
    offsets = np.arange(batch + 1, dtype=np.int64)
    for _ in range(steps):
        sparse = {}
        for c in range(NUM_CAT):
            ids = (rng.zipf(1.1, batch) % 1_000_000).astype(np.int64)
            sparse[f"C{c + 1}"] = Jagged(mix64(ids + (c << 40)).view(np.int64), offsets)
        dense = rng.normal(size=(batch, NUM_DENSE)).astype(np.float32)
        y = (rng.random(batch) < 0.2).astype(np.float32)
        out.append(
            Batch(
                sparse,
                dense,
                tuple(f"I{i + 1}" for i in range(NUM_DENSE)),
                y[:, None],
                ("label",),
                None,
                np.arange(batch, dtype=np.int64),
            )
        )
    return out


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    import tnrec as tn
    from tnrec.models import DeepFM

    strategy = tn.distribute.PsStrategy(timeout_s=300)
    rank, world = strategy.rank, strategy.world_size
    torch.manual_seed(0)
    model = DeepFM(tn.data.criteo_columns(), embedding_dim=DIM, hidden_units=(400, 400, 400))
    model.compile()
    data = _batches(rank, args.warmup + args.steps, args.batch)
    for b in data[: args.warmup]:
        model.train_step(b)
    comm = getattr(model.ps, "comm", None)
    if comm is not None:
        comm.bytes_sent, comm.seconds = 0, {}
    t = {"pull": 0.0, "forward/backward": 0.0, "push": 0.0, "dense step": 0.0}
    minimum = 0
    params = [p for p in model.parameters() if p.requires_grad]
    dense_bytes = 4 * sum(p.numel() for p in params)
    start = time.perf_counter()
    for b in data[args.warmup :]:
        t0 = time.perf_counter()
        rows, weight = model._global_size(b, "dist_bench")  # `where`: names the step in errors
        step = model.pull(b)
        t1 = time.perf_counter()
        loss, _ = model.compute_loss(b, model(b), norm=weight)
        model.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        model.ps.all_reduce_grads(params, np.zeros(1))
        t2 = time.perf_counter()
        model.push()
        t3 = time.perf_counter()
        model.optimizer.step()
        t4 = time.perf_counter()
        t["pull"] += t1 - t0
        t["forward/backward"] += t2 - t1
        t["push"] += t3 - t2
        t["dense step"] += t4 - t3
        if world > 1:
            from tnrec.ps import owner_of

            for name, tm in step.items():
                remote = int((owner_of(tm.keys, world) != rank).sum())
                D = model.tables[name].dim
                minimum += remote * (8 + 4 * D + 8)  # keys out, gradients + show/click out
            # rows this worker returns to others: counted on the requesters' side symmetrically
            for name, own in model.ps._own.items():
                D = model.tables[name].dim
                minimum += 4 * D * int(own.counts.sum() - own.counts[rank])
    total = time.perf_counter() - start
    n = args.steps
    seconds = dict(comm.seconds) if comm is not None else {}
    pipelined = [] if args.no_pipeline else _pipeline_runs(args, rank)  # every worker: collectives
    exchange = sum(v for k, v in seconds.items() if k.startswith(("pull:", "push:")))
    allreduce = sum(v for k, v in seconds.items() if k.startswith("all-reduce"))
    if rank == 0:
        result = {
            "world": world,
            "step_ms": 1000 * total / n,
            "samples_per_s_per_worker": args.batch * n / total,
            "samples_per_s_total": world * args.batch * n / total,
            "split_ms": {k: 1000 * v / n for k, v in t.items()},
            "exchange_ms": 1000 * exchange / n,
            "allreduce_ms": 1000 * allreduce / n,
            "bytes_sent_per_step": (comm.bytes_sent / n) if comm is not None else 0,
            "bytes_minimum_per_step": minimum / n,
            "dense_allreduce_bytes": 2 * (world - 1) / world * dense_bytes,
            "pipeline": pipelined,
        }
        with open(args.out, "w") as f:
            json.dump(result, f)
    strategy.shutdown()


def _pipeline_runs(args: argparse.Namespace, rank: int) -> list[dict]:
    """fit unpipelined, then pipelined, each on a fresh, warmed-up DeepFM (pipeline_phases.py)."""
    import tnrec as tn
    from tnrec.models import DeepFM

    runs = []
    for pipeline in (False, True):
        torch.manual_seed(0)
        model = DeepFM(tn.data.criteo_columns(), embedding_dim=DIM, hidden_units=(400, 400, 400))
        model.compile()
        for b in _batches(rank, args.warmup, args.batch):
            model.train_step(b)
        make = lambda i: _batches(rank, 1, args.batch, seed=1000 + i)[0]  # noqa: E731
        runs.append(measure(model, make, args.steps, pipeline))
    return runs


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--no-pipeline", action="store_true", help="skip the input pipeline table")
    add_strict_flag(p)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for world in args.worlds:
            out = os.path.join(d, f"w{world}.json")
            cmd = torchrun_command(
                world,
                os.path.abspath(__file__),
                "--worker",
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                "--batch",
                str(args.batch),
                "--out",
                out,
                *(["--no-pipeline"] if args.no_pipeline else []),
            )
            env = dict(os.environ, OMP_NUM_THREADS="1")
            with MachineWatch() as watch:  # torchrun and its workers are waited for: own CPU
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            with open(out) as f:
                rows.append({**json.load(f), "machine": watch.state})
    states: list[tuple[str, MachineState | None]] = [
        (f"W={r['world']}: {r['samples_per_s_total']:,.0f} samples/s", r["machine"]) for r in rows
    ]
    check_runs(states, args.strict)
    print(
        f"DeepFM, batch {args.batch} per worker, {args.steps} steps, 1 thread per worker, "
        f"load average {os.getloadavg()[0]:.1f}; others = cores other processes kept busy "
        "during the run"
    )
    head = (
        f"{'W':>2} {'step ms':>8} {'samples/s':>10} {'pull':>6} {'fwd/bwd':>8} {'push':>6} "
        f"{'dense':>6} {'exch ms':>8} {'allred ms':>9} {'MB sent':>8} {'MB min':>7} {'ratio':>6} "
        f"{'dense AR MB':>11} {'others':>7} {'load':>9}"
    )
    print(head)
    for r in rows:
        s, st = r["split_ms"], r["machine"]
        sent, mini = r["bytes_sent_per_step"] / 1e6, r["bytes_minimum_per_step"] / 1e6
        ratio = f"{sent / mini:.2f}" if mini else "-"
        print(
            f"{r['world']:>2} {r['step_ms']:>8.1f} {r['samples_per_s_total']:>10,.0f} "
            f"{s['pull']:>6.1f} {s['forward/backward']:>8.1f} {s['push']:>6.1f} "
            f"{s['dense step']:>6.1f} {r['exchange_ms']:>8.1f} {r['allreduce_ms']:>9.1f} "
            f"{sent:>8.2f} {mini:>7.2f} {ratio:>6} {r['dense_allreduce_bytes'] / 1e6:>11.2f} "
            f"{st.other_cores:>6.2f}{mark(st) or ' '} {st.load1_before:>4.2f}/{st.load1_after:.2f}"
        )
    for line in check_runs(states, strict=False):
        print(line)
    if not args.no_pipeline:
        print_table([{**run, "world": r["world"]} for r in rows for run in r["pipeline"]])


if __name__ == "__main__":
    main()
