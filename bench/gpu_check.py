"""The dense part on a GPU: equivalence with the CPU, DeepFM samples/s, and where a step goes.

    python3 bench/gpu_check.py                          # ~2 minutes with a GPU
    python3 bench/gpu_check.py --batches 4096 --steps 5
    python3 bench/gpu_check.py --profile                # and torch.profiler's table

Without CUDA (``torch.cuda.is_available()`` False) it prints one line starting
with "no CUDA device" and exits 0. With CUDA, on synthetic hashed batches built
in memory (26 categorical columns of one key a row, 13 dense features, labels
from a hidden logistic model), it runs:

1. **Equivalence**: a zoo DeepFM (dim 16, MLP 400-400-400) trained 50 steps
   at batch 1024 on the CPU and, from the same seed, on CUDA
   (``model.to("cuda")``; the tables stay on the host either way), once with
   SGD on the tables and the dense part and once with the zoo's optimizers
   (row-wise AdaGrad on the tables, Adam on the dense part). Both runs are
   float32 (TF32 off; the float32 matmul's error on each device is printed),
   but CUDA sums in other orders (cuBLAS's GEMM splits, atomic adds in the
   backward of index_select), ~1e-7 relative an op. Held to ``TOLERANCE =
   1e-4``: the first step's dense and pushed row gradients (relative to the
   largest), the held-out log loss (relative) and, with SGD, the max abs
   difference of the predictions on 4 held-out batches, of the dense
   parameters and of the table rows after the 50 steps. With AdaGrad and Adam
   those are printed, not held: both scale a step by the gradient's own
   running size (Adam's first updates are +-lr a parameter, a new row's first
   AdaGrad update has norm lr * sqrt(D)), so a gradient at rounding level moves
   a parameter by up to lr in a direction the rounding sets.
2. **Throughput** at batch 4096 and 16384: tnrec's DeepFM on the CPU and on
   CUDA, each over two passes of the same batches (pass 1 creates the rows it
   meets, pass 2 finds them: the steady state), samples/s and each step's
   split -- host pull and push (the tables' lookup and update), transfers
   (rows, dense features, labels to the device; ``E.grad`` and predictions
   back; each timed between two ``torch.cuda.synchronize()``, so overlap is
   lost and the split's total is an upper bound of the plain step) and the
   rest (device compute, and the host's de-duplication and kernel launches)
   -- then a plain-PyTorch model on the GPU at the same batch: one
   ``nn.EmbeddingBag`` per part (26 columns x ``--bag-rows`` rows, the key
   modulo the rows) under the same DeepFM dense network, Adagrad on its
   sparse gradients, Adam on the rest; and the dense-only step (the same
   dense network on pooled inputs already on the GPU).

3. **W = 2**: the DeepFM of 1. trained ``W2_STEPS`` steps by two workers
   under ``torchrun`` on 127.0.0.1, each with half of every batch (the sparse
   exchange on gloo), against one process on one GPU with the whole batches:
   the max abs difference of the dense parameters, within ``TOLERANCE``. With
   two GPUs or more each worker has its own and the dense all-reduce runs on
   the NCCL group :mod:`tnrec.ps.dense` creates; with one GPU both workers
   share it and the dense part is summed on a gloo group through host copies
   (NCCL wants a GPU a rank). The NCCL branch has not run: no machine here had two GPUs.

Each run records the machine's state (``machine_state.py``). ``bench/gpu_suite.sh``
runs this script with ``--profile`` and then the tests with CUDA branches.
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
W2_STEPS = 20
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


def deepfm(device: torch.device, optimizers: str = "adam") -> Any:
    """The zoo DeepFM: row-wise AdaGrad on the tables and Adam on the dense part, or
    (``optimizers="sgd"``) SGD on both."""
    import tnrec as tn
    from tnrec.models import DeepFM

    fc = tn.feature_column
    cols = [fc.category_column(f"C{c + 1}") for c in range(COLUMNS)]
    cols += [fc.numeric_column(f"I{j + 1}") for j in range(DENSE)]
    torch.manual_seed(0)
    if optimizers == "adam":
        sparse, opt = tn.optimizer.AdaGrad(0.05), tn.optimizer.Adam(1e-3)
    else:
        sparse, opt = tn.optimizer.SGD(0.05), tn.optimizer.SGD(0.05)
    model = DeepFM(cols, DIM, HIDDEN, sparse, opt)
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


class DenseOnly:
    """The dense-only step: a DeepFM's dense network on pooled inputs already on the device.

    The same work as tnrec's step on the device minus the tables: random pooled
    rows (``[B, C*D]`` and ``[B, C]``, made once), the batch's dense features and
    labels copied in, forward, loss, backward and Adam; the pooled inputs' gradients
    are computed (as tnrec computes ``E.grad``) and dropped.
    """

    def __init__(self, B: int, device: torch.device) -> None:
        self.model = deepfm(torch.device("cpu")).to(device)  # forward_dense only
        g = torch.Generator(device="cpu").manual_seed(0)
        self.emb = (torch.randn(B, COLUMNS * DIM, generator=g) * 0.01).to(device)
        self.wide = (torch.randn(B, COLUMNS, generator=g) * 0.01).to(device)
        self.emb.requires_grad_(True)
        self.wide.requires_grad_(True)
        self.device = device
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)

    def train_step(self, batch: Any) -> None:
        dense = torch.from_numpy(batch.dense).to(self.device)  # [B, F]
        y = torch.from_numpy(batch.labels[:, 0]).to(self.device)  # [B]
        out = self.model.forward_dense({"emb": self.emb, "wide": self.wide}, dense)  # [B]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out, y)
        self.opt.zero_grad(set_to_none=True)
        self.emb.grad = self.wide.grad = None
        loss.backward()
        self.opt.step()


# --------------------------------------------------------------------------- equivalence


def table_rows(model: Any) -> dict[str, np.ndarray]:
    return {n: t.pull(np.sort(t.keys()), create=False) for n, t in sorted(model.tables.items())}


def matmul_errors(n: int = 1024) -> str:
    """The float32 matmul's error on the CPU and CUDA (TF32 on CUDA would show ~1e-3)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    exact = a.double() @ b.double()
    scale = float(exact.abs().max())
    cpu = float((a @ b - exact).abs().max()) / scale
    gpu = float(((a.cuda() @ b.cuda()).cpu() - exact).abs().max()) / scale
    return f"cpu {cpu:.2g}, cuda {gpu:.2g}"


def relative(a: Any, b: Any) -> float:
    """``max |a - b| / max |a|`` over the arrays of two equal-keyed dicts (``max |a - b|``
    where every value of ``a`` is 0)."""
    num = max(float(np.abs(np.asarray(b[k]) - np.asarray(a[k])).max(initial=0)) for k in a)
    den = max(float(np.abs(np.asarray(a[k])).max(initial=0)) for k in a)
    return num / den if den else num


def logloss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def equivalence(
    steps: int = 50, batch: int = 1024, devices: Any = ("cpu", "cuda"), optimizers: str = "sgd"
) -> dict[str, float]:
    """A DeepFM trained ``steps`` steps on each of ``devices`` (the CPU, CUDA) from one seed.

    Returned: the first step's gradients (dense parameters, and the rows pushed
    to the tables) as ``max |diff| / max |grad|``; after the last step the max
    abs differences of the predictions on 4 held-out batches, of the dense
    parameters and of the table rows; and each run's held-out log loss.
    """
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 on both: the tolerance assumes it
    torch.backends.cudnn.allow_tf32 = False
    train, test = make_batches(steps, batch, seed=1), make_batches(4, batch, seed=2)
    y = np.concatenate([b.labels[:, 0] for b in test])
    runs = []
    for device in devices:
        model = deepfm(torch.device(device), optimizers)
        pushed: dict[str, np.ndarray] = {}
        push = model.ps.push

        def first_push(
            keys: Any,
            grads: Any,
            *args: Any,
            _push: Any = push,
            _pushed: Any = pushed,
            **kwargs: Any,
        ) -> Any:
            if not _pushed:
                _pushed.update({n: np.array(g) for n, g in grads.items()})
            return _push(keys, grads, *args, **kwargs)

        model.ps.push = first_push
        model.train_step(train[0])
        grads = {n: p.grad.detach().cpu().numpy() for n, p in model.named_parameters()}
        del model.ps.push  # back to the class's method
        for b in train[1:]:
            model.train_step(b)
        params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
        pred = model.predict(test)["prediction"]
        runs.append((grads, dict(pushed), pred, params, table_rows(model)))
    (g_a, e_a, p_a, w_a, t_a), (g_b, e_b, p_b, w_b, t_b) = runs
    return {
        "first step's dense gradients (relative)": relative(g_a, g_b),
        "first step's pushed row gradients (relative)": relative(e_a, e_b),
        "predictions": float(np.abs(p_b - p_a).max()),
        "dense params": max(float(np.abs(w_b[n] - w_a[n]).max()) for n in w_a),
        "table rows": max(float(np.abs(t_b[n] - t_a[n]).max()) for n in t_a),
        "held-out log loss, first device": logloss(p_a, y),
        "held-out log loss, second device": logloss(p_b, y),
    }


def equivalence_lines(diffs: dict[str, float], optimizers: str) -> tuple[bool, list[str]]:
    """Whether ``equivalence`` passed, and its report. With SGD every difference is held to
    ``TOLERANCE`` (relative for the first step's gradients); with AdaGrad and Adam only the
    first step's gradients and the held-out log loss (within ``TOLERANCE`` relative): see
    the module's docstring."""
    first = [k for k in diffs if k.startswith("first step")]
    held = list(diffs) if optimizers == "sgd" else first
    a, b = diffs["held-out log loss, first device"], diffs["held-out log loss, second device"]
    ok = all(diffs[k] <= TOLERANCE for k in held if "log loss" not in k)
    ok = ok and abs(b - a) <= TOLERANCE * a
    lines = [f"  {k}: {v:.3g}" for k, v in diffs.items()]
    return ok, lines


# --------------------------------------------------------------------------- W = 2


def w2_backend() -> str:
    """The dense backend of the W = 2 check: NCCL with a GPU a worker, else gloo on one GPU."""
    return "nccl" if torch.cuda.device_count() >= 2 else "gloo"


def w2_worker(out_dir: str, backend: str, device_type: str = "cuda") -> None:
    """One of ``torchrun``'s two workers: half of every batch on GPU ``local rank mod GPUs``
    (or on the CPU); rank 0 saves the dense parameters and the second process groups its PS
    created."""
    import tnrec as tn

    torch.backends.cuda.matmul.allow_tf32 = False
    strategy = tn.distribute.PsStrategy(dense_backend=backend)  # gloo for the sparse exchange
    rank, world = strategy.rank, strategy.world_size
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", strategy.env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    model = deepfm(device, "sgd")
    for b in make_batches(W2_STEPS, 1024, seed=1):
        half = b.size // world
        model.train_step(b.slice(rank * half, b.size if rank == world - 1 else (rank + 1) * half))
    if rank == 0:
        params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
        groups = np.array(sorted(model.ps.dense.groups()), dtype=str)
        np.savez(os.path.join(out_dir, "w2.npz"), _groups=groups, **params)
    strategy.shutdown()


def w2_check(device_type: str = "cuda") -> str:
    """W = 2 under ``torchrun`` against one process on one GPU; one line.

    With two GPUs or more each worker has its own and the dense part is summed
    by NCCL; with one, both workers share it and the dense part is summed by
    gloo through host copies (NCCL wants a GPU a rank). ``device_type="cpu"``:
    the same on the CPU (the harness's check where there is no GPU).
    """
    cuda = device_type == "cuda"
    backend = w2_backend() if cuda else "gloo"
    what = f"W = 2 with {backend} dense on " + (
        f"{min(torch.cuda.device_count(), 2)} GPU(s)" if cuda else "the CPU"
    )
    with tempfile.TemporaryDirectory() as d:
        cmd = torchrun_command(2, os.path.abspath(__file__), "--w2-worker", d, backend, device_type)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            return f"{what}: FAILED to run: {res.stderr[-1500:]}"
        got = dict(np.load(os.path.join(d, "w2.npz")))
    groups = got.pop("_groups").tolist()
    torch.backends.cuda.matmul.allow_tf32 = False
    model = deepfm(torch.device("cuda", 0) if cuda else torch.device("cpu"), "sgd")
    for b in make_batches(W2_STEPS, 1024, seed=1):
        model.train_step(b)
    diff = max(
        float(np.abs(p.detach().cpu().numpy() - got[n]).max()) for n, p in model.named_parameters()
    )
    verdict = "ok" if diff <= TOLERANCE and groups == [backend] else "FAILED"
    return (
        f"{what} ({W2_STEPS} steps, second groups {groups}) against one process: "
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


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for ``device``'s queued work: ``torch.cuda.synchronize``, or nothing."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def throughput(
    B: int, steps: int, warmup: int, bag_rows: int, devices: Any = ("cpu", "cuda")
) -> list[tuple[Any, ...]]:
    """``(batch, model, samples/s, step ms, pull, push, transfer, rest ms)`` rows.

    tnrec's DeepFM on each of ``devices`` over two passes of the same batches:
    pass 1 creates the rows it meets, pass 2 finds them all (the steady state).
    Then, on the last device, the ``nn.EmbeddingBag`` baseline and the
    dense-only step (after ``warmup`` untimed steps).
    """
    from machine_state import MachineWatch

    batches = make_batches(warmup + steps, B, seed=3)
    rows = []
    for device in devices:
        dev = torch.device(device)
        model = deepfm(dev)
        sync = synchronizer(dev)
        for b in batches[:warmup]:
            model.train_step(b)
        for p in (1, 2):
            with MachineWatch() as watch, split(model, dev) as spent:
                step_s = timed_steps(model.train_step, batches[warmup:], 0, sync)
            parts = [spent[k] / steps * 1e3 for k in ("pull", "push", "transfer")]
            rest = step_s * 1e3 - sum(parts)
            rows.append((B, f"tnrec {dev.type} pass {p}", B / step_s, step_s * 1e3, *parts, rest))
            rows.append(("", f"  machine: {watch.state.summary()}"))
    base = torch.device(devices[-1])
    for name, runner in (("EmbeddingBag", BagDeepFM(bag_rows, base)), ("dense-only", None)):
        step = (runner or DenseOnly(B, base)).train_step
        with MachineWatch() as watch:
            step_s = timed_steps(step, batches, warmup, synchronizer(base))
        rows.append((B, f"{name} {base.type}", B / step_s, step_s * 1e3, None, None, None, None))
        rows.append(("", f"  machine: {watch.state.summary()}"))
    return rows


def ratios(rows: list[tuple[Any, ...]]) -> str:
    """The targets' ratios from one batch size's rows: CUDA / CPU samples/s, step / dense-only,
    for each pass."""
    sps = {r[1]: r[2] for r in rows if len(r) > 2}
    dense = sps["dense-only cuda"]
    speed = ", ".join(
        f"pass {p} {sps[f'tnrec cuda pass {p}'] / sps[f'tnrec cpu pass {p}']:.2f}x" for p in (1, 2)
    )
    over = ", ".join(f"pass {p} {dense / sps[f'tnrec cuda pass {p}']:.2f}" for p in (1, 2))
    return (
        f"{rows[0][0]:>6} tnrec cuda / cpu samples/s: {speed} (target >= 5 at 16384); "
        f"step / dense-only step on cuda: {over} (target <= 1.3)"
    )


def profile(B: int, steps: int = 5, rows: int = 30, device: str = "cuda") -> str:
    """``torch.profiler``'s table of tnrec's DeepFM steps on ``device`` at batch ``B`` (a second
    pass over the same batches): the ops by their own host time, CUDA time beside (where the
    step's "rest" goes)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device == "cuda"
    sync = synchronizer(torch.device(device))
    model = deepfm(torch.device(device))
    batches = make_batches(3 + steps, B, seed=3)
    for b in batches:  # a first pass: the profiled one creates no rows
        model.train_step(b)
    sync()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with torch_profile(activities=activities) as prof:
        for b in batches[3:]:
            model.train_step(b)
        sync()
    return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


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
    p.add_argument("--profile", action="store_true", help="also profile 5 CUDA steps")
    p.add_argument("--w2-worker", nargs=3, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.w2_worker is not None:
        w2_worker(*a.w2_worker)
        return 0
    if not torch.cuda.is_available():
        print(no_cuda_line())
        return 0
    import numba

    from tnrec.table import threads

    print(
        f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"CPU threads {torch.get_num_threads()}, numba threads {numba.get_num_threads()}, "
        f"table threads {threads.get_num_threads()}"
    )
    print(f"float32 matmul, max relative error against float64: {matmul_errors()}")
    passed = True
    for opt, what in (("sgd", "SGD"), ("adam", "AdaGrad tables, Adam dense")):
        ok, lines = equivalence_lines(equivalence(optimizers=opt), opt)
        passed = passed and ok
        print(f"50-step equivalence, CPU vs CUDA, {what} "
              f"(tolerance {TOLERANCE:g}): {'ok' if ok else 'FAILED'}")  # fmt: skip
        print("\n".join(lines))
    w2 = w2_check()
    print(w2)
    print(HEADER + "   (ms a step; pull/push: host tables; rest: device compute + host prep)")
    summary = []
    for B in (int(x) for x in a.batches.split(",")):
        rows = throughput(B, a.steps, a.warmup, a.bag_rows)
        for row in rows:
            print_row(row)
        summary.append(ratios(rows))
    print("\n".join(summary))
    if a.profile:
        B = int(a.batches.split(",")[0])
        print(f"torch.profiler, tnrec DeepFM cuda, batch {B}, 5 steps:\n{profile(B)}")
    return 0 if passed and "FAILED" not in w2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
