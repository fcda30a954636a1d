"""Training throughput of DeepFM: tnrec vs a plain-PyTorch reference of the same network.

One command, one table::

    python bench/train_bench.py                 # ~2 minutes on the 2-core machine
    python bench/train_bench.py --steps 50 --rows 400000 --threads 2

Both run DeepFM (26 categorical Criteo columns, dim 16, MLP 400-400-400,
linear part of dimension-1 rows, 13 dense features, Adam on the dense part,
row-wise AdaGrad on the embeddings) on the same synthetic Criteo-schema batches
(batch 4096, read from Parquet with the tnrec reader and its prefetch thread):

* **tnrec**: ``tnrec.models.DeepFM``; each step de-duplicates the batch's keys,
  pulls them from the sparse tables into the temporary matrix, runs
  forward/backward, pushes the gradients (row-wise AdaGrad in the table) and
  steps Adam.
* **torch-ref**: the same network on fixed ``nn.EmbeddingBag`` tables (one per
  column, ``--ref-rows`` rows each, the key modulo the rows), sparse
  gradients, row-wise AdaGrad written out in torch (``g2sum += mean(g^2)``,
  ``w -= lr * g / (sqrt(g2sum) + eps)``), Adam on the dense part.

Per-step split (ms): input wait (time blocked on the reader), unique+pull
(tnrec: de-duplication + table lookup; ref: the modulo + index tensors),
forward/backward, push (tnrec: table update; ref: the AdaGrad row update),
dense step (Adam). "dense only" is forward/backward/Adam of the dense part
alone on pooled inputs (``forward_dense``), the floor for both. samples/s is
batch / mean step time, measured after ``--warmup`` steps. Each system's loop
records the machine's state (``machine_state.py``): "others" is the cores other
processes kept busy during it, ``*`` marks a loop run on a busy machine, and
``--strict`` refuses the figures instead.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import tnrec as tn
from machine_state import MachineWatch, add_strict_flag, check_runs, mark
from tnrec.data.synthetic import SyntheticConfig, generate
from tnrec.models import DeepFM
from tnrec.optimizer import AdaGrad, Adam

PARTS = ("input wait", "unique+pull", "forward/backward", "push", "dense step")


def reader(files: list[str], batch: int) -> tn.data.Reader:
    return tn.data.read_parquet(files, tn.data.criteo_columns(), batch_size=batch, prefetch=4)


def loop(data, steps: int, warmup: int, step_fn) -> np.ndarray:
    """Run ``step_fn(batch) -> (pull, fwd/bwd, push, dense)`` seconds; return ms per part."""
    out = []
    it = iter(data)
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(data)
            batch = next(it)
        wait = time.perf_counter() - t0
        parts = step_fn(batch)
        if i >= warmup:
            out.append((wait, *parts))
    return np.asarray(out) * 1e3  # [steps, 5] ms


# --------------------------------------------------------------------------- tnrec


def tnrec_step(model: DeepFM):
    opt = model.optimizer

    def step(batch):
        t0 = time.perf_counter()
        model.pull(batch)
        t1 = time.perf_counter()
        loss, _ = model.compute_loss(batch, model(batch))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        model.push()
        t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, t4 - t3

    return step


# --------------------------------------------------------------------------- reference


class RefDeepFM(torch.nn.Module):
    """DeepFM on fixed EmbeddingBag tables: the same dense network as tnrec's DeepFM."""

    def __init__(self, columns: list[str], rows: int, dim: int, hidden: list[int], n_dense: int):
        super().__init__()
        self.columns, self.rows, self.dim = columns, rows, dim
        self.emb = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in columns
        )
        self.wide = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(rows, 1, mode="sum", sparse=True) for _ in columns
        )
        with torch.no_grad():
            for e in self.emb:
                e.weight.normal_(0, 0.1 / dim**0.5)  # tnrec's normal(0.1)
            for w in self.wide:
                w.weight.zero_()
        # The dense part is a tnrec DeepFM's (same modules, same shapes).
        cols = [tn.feature_column.category_column(c) for c in columns]
        cols += [tn.feature_column.numeric_column(f"d{i}") for i in range(n_dense)]
        self.dense_part = DeepFM(cols, dim, hidden)
        self.g2sum = [torch.zeros(rows) for _ in range(2 * len(columns))]

    def sparse_params(self) -> list[torch.nn.Parameter]:
        return [e.weight for e in self.emb] + [w.weight for w in self.wide]

    def dense_params(self) -> list[torch.nn.Parameter]:
        return list(self.dense_part.parameters())

    def inputs(self, batch) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for c in self.columns:
            keys = batch.keys(c)
            idx = torch.from_numpy((keys.view(np.uint64) % np.uint64(self.rows)).astype(np.int64))
            out.append((idx, torch.from_numpy(batch.offsets(c)[:-1])))
        return out

    def forward(self, inputs, dense: torch.Tensor) -> torch.Tensor:
        emb = torch.cat([e(i, o) for e, (i, o) in zip(self.emb, inputs, strict=True)], 1)
        wide = torch.cat([w(i, o) for w, (i, o) in zip(self.wide, inputs, strict=True)], 1)
        return self.dense_part.forward_dense({"emb": emb, "wide": wide}, dense)  # [B]

    @torch.no_grad()
    def adagrad(self, lr: float, eps: float = 1e-8) -> None:
        """Row-wise AdaGrad on the sparse gradients (TensorNet's / TorchRec's rule)."""
        for p, g2 in zip(self.sparse_params(), self.g2sum, strict=True):
            g = p.grad.coalesce()
            rows, vals = g.indices()[0], g.values()  # [U], [U, D]
            g2[rows] += vals.square().mean(dim=1)
            p.index_add_(0, rows, -lr * vals / (g2[rows].sqrt() + eps).unsqueeze(1))
            p.grad = None


def ref_step(model: RefDeepFM, lr: float):
    opt = torch.optim.Adam(model.dense_params(), lr=1e-3)

    def step(batch):
        t0 = time.perf_counter()
        inputs = model.inputs(batch)
        dense = torch.from_numpy(batch.dense)
        y = torch.from_numpy(batch.labels[:, 0])
        t1 = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(model(inputs, dense), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        model.adagrad(lr)
        t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, t4 - t3

    return step


def dense_only_ms(model: DeepFM, batch: int, steps: int) -> float:
    """Forward/backward/Adam of the dense part alone on random pooled inputs (ms/step)."""
    C, D = model.num_fields, model.embedding_dim
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    # Magnitudes of a real step (the rows' initial std 0.1/sqrt(D), log1p counts): with
    # std-1 inputs the FM term overflows into NaNs, whose arithmetic is several times slower.
    emb = (0.1 / D**0.5 * torch.randn(batch, C * D)).requires_grad_(True)
    wide = torch.zeros(batch, C, requires_grad=True)
    dense = torch.randn(batch, model.num_dense).abs()
    y = (torch.rand(batch) < 0.1).float()
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(
            model.forward_dense({"emb": emb, "wide": wide}, dense), y
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 1e3 * float(np.mean(times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000, help="synthetic training rows")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20, help="measured steps per system")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: no oversubscription)")
    p.add_argument("--ref-rows", type=int, default=1 << 18, help="rows per reference table")
    p.add_argument("--data", help="existing synthetic data dir (default: generate to a temp dir)")
    add_strict_flag(p)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = a.data or tempfile.mkdtemp(prefix="tnrec-train-bench-")
    if not os.path.exists(os.path.join(out, "_synthetic.json")):
        generate(out, SyntheticConfig(rows_per_day=a.rows, num_days=1, test_rows=1))
    files = tn.data.list_files(out, days=None, pattern="*.parquet")
    files = [f for f in files if "/test/" not in f]
    cols = tn.data.criteo_columns()
    hidden = [400, 400, 400]
    print(
        f"DeepFM dim 16, MLP {hidden}, batch {a.batch}, {a.steps} steps after {a.warmup} warm-up, "
        f"torch threads {a.threads}, load average {os.getloadavg()[0]:.1f}"
    )

    torch.manual_seed(0)
    model = DeepFM(cols, 16, hidden, AdaGrad(0.05), Adam(1e-3))
    model.compile()
    model.train()
    with MachineWatch() as tn_watch:  # the reader's prefetch thread is this process's own
        tn_ms = loop(reader(files, a.batch), a.steps, a.warmup, tnrec_step(model))
    tables = {k: len(t) for k, t in model.tables.items()}

    torch.manual_seed(0)
    ref = RefDeepFM([f"C{j}" for j in range(1, 27)], a.ref_rows, 16, hidden, 13)
    with MachineWatch() as ref_watch:
        ref_ms = loop(reader(files, a.batch), a.steps, a.warmup, ref_step(ref, 0.05))
    with MachineWatch() as dense_watch:
        dense_ms = dense_only_ms(DeepFM(cols, 16, hidden), a.batch, max(5, a.steps // 2))
    tn_step, ref_step_ms = tn_ms.sum(1).mean(), ref_ms.sum(1).mean()
    states = [
        (f"tnrec: {a.batch / tn_step * 1e3:,.0f} samples/s", tn_watch.state),
        (f"torch-ref: {a.batch / ref_step_ms * 1e3:,.0f} samples/s", ref_watch.state),
        (f"dense only: {dense_ms:.1f} ms/step", dense_watch.state),
    ]
    check_runs(states, a.strict)

    print(f"\n{'ms/step (mean)':<20}{'tnrec':>12}{'torch-ref':>12}")
    for i, name in enumerate(PARTS):
        print(f"{name:<20}{tn_ms[:, i].mean():>12.1f}{ref_ms[:, i].mean():>12.1f}")
    print(f"{'step':<20}{tn_step:>12.1f}{ref_step_ms:>12.1f}")
    print(f"{'dense only':<20}{dense_ms:>12.1f}{dense_ms:>12.1f}")
    print(
        f"{'samples/s':<20}{a.batch / tn_step * 1e3:>12,.0f}{a.batch / ref_step_ms * 1e3:>12,.0f}"
    )
    cells = [f"{s.other_cores:.2f}{mark(s) or ' '}" for _, s in states[:2]]
    print(f"{'others (cores)':<20}{cells[0]:>12}{cells[1]:>12}")
    print(
        f"{'load before/after':<20}"
        + "".join(f"{f'{s.load1_before:.2f}/{s.load1_after:.2f} ':>12}" for _, s in states[:2])
    )
    print(f"dense only: {dense_watch.state.summary()}")
    for line in check_runs(states, strict=False):
        print(line)
    print(
        f"\ntnrec table rows after the run: {tables}; reference: 26 x {a.ref_rows} rows x 2 tables"
    )


if __name__ == "__main__":
    main()
