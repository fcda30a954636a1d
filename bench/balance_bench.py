"""Balanced epochs at W = 2: an uneven epoch, static against ``fit(balance=True)``.

One command, one table::

    python bench/balance_bench.py                 # well under a minute on 2 cores
    python bench/balance_bench.py --rows 200000 --batch 1024 --group 8192

Three epochs of the same ``--rows`` rows, each on a fresh model, under
``torchrun`` on 127.0.0.1 (gloo), one intra-op thread per worker:

* ``static``: two Parquet files, 3/4 and 1/4 of the rows: the static split
  gives rank 0 three times rank 1's rows, and rank 1 joins with empty
  batches once its part is done;
* ``balanced``: the same files with ``balance=True`` (units of row groups
  handed out as workers run dry);
* ``balanced data``: two files of 1/2 each, static: the target.

Steps are what every worker took; seconds are rank 0's ``fit`` (after one
warm-up epoch that loads the kernels). Time figures need a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np

from torchrun import torchrun_command


def _write(path: str, n: int, seed: int, group: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    cols = {f"C{c}": pa.array(rng.zipf(1.2, n) % 100_000 + (c << 40)) for c in range(8)}
    cols.update({f"I{i}": pa.array(rng.normal(size=n)) for i in range(4)})
    cols["label"] = pa.array((rng.random(n) < 0.2).astype(float))
    pq.write_table(pa.table(cols), path, row_group_size=group)


def _files(root: str, rows: int, shares: list[int], group: int) -> list[str]:
    paths = []
    for i, share in enumerate(shares):
        path = os.path.join(root, f"part-{i}.parquet")
        _write(path, rows * share // sum(shares), i, group)
        paths.append(path)
    return paths


def worker(args: argparse.Namespace) -> None:
    import torch

    import tnrec as tn

    torch.set_num_threads(1)
    strategy = tn.distribute.PsStrategy(timeout_s=120.0)
    fc = tn.feature_column
    cats = [fc.category_column(f"C{c}") for c in range(8)]
    dense = [fc.numeric_column(f"I{i}") for i in range(4)]

    class Net(tn.Model):
        def __init__(self) -> None:
            super().__init__()
            self.e = tn.layers.EmbeddingFeatures(
                [fc.embedding_column(c, 8) for c in cats], tn.table.AdaGrad(0.05), output="concat"
            )
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(8 * 8 + 4, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
            )
            self.steps = 0

        def forward_dense(self, pooled, d):
            return self.mlp(torch.cat([pooled["e"], d], 1))

        def train_step(self, batch):
            self.steps += 1
            return super().train_step(batch)

    def epoch(files: list[str], balance: bool) -> tuple[int, float]:
        torch.manual_seed(0)
        m = Net()
        m.compile(tn.optimizer.Adam(0.001), loss="binary_crossentropy_from_logits")
        data = tn.data.read_parquet(files, [*cats, *dense], batch_size=args.batch)
        t0 = time.perf_counter()
        m.fit(data, verbose=0, balance=balance)
        return m.steps, time.perf_counter() - t0

    root = args.out + ".data"
    uneven = sorted(os.path.join(root, "uneven", f) for f in os.listdir(f"{root}/uneven"))
    even = sorted(os.path.join(root, "even", f) for f in os.listdir(f"{root}/even"))
    epoch(even, False)  # warm-up: numba's kernels, pyarrow's first open
    runs = {
        "static": epoch(uneven, False),
        "balanced": epoch(uneven, True),
        "balanced data": epoch(even, False),
    }
    if strategy.rank == 0:
        with open(args.out, "w") as f:
            json.dump(runs, f)
    strategy.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=48_000)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--group", type=int, default=4096, help="Parquet row group rows")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "runs.json")
        for name, shares in (("uneven", [3, 1]), ("even", [1, 1])):
            os.makedirs(f"{out}.data/{name}")
            _files(f"{out}.data/{name}", args.rows, shares, args.group)
        cmd = torchrun_command(
            2, os.path.abspath(__file__), "--worker", f"--batch={args.batch}", f"--out={out}"
        )
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(out) as f:
            runs = json.load(f)
    base = runs["balanced data"][1]
    print(
        f"W=2, {args.rows} rows, batch {args.batch} per worker, row groups of {args.group}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'epoch':<14} {'steps':>6} {'seconds':>8} {'x balanced data':>16}")
    for name, (steps, secs) in runs.items():
        print(f"{name:<14} {steps:>6} {secs:>8.2f} {secs / base:>16.2f}")


if __name__ == "__main__":
    main()
