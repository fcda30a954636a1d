"""Batch normalisation and PCGrad on every worker under torchrun, and in-process as W = 1.

Run as ``torchrun --nproc-per-node W mp_dense_parity.py OUT_DIR CKPT_DIR``; each
worker writes ``OUT_DIR/dense-rank<r>.npz``. The global batches and their
slices by rank are those of the contract test (``mp_scenarios``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by torchrun as a script: import the tests package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tnrec as tn  # noqa: E402
from tests.multiprocess.mp_scenarios import global_batch, worker_slice  # noqa: E402
from tnrec.data.batch import Batch, Jagged  # noqa: E402
from tnrec.table import AdaGrad  # noqa: E402

fc = tn.feature_column
STEPS = 30
POS = fc.category_column("pos", dtype="int")
POS_KEYS = fc.hash_values(POS, [1, 2, 3])  # [3]


class Base(tn.Model):
    """The contract test's columns: user and a mean tags bag, item; two dense features."""

    def __init__(self) -> None:
        super().__init__()
        user, item, tags = (fc.category_column(k) for k in ("user", "item", "tags"))
        opt = AdaGrad(0.1, initial_g2sum=0.1)
        self.a = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(user, 4), fc.embedding_column(tags, 4, combiner="mean")],
            opt,
            output="concat",
        )
        self.b = tn.layers.EmbeddingFeatures([fc.embedding_column(item, 4)], opt, output="concat")

    def inputs(self, pooled, dense):
        return torch.cat([pooled["a"], pooled["b"], dense], 1)  # [B, 14]


class BNModel(Base):
    def __init__(self, sync_freq: int) -> None:
        super().__init__()
        self.bn = tn.layers.BatchNormalization(14, sync_freq=sync_freq, max_count=200)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(14, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
        )

    def forward_dense(self, pooled, dense):
        return self.mlp(self.bn(self.inputs(pooled, dense)))


class TwoHeads(Base):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(14, 8), torch.nn.ReLU())
        self.click = torch.nn.Linear(8, 1)
        self.other = torch.nn.Linear(8, 1)

    def forward_dense(self, pooled, dense):
        h = self.trunk(self.inputs(pooled, dense))  # [B, 8]
        return {"click": self.click(h), "other": self.other(h)}


class PosModel(Base):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = torch.nn.Linear(14, 1)
        self.position = tn.layers.PositionBias(POS, [1, 2, 3], hidden_units=[4])

    def forward_dense(self, pooled, dense):
        logit = self.mlp(self.inputs(pooled, dense)).squeeze(-1)  # [B]
        return logit + self.position(logit)  # [B]


def with_position(batch: Batch) -> Batch:
    """Add a position 1-3 per row (from its row id) as column "pos"."""
    keys = POS_KEYS[batch.row_ids % 3]  # [B]
    bags = Jagged(keys, np.arange(batch.size + 1, dtype=np.int64))
    return dataclasses.replace(batch, sparse={**batch.sparse, "pos": bags})


def opposite(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A head that pulls against the click head: squared error to 1 - y."""
    return (out - (1.0 - y)) ** 2


def train(
    model: tn.Model, rank: int, world: int, prefix: str, position: bool = False
) -> dict[str, np.ndarray]:
    losses = []
    for step in range(STEPS):
        batch = worker_slice(global_batch(step), step, rank, world)
        logs = model.train_step(with_position(batch) if position else batch)
        losses.append(float(model.ps.all_reduce_sum(np.array([logs.get("loss", 0.0)]))[0]))
    out = {f"{prefix}/loss": np.array(losses)}
    for name, p in model.named_parameters():
        out[f"{prefix}/dense/{name}"] = p.detach().numpy().copy()
    for name, b in model.named_buffers():
        out[f"{prefix}/buffer/{name}"] = b.numpy().copy()
    for tname, table in model.tables.items():
        for k, v in table.rows().items():
            out[f"{prefix}/table/{tname}/{k}"] = v
    return out


def batch_norm(rank: int, world: int, sync_freq: int, ckpt: str) -> dict[str, np.ndarray]:
    """Train the BN model; with a checkpoint directory, also save and report after the save."""
    torch.manual_seed(0)
    model = BNModel(sync_freq)
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    prefix = f"bn{sync_freq}"
    out = train(model, rank, world, prefix)
    if ckpt != "-":
        model.save_weights(ckpt, "d0")
        for name, b in model.bn.named_buffers():
            out[f"{prefix}/saved/{name}"] = b.numpy().copy()
    return out


def pcgrad(rank: int, world: int, on: bool) -> dict[str, np.ndarray]:
    # a start from which the heads' gradients conflict within the steps (from seed 0
    # they never do with this data, and PCGrad would leave every step as it is)
    torch.manual_seed(3)
    model = TwoHeads()
    model.compile(
        tn.optimizer.Adam(0.01),
        loss={"click": "binary_crossentropy_from_logits", "other": opposite},
        label={"click": "label", "other": "label"},
        pcgrad=on,
    )
    return train(model, rank, world, "pcgrad" if on else "plain")


def position_bias(rank: int, world: int) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    model = PosModel()
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    return train(model, rank, world, "position", position=True)


def run(rank: int, world: int, ckpt: str) -> dict[str, np.ndarray]:
    out = batch_norm(rank, world, 1, "-")
    out.update(batch_norm(rank, world, 4, ckpt))
    out.update(pcgrad(rank, world, True))
    out.update(position_bias(rank, world))
    return out


def main() -> None:
    out_dir, ckpt = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    strategy = tn.distribute.PsStrategy(timeout_s=120.0)
    out = run(strategy.rank, strategy.world_size, ckpt)
    np.savez(os.path.join(out_dir, f"dense-rank{strategy.rank}.npz"), **out)
    strategy.shutdown()


if __name__ == "__main__":
    main()
