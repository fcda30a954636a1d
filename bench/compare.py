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
run's own and the neighbours' load hits every column alike. samples/s is
measured over the steps after ``--warmup``; AUC is on a held-out split after
the pass. Run ``bench/requirements-torchrec.sh`` first for the TorchRec column.

    NUMBA_CACHE_DIR=.numba_cache python3 bench/compare.py                # all models, 5 repeats
    python3 bench/compare.py --models micro --repeats 3 --threads 2
    python3 bench/compare.py --split                                     # tnrec per-part split only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

IMPLS = ("tnrec", "torchrec", "plain", "dense")
B = 4096
D = 16
SPARSE_LR = 0.05
EPS = 1e-8
DENSE_LR = 1e-3
INIT_SCALE = 0.1  # N(0, 0.1/sqrt(D)) in every implementation (tnrec zoo's default)


# --------------------------------------------------------------------------- data


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _micro_batches(
    model: str, steps: int, test_steps: int, seed: int = 0
) -> tuple[list, list, np.ndarray]:
    """Return (train, test) lists of tnrec Batches for ``micro``/``zipf``, and the base keys.

    The base keys are those of ids below 1M (all of ``micro``'s; ``zipf``'s
    without the never-seen 5%): what a fixed table holds from the start.
    """
    from tnrec.data import Batch, Jagged

    ids_per_col = 1_000_000
    rng = np.random.default_rng(seed)
    fresh = ids_per_col  # never-seen ids come from a counter above the base range
    out = []
    base: list[np.ndarray] = []
    for s in range(steps + test_steps):
        sparse = {}
        logit = np.full(B, -1.5)
        for c in range(2):
            if model == "micro":
                ids = rng.integers(0, ids_per_col, B)
            else:
                u = rng.random(B)
                a = 1.0 - 1.1
                x = (1.0 + u * ((ids_per_col + 1.0) ** a - 1.0)) ** (1.0 / a)
                ids = np.minimum(x.astype(np.int64) - 1, ids_per_col - 1)
                new = rng.random(B) < 0.05
                ids[new] = fresh + np.arange(int(new.sum()))
                fresh += int(new.sum())
            keys = _mix64(ids.astype(np.uint64) + np.uint64(c << 40)).view(np.int64)
            base.append(keys[ids < ids_per_col])
            h = _mix64(keys.view(np.uint64) ^ np.uint64(0x1234567))
            w = (h >> np.uint64(11)).astype(np.float64) / 2.0**53  # U(0,1), a hidden weight
            logit += 2.0 * (w - 0.5) * 2.0
            sparse[f"c{c}"] = Jagged(keys, np.arange(B + 1, dtype=np.int64))
        y = (rng.random(B) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        out.append(
            Batch(
                sparse=sparse,
                dense=np.zeros((B, 0), np.float32),
                dense_names=(),
                labels=y[:, None],
                label_names=("label",),
                weights=None,
                row_ids=np.arange(s * B, (s + 1) * B, dtype=np.int64),
            )
        )
    return out[:steps], out[steps:], np.unique(np.concatenate(base))


def _deepfm_data(root: Path, steps: int, test_steps: int) -> None:
    from tnrec.data.synthetic import SyntheticConfig, generate

    if (root / "_synthetic.json").exists():
        return
    cfg = SyntheticConfig(rows_per_day=steps * B, num_days=1, test_rows=test_steps * B)
    generate(root, cfg, overwrite=True)


def _deepfm_batches(root: Path) -> tuple[list, list]:
    import tnrec as tn

    cols = tn.data.criteo_columns()
    train = list(tn.data.read_parquet(str(root / "2024-05-10" / "*.parquet"), cols, batch_size=B))
    test = list(tn.data.read_parquet(str(root / "test" / "*.parquet"), cols, batch_size=B))
    return train, test


# --------------------------------------------------------------------------- implementations


def _columns(batch: Any) -> list[str]:
    return sorted(batch.sparse, key=lambda k: (len(k), k))


class TnrecImpl:
    def __init__(self, model: str) -> None:
        import torch

        import tnrec as tn

        if model == "deepfm":
            from tnrec.models import DeepFM

            self.model = DeepFM(
                tn.data.criteo_columns(),
                embedding_dim=D,
                hidden_units=[400, 400, 400],
                sparse_optimizer=tn.optimizer.AdaGrad(SPARSE_LR, epsilon=EPS),
            )
            self.model.compile(torch.optim.Adam(self.model.parameters(), DENSE_LR), metrics=())
        else:
            cols = [
                tn.feature_column.embedding_column(tn.feature_column.category_column(f"c{c}"), D)
                for c in range(2)
            ]

            class Micro(tn.Model):
                def __init__(self) -> None:
                    super().__init__()
                    self.emb = tn.layers.EmbeddingFeatures(
                        cols,
                        tn.optimizer.AdaGrad(SPARSE_LR, epsilon=EPS),
                        output="concat",
                        initializer=tn.table.normal(INIT_SCALE),
                    )
                    self.lin = torch.nn.Linear(2 * D, 1)

                def forward_dense(self, pooled: dict, dense: Any) -> Any:
                    return self.lin(pooled["emb"]).squeeze(-1)  # [B]

            self.model = Micro()
            self.model.compile(
                torch.optim.Adam(self.model.parameters(), DENSE_LR),
                loss="binary_crossentropy_from_logits",
            )
        self.model.train()

    def prefill(self, keys: np.ndarray) -> None:
        """Create ``keys`` (a fixed table has all its rows up front)."""
        (table,) = self.model.tables.values()
        for i in range(0, keys.shape[0], 100_000):
            table.pull_unchecked(keys[i : i + 100_000])

    def train_step(self, batch: Any) -> None:
        self.model.train_step(batch)

    def predict(self, batch: Any) -> np.ndarray:
        self.model.eval()
        p = next(iter(self.model.predict_step(batch).values()))
        self.model.train()
        return p


class _FixedTables:
    """Hash each column's keys into a fixed table of ``rows[c]`` rows."""

    def __init__(self, model: str, first: Any) -> None:
        from tnrec.data.synthetic import CRITEO_CARDINALITIES

        self.cols = _columns(first)
        if model == "deepfm":
            self.rows = [min(n, FIXED_ROWS_CAP) for n in CRITEO_CARDINALITIES]
        else:
            self.rows = [1_000_000] * len(self.cols)
        self.base = np.concatenate([[0], np.cumsum(self.rows)]).astype(np.int64)

    def indices(self, batch: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
        idx, lengths = [], []
        for c, name in enumerate(self.cols):
            j = batch.sparse[name]
            idx.append((j.keys.view(np.uint64) % np.uint64(self.rows[c])).astype(np.int64))
            lengths.append(np.diff(j.offsets))
        return idx, lengths


FIXED_ROWS_CAP = 1_000_000
WIDE_DIM_TORCHREC = 4


class _DenseHead:
    """The dense part shared by the fixed-table implementations (same as tnrec's models)."""

    def __init__(self, model: str, num_cols: int, num_dense: int) -> None:
        import torch

        from tnrec.models.base import mlp

        self.model = model
        self.C = num_cols
        if model == "deepfm":
            self.deep = mlp(num_cols * D + num_dense, [400, 400, 400], "bench", out_features=1)
            self.wide_dense = torch.nn.Linear(num_dense, 1)
            self.modules = [self.deep, self.wide_dense]
        else:
            self.lin = torch.nn.Linear(num_cols * D, 1)
            self.modules = [self.lin]

    def parameters(self) -> list:
        return [p for m in self.modules for p in m.parameters()]

    def logit(self, flat: Any, wide: Any, dense: Any) -> Any:
        if self.model != "deepfm":
            return self.lin(flat).squeeze(-1)
        v = flat.view(flat.shape[0], self.C, D)  # [B, C, D]
        fm = 0.5 * (v.sum(dim=1).square() - v.square().sum(dim=1)).sum(dim=1)  # [B]
        deep = self.deep(__import__("torch").cat([flat, dense], dim=1)).squeeze(-1)
        return wide.sum(dim=1) + self.wide_dense(dense).squeeze(-1) + fm + deep


class _FixedImpl:
    """Shared loop of the fixed-table implementations: precomputed indices, BCE, Adam."""

    def __init__(self, model: str, first: Any) -> None:
        import torch

        self.torch = torch
        self.fixed = _FixedTables(model, first)
        self.model = model
        self.head = _DenseHead(model, len(self.fixed.cols), first.dense.shape[1])
        self.opt = torch.optim.Adam(self.head.parameters(), DENSE_LR)
        self._cache: dict[int, Any] = {}

    def inputs(self, batch: Any) -> Any:
        key = id(batch)
        if key not in self._cache:
            self._cache[key] = self.prepare(batch)
        return self._cache[key]

    def train_step(self, batch: Any) -> None:
        torch = self.torch
        flat, wide = self.embed(self.inputs(batch))
        dense = torch.from_numpy(batch.dense)
        logit = self.head.logit(flat, wide, dense)
        y = torch.from_numpy(batch.labels[:, 0])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
        self.opt.zero_grad(set_to_none=True)
        self.zero_sparse()
        loss.backward()
        self.sparse_step()
        self.opt.step()

    def predict(self, batch: Any) -> np.ndarray:
        torch = self.torch
        with torch.no_grad():
            flat, wide = self.embed(self.inputs(batch))
            logit = self.head.logit(flat, wide, torch.from_numpy(batch.dense))
        self._cache.pop(id(batch), None)
        return torch.sigmoid(logit).numpy()

    def zero_sparse(self) -> None:
        pass

    def sparse_step(self) -> None:
        pass


def _init_normal(w: Any, dim: int, zero: bool) -> None:
    import torch

    with torch.no_grad():
        if zero:
            w.zero_()
        else:
            w.normal_(0.0, INIT_SCALE / math.sqrt(dim))


class TorchrecImpl(_FixedImpl):
    def __init__(self, model: str, first: Any) -> None:
        super().__init__(model, first)
        import torch
        import torchrec
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

        cfg = []
        for c, name in enumerate(self.fixed.cols):
            cfg.append(
                torchrec.EmbeddingBagConfig(
                    name=f"t_{name}",
                    embedding_dim=D,
                    num_embeddings=self.fixed.rows[c],
                    feature_names=[name],
                    pooling=torchrec.PoolingType.SUM,
                )
            )
            if model == "deepfm":
                # fbgemm needs dims that are multiples of 4: the wide weight is
                # the mean of a dim-4 row, which row-wise AdaGrad updates exactly
                # like a dim-1 row (each element gets g/4, g2sum grows by g^2/16).
                cfg.append(
                    torchrec.EmbeddingBagConfig(
                        name=f"w_{name}",
                        embedding_dim=WIDE_DIM_TORCHREC,
                        num_embeddings=self.fixed.rows[c],
                        feature_names=[f"w_{name}"],
                        pooling=torchrec.PoolingType.SUM,
                    )
                )
        self.KJT = torchrec.KeyedJaggedTensor
        self.ebc = FusedEmbeddingBagCollection(
            tables=cfg,
            optimizer_type=torchrec.optim.RowWiseAdagrad,
            optimizer_kwargs={"lr": SPARSE_LR, "eps": EPS},
            device=torch.device("cpu"),
        )
        for name, w in self.ebc.state_dict().items():
            _init_normal(w, w.shape[1], zero=".w_" in name or name.startswith("w_"))
        self.names = [
            n
            for name in self.fixed.cols
            for n in ([name, f"w_{name}"] if model == "deepfm" else [name])
        ]

    def prepare(self, batch: Any) -> Any:
        torch = self.torch
        idx, lengths = self.fixed.indices(batch)
        if self.model == "deepfm":
            idx = [a for i in idx for a in (i, i)]
            lengths = [a for n in lengths for a in (n, n)]
        return self.KJT(
            keys=self.names,
            values=torch.from_numpy(np.concatenate(idx)),
            lengths=torch.from_numpy(np.concatenate(lengths)),
        )

    def embed(self, kjt: Any) -> Any:
        out = self.ebc(kjt).to_dict()  # fused backward applies the optimizer
        flat = self.torch.cat([out[n] for n in self.fixed.cols], dim=1)  # [B, C*D]
        wide = (
            self.torch.stack([out[f"w_{n}"].mean(dim=1) for n in self.fixed.cols], dim=1)
            if self.model == "deepfm"
            else None
        )  # [B, C]
        return flat, wide


class PlainImpl(_FixedImpl):
    def __init__(self, model: str, first: Any) -> None:
        super().__init__(model, first)
        torch = self.torch
        total = int(self.fixed.base[-1])
        self.emb = torch.nn.EmbeddingBag(total, D, mode="sum", sparse=True)
        _init_normal(self.emb.weight, D, zero=False)
        self.tables = [self.emb]
        if model == "deepfm":
            self.wide = torch.nn.EmbeddingBag(total, 1, mode="sum", sparse=True)
            _init_normal(self.wide.weight, 1, zero=True)
            self.tables.append(self.wide)
        self.g2 = [torch.zeros(t.weight.shape[0]) for t in self.tables]

    def prepare(self, batch: Any) -> Any:
        torch = self.torch
        idx, lengths = self.fixed.indices(batch)
        flat = np.concatenate([i + self.fixed.base[c] for c, i in enumerate(idx)])
        lens = np.concatenate(lengths)  # [C*B], column-major bags
        offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        return torch.from_numpy(flat), torch.from_numpy(offsets)

    def embed(self, inp: Any) -> Any:
        idx, offsets = inp
        C = len(self.fixed.cols)
        out = self.emb(idx, offsets)  # [C*B, D]
        flat = out.view(C, -1, D).permute(1, 0, 2).reshape(-1, C * D)  # [B, C*D]
        wide = self.wide(idx, offsets).view(C, -1).t() if self.model == "deepfm" else None
        return flat, wide

    def zero_sparse(self) -> None:
        for t in self.tables:
            t.weight.grad = None

    def sparse_step(self) -> None:
        """Row-wise AdaGrad on the coalesced sparse gradient, written out."""
        torch = self.torch
        with torch.no_grad():
            for t, g2 in zip(self.tables, self.g2, strict=True):
                g = t.weight.grad.coalesce()
                rows = g.indices()[0]  # [U]
                vals = g.values()  # [U, D]
                acc = g2.index_select(0, rows) + vals.square().mean(dim=1)  # [U]
                g2.index_copy_(0, rows, acc)
                t.weight.index_add_(0, rows, vals * (-SPARSE_LR / (EPS + acc.sqrt())).unsqueeze(1))


class DenseImpl:
    """The dense part alone on fixed random inputs: the floor of any implementation's step."""

    def __init__(self, model: str, first: Any) -> None:
        import torch

        self.torch = torch
        C = len(first.sparse)
        F = first.dense.shape[1]
        self.head = _DenseHead(model, C, F)
        self.opt = torch.optim.Adam(self.head.parameters(), DENSE_LR)
        g = torch.Generator().manual_seed(0)
        # The inputs stand for pooled embeddings: every implementation needs their
        # gradient, so the dense-only step computes it too.
        self.flat = (torch.randn(B, C * D, generator=g) * 0.02).requires_grad_()
        self.wide = (
            (torch.randn(B, C, generator=g) * 0.02).requires_grad_() if model == "deepfm" else None
        )

    def train_step(self, batch: Any) -> None:
        torch = self.torch
        n = batch.size
        logit = self.head.logit(
            self.flat[:n],
            None if self.wide is None else self.wide[:n],
            torch.from_numpy(batch.dense),
        )
        y = torch.from_numpy(batch.labels[:, 0])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
        self.opt.zero_grad(set_to_none=True)
        self.flat.grad = None
        loss.backward()
        self.opt.step()

    def predict(self, batch: Any) -> np.ndarray:
        return np.full(batch.size, 0.5, np.float32)


# --------------------------------------------------------------------------- one run


def _rss_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _collision_rate(fixed: _FixedTables, batches: list) -> float:
    """Share of distinct keys that share their fixed-table row with another distinct key."""
    shared = total = 0
    for c, name in enumerate(fixed.cols):
        keys = np.unique(np.concatenate([b.sparse[name].keys for b in batches]))
        rows = keys.view(np.uint64) % np.uint64(fixed.rows[c])
        _, inv, counts = np.unique(rows, return_inverse=True, return_counts=True)
        shared += int((counts[inv] > 1).sum())
        total += keys.shape[0]
    return shared / max(total, 1)


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """Train one implementation for one pass in this process; return its figures."""
    import torch

    torch.set_num_threads(args.threads)
    # Repeat r seeds torch with r in every implementation: a run is reproducible,
    # and within a repeat the dense layers (built first, in the same order) start equal.
    torch.manual_seed(args.seed)
    from tnrec.data.synthetic import roc_auc

    if args.model == "deepfm":
        train, test = _deepfm_batches(Path(args.data))
    else:
        train, test, base_keys = _micro_batches(args.model, args.steps, args.test_steps)
    rss_data = _rss_mib("VmRSS")
    res: dict[str, Any] = {"model": args.model, "impl": args.impl}
    if args.impl == "tnrec":
        impl: Any = TnrecImpl(args.model)
        if args.model != "deepfm":
            # TorchRec and plain start with every row allocated; tnrec starts with
            # the base ids' rows (zipf: the 5% never-seen ids are created in the step).
            t0 = time.perf_counter()
            impl.prefill(base_keys)
            res["prefill_s"] = time.perf_counter() - t0
    elif args.impl == "torchrec":
        impl = TorchrecImpl(args.model, train[0])
        res["collision_rate"] = _collision_rate(impl.fixed, train + test)
    elif args.impl == "plain":
        impl = PlainImpl(args.model, train[0])
        res["collision_rate"] = _collision_rate(impl.fixed, train + test)
    else:
        impl = DenseImpl(args.model, train[0])
    times = []
    for b in train:
        if args.impl in ("torchrec", "plain"):
            impl.inputs(b)  # index hashing outside the timed step (tnrec's keys come hashed)
        t0 = time.perf_counter()
        impl.train_step(b)
        times.append(time.perf_counter() - t0)
        if args.impl in ("torchrec", "plain"):
            impl._cache.pop(id(b), None)
    timed = times[args.warmup :]
    res["samples_per_s"] = B * len(timed) / sum(timed)
    res["step_ms_median"] = 1e3 * float(np.median(timed))
    if args.impl != "dense":
        y = np.concatenate([b.labels[:, 0] for b in test])
        p = np.concatenate([impl.predict(b) for b in test])
        res["auc"] = roc_auc(y, p)
    res["rss_after_data_mib"] = rss_data
    res["peak_rss_mib"] = _rss_mib("VmHWM")  # before the split's second model
    if args.impl == "tnrec" and args.split:
        res["split_ms"] = tnrec_split(impl.model, train[-args.split_steps :])
        fresh = TnrecImpl(args.model)  # a first pass again: new keys get their rows created
        if args.model != "deepfm":
            fresh.prefill(base_keys)
        res["alternating_ms"] = alternating(fresh, DenseImpl(args.model, train[0]), train)
    return res


def alternating(impl: Any, dense: Any, batches: list) -> dict[str, float]:
    """Median ms of tnrec's step and the dense-only step, run alternately in one process.

    Two processes run back to back still see different load on a shared
    machine (their ratio swung 0.73-1.47 between repeats); steps alternating in
    one process see the same, so their ratio is the steadier overhead figure.
    """
    times: dict[str, list[float]] = {"tnrec": [], "dense": []}
    for i, b in enumerate(batches):
        order = [("tnrec", impl), ("dense", dense)]
        for name, runner in order if i % 2 else order[::-1]:
            t0 = time.perf_counter()
            runner.train_step(b)
            times[name].append(time.perf_counter() - t0)
    out = {k: 1e3 * float(np.median(v[1:])) for k, v in times.items()}
    out["ratio"] = out["tnrec"] / out["dense"]
    return out


def tnrec_split(model: Any, batches: list) -> dict[str, float]:
    """Median ms per part of a tnrec step (the same calls as ``Model.train_step``)."""
    import torch

    from tnrec.ps import unique_inverse

    parts: dict[str, list[float]] = {
        k: [] for k in ("dedup", "pull", "forward", "backward", "push", "dense_opt", "step")
    }
    opt = model.optimizer
    for b in batches:
        keys = np.concatenate([j.keys for j in b.sparse.values()])
        t0 = time.perf_counter()
        unique_inverse(keys)
        t1 = time.perf_counter()
        model.pull(b)
        t2 = time.perf_counter()
        loss, _ = model.compute_loss(b, model(b), norm=float(b.size))
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t4 = time.perf_counter()
        model.push()
        t5 = time.perf_counter()
        opt.step()
        t6 = time.perf_counter()
        torch.set_num_threads(torch.get_num_threads())
        parts["dedup"].append(t1 - t0)
        parts["pull"].append(t2 - t1)
        parts["forward"].append(t3 - t2)
        parts["backward"].append(t4 - t3)
        parts["push"].append(t5 - t4)
        parts["dense_opt"].append(t6 - t5)
        parts["step"].append(t6 - t1)
    return {k: 1e3 * float(np.median(v)) for k, v in parts.items()}


# --------------------------------------------------------------------------- driver


def _has_torchrec() -> str | None:
    r = subprocess.run(
        [sys.executable, "-c", "import torchrec, fbgemm_gpu"], capture_output=True, text=True
    )
    if r.returncode == 0:
        return None
    last = (r.stderr.strip().splitlines() or ["?"])[-1]
    return f"TorchRec not importable ({last}); run bench/requirements-torchrec.sh"


def _child(model: str, impl: str, a: argparse.Namespace, data: str, seed: int) -> dict[str, Any]:
    steps = a.steps if model != "deepfm" else a.deepfm_steps
    cmd = [
        sys.executable, __file__, "--child", "--model", model, "--impl", impl,
        "--threads", str(a.threads), "--steps", str(steps),
        "--test-steps", str(a.test_steps), "--warmup", str(a.warmup), "--data", data,
        "--seed", str(seed),
    ]  # fmt: skip
    if impl == "tnrec" and (a.split or a.split_only):
        cmd += ["--split"]
    env = dict(
        os.environ,
        NUMBA_NUM_THREADS=str(a.threads),
        OMP_NUM_THREADS=str(a.threads),
        TNREC_TABLE_THREADS=str(a.threads),
    )
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout_s)
    if r.returncode != 0:
        return {"model": model, "impl": impl, "error": r.stderr.strip()[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _fmt_range(v: list[float], scale: float = 1e-3, digits: int = 1) -> str:
    med, lo, hi = (x * scale for x in (float(np.median(v)), min(v), max(v)))
    return f"{med:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _paired(num: list[dict], den: list[dict], key: str) -> list[float]:
    """``num[r][key] / den[r][key]`` for each repeat ``r`` both finished."""
    return [
        x[key] / y[key]
        for x, y in zip(num, den, strict=False)
        if "error" not in x and "error" not in y
    ]


def _fmt_ratio(v: list[float], suffix: str = "") -> str:
    if not v:
        return "-"
    return f"{np.median(v):.2f}{suffix} ({min(v):.2f}-{max(v):.2f})"


def report(results: dict[str, dict[str, list[dict]]], skipped: str | None) -> str:
    lines = [
        "samples/s in thousands: median (min-max) of the interleaved repeats; step ms: median "
        "step; AUC on the held-out split after one pass (median); peak RSS of the run's process "
        "(MiB, median); the ratios are taken within each repeat (its runs ran one after "
        "another), then the median (min-max) over the repeats",
        "",
        "model   impl      ksamples/s               step ms  AUC     collisions  peak RSS  "
        "vs tnrec            step/dense",
        "------  --------  -----------------------  -------  ------  ----------  --------  "
        "------------------  ----------------",
    ]
    for model, by_impl in results.items():
        tn_runs = by_impl.get("tnrec", [])
        dense_runs = by_impl.get("dense", [])
        for impl in IMPLS:
            runs = by_impl.get(impl)
            if runs is None:
                if impl == "torchrec" and skipped:
                    lines.append(f"{model:6}  {impl:8}  skipped: {skipped}")
                continue
            ok = [r for r in runs if "error" not in r]
            if not ok:
                lines.append(f"{model:6}  {impl:8}  FAILED: {runs[0]['error'].splitlines()[-1]}")
                continue
            sps = [r["samples_per_s"] for r in ok]
            ms = float(np.median([r["step_ms_median"] for r in ok]))
            auc = f"{np.median([r['auc'] for r in ok]):.4f}" if "auc" in ok[0] else "-"
            coll = f"{100 * ok[0]['collision_rate']:.1f}%" if "collision_rate" in ok[0] else "0"
            rss = float(np.median([r["peak_rss_mib"] for r in ok]))
            ratio = _fmt_ratio(_paired(tn_runs, runs, "samples_per_s"), "x")
            over = (
                _fmt_ratio(_paired(runs, dense_runs, "step_ms_median")) if impl != "dense" else "-"
            )
            lines.append(
                f"{model:6}  {impl:8}  {_fmt_range(sps):23}  {ms:7.2f}  {auc:6}  {coll:>10}  "
                f"{rss:8.0f}  {ratio:>18}  {over:>16}"
            )
    lines.append("")
    lines.append("vs tnrec = tnrec samples/s / this row's samples/s (> 1: tnrec faster)")
    for model, by_impl in results.items():
        for r in by_impl.get("tnrec", []):
            if "split_ms" in r:
                sp = r["split_ms"]
                lines.append(
                    f"tnrec {model} step split (ms, median of the last steps): "
                    + ", ".join(f"{k} {v:.2f}" for k, v in sp.items())
                    + (f"; prefill {r['prefill_s']:.1f} s" if "prefill_s" in r else "")
                )
                break
        alt = [r["alternating_ms"] for r in by_impl.get("tnrec", []) if "alternating_ms" in r]
        if alt:
            ratios = [x["ratio"] for x in alt]
            lines.append(
                f"tnrec {model} step / dense-only step, alternating in one process "
                f"(a fresh model, one pass): {_fmt_ratio(ratios)}; ms "
                f"{np.median([x['tnrec'] for x in alt]):.2f} / "
                f"{np.median([x['dense'] for x in alt]):.2f}"
            )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="micro,zipf,deepfm")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch and numba threads per run")
    p.add_argument("--steps", type=int, default=60, help="training steps of micro/zipf")
    p.add_argument("--deepfm-steps", type=int, default=30)
    p.add_argument("--test-steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="steps not timed")
    p.add_argument("--split", action="store_true", help="also print tnrec's per-part split")
    p.add_argument("--split-only", action="store_true", help="tnrec with its split, 1 repeat")
    p.add_argument("--split-steps", type=int, default=20)
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--out", help="write every figure as JSON")
    # child mode
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    p.add_argument("--data", default="", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(run_one(a)))
        return 0
    models = a.models.split(",")
    impls = ["tnrec"] if a.split_only else a.impls.split(",")
    repeats = 1 if a.split_only else a.repeats
    skipped = _has_torchrec() if "torchrec" in impls else None
    if skipped:
        print(f"TorchRec column skipped: {skipped}", file=sys.stderr)
        impls = [i for i in impls if i != "torchrec"]
    data_dir = Path(tempfile.gettempdir()) / f"tnrec_compare_deepfm_{a.deepfm_steps}_{a.test_steps}"
    if "deepfm" in models:
        _deepfm_data(data_dir, a.deepfm_steps, a.test_steps)
    t_start = time.time()
    results: dict[str, dict[str, list[dict]]] = {m: {i: [] for i in impls} for m in models}
    for model in models:
        for r in range(repeats):
            for impl in impls:
                res = _child(model, impl, a, str(data_dir), r)
                results[model][impl].append(res)
                msg = res.get("error", "").splitlines()[-1:] or [
                    f"{res['samples_per_s'] / 1e6:.3f} M samples/s"
                ]
                print(f"[{time.time() - t_start:6.0f} s] {model} {impl} r{r}: {msg[0]}",
                      file=sys.stderr, flush=True)  # fmt: skip
    text = report(results, skipped)
    import torch

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}, "
        f"threads {a.threads}; {a.steps} micro steps / {a.deepfm_steps} DeepFM steps "
        f"of {B}, {a.warmup} untimed"
    )
    print(text)
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "results": results}, indent=1))
    failed = any("error" in r for m in results.values() for rs in m.values() for r in rs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
