"""The ``tnrec`` command: ``demo``, ``train``, ``evaluate``, ``predict``.

::

    tnrec demo                                  # synthetic data -> DeepFM -> AUC vs optimal
    tnrec train --config run.toml               # <output_dir>/model, config.json, runlog.jsonl
    tnrec evaluate --model-dir runs/deepfm      # the config's test data, or --data PATTERN ...
    tnrec predict --model-dir runs/deepfm --output preds.parquet   # row_id, labels, prediction

The run configuration (TOML) is described in :mod:`tnrec.models.config`; every
error names the key and the file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import torch

from tnrec.errors import TnrecError
from tnrec.models import ZooModel, build
from tnrec.models.artifacts import load_model, save_model
from tnrec.models.config import (
    ConfigError,
    RunConfig,
    load_config,
    make_columns,
    make_optimizer,
    make_reader,
)
from tnrec.runlog import RunLog

__all__ = ["demo", "evaluate", "main", "predict", "train"]

MODEL_SUBDIR = "model"
CONFIG_FILE = "config.json"


def _model_params(cfg: RunConfig) -> dict[str, Any]:
    """The constructor arguments of the configured model (besides columns and optimizers)."""
    m = cfg.model
    params: dict[str, Any] = {"seed": cfg.seed}
    if m["name"] != "lr":
        params.update(embedding_dim=m["embedding_dim"], hidden_units=list(m["hidden_units"]))
    if m["name"] == "dcn":
        params["cross_layers"] = m["cross_layers"]
    return params


def build_model(cfg: RunConfig) -> ZooModel:
    """Return the configured zoo model, compiled (logit loss, auc + logloss)."""
    torch.manual_seed(cfg.seed)
    model = build(
        cfg.model["name"],
        make_columns(cfg),
        sparse_optimizer=make_optimizer(cfg, "sparse"),
        dense_optimizer=make_optimizer(cfg, "dense"),
        **_model_params(cfg),
    )
    model.compile()
    return model


def train(cfg: RunConfig, verbose: int = 1) -> dict[str, Any]:
    """Train the configured model; save it, the resolved config and the run log in the output dir.

    Returns:
        The last epoch's logs (with ``val_*`` when the config has test data)
        and ``samples_per_s``.
    """
    out = cfg.output_dir
    os.makedirs(out, exist_ok=True)
    model = build_model(cfg)
    t = cfg.train
    train_data = make_reader(cfg, "train", shuffle=cfg.data["shuffle"])
    test_data = make_reader(cfg, "test") if cfg.has_test else None
    log = RunLog(out, every=t["log_every"])
    start = time.perf_counter()
    history = model.fit(
        log.wrap(train_data),
        epochs=t["epochs"],
        steps_per_epoch=t["steps_per_epoch"],
        validation_data=test_data,
        callbacks=[log],
        verbose=verbose,
        log_every=t["log_every"],
    )
    secs = time.perf_counter() - start
    save_model(model, os.path.join(out, MODEL_SUBDIR), _model_params(cfg))
    with open(os.path.join(out, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(cfg.to_dict(), f, indent=2)
    result = {k: v[-1] for k, v in history.history.items()}
    result["samples_per_s"] = log.data.rows / max(secs, 1e-9) if log.data else 0.0
    result["train_s"] = secs
    if verbose:
        print(f"saved the model to {os.path.join(out, MODEL_SUBDIR)}; run log {log.path}")
    return result


def _load_run(model_dir: str) -> tuple[ZooModel, RunConfig]:
    cfg = load_config(os.path.join(model_dir, CONFIG_FILE))
    model, _ = load_model(os.path.join(model_dir, MODEL_SUBDIR))
    return model, cfg


def evaluate(
    model_dir: str, data: Sequence[str] | None = None, verbose: int = 1
) -> dict[str, float]:
    """Evaluate a trained run on its config's test data (or ``data`` patterns).

    Returns:
        loss, auc, logloss and the exact AUC (``auc_exact``).
    """
    model, cfg = _load_run(model_dir)
    reader = make_reader(cfg, "test", paths=data)
    return model.evaluate(reader, verbose=verbose, exact_auc=True)


def predict(
    model_dir: str, output: str, data: Sequence[str] | None = None, fmt: str | None = None
) -> int:
    """Write ``row_id``, labels and ``prediction`` of the test data (or ``data``) to ``output``.

    Args:
        model_dir: the output dir of ``tnrec train``.
        output: the file to write.
        data: input patterns (default: the config's test data).
        fmt: ``parquet`` or ``csv`` (default: from the extension of ``output``).

    Returns:
        The number of rows written.

    Raises:
        ConfigError: unknown format.
    """
    kind = fmt or ("csv" if output.lower().endswith(".csv") else "parquet")
    if kind not in ("parquet", "csv"):
        raise ConfigError(f"--format must be 'parquet' or 'csv'. Received: {kind!r}.")
    model, cfg = _load_run(model_dir)
    cols = model.predict(make_reader(cfg, "test", paths=data))
    table = pa.table({k: pa.array(np.asarray(v)) for k, v in cols.items()})
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    if kind == "csv":
        pa_csv.write_csv(table, output)
    else:
        pq.write_table(table, output)
    return table.num_rows


DEMO_TOML = """\
# Written by `tnrec demo`; run it again with `tnrec train --config {config}`.
seed = {seed}
output_dir = "{out}"
columns = "criteo"

[model]
name = "deepfm"
embedding_dim = 16
hidden_units = [{hidden}]

[data]
format = "parquet"
dir = "{data}"
train_days = {days}
test = "{data}/test/*.parquet"

[optimizer.sparse]
type = "adagrad"
learning_rate = 0.05

[optimizer.dense]
type = "adam"
learning_rate = 0.002

[train]
epochs = {epochs}
batch_size = 2048
log_every = 20
"""


def demo(
    rows: int = 300_000, epochs: int = 1, output_dir: str | None = None, seed: int = 0
) -> dict[str, Any]:
    """Generate synthetic Criteo-schema data, train DeepFM on it, compare with the optimal AUC.

    Returns:
        ``test_auc``, ``optimal_auc``, ``samples_per_s`` and the output dir.
    """
    from tnrec.data.synthetic import SyntheticConfig, generate

    out = output_dir or tempfile.mkdtemp(prefix="tnrec-demo-")
    print(f"tnrec demo: generating {rows:,} training rows of synthetic Criteo data in {out}/data")
    gen = generate(
        os.path.join(out, "data"),
        SyntheticConfig(rows_per_day=rows, num_days=1, test_rows=max(rows // 4, 1), seed=seed),
        overwrite=True,
    )
    config = os.path.join(out, "run.toml")
    with open(config, "w", encoding="utf-8") as f:
        f.write(
            DEMO_TOML.format(
                config=config,
                seed=seed,
                out=os.path.join(out, "run"),
                hidden="256, 128",
                data=os.path.join(out, "data"),
                days=json.dumps(list(gen.days)),
                epochs=epochs,
            )
        )
    print(f"training DeepFM with {config}")
    logs = train(load_config(config))
    res = {
        "test_auc": logs.get("val_auc", float("nan")),
        "optimal_auc": gen.optimal_auc,
        "samples_per_s": logs["samples_per_s"],
        "output_dir": out,
    }
    print(
        f"\ntest AUC {res['test_auc']:.4f}   optimal AUC {res['optimal_auc']:.4f} (the "
        f"generator's true probabilities)   {res['samples_per_s']:,.0f} samples/s"
    )
    return res


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tnrec", description="tnrec: train and run zoo models.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="synthetic data -> DeepFM -> test AUC vs optimal AUC")
    d.add_argument("--rows", type=int, default=300_000, help="training rows (default 300000)")
    d.add_argument("--epochs", type=int, default=1)
    d.add_argument("--output-dir", help="keep data and run here (default: a temp dir)")
    d.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train", help="train the model of a TOML run config")
    t.add_argument("--config", required=True, help="the run.toml")
    t.add_argument("--output-dir", help="override output_dir of the config")
    for name in ("evaluate", "predict"):
        e = sub.add_parser(name, help=f"{name} with a model written by `tnrec train`")
        e.add_argument("--model-dir", required=True, help="the output_dir of `tnrec train`")
        e.add_argument("--data", nargs="+", help="input files/globs (default: the config's test)")
        if name == "predict":
            e.add_argument("--output", required=True, help="predictions file (.parquet or .csv)")
            e.add_argument("--format", choices=("parquet", "csv"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tnrec`` command line; return the exit status (2 for a user error)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            demo(args.rows, args.epochs, args.output_dir, args.seed)
        elif args.command == "train":
            cfg = load_config(args.config, output_dir=args.output_dir)
            logs = train(cfg)
            print(json.dumps(logs))
        elif args.command == "evaluate":
            print(json.dumps(evaluate(args.model_dir, args.data, verbose=0)))
        elif args.command == "predict":
            n = predict(args.model_dir, args.output, args.data, args.format)
            print(f"wrote {n} predictions to {args.output}")
    except TnrecError as e:
        print(f"tnrec {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
