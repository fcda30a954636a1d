"""Test AUC of LR, WideDeep, DeepFM and DCN on the 9,999-row Criteo sample.

::

    python bench/criteo_quality.py            # ~1-2 minutes on the 2-core machine

The first 8,000 rows train, the last 1,999 test (both read with
``tnrec.data.read_criteo`` from two files cut out of the sample). Every model
trains ``--epochs`` epochs (batch ``--batch``) per seed; the table shows the
test AUC after each epoch, mean ± std over ``--seeds`` seeds (the seed sets the
dense initialisation, the tables' seed and the shuffle). 10,000 rows are far
too few to reproduce published Criteo numbers (those train on 45M rows);
this checks that the models learn real data and how they compare at this size.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch

import tnrec as tn
from tnrec.models import build
from tnrec.optimizer import AdaGrad, Adam

SAMPLE = os.path.join(
    os.path.dirname(__file__), "..", "..", "shared", "data", "criteo", "dac_train_head_9999.tsv"
)


def split(path: str, n_train: int, out: str) -> tuple[str, str]:
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    train, test = os.path.join(out, "train.tsv"), os.path.join(out, "test.tsv")
    with open(train, "w", encoding="utf-8") as f:
        f.writelines(lines[:n_train])
    with open(test, "w", encoding="utf-8") as f:
        f.writelines(lines[n_train:])
    return train, test


def run(name: str, train: str, test: str, a: argparse.Namespace, seed: int) -> list[float]:
    cols = tn.data.criteo_columns()
    torch.manual_seed(seed)
    params = {} if name == "lr" else {"embedding_dim": a.dim, "hidden_units": a.hidden}
    model = build(
        name,
        cols,
        sparse_optimizer=AdaGrad(a.sparse_lr),
        dense_optimizer=Adam(a.dense_lr),
        seed=seed,
        **params,
    )
    model.compile()
    tr = tn.data.read_criteo(train, cols, batch_size=a.batch, shuffle=True, seed=seed)
    te = tn.data.read_criteo(test, cols, batch_size=2000)
    aucs = []
    for _ in range(a.epochs):
        model.fit(tr, epochs=1, verbose=0)
        aucs.append(model.evaluate(te, verbose=0, exact_auc=True)["auc_exact"])
    return aucs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=os.path.normpath(SAMPLE))
    p.add_argument("--train-rows", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, nargs="+", default=[400, 400, 400])
    p.add_argument("--sparse-lr", type=float, default=0.05)
    p.add_argument("--dense-lr", type=float, default=1e-3)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=["lr", "widedeep", "deepfm", "dcn"])
    a = p.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="tnrec-criteo-")
    train, test = split(a.data, a.train_rows, tmp)
    print(
        f"{a.data}: {a.train_rows} train rows, the rest test; dim {a.dim}, MLP {a.hidden}, "
        f"batch {a.batch}, AdaGrad({a.sparse_lr}) / Adam({a.dense_lr}), {a.seeds} seeds"
    )
    header = "".join(f"{f'epoch {e + 1}':>17}" for e in range(a.epochs))
    print(f"\n{'model':<10}{header}")
    for name in a.models:
        res = np.array([run(name, train, test, a, s) for s in range(a.seeds)])  # [seeds, epochs]
        cells = "".join(
            f"{m:>10.4f} ± {s:.3f}" for m, s in zip(res.mean(0), res.std(0), strict=True)
        )
        print(f"{name:<10}{cells}", flush=True)


if __name__ == "__main__":
    main()
