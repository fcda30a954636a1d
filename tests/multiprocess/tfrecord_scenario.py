"""Each worker under torchrun trains one epoch on its records of one TFRecord file.

Run as ``torchrun --nproc-per-node W tfrecord_scenario.py OUT_DIR DATA``; each worker
writes ``OUT_DIR/tfrecord-rank<r>.npz`` (the row ids it trained on, its bad rows).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo: tests.multiprocess

import tnrec as tn  # noqa: E402
from tests.multiprocess.mp_scenarios import RowCounting  # noqa: E402
from tnrec.table import AdaGrad  # noqa: E402

fc = tn.feature_column


def reader(path: str) -> tn.data.Reader:
    cols = [fc.category_column(k) for k in ("user", "item", "tags")]
    cols += [fc.numeric_column("d0"), fc.numeric_column("d1")]
    return tn.data.read_tfrecord(path, cols, batch_size=2, prefetch=0, on_bad_row="skip")


def run(path: str) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    model = RowCounting(AdaGrad(0.1))
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    data = reader(path)
    part = model.worker_part(data)
    model.fit(part, epochs=1, verbose=0)
    rows = np.concatenate(model.trained_rows) if model.trained_rows else np.zeros(0, np.int64)
    return {"trained_rows": rows, "bad_rows": np.array(part.stats.bad_rows)}


def main() -> None:
    out_dir, path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    strategy = tn.distribute.PsStrategy(timeout_s=120.0)
    out = run(path)
    np.savez(os.path.join(out_dir, f"tfrecord-rank{strategy.rank}.npz"), **out)
    strategy.shutdown()


if __name__ == "__main__":
    main()
