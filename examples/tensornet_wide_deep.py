"""TensorNet's Wide&Deep example (its ``examples/models/wide_deep.py``) written in tnrec.

TensorNet's model: a linear group (dimension 1) and a deep group (dimension 8)
of embeddings, each an ``EmbeddingFeatures`` with CVM on
(``target_columns=["label"]``) and the sparse optimizer
``AdaGrad(learning_rate=0.01, initial_g2sum=0.1, initial_scale=0.1)``; the deep
group through a ReLU stack 512-256-256; both concatenated into a synchronized
batch norm (``sync_freq=4, max_count=1000000``) and one output unit; dense
Adam(0.001); one ``fit`` per day with a checkpoint each day. With
``sync_freq=4`` each worker normalises with its own view of the statistics
between exchanges, so a run on W workers differs a little from one worker's
(``sync_freq=1`` makes them equal). Here the same,
through :mod:`tnrec.compat.tensornet`, so every argument keeps TensorNet's
name and meaning. Two changes: the output is a logit (the loss applies the
sigmoid), and Criteo's 13 numeric columns join the deep tower (TensorNet's
example data has none). Criteo's categories are hex strings, hashed as
``dtype="str"``; signs made elsewhere would use ``tnc.category_column``
(``dtype="sign"``) instead.

Data: a raw Criteo TSV (``--data``; by default the 9,999-row Criteo sample in
``../shared/data/criteo/`` beside the repository when it is there), split into
two training days and a test day of Parquet files; or, with ``--synthetic
ROWS`` (and when no sample is found), the synthetic Criteo-schema generator.
It prints each day's line, the test AUC, and the largest difference between
the export's ``Predictor`` and ``model.predict`` on the test rows.

Run::

    python examples/tensornet_wide_deep.py
    python examples/tensornet_wide_deep.py --data train.txt --out /tmp/wd
    torchrun --nproc-per-node 2 examples/tensornet_wide_deep.py --out /tmp/wd2
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

import tnrec as tn
import tnrec.compat.tensornet as tnc

SAMPLE = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo" / "dac_train_head_9999.tsv"
)
DAYS = ("2020-05-10", "2020-05-11")
DEEP_HIDDEN_UNITS = (512, 256, 256)


class WideDeep(tn.Model):
    """TensorNet's example model: ``logit = out(BN([linear embs, MLP(deep embs, dense)]))``."""

    def __init__(self, categorical: list[Any], numeric: list[Any]) -> None:
        super().__init__()
        self.feature_columns = numeric  # the dense features [B, F], for the export's spec
        num_dense = len(numeric)
        sparse = tnc.AdaGrad(learning_rate=0.01, initial_g2sum=0.1, initial_scale=0.1)

        def group(name: str, dim: int) -> Any:
            cols = [tnc.embedding_column(c, dimension=dim) for c in categorical]
            return tnc.EmbeddingFeatures(
                cols, sparse, name=f"{name}_input", is_concat=True, target_columns=["label"]
            )

        self.linear = group("linear", 1)
        self.deep = group("deep", 8)
        C = len(categorical)
        layers: list[torch.nn.Module] = []
        width = C * (8 + 2) + num_dense  # CVM: show and CTR beside each embedding
        for units in DEEP_HIDDEN_UNITS:
            layers += [torch.nn.Linear(width, units), torch.nn.ReLU()]
            width = units
        self.mlp = torch.nn.Sequential(*layers)
        both = C * (1 + 2) + width
        self.bn = tn.layers.BatchNormalization(
            both, synchronized=True, sync_freq=4, max_count=1_000_000
        )
        self.out = torch.nn.Linear(both, 1)

    def forward_dense(self, pooled: dict[str, Any], dense: torch.Tensor) -> torch.Tensor:
        deep = self.mlp(torch.cat([pooled["deep_input"], dense], dim=1))  # [B, 256]
        x = torch.cat([pooled["linear_input"], deep], dim=1)  # [B, 3C + 256]
        return self.out(self.bn(x)).squeeze(1)  # a logit [B]


def criteo_days(tsv: str, root: str) -> None:
    """Split a raw Criteo TSV into two training days (40% each) and a test day (20%)."""
    names = list(tn.data.CRITEO_FIELDS)
    types = {n: pa.string() for n in tn.data.CRITEO_CATEGORICAL}
    types.update({n: pa.float64() for n in (tn.data.CRITEO_LABEL, *tn.data.CRITEO_NUMERIC)})
    table = pacsv.read_csv(
        tsv,
        read_options=pacsv.ReadOptions(column_names=names),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
    )
    n = table.num_rows
    cuts = [0, int(0.4 * n), int(0.8 * n), n]
    for a, b, day in zip(cuts, cuts[1:], (*DAYS, "test"), strict=False):
        os.makedirs(os.path.join(root, day), exist_ok=True)
        pq.write_table(table.slice(a, b - a), os.path.join(root, day, "part-00000.parquet"))


def synthetic_days(rows: int, root: str) -> None:
    """Write synthetic Criteo-schema days under the same names."""
    from tnrec.data.synthetic import SyntheticConfig, generate

    generate(
        root,
        SyntheticConfig(rows_per_day=rows, num_days=2, test_rows=rows // 2, start_date=DAYS[0]),
        overwrite=True,
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train TensorNet's Wide&Deep for two days, test it, export it, check the Predictor."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="a raw Criteo TSV (default: the shared 9,999-row sample)")
    p.add_argument("--synthetic", type=int, metavar="ROWS", help="synthetic rows a day instead")
    p.add_argument("--out", help="working directory (default: a new temporary one)")
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args(argv)
    strategy = tn.distribute.PsStrategy() if "WORLD_SIZE" in os.environ else None
    out = args.out or tempfile.mkdtemp(prefix="tnrec-wide-deep-")
    root = os.path.join(out, "data")
    rank0 = strategy is None or strategy.rank == 0
    if rank0:
        if args.synthetic is None and (args.data or SAMPLE.is_file()):
            criteo_days(args.data or str(SAMPLE), root)
        else:
            synthetic_days(args.synthetic or 4000, root)
    if strategy is not None:
        strategy.barrier()

    columns = tn.data.criteo_columns()
    categorical = [c for c in columns if isinstance(c, tn.feature_column.CategoryColumn)]
    numeric = [c for c in columns if isinstance(c, tn.feature_column.NumericColumn)]
    model = WideDeep(categorical, numeric)
    model.compile(
        tn.optimizer.Adam(learning_rate=0.001),
        loss="binary_crossentropy_from_logits",
        metrics=["auc", "ctr", "pctr", "copc"],
    )

    def reader(day: str) -> Any:
        files = tn.data.list_files(root, days=[day], pattern="*.parquet")
        return lambda: tn.data.read_parquet(files, columns, batch_size=args.batch_size)

    tn.daily.train_days(
        model, [(d, reader(d)) for d in DAYS], os.path.join(out, "model"), verbose=1
    )
    test = tn.data.list_files(root, days=["test"], pattern="*.parquet")
    logs = model.evaluate(tn.data.read_parquet(test, columns, batch_size=args.batch_size))
    export = os.path.join(out, "export")
    model.export(export)
    result = {"test_auc": float(logs["auc"])}
    if (
        strategy is None
    ):  # model.predict is collective: under torchrun each worker predicts its part
        rows = pq.read_table(test[0]).to_pylist()
        served = tn.serving.Predictor(export).predict(rows)
        trained = model.predict(tn.data.read_parquet(test, columns, batch_size=len(rows)))
        result["max_abs_diff"] = float(np.max(np.abs(np.asarray(served) - trained["prediction"])))
        print(
            f"Predictor vs model.predict: max |diff| {result['max_abs_diff']:.2e} "
            f"over {len(rows)} rows"
        )
    if rank0:
        print(f"test AUC {result['test_auc']:.4f}; export in {export}")
    return result


if __name__ == "__main__":
    main()
