"""Checkpoint save/load throughput of one sparse table (the documented case: 10M keys, dim 16).

    NUMBA_CACHE_DIR=.numba_cache python bench/checkpoint_bench.py --keys 10000000 --dim 16

Builds a one-table model (row-wise AdaGrad), creates ``--keys`` rows, then times
``model.save_weights`` (write, fsync, sha256, publish) and ``load_weights`` into
a fresh model (checksums verified, rows re-inserted into the hash index), and
prints MB/s over the checkpoint's bytes on disk. Single process. The save and
the load each record the machine's state (``machine_state.py``, printed under
the table); a figure taken while other processes kept the machine busy is
marked ``*``, and ``--strict`` refuses it instead.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time

import numpy as np
import torch

import tnrec as tn
from machine_state import MachineWatch, add_strict_flag, check_runs, mark


class OneTable(tn.Model):
    def __init__(self, dim: int) -> None:
        super().__init__()
        col = tn.feature_column.category_column("id", dtype="int")
        self.emb = tn.layers.EmbeddingFeatures(
            [tn.feature_column.embedding_column(col, dimension=dim)],
            sparse_optimizer=tn.optimizer.AdaGrad(learning_rate=0.05),
            name="emb",
        )
        self.out = torch.nn.Linear(dim, 1)

    def forward_dense(self, pooled, dense):  # type: ignore[no-untyped-def]
        return self.out(pooled["emb"]).squeeze(-1)


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _model(dim: int) -> OneTable:
    m = OneTable(dim)
    m.compile(dense_optimizer=tn.optimizer.Adam(1e-3), loss="binary_crossentropy_from_logits")
    return m


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--dir", default=None, help="checkpoint root (default: a temp dir)")
    add_strict_flag(p)
    args = p.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="tnrec-ckpt-bench-")
    torch.set_num_threads(1)
    model = _model(args.dim)
    table = model.tables["emb"]
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    chunk = 1_000_000
    for lo in range(0, args.keys, chunk):
        n = min(chunk, args.keys - lo)
        table.pull(rng.integers(-(2**62), 2**62, n, dtype=np.int64), create=True)
    fill_s = time.perf_counter() - t0
    print(f"table: {len(table):,} keys, dim {args.dim}, filled in {fill_s:.1f} s")
    with MachineWatch() as save_watch:
        t0 = time.perf_counter()
        path = model.save_weights(root, "2024-05-10")
        save_s = time.perf_counter() - t0
    size = _dir_bytes(path)
    del model, table
    fresh = _model(args.dim)
    with MachineWatch() as load_watch:
        t0 = time.perf_counter()
        fresh.load_weights(root)
        load_s = time.perf_counter() - t0
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    mb = size / 2**20
    save, load = save_watch.state, load_watch.state
    states = [(f"save: {mb / save_s:,.0f} MB/s", save), (f"load: {mb / load_s:,.0f} MB/s", load)]
    check_runs(states, args.strict)
    print(f"checkpoint: {mb:,.0f} MB on disk in {path}")
    print("| keys | dim | MB | save s | save MB/s | load s | load MB/s | peak RSS GB |")
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {len(fresh.tables['emb']):,} | {args.dim} | {mb:,.0f} | {save_s:.1f} | "
        f"{mb / save_s:,.0f}{mark(save)} | {load_s:.1f} | {mb / load_s:,.0f}{mark(load)} | "
        f"{rss_gb:.1f} |"
    )
    print(f"machine during the save: {save.summary()}; during the load: {load.summary()}")
    for line in check_runs(states, strict=False):
        print(line)
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
