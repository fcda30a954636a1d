"""A model whose table admits keys at show 2 and caps rows, for the day-counter tests.

Run as ``torchrun --nproc-per-node 2 memory_common.py OUT_DIR DATA_DIR``: every worker
trains (1) a fit where rank 1 runs out of data after one batch, recording the memory
reports it took part in, and (2) two days of ``train_days``, recording its tables'
counters at the start and end of each day; it writes ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

# the repository root, so that a worker started by torchrun imports tests.unit.checkpoint
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if ROOT not in sys.path:  # run as a script under torchrun
    sys.path.insert(0, ROOT)

import tnrec as tn  # noqa: E402
from tests.unit.checkpoint import ckpt_common as cc  # noqa: E402
from tnrec.callbacks import Callback  # noqa: E402
from tnrec.table import AdaGrad, AdmissionPolicy, EvictionPolicy  # noqa: E402

fc = tn.feature_column
DAYS = ("2024-05-10", "2024-05-11")


class AdmNet(tn.Model):
    """One dim-4 table: admission at show 2 (a small sketch), a 1,024-row cap, and
    eviction of rows unseen for a day at each day's end."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(c, 4, combiner="mean") for c in cc.COLS],
            AdaGrad(0.1),
            output="concat",
            admission=AdmissionPolicy(min_show=2, sketch_bytes=1 << 16),
            policy=EvictionPolicy(max_rows=1024, show_threshold=0.5, max_unseen_days=1),
        )
        self.mlp = torch.nn.Linear(3 * 4 + 1, 1)
        self.feature_columns = cc.NUMERIC

    def forward_dense(self, pooled, dense):
        return self.mlp(torch.cat([pooled["emb"], dense], 1)).squeeze(1)


def build() -> AdmNet:
    torch.manual_seed(0)
    m = AdmNet()
    m.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
    return m


def write_data(data_dir: str) -> None:
    """The days' files and an extra day (``day5``) for the uneven fit; written once, by the
    test, before the workers start (two workers writing one file would race)."""
    for i in (0, 1, 5):
        cc.write_day(data_dir, i)


def days(data_dir: str) -> list:
    """``train_days``' schedule over the files :func:`write_data` wrote."""

    def make(i: int):
        return lambda: cc.reader(os.path.join(data_dir, f"day{i}.parquet"))

    return [(dt, make(i)) for i, dt in enumerate(DAYS)]


class Recorder(Callback):
    """Each memory report with this worker's own memory() then; counters at fit's ends."""

    def __init__(self) -> None:
        self.reports: list = []
        self.counters: list = []

    def on_memory_report(self, step, report):
        self.reports.append(
            {"step": step, "report": report, "mine": self.model.tables["emb"].memory()}
        )

    def on_train_begin(self, logs=None):
        self.counters.append({"start": dict(self.model.tables["emb"].counters)})

    def on_train_end(self, logs=None):
        self.counters[-1]["end"] = dict(self.model.tables["emb"].counters)


def run(out_dir: str, data_dir: str) -> None:
    from tnrec.daily import train_days

    strategy = tn.distribute.PsStrategy(timeout_s=120.0)
    rank = strategy.rank
    batches = list(cc.reader(os.path.join(data_dir, "day5.parquet")))
    mine = batches[:5] if rank == 0 else batches[5:6]  # rank 1 is out of data after 1 step
    model = build()
    uneven = Recorder()
    model.fit(mine, callbacks=[uneven], verbose=0, log_every=2)
    model = build()
    daily = Recorder()
    reports = train_days(
        model, days(data_dir), os.path.join(data_dir, "m"), callbacks=[daily], log_every=3
    )
    out = {
        "uneven": uneven.reports,
        "daily_reports": daily.reports,
        "counters": daily.counters,
        "days": [r.__dict__ for r in reports],
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(out, f)
    strategy.shutdown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(sys.argv[1], sys.argv[2])
