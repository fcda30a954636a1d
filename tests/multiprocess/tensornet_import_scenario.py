"""Each worker under torchrun loads an imported TensorNet checkpoint and predicts its signs.

Run as ``torchrun --nproc-per-node W tensornet_import_scenario.py OUT_DIR CKPT``; each
worker writes ``OUT_DIR/tn-import-rank<r>.npz``: the keys of its own table shard and
the predictions (sum of each sign's weights) for signs read from CKPT/signs.npy.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo: tests.unit.compat

import tnrec as tn  # noqa: E402
from tests.unit.compat.test_tensornet_import import SignModel  # noqa: E402
from tnrec.compat import tensornet as tnc  # noqa: E402


def run(ckpt: str) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    model = SignModel()
    model.compile(tn.optimizer.Adam(learning_rate=0.01), loss="mse")
    model.load_weights(ckpt, partial=True)
    signs = np.load(os.path.join(ckpt, "signs.npy"))  # uint64
    batch = tn.data.to_batch({"sid": signs}, [tnc.category_column("sid")])
    pred = model.predict_step(batch)[""]
    return {"keys": model.tables["user"].keys(), "prediction": pred}


def main() -> None:
    out_dir, ckpt = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    strategy = tn.distribute.PsStrategy(timeout_s=120.0)
    out = run(ckpt)
    np.savez(os.path.join(out_dir, f"tn-import-rank{strategy.rank}.npz"), **out)
    strategy.shutdown()


if __name__ == "__main__":
    main()
