"""Sharded exports on every worker: run under torchrun by ``test_sharded_export.py``.

Run as ``torchrun --nproc-per-node 2 sharded_scenarios.py WORK_DIR M1``; ``M1`` is a
model dir of ``tnrec train`` in one process (days ``DAYS``). Every worker writes into
``WORK_DIR``:

* ``from-w1``, ``d1-from-w1``: ``tnrec export`` of m1's checkpoints (written by 1 worker);
* ``m2``: m1's two checkpoints loaded and saved again by the workers (written by 2);
* ``model-export``: ``model.export`` of the second day's model under the PsStrategy;
* ``from-w2``: ``tnrec export`` of m2's last checkpoint;
* ``delta-from-w1``, ``delta-from-w2``: the delta exports between the two days;
* ``two-tables``: :func:`two_tables`, an empty table and a worker whose buckets hold no keys;
* ``failed``: a write that fails on rank 1 only (must leave nothing);

and writes what it saw to ``WORK_DIR/result-rank<r>.json``. The test compares the
exports to the same ones written in one process. Imports only tnrec and third-party
packages (the child process does not have ``tests`` on its path).
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pyarrow as pa
import torch

import tnrec as tn
from tnrec.cli import artifacts
from tnrec.cli import run as cli_run
from tnrec.errors import WriteError

DAYS = ("2024-05-10", "2024-05-11")
FAIL_NEEDLE = "shard-00001-of-00002/weights.npy"  # a file only rank 1 of 2 writes
fc = tn.feature_column
A = fc.category_column("a", dtype="int")
B = fc.category_column("b", dtype="int")


class TwoTables(tn.Model):
    """Table "few" holds a few keys, all of the buckets of rank 0 of 2; table "none" none."""

    def __init__(self):
        super().__init__()
        opt = tn.table.AdaGrad(0.1)
        self.few = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(A, 3)], opt, table="few", output="concat"
        )
        self.none = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(B, 2)], opt, table="none", output="concat"
        )
        self.mlp = torch.nn.Linear(5, 1)

    def forward_dense(self, pooled, dense):
        return self.mlp(torch.cat([pooled["few"], pooled["none"]], 1))


def two_table_rows() -> list[dict[str, int]]:
    return [{"a": v, "b": v} for v in range(40)]


def two_tables(rank: int, world: int) -> TwoTables:
    """The model with, in table "few", the keys of the rows whose bucket is even."""
    torch.manual_seed(0)
    model = TwoTables()
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    keys = tn.data.to_batch(pa.Table.from_pylist(two_table_rows()), [A, B]).sparse["a"].keys
    even = keys[tn.export.shard_of(keys, 2) == 0]  # shard 0 of 2: worker 0 of 2's buckets
    mine = even[tn.export.shard_of(even, world) == rank]
    model.tables["few"].pull(np.ascontiguousarray(mine), create=True)
    return model


def main() -> None:
    work, m1 = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    strategy = tn.distribute.PsStrategy(timeout_s=120.0)
    rank, world = strategy.rank, strategy.world_size
    m2 = os.path.join(work, "m2")
    out = {}
    cli_run.export(m1, os.path.join(work, "from-w1"))
    cli_run.export(m1, os.path.join(work, "d1-from-w1"), dt=DAYS[0])
    if rank == 0:
        os.makedirs(m2)
        shutil.copy(os.path.join(m1, "model.json"), m2)
    strategy.barrier()
    for day in DAYS:
        model, _ = artifacts.load_model(m1, day)
        model.save_weights(m2, day)
    out["own_keys_only"] = all(
        bool((tn.export.shard_of(t.keys(), world) == rank).all()) for t in model.tables.values()
    )
    model.export(os.path.join(work, "model-export"), dt=DAYS[1])
    cli_run.export(m2, os.path.join(work, "from-w2"))
    for name, root in (("delta-from-w1", m1), ("delta-from-w2", m2)):
        cli_run.export(root, os.path.join(work, name), delta=True, since=DAYS[0], to=DAYS[1])
    two_tables(rank, world).export(os.path.join(work, "two-tables"))
    os.environ["TNREC_FAIL_WRITE"] = FAIL_NEEDLE
    try:
        model.export(os.path.join(work, "failed"))
        out["failed"] = "no error"
    except WriteError as e:
        out["failed"] = str(e)
    finally:
        del os.environ["TNREC_FAIL_WRITE"]
    strategy.barrier()
    with open(os.path.join(work, f"result-rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(out, f)
    strategy.shutdown()


if __name__ == "__main__":
    main()
