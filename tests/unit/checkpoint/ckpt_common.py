"""Model, data and comparisons used by the checkpoint tests and their child processes."""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import tnrec as tn
from tnrec.table import AdaGrad, Adam, EvictionPolicy

fc = tn.feature_column
COLS = [fc.category_column(k) for k in ("user", "item", "tags")]
NUMERIC = [fc.numeric_column("d0")]


class Net(tn.Model):
    def __init__(self, dim: int = 4, extra: bool = False):
        super().__init__()
        policy = EvictionPolicy(show_threshold=0.5, max_unseen_days=1)
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(c, dim, combiner="mean") for c in COLS],
            AdaGrad(0.1),
            output="concat",
            policy=policy,
        )
        self.wide = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(c, 1) for c in COLS], Adam(0.01), output="concat"
        )
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(3 * dim + 1, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
        )
        self.extra = torch.nn.Linear(2, 2) if extra else None
        self.feature_columns = NUMERIC

    def forward_dense(self, pooled, dense):
        return self.mlp(torch.cat([pooled["emb"], dense], 1)).squeeze(1) + pooled["wide"].sum(1)


def build(**kw) -> Net:
    torch.manual_seed(0)
    m = Net(**kw)
    m.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
    return m


def write_day(data_dir: str, day: int, rows: int = 240) -> str:
    """One day of Parquet data; ids churn from day to day."""
    rng = np.random.default_rng(day)
    path = os.path.join(data_dir, f"day{day}.parquet")
    users = rng.integers(0, 60, rows) + 40 * day
    items = rng.integers(0, 30, rows)
    pq.write_table(
        pa.table(
            {
                "user": pa.array(users, pa.int64()),
                "item": pa.array(items, pa.int64()),
                "tags": pa.array(
                    [rng.integers(0, 9, rng.integers(0, 3)).tolist() for _ in range(rows)],
                    pa.list_(pa.int64()),
                ),
                "d0": pa.array(rng.normal(size=rows)),
                "label": pa.array(((users + items) % 3 == 0).astype(float)),
            }
        ),
        path,
        row_group_size=64,
    )
    return path


def reader(path: str):
    return tn.data.read_parquet([path], [*COLS, *NUMERIC], batch_size=16, prefetch=0)


def snapshot(model: Net) -> dict[str, np.ndarray]:
    """Every table row (sorted by key) and every dense tensor, as numpy."""
    out = {}
    for name, table in model.tables.items():
        for k, v in table.rows().items():
            out[f"table/{name}/{k}"] = v
    for k, v in model.state_dict().items():
        out[f"dense/{k}"] = v.numpy().copy()
    if model.optimizer is not None:
        for i, st in model.optimizer.state_dict()["state"].items():
            for k, v in st.items():
                out[f"opt/{i}/{k}"] = v.numpy().copy() if torch.is_tensor(v) else np.array(v)
    return out


def assert_same(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], skip=("marker",), context: str = ""
) -> None:
    """Assert two snapshots are bit-identical but for arrays named in ``skip``.

    ``context`` (e.g. which run of a loop) starts the failure message.
    """
    where = f"{context}: " if context else ""
    assert sorted(a) == sorted(b), f"{where}arrays in only one: {sorted(set(a) ^ set(b))}"
    for k in a:
        if k.rsplit("/", 1)[-1] in skip:
            continue
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"{where}{k}")


def train_days(model_dir: str, data_dir: str, days: int, save_every: int | None = None) -> Net:
    """The daily cycle (tnrec.daily): skip complete days, resume, decay, evict, save."""
    from tnrec.daily import train_days as daily

    model = build()
    schedule = [(f"day{d}", lambda d=d: reader(write_day(data_dir, d))) for d in range(days)]
    daily(model, schedule, model_dir, save_every_n_steps=save_every)
    return model


if (
    __name__ == "__main__"
):  # child process for kill tests: python ckpt_common.py MODEL_DIR DATA_DIR DAYS [N]
    torch.set_num_threads(1)
    every = int(sys.argv[4]) if len(sys.argv) > 4 else None
    train_days(sys.argv[1], sys.argv[2], int(sys.argv[3]), every)
