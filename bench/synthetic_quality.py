"""Test AUC of LR and DeepFM on ~1M rows of synthetic Criteo-schema data vs the optimal AUC.

::

    python bench/synthetic_quality.py           # ~4 minutes on the 2-core machine

Generates the default generator settings with 333,334 rows a day for 3 days
(1M training rows) and a 333,334-row test day, trains LR and DeepFM one epoch
each (batch 4096, shuffled), and prints one table: their test AUC next to

* the optimal AUC (the generator's true probabilities on the test day);
* "oracle seen": the true logit keeping only the weights of ids (and cross
  pairs) seen in training, with the exact numeric latents;
* "Bayes oracle": the same, but each seen id's (pair's) weight is its MAP
  estimate from the training rows under the true prior ``N(0, std^2)``, with
  every other term of the logit known exactly. No learner that must also
  estimate the other weights can expect to beat it, so it is the realistic
  ceiling at this data size.

The oracles read the generator's internals (``_DaySampler``): an analysis
tool, not an API. Columns: ``--columns bucketized`` (default) replaces each
numeric column by its ``log1p`` value bucketized in steps of 0.25, with
missing values (default -1) in a bucket of their own; ``criteo`` uses
``tn.data.criteo_columns()`` (``log1p``, missing = 0). LR and DeepFM always
get the same columns.
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
from tnrec.feature_column import bucketize, category_column, log1p, numeric_column
from tnrec.models import build
from tnrec.optimizer import AdaGrad, Adam, Ftrl

# name -> (constructor params, sparse optimizer, dense learning rate)
MODELS = {
    "lr": ({}, lambda: Ftrl(0.1, beta=3e-4, l1=0.0, l2=0.0), 0.01),
    "deepfm": ({"embedding_dim": 16, "hidden_units": [256, 128]}, lambda: AdaGrad(0.01), 0.002),
}
BOUNDARIES = [-0.5] + [0.25 * i for i in range(1, 61)]  # log1p scale; -1 (missing) < -0.5


def columns(kind: str) -> list:
    """Return the Criteo columns with numeric columns as given by ``kind``."""
    if kind == "criteo":
        return tn.data.criteo_columns()
    nums = [numeric_column(k, -1.0, [log1p(), bucketize(BOUNDARIES)]) for k in S.NUMERIC_COLUMNS]
    return nums + [category_column(k, dtype="str") for k in S.CATEGORICAL_COLUMNS]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def oracle(data: str) -> dict[str, float]:
    """AUCs of the oracle bounds (see the module doc) on the test split of ``data``."""
    meta = json.load(open(os.path.join(data, "_synthetic.json"), encoding="utf-8"))
    cfg = S.SyntheticConfig(rows_per_day=meta["config"]["rows_per_day"])
    sm = S._DaySampler(cfg)
    none = np.uint64(2**63)

    def terms(day: int):
        """Numeric part [n] and {term: (key [n], true weight [n], std)} of a day."""
        n = cfg.rows_of(day)
        ids = {c: sm._ids(day, c, n) for c in range(1, 27)}
        num = np.zeros(n)
        for j in range(13):
            rng = S._rng(cfg.seed, day, 100 + j)
            z = rng.standard_normal(n)
            valid = rng.random(n) >= cfg.numeric_missing_rates[j]
            num += np.where(valid, cfg.numeric_effects[j] * z, 0.0)
        out = {}
        for c, s in cfg.id_weight_stds:
            i, v = ids[c]
            w = s * S._hash_normal(i ^ S._salt(cfg.seed, c, 1))
            out[("id", c)] = (np.where(v, i, none), np.where(v, w, 0.0), s)
        for a, b, s in cfg.crosses:
            (ia, va), (ib, vb) = ids[a], ids[b]
            h = S._splitmix64(ia ^ S._salt(cfg.seed, a, b, 3)) + ib
            v = va & vb
            w = np.where(v, s * S._hash_normal(h), 0.0)
            out[("cross", a, b)] = (np.where(v, h, none), w, s)
        return num, out

    def labels(name: str) -> np.ndarray:
        path = os.path.join(data, name, "part-00000.parquet")
        return pq.read_table(path, columns=["label"])["label"].to_numpy()

    train = [terms(d) for d in range(cfg.num_days)]
    y_tr = np.concatenate([labels(d) for d in meta["days"]])
    num_te, te = terms(cfg.num_days)
    y_te = labels("test")
    logit_tr = np.concatenate([t[0] for t in train]) + meta["bias"]
    logit_tr = logit_tr + sum(np.concatenate([t[1][k][1] for t in train]) for k in te)
    seen_w, map_w = {}, {}
    for k, (kt, wt, s) in te.items():
        keys = np.concatenate([t[1][k][0] for t in train])
        w = np.concatenate([t[1][k][1] for t in train])
        ok = keys != none
        u, inv = np.unique(keys[ok], return_inverse=True)
        off, y = (logit_tr - w)[ok], y_tr[ok]
        est = np.zeros(len(u))
        for _ in range(8):  # Newton steps of the per-key MAP problem
            p = _sigmoid(off + est[inv])
            grad = np.bincount(inv, y - p, len(u)) - est / s**2
            est += grad / (np.bincount(inv, p * (1 - p), len(u)) + 1 / s**2)
        pos = np.minimum(np.searchsorted(u, kt), len(u) - 1)
        seen = (u[pos] == kt) & (kt != none)
        seen_w[k], map_w[k] = np.where(seen, wt, 0.0), np.where(seen, est[pos], 0.0)
    res = {}
    for tag, keep in (("no crosses", lambda k: k[0] == "id"), ("with crosses", lambda k: True)):
        res[f"oracle seen, {tag}"] = S.roc_auc(y_te, num_te + sum(seen_w[k] for k in te if keep(k)))
        res[f"Bayes oracle, {tag}"] = S.roc_auc(y_te, num_te + sum(map_w[k] for k in te if keep(k)))
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows-per-day", type=int, default=333_334)
    p.add_argument("--data", help="data dir (default: a temp dir)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--columns", choices=["bucketized", "criteo"], default="bucketized")
    p.add_argument("--no-oracle", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    out = a.data or tempfile.mkdtemp(prefix="tnrec-syn-quality-")
    cfg = S.SyntheticConfig(rows_per_day=a.rows_per_day)
    meta_path = os.path.join(out, "_synthetic.json")
    if os.path.exists(meta_path):
        meta = json.load(open(meta_path, encoding="utf-8"))
        if meta["config"]["rows_per_day"] != a.rows_per_day:
            raise SystemExit(f"{out} holds {meta['config']['rows_per_day']} rows a day")
        optimal = meta["optimal_auc"]
    else:
        optimal = S.generate(out, cfg).optimal_auc
    cols = columns(a.columns)
    files = tn.data.list_files(out, days=list(cfg.days))
    test = os.path.join(out, "test", "part-00000.parquet")
    rows = len(cfg.days) * a.rows_per_day
    print(
        f"default generator, {len(cfg.days)} days x {a.rows_per_day:,} rows, test "
        f"{a.rows_per_day:,} rows; columns={a.columns}, batch {a.batch_size}, "
        f"{a.epochs} epoch(s)",
        flush=True,
    )
    table = [("optimal (true probabilities)", optimal)]
    if not a.no_oracle:
        table += sorted(oracle(out).items(), key=lambda kv: -kv[1])
    for name, (params, sparse, dlr) in MODELS.items():
        torch.manual_seed(0)
        opt = sparse()
        model = build(name, cols, sparse_optimizer=opt, dense_optimizer=Adam(dlr), **params)
        model.compile()
        te = tn.data.read_parquet(test, cols, batch_size=8192)
        aucs, t0 = [], time.perf_counter()
        for epoch in range(a.epochs):
            tr = tn.data.read_parquet(
                files, cols, batch_size=a.batch_size, shuffle=True, seed=epoch
            )
            model.fit(tr, epochs=1, verbose=0)
            aucs.append(model.evaluate(te, verbose=0, exact_auc=True)["auc_exact"])
        rate = a.epochs * rows / (time.perf_counter() - t0)
        label = f"{name} {params or ''} {opt}, Adam({dlr}) [{rate:,.0f} samples/s]"
        if len(aucs) > 1:
            label += " per epoch: " + ", ".join(f"{x:.4f}" for x in aucs)
        table.append((label, aucs[-1]))
    print(f"| {'':<60} | test AUC | optimal - AUC |")
    for label, auc in table:
        print(f"| {label:<60} | {auc:.4f}   | {optimal - auc:.4f}        |")


if __name__ == "__main__":
    main()
