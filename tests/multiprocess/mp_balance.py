"""Balanced epochs (``fit(balance=True)``) run by every worker under torchrun.

Run as ``torchrun --nproc-per-node W mp_balance.py SCENARIO OUT_DIR DATA_DIR [ARGS]``;
each worker writes ``OUT_DIR/<scenario>-rank<r>.npz``. ``DATA_DIR`` holds the
Parquet files :func:`write_files` wrote.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import tnrec as tn
from tnrec.table import AdaGrad

fc = tn.feature_column
BATCH = 4


def write_files(data_dir: str, sizes: list[int], group: int = 8) -> list[str]:
    """Parquet files of ``sizes[i]`` rows, in row groups of ``group`` rows."""
    paths = []
    for i, n in enumerate(sizes):
        rng = np.random.default_rng(i)
        table = pa.table(
            {
                "user": pa.array(rng.integers(0, 50, n), pa.int64()),
                "item": pa.array(rng.integers(0, 20, n) + (1 << 40), pa.int64()),
                "d0": pa.array(rng.normal(size=n), pa.float64()),
                "label": pa.array(rng.integers(0, 2, n).astype(float), pa.float64()),
            }
        )
        path = os.path.join(data_dir, f"part-{i:02d}.parquet")
        pq.write_table(table, path, row_group_size=group)
        paths.append(path)
    return paths


def reader(data_dir: str, **kw: object) -> tn.data.Reader:
    files = sorted(
        os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".parquet")
    )
    cols = [fc.category_column("user"), fc.category_column("item"), fc.numeric_column("d0")]
    return tn.data.read_parquet(files, cols, batch_size=BATCH, prefetch=1, **kw)


class RowModel(tn.Model):
    """A small model that records the row ids of every batch ``fit`` hands it."""

    def __init__(self) -> None:
        super().__init__()
        user, item = fc.category_column("user"), fc.category_column("item")
        self.e = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(user, 4), fc.embedding_column(item, 4)],
            AdaGrad(0.1),
            output="concat",
        )
        self.mlp = torch.nn.Linear(9, 1)
        self.steps_rows: list[np.ndarray] = []

    def forward_dense(self, pooled, dense):
        return self.mlp(torch.cat([pooled["e"], dense], 1))

    def train_step(self, batch):
        self.steps_rows.append(batch.row_ids.copy())
        return super().train_step(batch)


def model() -> RowModel:
    torch.manual_seed(0)
    m = RowModel()
    m.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    return m


def _rows(m: RowModel) -> np.ndarray:
    return np.concatenate(m.steps_rows) if m.steps_rows else np.zeros(0, np.int64)


def run_rows(rank: int, world: int, data_dir: str, args: list[str]) -> dict[str, np.ndarray]:
    """One static and one balanced epoch (two with shuffle): rows trained and steps taken."""
    out = {}
    for name, balance in (("static", False), ("balanced", True)):
        m = model()
        m.fit(reader(data_dir), verbose=0, balance=balance)
        out[f"{name}/rows"] = _rows(m)
        out[f"{name}/steps"] = np.array(len(m.steps_rows))
    m = model()
    shuffled = reader(data_dir, shuffle=True, seed=5, shuffle_buffer_rows=8)
    m.fit(shuffled, epochs=2, verbose=0, balance=True)
    out["shuffled/rows"] = _rows(m)
    return out


class Crash(tn.callbacks.Callback):
    """Raise at step ``n`` on every worker: the job dies after its checkpoint."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_train_batch_end(self, step, logs=None):
        if step == self.n:
            raise RuntimeError("crash")


def run_resume(rank: int, world: int, data_dir: str, args: list[str]) -> dict[str, np.ndarray]:
    """Checkpoint every ``save`` steps, die at step ``crash``; ``phase`` 2 resumes from it."""
    phase, save, crash, ckpt = int(args[0]), int(args[1]), int(args[2]), args[3]
    data = reader(data_dir, shuffle=True, seed=2, shuffle_buffer_rows=8)
    m = model()
    if phase == 1:
        cb = tn.callbacks.Checkpoint(ckpt, "d", save_every_n_steps=save, save_at_end=False)
        try:
            m.fit(data, verbose=0, balance=True, callbacks=[cb, Crash(crash)])
        except RuntimeError:
            pass
        saved = (crash // save) * save
        return {"rows": np.concatenate(m.steps_rows[:saved]), "steps": np.array(saved)}
    cb = tn.callbacks.Checkpoint(ckpt, "d", save_at_end=False)
    m.fit(data, verbose=0, balance=True, callbacks=[cb])
    return {"rows": _rows(m), "steps": np.array(len(m.steps_rows))}


def run_errors(rank: int, world: int, data_dir: str, args: list[str]) -> dict[str, np.ndarray]:
    """The ArgumentErrors of balance=True on several workers, printed by rank 0."""
    m = model()
    cases = {
        "list": lambda: m.fit([reader(data_dir).empty_batch()], verbose=0, balance=True),
        "split": lambda: m.fit(reader(data_dir).split(rank, world), verbose=0, balance=True),
        "pipeline": lambda: m.fit(reader(data_dir), verbose=0, balance=True, pipeline=True),
    }
    for name, case in cases.items():
        try:
            case()
            print(f"{name}: no error", flush=True)
        except tn.errors.ArgumentError as e:
            if rank == 0:
                print(f"{name}: ArgumentError: {e}", flush=True)
    return {}


SCENARIOS = {"rows": run_rows, "resume": run_resume, "errors": run_errors}


def main() -> None:
    scenario, out_dir, data_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    mode = "async" if scenario == "async" else "sync"
    strategy = tn.distribute.PsStrategy(timeout_s=60.0, mode=mode)
    if scenario == "async":
        try:
            model().fit(reader(data_dir), verbose=0, balance=True)
            print("async: no error", flush=True)
        except tn.errors.ArgumentError as e:
            print(f"async: ArgumentError: {e}", flush=True)
        out: dict[str, np.ndarray] = {}
    else:
        out = SCENARIOS[scenario](strategy.rank, strategy.world_size, data_dir, sys.argv[4:])
    np.savez(os.path.join(out_dir, f"{scenario}-rank{strategy.rank}.npz"), **out)
    strategy.shutdown()


if __name__ == "__main__":
    main()
