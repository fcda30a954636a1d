"""The implementations ``bench/compare.py`` runs: tnrec, TorchRec, plain PyTorch, dense only.

* ``TnrecImpl``: ``tnrec.Model`` over sparse tables, row-wise AdaGrad;
* ``TorchrecImpl``: ``FusedEmbeddingBagCollection`` with EXACT_ROWWISE_ADAGRAD;
  fixed tables, keys hashed into ``[0, rows)``;
* ``PlainImpl``: ``nn.EmbeddingBag(sparse=True)`` with row-wise AdaGrad written
  out; the same fixed tables;
* ``DenseImpl``: the dense part alone on fixed inputs (no tables).

Each has ``train_step(batch)`` and ``predict(batch) -> [B]`` probabilities.
torch and torchrec are imported when an implementation is built, so this module
imports without them.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from compare_data import IDS_PER_COLUMN, B

IMPLS = ("tnrec", "torchrec", "plain", "dense")
D = 16
SPARSE_LR = 0.05
EPS = 1e-8
DENSE_LR = 1e-3
INIT_SCALE = 0.1  # N(0, 0.1/sqrt(D)) in every implementation (tnrec zoo's default)
FIXED_ROWS_CAP = 1_000_000
WIDE_DIM_TORCHREC = 4


def _columns(batch: Any) -> list[str]:
    return sorted(batch.sparse, key=lambda k: (len(k), k))


class TnrecImpl:
    """``tnrec.Model`` over sparse tables: DeepFM from the zoo, or one concat layer + Linear."""

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


class FixedTables:
    """Hash each column's keys into a fixed table of ``rows[c]`` rows."""

    def __init__(self, model: str, first: Any) -> None:
        from tnrec.data.synthetic import CRITEO_CARDINALITIES

        self.cols = _columns(first)
        if model == "deepfm":
            self.rows = [min(n, FIXED_ROWS_CAP) for n in CRITEO_CARDINALITIES]
        else:
            self.rows = [IDS_PER_COLUMN] * len(self.cols)
        self.base = np.concatenate([[0], np.cumsum(self.rows)]).astype(np.int64)

    def indices(self, batch: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
        idx, lengths = [], []
        for c, name in enumerate(self.cols):
            j = batch.sparse[name]
            idx.append((j.keys.view(np.uint64) % np.uint64(self.rows[c])).astype(np.int64))
            lengths.append(np.diff(j.offsets))
        return idx, lengths


class _DenseHead:
    """The dense part shared by the fixed-table implementations (same as tnrec's models)."""

    def __init__(self, model: str, num_cols: int, num_dense: int) -> None:
        import torch

        from tnrec.models.base import mlp

        self.torch = torch
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
        deep = self.deep(self.torch.cat([flat, dense], dim=1)).squeeze(-1)
        return wide.sum(dim=1) + self.wide_dense(dense).squeeze(-1) + fm + deep


class _FixedImpl:
    """Shared loop of the fixed-table implementations: precomputed indices, BCE, Adam."""

    def __init__(self, model: str, first: Any) -> None:
        import torch

        self.torch = torch
        self.fixed = FixedTables(model, first)
        self.model = model
        self.head = _DenseHead(model, len(self.fixed.cols), first.dense.shape[1])
        self.opt = torch.optim.Adam(self.head.parameters(), DENSE_LR)
        self._cache: dict[int, Any] = {}

    def inputs(self, batch: Any) -> Any:
        """Return ``batch``'s table indices, prepared once and kept until :meth:`forget`."""
        key = id(batch)
        if key not in self._cache:
            self._cache[key] = self.prepare(batch)
        return self._cache[key]

    def forget(self, batch: Any) -> None:
        """Drop ``batch``'s prepared indices."""
        self._cache.pop(id(batch), None)

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
        self.forget(batch)
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
    """TorchRec's ``FusedEmbeddingBagCollection``; the optimizer runs in its backward."""

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
    """``nn.EmbeddingBag(sparse=True)`` over all columns' rows, row-wise AdaGrad written out."""

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
        self.timed_step(batch)

    def timed_step(self, batch: Any) -> dict[str, float]:
        """:meth:`train_step`, returning the seconds of its parts: ``forward`` (with
        the loss), ``backward`` and ``dense_opt``."""
        torch = self.torch
        n = batch.size
        t0 = time.perf_counter()
        logit = self.head.logit(
            self.flat[:n],
            None if self.wide is None else self.wide[:n],
            torch.from_numpy(batch.dense),
        )
        y = torch.from_numpy(batch.labels[:, 0])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
        t1 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        self.flat.grad = None
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "dense_opt": t3 - t2}

    def predict(self, batch: Any) -> np.ndarray:
        return np.full(batch.size, 0.5, np.float32)
