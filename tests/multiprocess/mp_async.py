"""Async-mode scenarios run by every worker under torchrun.

Run as ``torchrun --nproc-per-node W mp_async.py SCENARIO OUT_DIR [ARGS...]``;
each worker writes ``OUT_DIR/<scenario>-rank<r>.npz``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run by torchrun as a script: import the tests package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tnrec as tn  # noqa: E402
from tests.multiprocess.mp_scenarios import (  # noqa: E402
    OPTIMIZERS,
    ContractModel,
    contract,
    global_batch,
    worker_slice,
)

STEPS = 30


def part_of(rank: int, world: int, steps: int) -> list:
    """This worker's slices of ``steps`` global batches; rank 0 gets twice the steps."""
    n = steps * 2 if rank == 0 else steps
    return [worker_slice(global_batch(step), step, rank, world) for step in range(n)]


def occurrences(batches: list, columns: dict[str, list[str]]) -> dict[str, dict[int, float]]:
    """Each table's keys with their summed sample weight over ``batches`` (the show a push adds)."""
    out: dict[str, dict[int, float]] = {}
    for batch in batches:
        for table, cols in columns.items():
            counts = out.setdefault(table, {})
            for col in cols:
                jag = batch.sparse[col]
                rows = np.repeat(np.arange(batch.size), np.diff(jag.offsets))
                for k, r in zip(jag.keys.tolist(), rows.tolist(), strict=True):
                    counts[k] = counts.get(k, 0.0) + float(batch.weights[r])
    return out


class Sleepy(tn.callbacks.Callback):
    """The straggler: sleeps ``seconds`` after every step."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, step, logs=None):
        time.sleep(self.seconds)


def _dump(model: tn.Model, out: dict, prefix: str) -> None:
    for name, p in model.named_parameters():
        out[f"{prefix}/dense/{name}"] = p.detach().numpy().copy()
    for tname, table in model.tables.items():
        for k, v in table.rows().items():
            out[f"{prefix}/table/{tname}/{k}"] = v


def run_train(rank: int, world: int, args: list[str]) -> dict[str, np.ndarray]:
    """Fit two epochs on uneven parts (rank 0 has twice the steps), save, report."""
    sleep_s, ckpt = float(args[0]), args[1]
    torch.manual_seed(0)
    model = ContractModel(OPTIMIZERS["adagrad"]())
    model.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
    part = part_of(rank, world, STEPS)
    cbs = [Sleepy(sleep_s)] if sleep_s > 0 and rank == world - 1 else []
    start = time.perf_counter()
    model.fit(part, epochs=2, callbacks=cbs, verbose=0)
    seconds = time.perf_counter() - start
    ps = model.ps
    out = {
        "steps": np.array(model.global_step),
        "seconds": np.array(seconds),
        "max_outstanding": np.array(getattr(ps, "max_outstanding", -1)),
        "pushes_applied": np.array(getattr(ps, "pushes_applied", -1)),
        "asynchronous": np.array(ps.asynchronous),
    }
    _dump(model, out, "trained")
    flat = {
        k: np.concatenate([st[k].reshape(-1).numpy() for st in model.optimizer.state.values()])
        for k in ("exp_avg", "exp_avg_sq")
    }
    out.update({f"opt/{k}": v for k, v in flat.items()})
    out["opt/step"] = np.array(
        [float(st["step"]) for st in model.optimizer.state.values()], np.float64
    )
    counts = occurrences(part, {"shared": ["user", "tags", "item"], "c": ["user", "item"]})
    for table, got in counts.items():
        out[f"occ/{table}/keys"] = np.array(list(got), np.int64)
        out[f"occ/{table}/show"] = np.array(list(got.values()), np.float64) * 2  # two epochs
    model.save_weights(ckpt, "2024-05-10")
    return out


def run_crash(rank: int, world: int, args: list[str]) -> dict[str, np.ndarray]:
    """Rank 1 dies in its fourth step; rank 0 must fail with a DistributedError, not hang."""
    torch.manual_seed(0)
    model = ContractModel(OPTIMIZERS["adagrad"]())
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")

    class Die(tn.callbacks.Callback):
        def on_train_batch_begin(self, step, logs=None):
            if rank == 1 and step == 4:
                os._exit(7)

    try:
        model.fit(part_of(rank, world, STEPS), callbacks=[Die()], verbose=0)
    except tn.errors.DistributedError as e:
        print(f"DistributedError: {e}", flush=True)
        sys.exit(3)
    return {}


def run_k0(rank: int, world: int, args: list[str]) -> dict[str, np.ndarray]:
    """``staleness=0`` runs sync mode: the contract scenario's results."""
    return contract("adagrad", rank, world)


def run_resume(rank: int, world: int, args: list[str]) -> dict[str, np.ndarray]:
    """Load a checkpoint (written in sync mode by one process), dump it, train one async epoch."""
    torch.manual_seed(1)  # other initial dense weights than the checkpoint's
    model = ContractModel(OPTIMIZERS["adagrad"]())
    model.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
    model.load_weights(args[0])
    out: dict[str, np.ndarray] = {}
    _dump(model, out, "loaded")
    out["loaded/opt/step"] = np.array(
        [float(st["step"]) for st in model.optimizer.state.values()], np.float64
    )
    model.fit(part_of(rank, world, 10), verbose=0)
    _dump(model, out, "trained")
    out["trained/opt/step"] = np.array(
        [float(st["step"]) for st in model.optimizer.state.values()], np.float64
    )
    return out


def run_empty(rank: int, world: int, args: list[str]) -> dict[str, np.ndarray]:
    """Rank 1 has no batch at all: rank 0 trains its part, the epoch still ends on both."""
    torch.manual_seed(0)
    model = ContractModel(OPTIMIZERS["adagrad"]())
    model.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
    part = part_of(rank, world, 10) if rank == 0 else []
    model.fit(part, epochs=2, verbose=0)
    out = {"steps": np.array(model.global_step)}
    _dump(model, out, "trained")
    return out


SCENARIOS = {
    "empty": run_empty,
    "train": run_train,
    "crash": run_crash,
    "k0": run_k0,
    "resume": run_resume,
}


def main() -> None:
    scenario, out_dir, staleness = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    strategy = tn.distribute.PsStrategy(timeout_s=60.0, mode="async", staleness=staleness)
    out = SCENARIOS[scenario](strategy.rank, strategy.world_size, sys.argv[4:])
    np.savez(os.path.join(out_dir, f"{scenario}-rank{strategy.rank}.npz"), **out)
    strategy.shutdown()


if __name__ == "__main__":
    main()
