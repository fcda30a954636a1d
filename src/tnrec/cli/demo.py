"""``tnrec demo``: synthetic Criteo-schema data, DeepFM, test AUC beside the optimal AUC."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from tnrec.cli.common import check_number, dir_problem
from tnrec.cli.config import load_config
from tnrec.cli.train import train
from tnrec.errors import ArgumentError

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

# The settings of bench/synthetic_quality.py (docs/models_cli.md): Ftrl with a
# small beta keeps the weights of rarely seen ids small.
[optimizer.sparse]
type = "ftrl"
learning_rate = 0.05
beta = 0.004
l1 = 0.0
l2 = 0.04

[optimizer.dense]
type = "adam"
learning_rate = 0.001

[train]
epochs = {epochs}
batch_size = 1024
log_every = 20
"""


def demo(
    rows: int = 300_000, epochs: int = 1, output_dir: str | None = None, seed: int = 0
) -> dict[str, Any]:
    """Generate synthetic Criteo-schema data, train DeepFM on it, compare with the optimal AUC.

    Args:
        rows: training rows (>= 1); the test day has a quarter as many.
        epochs: passes over the training day (>= 1).
        output_dir: keep the data and the run here (default: a new temp dir).
        seed: the generator's and the run's seed (>= 0).

    Returns:
        ``test_auc``, ``optimal_auc``, ``samples_per_s`` and the output dir.

    Raises:
        ArgumentError: ``rows``, ``epochs`` or ``seed`` out of range, or
            ``output_dir`` is a file (or lies under one).
    """
    from tnrec.data.synthetic import SyntheticConfig, generate

    check_number("demo: `rows`", rows, int, 1)
    check_number("demo: `epochs`", epochs, int, 1)
    check_number("demo: `seed`", seed, int, 0)
    if output_dir is not None:
        problem = dir_problem(output_dir)
        if problem is not None:
            raise ArgumentError(f"--output-dir {problem}.")
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
