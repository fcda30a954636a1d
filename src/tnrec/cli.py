"""The ``tnrec`` command: ``demo``, ``train``, ``evaluate``, ``predict``, ``export``, ``inspect``.

::

    tnrec demo                                  # synthetic data -> DeepFM -> AUC vs optimal
    tnrec train --config run.toml [--eval-next-day]   # the days in order, a checkpoint per day
    tnrec evaluate --model-dir runs/deepfm/model       # the config's test data, or --data ...
    tnrec predict --model-dir runs/deepfm/model --output preds.parquet [--merge]
    tnrec export --model-dir runs/deepfm/model [--dt DT] --out export/ [--min-show X] [--onnx]
    tnrec export --model-dir runs/deepfm/model --delta --since DT1 --to DT2 --out delta/
    tnrec inspect runs/deepfm/model[/DT] [--table T --key K] [--json]
    torchrun --nproc-per-node 2 -m tnrec.cli train --config run.toml

The model dir is a checkpoint root (:mod:`tnrec.checkpoint`) plus ``model.json``
(:mod:`tnrec.models.artifacts`), from which the zoo model is rebuilt. The run
configuration (TOML) is described in :mod:`tnrec.models.config`; every error
names the key and the file. ``train``, ``evaluate`` and ``predict`` run on
every worker a launcher starts (``torchrun``); only rank 0 prints and writes
shared files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import torch

from tnrec import checkpoint
from tnrec.daily import DayReport, train_days
from tnrec.data import Reader
from tnrec.distribute import PsStrategy, current_strategy, launch_env
from tnrec.errors import ArgumentError, CheckpointError, TnrecError
from tnrec.inspection import _no_checkpoint, inspect
from tnrec.models import ZooModel, build
from tnrec.models.artifacts import (
    MODEL_FILE,
    load_model,
    model_doc,
    read_model_json,
    write_model_json,
)
from tnrec.models.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    day_files,
    load_config,
    make_columns,
    make_optimizer,
    make_policy,
    make_reader,
)
from tnrec.runlog import RUNLOG_FILE, RunLog

__all__ = ["demo", "evaluate", "export", "inspect", "main", "predict", "train"]

CONFIG_FILE = "config.json"
GLOB_DAY = "train"  # the day label of a config with data.train globs instead of days


def _strategy() -> PsStrategy:
    """The current strategy, created from the launcher's environment on first use."""
    s = current_strategy()
    return s if s is not None else PsStrategy()


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
    """Return the configured zoo model with its eviction policy, compiled (logit loss, auc).

    Build it after :class:`~tnrec.distribute.PsStrategy` to shard its tables.
    """
    torch.manual_seed(cfg.seed)
    model = build(
        cfg.model["name"],
        make_columns(cfg),
        sparse_optimizer=make_optimizer(cfg, "sparse"),
        dense_optimizer=make_optimizer(cfg, "dense"),
        **_model_params(cfg),
    )
    policy = make_policy(cfg)
    for layer in model.embedding_layers():
        layer.policy = policy
    model.compile()
    return model


def _days(cfg: RunConfig) -> list[tuple[str, Callable[[], Reader]]]:
    """``(dt, make_reader)`` of every training day, in order; every day's files checked first."""
    shuffle = cfg.data["shuffle"]
    if cfg.data["train"]:
        make_reader(cfg, "train")  # checks the patterns now
        return [(GLOB_DAY, lambda: make_reader(cfg, "train", shuffle=shuffle))]
    days = list(cfg.data["train_days"])
    for dt in days:
        day_files(cfg, "train", [dt])

    def maker(dt: str) -> Callable[[], Reader]:
        return lambda: make_reader(cfg, "train", days=[dt], shuffle=shuffle)

    return [(dt, maker(dt)) for dt in days]


def _check_same_model(model_dir: str, doc: dict[str, Any]) -> None:
    """Refuse to train into a model dir that holds another model."""
    if not os.path.isfile(os.path.join(model_dir, MODEL_FILE)):
        return
    old = read_model_json(model_dir)
    for key in ("model", "params", "sparse_optimizer", "feature_spec"):
        if old.get(key) != doc[key]:
            raise ConfigError(
                f"{model_dir}/{MODEL_FILE}: the model dir holds another model ({key} "
                f"{old.get(key)!r} != {doc[key]!r}); train into a new checkpoint.dir."
            )


def _append_runlog(out_dir: str, records: Sequence[dict[str, Any]]) -> str:
    path = os.path.join(out_dir, RUNLOG_FILE)
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def _day_record(day: DayReport) -> dict[str, Any]:
    return {
        "event": "day",
        "dt": day.dt,
        "skipped": day.skipped,
        "resumed": day.resumed,
        "rows": day.rows_trained,
        "keys_created": day.keys_created,
        "keys_evicted": day.keys_evicted,
        "table_sizes": day.table_sizes,
        "next_day_auc": day.next_day_auc,
    }


def train(cfg: RunConfig, verbose: int = 1, eval_next_day: bool = False) -> dict[str, Any]:
    """Train the configured days in order into the model dir (checkpoint root); evaluate on test.

    A day already complete in the checkpoint is skipped; an interrupted day
    resumes from its saved input position (``checkpoint.save_every_n_steps``).
    Before each day's save the tables decay and evict by ``[eviction]``. Rank 0
    writes ``model.json``, ``config.json``, prints one line per day and
    appends them to ``runlog.jsonl``.

    Args:
        cfg: the run config.
        verbose: 1 prints the per-day lines (rank 0).
        eval_next_day: before training a day, report the AUC on it of the model so far.

    Returns:
        ``days`` (one record per day), ``rows``, ``samples_per_s``, ``train_s``,
        and ``val_*`` metrics on the test data when the config has some.

    Raises:
        ConfigError: ``train.steps_per_epoch`` is set, a day has no files, or the
            model dir holds another model.
    """
    if cfg.train["steps_per_epoch"] is not None:
        raise ConfigError(
            f'{cfg.source}: "train.steps_per_epoch" is not supported by the daily cycle of '
            "`tnrec train` (every day is trained in full); remove it."
        )
    strategy = _strategy()
    rank = strategy.rank
    days = _days(cfg)
    model = build_model(cfg)
    model_dir = cfg.model_dir
    doc = model_doc(model, _model_params(cfg), make_policy(cfg), cfg.to_dict())
    if rank == 0:
        _check_same_model(model_dir, doc)
        os.makedirs(cfg.output_dir, exist_ok=True)
        write_model_json(model_dir, doc)
        with open(os.path.join(cfg.output_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(cfg.to_dict(), f, indent=2)
    strategy.barrier()
    start = time.perf_counter()
    ck = cfg.checkpoint
    # Per-step and per-epoch records (rows, samples/s, input wait, metrics): rank 0 only.
    log = RunLog(cfg.output_dir, every=cfg.train["log_every"]) if rank == 0 else None
    reports = train_days(
        model,
        days,
        model_dir,
        epochs=cfg.train["epochs"],
        save_every_n_steps=ck["save_every_n_steps"],
        keep=ck["keep"],
        eval_next_day=eval_next_day,
        verbose=verbose,
        callbacks=[log] if log is not None else (),
        wrap=log.wrap if log is not None else None,
    )
    secs = time.perf_counter() - start
    rows = sum(r.rows_trained for r in reports)
    records = [_day_record(r) for r in reports]
    result: dict[str, Any] = {
        "days": records,
        "rows": rows,
        "samples_per_s": rows / max(secs, 1e-9),
        "train_s": secs,
    }
    if cfg.has_test:
        logs = model.evaluate(make_reader(cfg, "test"), verbose=0)
        result.update({f"val_{k}": v for k, v in logs.items()})
    if rank == 0:
        summary = {"event": "train", **{k: v for k, v in result.items() if k != "days"}}
        path = _append_runlog(cfg.output_dir, [*records, summary])
        if verbose:
            print(f"checkpoints in {model_dir}; run log {path}", flush=True)
    return result


def _resolve_model_dir(path: str) -> str:
    """The checkpoint root of ``path``: itself, or ``path/model`` of an output dir.

    Raises:
        CheckpointError: no ``model.json`` there.
    """
    for cand in (path, os.path.join(path, "model")):
        if os.path.isfile(os.path.join(cand, MODEL_FILE)):
            return cand
    cfg_file = os.path.join(path, CONFIG_FILE)
    if os.path.isfile(cfg_file):
        cand = load_config(cfg_file).model_dir
        if os.path.isfile(os.path.join(cand, MODEL_FILE)):
            return cand
    raise CheckpointError(
        f"{os.path.join(path, MODEL_FILE)} not found: not a model directory written by "
        "`tnrec train`."
    )


def _load_run(model_dir: str) -> tuple[ZooModel, RunConfig]:
    """Rebuild the model of a model dir (sharded under a strategy) and its run config."""
    _strategy()
    root = _resolve_model_dir(model_dir)
    model, doc = load_model(root)
    where = os.path.join(root, MODEL_FILE)
    if not doc.get("config"):
        raise ConfigError(f"{where} holds no run config; it was not written by `tnrec train`.")
    return model, config_from_dict(doc["config"], where)


def evaluate(
    model_dir: str, data: Sequence[str] | None = None, verbose: int = 1
) -> dict[str, float]:
    """Evaluate a trained model on its config's test data (or ``data`` patterns).

    Under torchrun every worker reads its part; the metrics are global.

    Returns:
        loss, auc, logloss and the exact AUC (``auc_exact``).
    """
    model, cfg = _load_run(model_dir)
    reader = make_reader(cfg, "test", paths=data)
    return model.evaluate(reader, verbose=verbose, exact_auc=True)


def part_path(output: str, rank: int, world: int, kind: str) -> str:
    """``<output without extension>.part-<rank>-of-<W>.<kind>``: one worker's predictions."""
    base = output[: -len(kind) - 1] if output.lower().endswith("." + kind) else output
    return f"{base}.part-{rank}-of-{world}.{kind}"


def _write_table(table: pa.Table, path: str, kind: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    if kind == "csv":
        pa_csv.write_csv(table, tmp)
    else:
        pq.write_table(table, tmp)
    os.replace(tmp, path)


def _read_table(path: str, kind: str) -> pa.Table:
    return pa_csv.read_csv(path) if kind == "csv" else pq.read_table(path)


def predict(
    model_dir: str,
    output: str,
    data: Sequence[str] | None = None,
    fmt: str | None = None,
    merge: bool = False,
) -> int:
    """Write ``row_id``, labels and ``prediction`` of the test data (or ``data``) to ``output``.

    Under torchrun with W workers each worker writes its rows to
    ``<output>.part-<rank>-of-<W>.<ext>``; with ``merge`` rank 0 then (after a
    barrier) writes them all, sorted by ``row_id``, to ``output`` and removes the parts.

    Args:
        model_dir: the model dir (or the output dir) of ``tnrec train``.
        output: the file to write.
        data: input patterns (default: the config's test data).
        fmt: ``parquet`` or ``csv`` (default: from the extension of ``output``).
        merge: merge the workers' files into ``output``.

    Returns:
        The number of rows written by this worker (rank 0 after ``merge``: all rows).

    Raises:
        ConfigError: unknown format.
    """
    kind = fmt or ("csv" if output.lower().endswith(".csv") else "parquet")
    if kind not in ("parquet", "csv"):
        raise ConfigError(f"--format must be 'parquet' or 'csv'. Received: {kind!r}.")
    model, cfg = _load_run(model_dir)
    cols = model.predict(make_reader(cfg, "test", paths=data))
    table = pa.table({k: pa.array(np.asarray(v)) for k, v in cols.items()})
    strategy = _strategy()
    rank, world = strategy.rank, strategy.world_size
    if world == 1:
        _write_table(table, output, kind)
        return table.num_rows
    _write_table(table, part_path(output, rank, world, kind), kind)
    if not merge:
        return table.num_rows
    strategy.barrier()
    if rank == 0:
        parts = [part_path(output, r, world, kind) for r in range(world)]
        merged = pa.concat_tables([_read_table(p, kind) for p in parts])
        merged = merged.take(pa.array(np.argsort(merged["row_id"].to_numpy(), kind="stable")))
        _write_table(merged, output, kind)
        for p in parts:
            os.remove(p)
        table = merged
    strategy.barrier()
    return table.num_rows


def export(
    model_dir: str,
    out: str,
    *,
    dt: str | None = None,
    min_show: float | None = None,
    delta: bool = False,
    since: str | None = None,
    to: str | None = None,
    onnx: bool = False,
) -> str:
    """Write the inference export of a checkpoint (or a delta between two days) to ``out``.

    Runs in one process, whatever number of workers wrote the checkpoint: the
    zoo model is rebuilt from ``model.json``, loaded with ``load_weights`` and
    exported with ``model.export``. With ``delta``, the rows updated and keys
    deleted between the last checkpoints of days ``since`` and ``to``
    (:func:`tnrec.export.export_delta`).

    Raises:
        ArgumentError: run under several workers, or options that do not go together.
        CheckpointError: no checkpoint (of the day) in ``model_dir``.
    """
    from tnrec import export as export_lib

    if launch_env().world_size > 1:
        raise ArgumentError("tnrec export runs in one process; launch it without torchrun.")
    root = _resolve_model_dir(model_dir)
    if not delta:
        if since is not None or to is not None:
            raise ArgumentError("--since and --to go with --delta.")
        path = checkpoint.latest(root, dt)
        if path is None:
            raise CheckpointError(_no_checkpoint(root, dt))
        model, _ = load_model(root, dt)
        dt_label = checkpoint.read_manifest(path)["dt"]
        return model.export(out, min_show=min_show, dt=dt_label, onnx=onnx)
    if dt is not None:
        raise ArgumentError("--delta takes --since DT1 and --to DT2, not --dt.")
    if since is None or to is None:
        raise ArgumentError("--delta needs --since DT1 and --to DT2.")
    dirs = []
    for day in (since, to):
        path = checkpoint.latest(root, day)
        if path is None:
            raise CheckpointError(_no_checkpoint(root, day))
        dirs.append(path)
    return export_lib.export_delta(dirs[0], dirs[1], out, min_show=min_show)


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
    t = sub.add_parser("train", help="train the days of a TOML run config, a checkpoint a day")
    t.add_argument("--config", required=True, help="the run.toml")
    t.add_argument("--output-dir", help="override output_dir of the config")
    t.add_argument(
        "--eval-next-day", action="store_true", help="AUC on each day before training on it"
    )
    for name in ("evaluate", "predict"):
        e = sub.add_parser(name, help=f"{name} with a model written by `tnrec train`")
        e.add_argument("--model-dir", required=True, help="the model dir (or output_dir)")
        e.add_argument("--data", nargs="+", help="input files/globs (default: the config's test)")
        if name == "predict":
            e.add_argument("--output", required=True, help="predictions file (.parquet or .csv)")
            e.add_argument("--format", choices=("parquet", "csv"))
            e.add_argument(
                "--merge", action="store_true", help="under torchrun: rank 0 merges the parts"
            )
    x = sub.add_parser("export", help="inference export (or delta export) of a checkpoint")
    x.add_argument("--model-dir", required=True)
    x.add_argument("--out", required=True, help="a new directory")
    x.add_argument("--dt", help="the last checkpoint of this day (default: the published one)")
    x.add_argument("--min-show", type=float, help="drop rows whose show is below this")
    x.add_argument("--onnx", action="store_true", help="also write dense.onnx (needs onnx)")
    x.add_argument("--delta", action="store_true", help="rows updated/deleted --since --to")
    x.add_argument("--since", help="delta: the day of the full export it applies to")
    x.add_argument("--to", help="delta: the day it brings the export to")
    i = sub.add_parser("inspect", help="days, generations, tables of a model dir; one row")
    i.add_argument("path", metavar="MODEL_DIR[/DT]")
    i.add_argument("--table")
    i.add_argument("--key", help="a hashed key (int)")
    i.add_argument("--json", action="store_true", help="print JSON")
    return p


def _run(args: argparse.Namespace) -> None:
    if args.command == "demo":
        demo(args.rows, args.epochs, args.output_dir, args.seed)
    elif args.command == "train":
        cfg = load_config(args.config, output_dir=args.output_dir)
        logs = train(cfg, eval_next_day=args.eval_next_day)
        if _strategy().rank == 0:
            print(json.dumps({k: v for k, v in logs.items() if k != "days"}))
    elif args.command == "evaluate":
        logs = evaluate(args.model_dir, args.data, verbose=0)
        if _strategy().rank == 0:
            print(json.dumps(logs))
    elif args.command == "predict":
        n = predict(args.model_dir, args.output, args.data, args.format, args.merge)
        s = _strategy()
        if s.rank == 0:
            where = args.output
            if s.world_size > 1 and not args.merge:
                kind = args.format or ("csv" if where.lower().endswith(".csv") else "parquet")
                where = part_path(where, 0, s.world_size, kind).replace(".part-0-", ".part-*-")
            print(f"wrote {n} predictions to {where}")
    elif args.command == "export":
        out = export(
            args.model_dir,
            args.out,
            dt=args.dt,
            min_show=args.min_show,
            delta=args.delta,
            since=args.since,
            to=args.to,
            onnx=args.onnx,
        )
        print(f"wrote {'the delta' if args.delta else 'the export'} to {out}")
    elif args.command == "inspect":
        print(inspect(args.path, args.table, args.key, args.json))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tnrec`` command line; return the exit status (2 for a user error)."""
    args = _parser().parse_args(argv)
    try:
        _run(args)
    except TnrecError as e:
        print(f"tnrec {args.command}: error: {e}", file=sys.stderr)
        return 2
    finally:
        s = current_strategy()
        if s is not None and s.is_distributed:
            s.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
