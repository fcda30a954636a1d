"""The ``tnrec`` command: ``demo``, ``train``, ``evaluate``, ``predict``, ``export``, ``inspect``.

::

    tnrec demo                                  # synthetic data -> DeepFM -> AUC vs optimal
    tnrec train --config run.toml [--eval-next-day]   # the days in order, a checkpoint per day
    tnrec evaluate --model-dir runs/deepfm/model       # the config's test data, or --data ...
    tnrec predict --model-dir runs/deepfm/model --output preds.parquet [--merge]
    tnrec export --model-dir runs/deepfm/model [--dt DT] --out export/ [--min-show X] [--onnx]
                 [--allow-incomplete]
    tnrec export --model-dir runs/deepfm/model --delta --since DT1 --to DT2 --out delta/
    tnrec inspect runs/deepfm/model[/DT] [--table T --key K] [--json]
    tnrec checkpoint publish runs/deepfm/model/DT/GEN   # restore a lost _checkpoint, roll back
    torchrun --nproc-per-node 2 -m tnrec.cli train --config run.toml

The model dir is a checkpoint root (:mod:`tnrec.checkpoint`) plus ``model.json``
(:mod:`tnrec.models.artifacts`), from which the zoo model is rebuilt. The run
configuration (TOML) is described in :mod:`tnrec.models.config`; every error
names the key and the file. ``train``, ``evaluate`` and ``predict`` run on
every worker a launcher starts (``torchrun``); only rank 0 prints and writes
shared files.

Every JSON the command prints or appends to the run log is strict JSON: a
non-finite number (an AUC of data with one label is NaN) is written as
``null``. Exit status: 0 on success; 2 for a user error (one line
``tnrec <command>: error: ...`` on stderr, naming the key, flag, file or
path); 1 for an operating-system error (a full disk, a permission), with the
path.
"""

from __future__ import annotations

import argparse
import json
import math
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
from tnrec.errors import ArgumentError, CheckpointError, DataError, DistributedError, TnrecError
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
    check_inputs,
    config_from_dict,
    key_digests,
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


def _strategy(timeout_s: float | None = None) -> PsStrategy:
    """The current strategy; created on first use from the launcher's environment.

    ``timeout_s`` (``distributed.timeout_s``, or ``--timeout-s``) is the
    collective timeout of the process group this creates; an existing strategy is kept.
    """
    s = current_strategy()
    if s is not None:
        return s
    return PsStrategy() if timeout_s is None else PsStrategy(timeout_s=timeout_s)


# ----------------------------------------------------------------- checks of numbers, paths, JSON


def _number_problem(value: Any, kind: type, minimum: float, above: bool) -> str | None:
    """What is wrong with ``value`` as a finite ``kind`` >= ``minimum`` (> with ``above``)."""
    # An int is finite; math.isfinite would overflow on one too large for a float.
    ok = (
        isinstance(value, (int, float) if kind is float else int)
        and not isinstance(value, bool)
        and (isinstance(value, int) or math.isfinite(value))
        and (value > minimum if above else value >= minimum)
    )
    if ok:
        return None
    what = "an int" if kind is int else "a finite number"
    return f"must be {what} {'>' if above else '>='} {minimum:g}"


def _check_number(
    name: str, value: Any, kind: type = float, minimum: float = 0, above: bool = False
) -> Any:
    """Return ``value`` if it is a finite ``kind`` >= ``minimum`` (> ``minimum`` with ``above``).

    Raises:
        ArgumentError: otherwise, naming ``name``.
    """
    problem = _number_problem(value, kind, minimum, above)
    if problem is not None:
        raise ArgumentError(f"{name} {problem}. Received: {value!r}.")
    return value


def _number_arg(kind: type, minimum: float = 0, above: bool = False) -> Callable[[str], Any]:
    """Return an argparse ``type=`` that parses a finite ``kind`` >= ``minimum`` (> with ``above``).

    NaN, infinities, values out of range and text that is not a ``kind`` are
    refused with argparse's usage error (exit 2), naming the flag.
    """

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = text
        problem = _number_problem(value, kind, minimum, above)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{problem}. Received: {text!r}.")
        return value

    return parse


def _dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be a directory (it, or the nearest existing parent, is a file)."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        return None if os.path.isdir(path) else f"{path} is an existing file, not a directory"
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent) and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{path} cannot be created: {parent} is a file, not a directory"
    return None


def _make_dir(path: str, label: str) -> None:
    """Create directory ``path``; an error names ``label`` (the key or flag) and the path."""
    problem = _dir_problem(path)
    if problem is None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            problem = f"cannot create {path}: {e.strerror}"
    if problem is not None:
        raise ConfigError(f"{label}: {problem}.")


def _finite_or_null(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, inf) replaced by None; numpy scalars as Python."""
    if isinstance(obj, dict):
        return {k: _finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_null(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _to_json(obj: Any, **kwargs: Any) -> str:
    """Return ``obj`` as strict JSON: a non-finite number becomes ``null``."""
    return json.dumps(_finite_or_null(obj), allow_nan=False, **kwargs)


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
    """``(dt, make_reader)`` of every training day, in order (check the inputs first)."""
    shuffle = cfg.data["shuffle"]
    if cfg.data["train"]:
        return [(GLOB_DAY, lambda: make_reader(cfg, "train", shuffle=shuffle))]

    def maker(dt: str) -> Callable[[], Reader]:
        return lambda: make_reader(cfg, "train", days=[dt], shuffle=shuffle)

    return [(dt, maker(dt)) for dt in cfg.data["train_days"]]


def _check_same_config(strategy: PsStrategy, cfg: RunConfig) -> None:
    """Fail on every worker, naming the keys, when the workers' configs or model dirs differ.

    Each worker puts the digest of every config key (:func:`key_digests`) in
    its row of a ``[W, K]`` float64 table; one all-reduce sums the rows, so
    every worker sees every worker's digests and compares them with rank 0's.
    """
    if strategy.comm is None:
        return
    keys, digests = zip(*key_digests(cfg), strict=True)
    table = torch.zeros((strategy.world_size, len(keys)), dtype=torch.float64)  # [W, K]
    table[strategy.rank] = torch.tensor(digests, dtype=torch.float64)
    strategy.comm.all_reduce_sum(table, "compare the workers' run configs")
    differ = {
        r: [k for k, a, b in zip(keys, table[0].tolist(), table[r].tolist(), strict=True) if a != b]
        for r in range(1, strategy.world_size)
    }
    lines = [f"rank {r} differs from rank 0 in {', '.join(ks)}" for r, ks in differ.items() if ks]
    if lines:
        raise ConfigError(
            f"{cfg.source}: the workers were started with different run configs or model dirs: "
            f"{'; '.join(lines)}. Start every worker with the same config and --output-dir."
        )


def _has_checkpoint(model_dir: str) -> bool:
    """Whether ``model_dir`` holds a checkpoint (a ``_checkpoint`` pointer or a generation)."""
    pointer = os.path.join(model_dir, checkpoint.POINTER)
    return os.path.lexists(pointer) or bool(checkpoint.generations(model_dir))


def _check_same_model(model_dir: str, doc: dict[str, Any]) -> None:
    """Refuse to train into a model dir whose checkpoint belongs to another model.

    A ``model.json`` without a checkpoint (a run that failed before its first
    save) is replaced by the new one.
    """
    if not os.path.isfile(os.path.join(model_dir, MODEL_FILE)) or not _has_checkpoint(model_dir):
        return
    old = read_model_json(model_dir)
    for key in ("model", "params", "sparse_optimizer", "feature_spec"):
        if old.get(key) != doc[key]:
            raise ConfigError(
                f"{model_dir}/{MODEL_FILE}: the model dir holds another model ({key} "
                f"{old.get(key)!r} != {doc[key]!r}); train into a new checkpoint.dir."
            )


def _check_run_dirs(cfg: RunConfig) -> None:
    """Refuse an ``output_dir`` or model dir that is a file (or lies under one)."""
    key = '"checkpoint.dir"' if cfg.checkpoint["dir"] else '"output_dir"'
    for label, path in (('"output_dir"', cfg.output_dir), (key, cfg.model_dir)):
        problem = _dir_problem(path)
        if problem is not None:
            raise ConfigError(f"{cfg.source}: {label}: {problem}.")


def _write_run_files(cfg: RunConfig, doc: dict[str, Any]) -> None:
    """Rank 0: check the model dir, create the dirs, write ``model.json`` and ``config.json``."""
    _check_same_model(cfg.model_dir, doc)
    key = '"checkpoint.dir"' if cfg.checkpoint["dir"] else '"output_dir"'
    _make_dir(cfg.output_dir, f'{cfg.source}: "output_dir"')
    _make_dir(cfg.model_dir, f"{cfg.source}: {key}")
    write_model_json(cfg.model_dir, doc)
    path = os.path.join(cfg.output_dir, CONFIG_FILE)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(_to_json(cfg.to_dict(), indent=2))
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror}.") from None


def _on_rank0(strategy: PsStrategy, step: Callable[[], None], what: str) -> None:
    """Run ``step`` on rank 0; if it fails, every worker fails (no worker waits for a timeout).

    Raises:
        TnrecError: rank 0's error on rank 0.
        DistributedError: on the other workers, when rank 0 failed.
    """
    err: TnrecError | None = None
    if strategy.rank == 0:
        try:
            step()
        except TnrecError as e:
            err = e
    if strategy.comm is not None:
        failed = torch.tensor([float(err is not None)], dtype=torch.float64)
        strategy.comm.broadcast(failed, what)  # also the barrier after rank 0's writes
        if err is None and failed.item():
            raise DistributedError(
                f"rank {strategy.rank}/{strategy.world_size}: rank 0 failed to {what} "
                "(rank 0's error names the cause); stopping."
            )
    if err is not None:
        raise err


def _append_runlog(out_dir: str, records: Sequence[dict[str, Any]]) -> str:
    path = os.path.join(out_dir, RUNLOG_FILE)
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(_to_json(r) + "\n")
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

    Before anything is built or written, the workers compare their configs and
    model dirs, and every input (each day, the test data) is checked. A day
    already complete in the checkpoint is skipped; an interrupted day resumes
    from its saved input position (``checkpoint.save_every_n_steps``). Before
    each day's save the tables decay and evict by ``[eviction]``. Rank 0
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
        ConfigError: ``train.steps_per_epoch`` is set, the workers' configs or
            model dirs differ, an input matches no file or holds no rows,
            ``output_dir`` or the model dir is a file, or the model dir holds
            another model's checkpoint.
        DistributedError: on the other workers when rank 0 cannot write the model dir.
    """
    strategy = _strategy(cfg.distributed["timeout_s"])
    rank = strategy.rank
    _check_same_config(strategy, cfg)
    if cfg.train["steps_per_epoch"] is not None:
        raise ConfigError(
            f'{cfg.source}: "train.steps_per_epoch" is not supported by the daily cycle of '
            "`tnrec train` (every day is trained in full); remove it."
        )
    _check_run_dirs(cfg)
    check_inputs(cfg)
    days = _days(cfg)
    model = build_model(cfg)
    model_dir = cfg.model_dir
    doc = model_doc(model, _model_params(cfg), make_policy(cfg), cfg.to_dict())
    _on_rank0(strategy, lambda: _write_run_files(cfg, doc), "prepare the model dir")
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


def _load_run(model_dir: str, timeout_s: float | None = None) -> tuple[ZooModel, RunConfig]:
    """Rebuild the model of a model dir (sharded under a strategy) and its run config.

    The strategy, when this creates it, takes ``timeout_s`` or else the run
    config's ``distributed.timeout_s``.
    """
    root = _resolve_model_dir(model_dir)
    where = os.path.join(root, MODEL_FILE)
    doc = read_model_json(root)
    if not doc.get("config"):
        raise ConfigError(f"{where} holds no run config; it was not written by `tnrec train`.")
    cfg = config_from_dict(doc["config"], where)
    _strategy(cfg.distributed["timeout_s"] if timeout_s is None else timeout_s)
    model, _ = load_model(root)
    return model, cfg


def _worker_part(reader: Reader) -> Reader:
    """This worker's part of ``reader`` (the reader itself in one process)."""
    s = _strategy()
    return reader.split(s.rank, s.world_size) if s.world_size > 1 else reader


def _input_name(data: Sequence[str] | None) -> str:
    return "--data " + " ".join(data) if data else "the run config's test data"


def _require_rows(model: ZooModel, part: Reader, data: Sequence[str] | None) -> None:
    """Refuse a result over no rows: every row of the input was bad and skipped.

    Raises:
        DataError: no worker read a row (names the input and the bad rows).
    """
    rows, bad = model.ps.all_reduce_sum(
        np.array([part.stats.rows, part.stats.bad_rows], np.float64)
    )
    if rows == 0:
        raise DataError(
            f"{_input_name(data)}: the input holds no rows that can be read ({int(bad)} bad "
            'rows skipped (data.on_bad_row = "skip")).'
        )


def evaluate(
    model_dir: str,
    data: Sequence[str] | None = None,
    verbose: int = 1,
    timeout_s: float | None = None,
) -> dict[str, float]:
    """Evaluate a trained model on its config's test data (or ``data`` patterns).

    Under torchrun every worker reads its part; the metrics are global.

    Args:
        model_dir: the model dir (or the output dir) of ``tnrec train``.
        data: input patterns (default: the config's test data).
        verbose: 1 prints the results (rank 0).
        timeout_s: the collective timeout (default: the run config's).

    Returns:
        loss, auc, logloss and the exact AUC (``auc_exact``). An AUC of data
        with one label only is NaN.

    Raises:
        ArgumentError: the input matches no file or holds no rows (named).
        ConfigError: the same for the config's test data.
        DataError: a bad row, or no row that can be read (names the input).
    """
    model, cfg = _load_run(model_dir, timeout_s)
    part = _worker_part(make_reader(cfg, "test", paths=data))
    try:
        return model.evaluate(part, verbose=verbose, exact_auc=True)
    except DataError as e:
        bad = part.stats.bad_rows
        skipped = f" ({bad} bad rows skipped by this worker)" if bad else ""
        raise DataError(f"{_input_name(data)}: {e}{skipped}") from None


def part_path(output: str, rank: int, world: int, kind: str) -> str:
    """``<output without extension>.part-<rank>-of-<W>.<kind>``: one worker's predictions."""
    base = output[: -len(kind) - 1] if output.lower().endswith("." + kind) else output
    return f"{base}.part-{rank}-of-{world}.{kind}"


def _check_output_file(path: str) -> None:
    """Refuse an ``--output`` that is a directory or lies under a file."""
    if os.path.isdir(path):
        raise ArgumentError(f"--output {path} is a directory; give a file name.")
    problem = _dir_problem(os.path.dirname(os.path.abspath(path)))
    if problem is not None:
        raise ArgumentError(f"--output {path}: {problem}.")


def _write_table(table: pa.Table, path: str, kind: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if kind == "csv":
            pa_csv.write_csv(table, tmp)
        else:
            pq.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise ArgumentError(f"--output {path}: cannot write: {e}") from None


def _read_table(path: str, kind: str) -> pa.Table:
    return pa_csv.read_csv(path) if kind == "csv" else pq.read_table(path)


def predict(
    model_dir: str,
    output: str,
    data: Sequence[str] | None = None,
    fmt: str | None = None,
    merge: bool = False,
    timeout_s: float | None = None,
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
        timeout_s: the collective timeout (default: the run config's).

    Returns:
        The number of rows written by this worker (rank 0 after ``merge``: all rows).

    Raises:
        ConfigError: unknown format; the config's test data matches no file or holds no rows.
        ArgumentError: ``output`` cannot be written, ``data`` matches no file or
            holds no rows; nothing is written then.
        DataError: no row of the input can be read; nothing is written then.
    """
    kind = fmt or ("csv" if output.lower().endswith(".csv") else "parquet")
    if kind not in ("parquet", "csv"):
        raise ConfigError(f"--format must be 'parquet' or 'csv'. Received: {kind!r}.")
    _check_output_file(output)
    model, cfg = _load_run(model_dir, timeout_s)
    part = _worker_part(make_reader(cfg, "test", paths=data))
    cols = model.predict(part)
    _require_rows(model, part, data)
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


def _checked_manifest(path: str, allow_incomplete: bool) -> dict[str, Any]:
    """Return the manifest of checkpoint ``path`` unless it marks its day incomplete (mid-day).

    Raises:
        ArgumentError: the day is incomplete and ``allow_incomplete`` is False.
    """
    manifest = checkpoint.read_manifest(path)
    if (manifest.get("resume") or {}).get("day_complete") is False and not allow_incomplete:
        raise ArgumentError(
            f"{path}: day {manifest.get('dt')!r} is incomplete: its last checkpoint (generation "
            f"{manifest.get('generation')}) was saved mid-day (the day's training was "
            "interrupted or is still running). Pass --allow-incomplete to export it anyway."
        )
    return manifest


def _provenance(root: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint an export comes from, for its manifest (:func:`tnrec.export.export`)."""
    resume = manifest.get("resume") or {}
    return {
        "model_dir": root,
        "dt": manifest["dt"],
        "generation": manifest["generation"],
        "global_step": resume.get("global_step"),
        "complete": resume.get("day_complete"),
    }


def _check_new_dir(path: str, flag: str) -> None:
    """Refuse an output directory that exists or cannot be created."""
    if os.path.lexists(path):
        raise ArgumentError(f"{flag} {path} already exists; choose a new directory.")
    problem = _dir_problem(path)
    if problem is not None:
        raise ArgumentError(f"{flag} {problem}.")


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
    allow_incomplete: bool = False,
) -> str:
    """Write the inference export of a checkpoint (or a delta between two days) to ``out``.

    Runs in one process, whatever number of workers wrote the checkpoint: the
    zoo model is rebuilt from ``model.json``, loaded with ``load_weights`` and
    exported with :func:`tnrec.export.export`, whose manifest records the
    checkpoint's provenance (model dir, day, generation, global step,
    complete). With ``delta``, the rows updated and keys deleted between the
    last checkpoints of days ``since`` and ``to``
    (:func:`tnrec.export.export_delta`). A checkpoint whose manifest marks its
    day incomplete (a mid-day save) is refused unless ``allow_incomplete``.

    Raises:
        ArgumentError: run under several workers, options that do not go
            together, ``min_show`` not a finite number >= 0, ``out`` exists or
            cannot be created, or an incomplete day without ``allow_incomplete``.
        CheckpointError: no checkpoint (of the day) in ``model_dir``.
    """
    from tnrec import export as export_lib

    if launch_env().world_size > 1:
        raise ArgumentError("tnrec export runs in one process; launch it without torchrun.")
    if min_show is not None:
        _check_number("--min-show", min_show)
    if not delta and (since is not None or to is not None):
        raise ArgumentError("--since and --to go with --delta.")
    if delta and dt is not None:
        raise ArgumentError("--delta takes --since DT1 and --to DT2, not --dt.")
    if delta and (since is None or to is None):
        raise ArgumentError("--delta needs --since DT1 and --to DT2.")
    _check_new_dir(out, "--out")
    root = _resolve_model_dir(model_dir)
    if not delta:
        path = checkpoint.latest(root, dt)
        if path is None:
            raise CheckpointError(_no_checkpoint(root, dt))
        manifest = _checked_manifest(path, allow_incomplete)
        model, _ = load_model(root, dt)
        return export_lib.export(
            model,
            out,
            min_show=min_show,
            dt=manifest["dt"],
            onnx=onnx,
            provenance=_provenance(root, manifest),
        )
    dirs = []
    for day in (since, to):
        path = checkpoint.latest(root, day)
        if path is None:
            raise CheckpointError(_no_checkpoint(root, day))
        _checked_manifest(path, allow_incomplete)
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

    _check_number("demo: `rows`", rows, int, 1)
    _check_number("demo: `epochs`", epochs, int, 1)
    _check_number("demo: `seed`", seed, int, 0)
    if output_dir is not None:
        problem = _dir_problem(output_dir)
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


def _parser() -> argparse.ArgumentParser:
    positive_int = _number_arg(int, 1)
    timeout = _number_arg(float, 0, above=True)
    p = argparse.ArgumentParser(prog="tnrec", description="tnrec: train and run zoo models.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="synthetic data -> DeepFM -> test AUC vs optimal AUC")
    d.add_argument("--rows", type=positive_int, default=300_000, help="training rows (>= 1)")
    d.add_argument("--epochs", type=positive_int, default=1, help="passes (>= 1)")
    d.add_argument("--output-dir", help="keep data and run here (default: a temp dir)")
    d.add_argument("--seed", type=_number_arg(int, 0), default=0, help="(>= 0)")
    t = sub.add_parser("train", help="train the days of a TOML run config, a checkpoint a day")
    t.add_argument("--config", required=True, help="the run.toml")
    t.add_argument("--output-dir", help="override output_dir of the config")
    t.add_argument(
        "--eval-next-day", action="store_true", help="AUC on each day before training on it"
    )
    t.add_argument("--timeout-s", type=timeout, help="override distributed.timeout_s (> 0)")
    for name in ("evaluate", "predict"):
        e = sub.add_parser(name, help=f"{name} with a model written by `tnrec train`")
        e.add_argument("--model-dir", required=True, help="the model dir (or output_dir)")
        e.add_argument("--data", nargs="+", help="input files/globs (default: the config's test)")
        e.add_argument(
            "--timeout-s", type=timeout, help="collective timeout (default: the run config's)"
        )
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
    x.add_argument(
        "--min-show", type=_number_arg(float, 0), help="drop rows whose show is below this (>= 0)"
    )
    x.add_argument("--onnx", action="store_true", help="also write dense.onnx (needs onnx)")
    x.add_argument("--delta", action="store_true", help="rows updated/deleted --since --to")
    x.add_argument("--since", help="delta: the day of the full export it applies to")
    x.add_argument("--to", help="delta: the day it brings the export to")
    x.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="export a day whose last checkpoint was saved mid-day",
    )
    c = sub.add_parser("checkpoint", help="checkpoint maintenance: publish a generation")
    csub = c.add_subparsers(dest="action", required=True)
    cp = csub.add_parser(
        "publish", help="make MODEL_DIR/DT/GEN the current checkpoint (rewrite _checkpoint)"
    )
    cp.add_argument("path", metavar="MODEL_DIR/DT/GEN")
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
        if args.timeout_s is not None:
            cfg.distributed["timeout_s"] = args.timeout_s
        logs = train(cfg, eval_next_day=args.eval_next_day)
        if _strategy().rank == 0:
            print(_to_json({k: v for k, v in logs.items() if k != "days"}))
    elif args.command == "evaluate":
        logs = evaluate(args.model_dir, args.data, verbose=0, timeout_s=args.timeout_s)
        if _strategy().rank == 0:
            print(_to_json(logs))
    elif args.command == "predict":
        n = predict(args.model_dir, args.output, args.data, args.format, args.merge, args.timeout_s)
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
            allow_incomplete=args.allow_incomplete,
        )
        print(f"wrote {'the delta' if args.delta else 'the export'} to {out}")
    elif args.command == "inspect":
        print(inspect(args.path, args.table, args.key, args.json))
    elif args.command == "checkpoint":
        pointer = checkpoint.publish(args.path)
        print(f"{pointer} now names {os.path.abspath(args.path)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tnrec`` command line; return the exit status.

    0 on success (and ``--help``); 2 for a user error: a bad flag (argparse's
    usage error) or a :class:`~tnrec.errors.TnrecError`, printed as one line
    ``tnrec <command>: error: ...``; 1 for any other ``OSError``, printed
    with its path.
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage error or the help
        return e.code if isinstance(e.code, int) else 2
    try:
        _run(args)
    except TnrecError as e:
        print(f"tnrec {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        print(f"tnrec {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    finally:
        s = current_strategy()
        if s is not None and s.is_distributed:
            s.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
