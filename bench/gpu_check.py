"""The dense part on a GPU: equivalence with the CPU, DeepFM samples/s, and where a step goes.

    python3 bench/gpu_check.py                          # ~2 minutes with a GPU
    python3 bench/gpu_check.py --batches 4096 --steps 5

Without CUDA (``torch.cuda.is_available()`` False) it prints one line starting
with "no CUDA device" and exits 0. With CUDA, on synthetic hashed batches built
in memory (26 categorical columns of one key a row, 13 dense features, labels
from a hidden logistic model), it runs:

1. **Equivalence**: a zoo DeepFM (dim 16, MLP 400-400-400, row-wise AdaGrad on
   the tables, Adam on the dense part) trained 50 steps at batch 1024 on the
   CPU and, from the same seed, on CUDA (``model.to("cuda")``; the tables stay
   on the host either way). Reported: the max abs difference of the
   predictions on 4 held-out batches, of the dense parameters and of the table
   rows. Tolerance ``TOLERANCE = 1e-4``: both runs are float32 (TF32 off), but
   CUDA sums in other orders (cuBLAS's GEMM splits, atomic adds in the
   backward of index_select/embedding_bag), a ~1e-7 relative difference per
   op that 50 Adam steps carry into the parameters (Adam divides by the
   gradient's running scale, so small gradients' differences are amplified).
2. **Throughput** at batch 4096 and 16384: tnrec's DeepFM on the CPU and on
   CUDA, samples/s and each step's split -- host pull and push (the tables'
   lookup and update), transfers (rows, dense features, labels to the device;
   ``E.grad`` and predictions back; each timed between two
   ``torch.cuda.synchronize()``, so overlap is lost and the split's total is an
   upper bound of the plain step) and the rest (device compute, and the host's
   de-duplication and kernel launches) -- and a plain-PyTorch model on the GPU
   at the same batch: one ``nn.EmbeddingBag`` per part (26 columns x
   ``--bag-rows`` rows, the key modulo the rows) under the same DeepFM dense
   network, Adagrad on its sparse gradients, Adam on the rest.

3. **W = 2 with NCCL dense**, with two GPUs or more: the DeepFM of 1. trained
   ``NCCL_STEPS`` steps by two workers under ``torchrun`` on 127.0.0.1, each on
   its own GPU with half of every batch (the sparse exchange on gloo, the
   dense all-reduce on the NCCL group :mod:`tnrec.ps.dense` creates), against
   one process on one GPU with the whole batches: the max abs difference of
   the dense parameters, within ``TOLERANCE``. With one GPU it says so and
   checks nothing.

Each run records the machine's state (``machine_state.py``). Written on a
machine without a GPU: only the no-CUDA branch has been run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from torchrun import torchrun_command

TOLERANCE = 1e-4
NCCL_STEPS = 20
HEADER = f"{'batch':>6} {'model':<18} {'samples/s':>10} {'step ms':>8}" + "".join(
    f" {name:>{w}}" for name, w in (("pull", 6), ("push", 6), ("transfer", 9), ("rest", 7))
)
COLUMNS, DENSE, HIDDEN, DIM = 26, 13, [400, 400, 400], 16
IDS = 100_000  # ids per column (Zipf), the synthetic vocabulary


def no_cuda_line() -> str:
    return (
        f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}); "
        "nothing checked"
    )


# --------------------------------------------------------------------------- data and models


def make_batches(n: int, B: int, seed: int) -> list[Any]:
    """``n`` hashed batches of ``B`` rows; the hidden model is the same for every seed."""
    from tnrec.data.batch import Batch, Jagged

    weights = np.random.default_rng(0).normal(0, 0.3, (COLUMNS, IDS))  # [C, IDS]
    rng = np.random.default_rng(seed)
    offsets = np.arange(B + 1, dtype=np.int64)  # one key a row
    out = []
    for _ in range(n):
        ids = (rng.zipf(1.2, (COLUMNS, B)) - 1) % IDS  # [C, B]
        dense = np.log1p(rng.exponential(3.0, (B, DENSE))).astype(np.float32)  # [B, F]
        logit = weights[np.arange(COLUMNS)[:, None], ids].sum(0) + 0.2 * dense[:, 0] - 1.5  # [B]
        y = (rng.random(B) < 1 / (1 + np.exp(-logit))).astype(np.float32)[:, None]  # [B, 1]
        keys = ids + (np.arange(COLUMNS)[:, None] << 32)  # [C, B] a distinct key space a column
        out.append(
            Batch(
                sparse={
                    f"C{c + 1}": Jagged(keys[c].astype(np.int64), offsets) for c in range(COLUMNS)
                },
                dense=dense,
                dense_names=tuple(f"I{j + 1}" for j in range(DENSE)),
                labels=y,
                label_names=("label",),
                weights=None,
                row_ids=np.arange(B, dtype=np.int64),
            )
        )
    return out


def deepfm(device: torch.device) -> Any:
    import tnrec as tn
    from tnrec.models import DeepFM

    fc = tn.feature_column
    cols = [fc.category_column(f"C{c + 1}") for c in range(COLUMNS)]
    cols += [fc.numeric_column(f"I{j + 1}") for j in range(DENSE)]
    torch.manual_seed(0)
    model = DeepFM(cols, DIM, HIDDEN, tn.optimizer.AdaGrad(0.05), tn.optimizer.Adam(1e-3))
    model.compile()
    return model.to(device)


class BagDeepFM(torch.nn.Module):
    """The plain-PyTorch baseline: EmbeddingBag tables under a tnrec DeepFM's dense network."""

    def __init__(self, rows: int, device: torch.device) -> None:
        super().__init__()
        self.rows = rows
        self.emb = torch.nn.EmbeddingBag(COLUMNS * rows, DIM, mode="sum", sparse=True)
        self.wide = torch.nn.EmbeddingBag(COLUMNS * rows, 1, mode="sum", sparse=True)
        self.dense_part = deepfm(torch.device("cpu"))  # its forward_dense only
        self.to(device)
        self.device = device
        sparse = [self.emb.weight, self.wide.weight]
        self.opts = [
            torch.optim.Adagrad(sparse, lr=0.05),
            torch.optim.Adam(self.dense_part.parameters(), lr=1e-3),
        ]

    def train_step(self, batch: Any) -> None:
        B = batch.size
        keys = np.stack([batch.keys(f"C{c + 1}") for c in range(COLUMNS)], 1)  # [B, C]
        idx = keys.view(np.uint64) % np.uint64(self.rows) + np.arange(COLUMNS, dtype=np.uint64)
        idx = torch.from_numpy(idx.astype(np.int64).reshape(-1)).to(self.device)  # [B*C]
        bags = torch.arange(B * COLUMNS, device=self.device)  # one key a bag
        emb = self.emb(idx, bags).view(B, COLUMNS * DIM)  # [B, C*D]
        wide = self.wide(idx, bags).view(B, COLUMNS)  # [B, C]
        dense = torch.from_numpy(batch.dense).to(self.device)  # [B, F]
        y = torch.from_numpy(batch.labels[:, 0]).to(self.device)  # [B]
        out = self.dense_part.forward_dense({"emb": emb, "wide": wide}, dense)  # [B] logit
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out, y)
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in self.opts:
            opt.step()


# --------------------------------------------------------------------------- equivalence


def table_rows(model: Any) -> dict[str, np.ndarray]:
    return {n: t.pull(np.sort(t.keys()), create=False) for n, t in sorted(model.tables.items())}


def equivalence(
    steps: int = 50, batch: int = 1024, devices: Any = ("cpu", "cuda")
) -> dict[str, float]:
    """Max abs differences of a DeepFM trained ``steps`` steps on ``devices`` (the CPU, CUDA)."""
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 on both: the tolerance assumes it
    torch.backends.cudnn.allow_tf32 = False
    train, test = make_batches(steps, batch, seed=1), make_batches(4, batch, seed=2)
    runs = []
    for device in devices:
        model = deepfm(torch.device(device))
        for b in train:
            model.train_step(b)
        params = {n: p.detach().cpu() for n, p in model.named_parameters()}
        runs.append((model.predict(test)["prediction"], params, table_rows(model)))
    (p_cpu, w_cpu, t_cpu), (p_gpu, w_gpu, t_gpu) = runs
    return {
        "predictions": float(np.abs(p_gpu - p_cpu).max()),
        "dense params": max(float((w_gpu[n] - w_cpu[n]).abs().max()) for n in w_cpu),
        "table rows": max(float(np.abs(t_gpu[n] - t_cpu[n]).max()) for n in t_cpu),
    }


# --------------------------------------------------------------------------- W = 2, NCCL


def nccl_worker(out_dir: str) -> None:
    """One of ``torchrun``'s two workers: half of every batch on its own GPU; rank 0 saves the
    dense parameters and the second process groups its PS created."""
    import tnrec as tn

    torch.backends.cuda.matmul.allow_tf32 = False
    strategy = tn.distribute.PsStrategy()  # gloo for the sparse exchange
    rank, world = strategy.rank, strategy.world_size
    device = torch.device("cuda", strategy.env.local_rank)
    torch.cuda.set_device(device)
    model = deepfm(device)
    for b in make_batches(NCCL_STEPS, 1024, seed=1):
        half = b.size // world
        model.train_step(b.slice(rank * half, b.size if rank == world - 1 else (rank + 1) * half))
    if rank == 0:
        params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
        groups = np.array(sorted(model.ps.dense.groups()), dtype=str)
        np.savez(os.path.join(out_dir, "w2.npz"), _groups=groups, **params)
    strategy.shutdown()


def nccl_check() -> str:
    """W = 2 under ``torchrun`` (NCCL dense) against one process on one GPU; one line."""
    if torch.cuda.device_count() < 2:
        return "W = 2 with NCCL dense: not checked (it needs two GPUs; this machine has one)"
    with tempfile.TemporaryDirectory() as d:
        cmd = torchrun_command(2, os.path.abspath(__file__), "--nccl-worker", d)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            return f"W = 2 with NCCL dense: FAILED to run: {res.stderr[-1500:]}"
        got = dict(np.load(os.path.join(d, "w2.npz")))
    groups = got.pop("_groups").tolist()
    torch.backends.cuda.matmul.allow_tf32 = False
    model = deepfm(torch.device("cuda", 0))
    for b in make_batches(NCCL_STEPS, 1024, seed=1):
        model.train_step(b)
    diff = max(
        float(np.abs(p.detach().cpu().numpy() - got[n]).max()) for n, p in model.named_parameters()
    )
    verdict = "ok" if diff <= TOLERANCE and groups == ["nccl"] else "FAILED"
    return (
        f"W = 2 with NCCL dense ({NCCL_STEPS} steps, second groups {groups}) against one process: "
        f"max abs difference of the dense params {diff:.3g} (tolerance {TOLERANCE:g}): {verdict}"
    )


# --------------------------------------------------------------------------- the step's split


@contextlib.contextmanager
def split(model: Any, device: torch.device) -> Iterator[dict[str, float]]:
    """Time the host pull/push and every transfer of ``model``'s steps (seconds, summed)."""
    import tnrec.layers.embedding
    import tnrec.layers.pooling
    import tnrec.model
    import tnrec.steps

    spent = {"pull": 0.0, "push": 0.0, "transfer": 0.0}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        def run(*args: Any, **kw: Any) -> Any:
            sync()  # the device work queued before is not this part's
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            sync()
            spent[part] += time.perf_counter() - t0
            return out

        return run

    patched = [(model.ps, "pull"), (model.ps, "push")]
    modules = (tnrec.model, tnrec.steps, tnrec.layers.pooling, tnrec.layers.embedding)
    for m in modules:
        patched += [(m, n) for n in ("to_device", "to_host", "host_float32") if hasattr(m, n)]
    saved = [(obj, name, getattr(obj, name)) for obj, name in patched]
    for obj, name, fn in saved:
        setattr(obj, name, timed(fn, name if name in ("pull", "push") else "transfer"))
    try:
        yield spent
    finally:
        for obj, name, fn in saved:
            if obj is model.ps:
                delattr(obj, name)  # back to the class's method
            else:
                setattr(obj, name, fn)


def timed_steps(step: Callable[[Any], Any], batches: list[Any], warmup: int, sync: Any) -> float:
    """Mean seconds of a step over ``batches[warmup:]``, the device idle at both ends."""
    for b in batches[:warmup]:
        step(b)
    sync()
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        step(b)
    sync()
    return (time.perf_counter() - t0) / (len(batches) - warmup)


def throughput(B: int, steps: int, warmup: int, bag_rows: int) -> list[tuple[Any, ...]]:
    """``(batch, model, samples/s, step ms, pull, push, transfer, rest ms)`` of the three runs."""
    from machine_state import MachineWatch

    batches = make_batches(warmup + steps, B, seed=3)
    rows = []
    for name, device in (("tnrec DeepFM cpu", "cpu"), ("tnrec DeepFM cuda", "cuda")):
        dev = torch.device(device)
        model = deepfm(dev)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        for b in batches[:warmup]:
            model.train_step(b)
        with MachineWatch() as watch, split(model, dev) as spent:
            step_s = timed_steps(model.train_step, batches[warmup:], 0, sync)
        parts = [spent[k] / steps * 1e3 for k in ("pull", "push", "transfer")]
        rows.append((B, name, B / step_s, step_s * 1e3, *parts, step_s * 1e3 - sum(parts)))
        rows.append(("", f"  machine: {watch.state.summary()}"))
    bag = BagDeepFM(bag_rows, torch.device("cuda"))
    with MachineWatch() as watch:
        step_s = timed_steps(bag.train_step, batches, warmup, torch.cuda.synchronize)
    rows.append((B, "EmbeddingBag cuda", B / step_s, step_s * 1e3, None, None, None, None))
    rows.append(("", f"  machine: {watch.state.summary()}"))
    return rows


def print_row(row: tuple[Any, ...]) -> None:
    if len(row) == 2:
        print(f"{row[0]:>6} {row[1]}")
        return
    B, name, sps, step_ms, *parts = row
    cells = "".join(
        f"{'-' if v is None else f'{v:.1f}':>{w}}"
        for v, w in zip(parts, (7, 7, 10, 8), strict=True)
    )
    print(f"{B:>6} {name:<18} {sps:>10,.0f} {step_ms:>8.1f}{cells}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", default="4096,16384", help="batch sizes, comma-separated")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bag-rows", type=int, default=1 << 17, help="EmbeddingBag rows per column")
    p.add_argument("--nccl-worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.nccl_worker is not None:
        nccl_worker(a.nccl_worker)
        return 0
    if not torch.cuda.is_available():
        print(no_cuda_line())
        return 0
    # Not run here (no GPU where this was written): the CUDA branch.
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"CPU threads {torch.get_num_threads()}")  # fmt: skip
    diffs = equivalence()
    worst = max(diffs.values())
    verdict = "ok" if worst <= TOLERANCE else "FAILED"
    print(f"50-step equivalence, CPU vs CUDA (tolerance {TOLERANCE:g}): {verdict}")
    for what, d in diffs.items():
        print(f"  max abs difference, {what}: {d:.3g}")
    w2 = nccl_check()
    print(w2)
    print(HEADER + "   (ms a step; pull/push: host tables; rest: device compute + host prep)")
    for B in (int(x) for x in a.batches.split(",")):
        for row in throughput(B, a.steps, a.warmup, a.bag_rows):
            print_row(row)
    return 0 if worst <= TOLERANCE and "FAILED" not in w2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
