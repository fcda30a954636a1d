"""Test AUC of LR and DeepFM on ~1M rows of synthetic Criteo-schema data vs the optimal AUC.

::

    python bench/synthetic_quality.py           # ~5 minutes on the 2-core machine

Generates the default generator settings with 333,334 rows a day for 3 days
(1M training rows) and a 333,334-row test day, trains LR and DeepFM one epoch
each, and prints their test AUC next to:

* the optimal AUC (the generator's true probabilities on the test day);
* an oracle bound: the AUC of the true logit restricted to what 1M training
  rows can show, i.e. the hidden weights of ids seen at least ``k`` times in the
  training days (and the exact numeric latents, crosses included or not).
  It reads the generator's internals (``_DaySampler``), so it is an analysis
  tool, not an API.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq
import torch

import tnrec as tn
from tnrec.data import synthetic as S
from tnrec.models import build
from tnrec.optimizer import AdaGrad, Adam

MODELS = {
    "lr": ({}, 0.05, 0.01),
    "deepfm": ({"embedding_dim": 16, "hidden_units": [256, 128]}, 0.01, 0.002),
}


def oracle(cfg: S.SyntheticConfig, test_file: str, ks=(1, 5)) -> dict[str, float]:
    """AUC of the true logit keeping only ids seen >= k times in training (see the doc)."""
    sm = S._DaySampler(cfg)

    def ids_of(day):
        return {col: sm._ids(day, col, cfg.rows_of(day)) for col in range(1, 27)}

    train = [ids_of(d) for d in range(cfg.num_days)]
    test = ids_of(cfg.num_days)
    y = pq.read_table(test_file, columns=["label"])["label"].to_numpy()
    n = y.shape[0]
    num = np.zeros(n)
    for j in range(13):
        rng = S._rng(cfg.seed, cfg.num_days, 100 + j)
        z = rng.standard_normal(n)
        valid = rng.random(n) >= cfg.numeric_missing_rates[j]
        num += np.where(valid, cfg.numeric_effects[j] * z, 0.0)
    stds = dict(cfg.id_weight_stds)
    out = {}
    for k in ks:
        logit = num.copy()
        for col, std in stds.items():
            ids, valid = test[col]
            seen_ids = np.concatenate([t[col][0][t[col][1]] for t in train])
            u, cnt = np.unique(seen_ids, return_counts=True)
            pos = np.minimum(np.searchsorted(u, ids), len(u) - 1)
            seen = (u[pos] == ids) & (cnt[pos] >= k)
            w = S._hash_normal(ids ^ S._salt(cfg.seed, col, 1))
            logit += np.where(valid & seen, std * w, 0.0)
        out[f"oracle k>={k}, no crosses"] = S.roc_auc(y, logit)
        for a, b, std in cfg.crosses:
            (ia, va), (ib, vb) = test[a], test[b]
            h = S._splitmix64(ia ^ S._salt(cfg.seed, a, b, 3)) + ib
            logit += np.where(va & vb, std * S._hash_normal(h), 0.0)
        out[f"oracle k>={k}, with crosses"] = S.roc_auc(y, logit)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows-per-day", type=int, default=333_334)
    p.add_argument("--data", help="data dir (default: a temp dir)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--no-oracle", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    out = a.data or tempfile.mkdtemp(prefix="tnrec-syn-quality-")
    cfg = S.SyntheticConfig(rows_per_day=a.rows_per_day)
    if os.path.exists(os.path.join(out, "_synthetic.json")):
        meta = json.load(open(os.path.join(out, "_synthetic.json"), encoding="utf-8"))
        optimal = meta["optimal_auc"]
    else:
        optimal = S.generate(out, cfg).optimal_auc
    cols = tn.data.criteo_columns()
    files = tn.data.list_files(out, days=list(cfg.days))
    test = os.path.join(out, "test", "part-00000.parquet")
    print(f"{len(cfg.days)} days x {a.rows_per_day:,} rows; optimal test AUC {optimal:.4f}")
    for name, (params, slr, dlr) in MODELS.items():
        torch.manual_seed(0)
        model = build(
            name, cols, sparse_optimizer=AdaGrad(slr), dense_optimizer=Adam(dlr), **params
        )
        model.compile()
        tr = tn.data.read_parquet(files, cols, batch_size=4096, shuffle=True, seed=0)
        te = tn.data.read_parquet(test, cols, batch_size=8192)
        t0 = time.perf_counter()
        model.fit(tr, epochs=a.epochs, verbose=0)
        secs = time.perf_counter() - t0
        auc = model.evaluate(te, verbose=0, exact_auc=True)["auc_exact"]
        rate = a.epochs * len(cfg.days) * a.rows_per_day / secs
        print(
            f"{name:<8} {params or ''} AdaGrad({slr}) Adam({dlr}): test AUC {auc:.4f} "
            f"(optimal - {optimal - auc:.4f}), {rate:,.0f} samples/s",
            flush=True,
        )
    if not a.no_oracle:
        for k, v in oracle(cfg, test).items():
            print(f"{k:<30} {v:.4f}")


if __name__ == "__main__":
    main()
