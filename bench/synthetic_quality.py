"""Test AUC of LR and DeepFM on ~1M rows of synthetic Criteo-schema data vs the optimal AUC.

::

    python bench/synthetic_quality.py           # 1.5-2 minutes on the 2-core machine

Generates the default generator settings with 333,334 rows a day for 3 days
(1M training rows) and a 333,334-row test day, trains LR and DeepFM one epoch
each (batch 1024, shuffled; settings in ``MODELS``), and prints one table:
their test AUC next to

* the optimal AUC (the generator's true probabilities on the test day);
* "oracle seen": the true logit keeping only the weights of ids (and cross
  pairs) seen in training;
* "Bayes oracle": the same, but each seen id's (pair's) weight is its MAP
  estimate from the training rows under the true prior ``N(0, std_r^2)``
  (the id's own spread, which knows its rank), with every other term of the
  logit known exactly. No learner that must also estimate the other weights
  can expect to beat it, so it is the realistic ceiling at this data size;
* "Bayes oracle, one prior per column": the same with the column's head
  spread as every id's prior, as for a learner that sees an id's rows but
  not its rank;
* "crosses as their additive part": the true logit with each cross replaced
  by its mean per value of either column, the most a model without
  interactions (LR) can take from the crosses.

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
from tnrec.metrics import exact_auc
from tnrec.models import build
from tnrec.optimizer import Adam, Ftrl

# name -> (constructor params, sparse optimizer for batch size b, dense learning rate).
# The loss is a batch mean, so a key's gradient scales as 1/b: Ftrl's beta and l2
# (measured best at b = 1024) scale the same way.
MODELS = {
    "lr": ({}, lambda b: Ftrl(0.1, beta=5.12 / b, l1=0.0, l2=0.0), 0.01),
    "deepfm": (
        {"embedding_dim": 16, "hidden_units": [256, 128]},
        lambda b: Ftrl(0.05, beta=4.096 / b, l1=0.0, l2=40.96 / b),
        0.001,
    ),
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


def _map_weights(keys, prior_var, offset, y, n_keys):
    """Per-key MAP weights under ``N(0, prior_var[key])``, the rest of the logit known."""
    est = np.zeros(n_keys)
    for _ in range(8):
        p = _sigmoid(offset + est[keys])
        grad = np.bincount(keys, y - p, n_keys) - est / prior_var
        est += grad / (np.bincount(keys, p * (1 - p), n_keys) + 1 / prior_var)
    return est


def oracle_aucs(
    cfg: S.SyntheticConfig, bias: float, y_by_day: list[np.ndarray], detail: dict | None = None
) -> dict[str, float]:
    """AUCs of the oracle bounds (see the module doc) on the test day of ``cfg``.

    ``y_by_day`` holds the labels of the training days and then of the test day.
    ``detail``, if given, receives per term (``("id", column)`` or ``("cross", a,
    b)``) the test-day mean squared error of the Bayes and of the one-prior
    estimates, and the term's mean square.
    """
    sm = S._DaySampler(cfg)

    def terms(day: int):
        """Numeric part [n] and {term: (valid [n], key [n], true weight [n], prior var [n])}."""
        n = cfg.rows_of(day)
        ids = {c: sm.ids(day, c, n) for c in range(1, 27)}
        num = sum(sm.numeric(day, j, n)[2] for j in range(13))
        out = {}
        for c, _ in cfg.id_weight_stds:
            i, v = ids[c]
            w = sm.id_weight(c, i)
            var = np.maximum(sm.id_weight_std(c, i) ** 2, 1e-12)  # the id's prior
            out[("id", c)] = (v, i, np.where(v, w, 0.0), var)
        for a, b, s in cfg.crosses:
            (ia, va), (ib, vb) = ids[a], ids[b]
            v = va & vb
            w = np.where(v, sm.cross_weight(a, ia, b, ib, s), 0.0)
            key = (ia << np.uint64(32)) | ib  # ids < 2**32: one key per value pair
            out[("cross", a, b)] = (v, key, w, np.full(n, max(s * s, 1e-12)))
        return num, out

    train = [terms(d) for d in range(cfg.num_days)]
    num_te, te = terms(cfg.num_days)
    y_tr, y_te = np.concatenate(y_by_day[:-1]), y_by_day[-1]
    logit_tr = np.concatenate([t[0] for t in train]) + bias
    logit_tr = logit_tr + sum(np.concatenate([t[1][k][2] for t in train]) for k in te)
    seen_w, map_w, flat_w, additive = {}, {}, {}, {}
    for k, (vt, kt, wt, _) in te.items():
        cat = [np.concatenate([t[1][k][f] for t in train]) for f in range(4)]
        ok, keys, w, var = cat[0], cat[1][cat[0]], cat[2][cat[0]], cat[3][cat[0]]
        u, first, inv = np.unique(keys, return_index=True, return_inverse=True)
        offset = (logit_tr - cat[2])[ok]
        est = _map_weights(inv, var[first], offset, y_tr[ok], len(u))
        pos = np.minimum(np.searchsorted(u, kt), len(u) - 1)
        seen = (u[pos] == kt) & vt
        seen_w[k], map_w[k] = np.where(seen, wt, 0.0), np.where(seen, est[pos], 0.0)
        # The same with one prior per column (the column's std): a learner that
        # does not know an id's rank, only its rows.
        flat_var = np.full(len(u), var.max())
        flat = _map_weights(inv, flat_var, offset, y_tr[ok], len(u)) if k[0] == "id" else est
        flat_w[k] = np.where(seen, flat[pos], 0.0)
        if detail is not None:  # mean squared errors and mean square of the term (test day)
            errs = ((map_w[k] - wt) ** 2, (flat_w[k] - wt) ** 2, wt**2)
            detail[k] = tuple(float(np.mean(x)) for x in errs)
        if k[0] == "cross":  # the cross's best additive part: its mean per value of a and of b
            ids_te = [kt >> np.uint64(32), kt & np.uint64(0xFFFFFFFF)]
            ids_tr = [keys >> np.uint64(32), keys & np.uint64(0xFFFFFFFF)]
            part = np.full(len(kt), -w.mean())
            for i_tr, i_te in zip(ids_tr, ids_te, strict=True):
                v, inv2 = np.unique(i_tr, return_inverse=True)
                mean = np.bincount(inv2, w, len(v)) / np.bincount(inv2, None, len(v))
                p2 = np.minimum(np.searchsorted(v, i_te), len(v) - 1)
                part += np.where(v[p2] == i_te, mean[p2], 0.0)
            additive[k] = np.where(vt, part, 0.0)
    full = num_te + sum(wt for _, _, wt, _ in te.values())
    crosses = [k for k in te if k[0] == "cross"]
    res = {
        "crosses as their additive part (true weights)": exact_auc(
            y_te, full - sum(te[k][2] for k in crosses) + sum(additive[k] for k in crosses)
        )
    }
    for tag, keep in (("no crosses", lambda k: k[0] == "id"), ("with crosses", lambda k: True)):
        res[f"oracle seen, {tag}"] = exact_auc(y_te, num_te + sum(seen_w[k] for k in te if keep(k)))
        res[f"Bayes oracle, {tag}"] = exact_auc(y_te, num_te + sum(map_w[k] for k in te if keep(k)))
    res["Bayes oracle, one prior per column"] = exact_auc(y_te, num_te + sum(flat_w.values()))
    return res


def oracle(data: str) -> dict[str, float]:
    """AUCs of the oracle bounds on the generated data in ``data``."""
    meta = json.load(open(os.path.join(data, "_synthetic.json"), encoding="utf-8"))
    cfg = S.SyntheticConfig(rows_per_day=meta["config"]["rows_per_day"])

    def labels(name: str) -> np.ndarray:
        path = os.path.join(data, name, "part-00000.parquet")
        return pq.read_table(path, columns=["label"])["label"].to_numpy()

    return oracle_aucs(cfg, meta["bias"], [labels(d) for d in [*meta["days"], "test"]])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows-per-day", type=int, default=333_334)
    p.add_argument("--data", help="data dir (default: a temp dir)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--columns", choices=["bucketized", "criteo"], default="bucketized")
    p.add_argument("--no-oracle", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    out = a.data or tempfile.mkdtemp(prefix="tnrec-syn-quality-")
    cfg = S.SyntheticConfig(rows_per_day=a.rows_per_day)
    meta_path = os.path.join(out, "_synthetic.json")
    if os.path.exists(meta_path):
        meta = json.load(open(meta_path, encoding="utf-8"))
        if meta["version"] != S.GENERATOR_VERSION:
            raise SystemExit(f"{out} holds generator version {meta['version']} data")
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
        opt = sparse(a.batch_size)
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
        gap = round(optimal - auc, 4) + 0.0  # no "-0.0000"
        print(f"| {label:<60} | {auc:.4f}   | {gap:.4f}        |")
    print(f"bench time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
