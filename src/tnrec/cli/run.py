"""``tnrec evaluate``, ``predict`` and ``export``: run a model dir written by ``tnrec train``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from tnrec import _fileio, checkpoint
from tnrec.cli.artifacts import (
    MODEL_FILE,
    load_model,
    read_model_json,
)
from tnrec.cli.common import (
    CONFIG_FILE,
    check_number,
    current_or_new_strategy,
    dir_problem,
    to_json,
)
from tnrec.cli.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    load_config,
)
from tnrec.cli.inputs import make_reader
from tnrec.cli.inspection import no_checkpoint_message
from tnrec.data import Reader
from tnrec.errors import ArgumentError, CheckpointError, DataError
from tnrec.export.workers import check_new_path
from tnrec.models import ZooModel


def resolve_model_dir(path: str) -> str:
    """The checkpoint root of ``path``: itself, or ``path/model`` of an output dir.

    Raises:
        CheckpointError: no ``model.json`` there.
    """
    for cand in (path, os.path.join(path, "model")):
        if _fileio.is_file(os.path.join(cand, MODEL_FILE)):
            return cand
    cfg_file = os.path.join(path, CONFIG_FILE)
    if _fileio.is_file(cfg_file):
        cand = load_config(cfg_file).model_dir
        if _fileio.is_file(os.path.join(cand, MODEL_FILE)):
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
    root = resolve_model_dir(model_dir)
    where = os.path.join(root, MODEL_FILE)
    doc = read_model_json(root)
    if not doc.get("config"):
        raise ConfigError(f"{where} holds no run config; it was not written by `tnrec train`.")
    cfg = config_from_dict(doc["config"], where)
    current_or_new_strategy(cfg.distributed.timeout_s if timeout_s is None else timeout_s)
    model, _ = load_model(root)
    return model, cfg


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
    part = model.worker_part(make_reader(cfg, "test", paths=data))
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
    if _fileio.is_dir(path):
        raise ArgumentError(f"--output {path} is a directory; give a file name.")
    problem = dir_problem(_fileio.parent(_fileio.absolute(path)))
    if problem is not None:
        raise ArgumentError(f"--output {path}: {problem}.")


def _write_table(table: pa.Table, path: str, kind: str) -> None:
    """Write predictions to ``path`` whole (temporary sibling, fsync, rename)."""
    _fileio.makedirs(_fileio.parent(_fileio.absolute(path)))

    def write(f: IO[bytes]) -> None:
        if kind == "csv":
            pa_csv.write_csv(table, f)
        else:
            pq.write_table(table, f)

    _fileio.write_atomic(path, write)


def _read_table(path: str, kind: str) -> pa.Table:
    source = _fileio.input_source(path)
    return pa_csv.read_csv(source) if kind == "csv" else pq.read_table(source)


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
    part = model.worker_part(make_reader(cfg, "test", paths=data))
    cols = model.predict(part)
    _require_rows(model, part, data)
    table = pa.table({k: pa.array(np.asarray(v)) for k, v in cols.items()})
    strategy = current_or_new_strategy()
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
            _fileio.remove_file(p)
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
    """Refuse an output directory that exists (unless it is what a killed export to an object
    store left, see :func:`tnrec.export.workers.check_new_path`) or cannot be created."""
    try:
        check_new_path(path)
    except ArgumentError:
        raise ArgumentError(f"{flag} {path} already exists; choose a new directory.") from None
    problem = dir_problem(path)
    if problem is not None:
        raise ArgumentError(f"{flag} {problem}.")


def _export_strategy(root: str) -> None:
    """Join the workers the launcher started (a single process is one worker), with the
    trained run's collective timeout when its config is there."""
    doc = read_model_json(root)
    timeout_s = None
    if doc.get("config"):
        cfg = config_from_dict(doc["config"], os.path.join(root, MODEL_FILE))
        timeout_s = cfg.distributed.timeout_s
    current_or_new_strategy(timeout_s)


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

    Runs in one process or on every worker ``torchrun`` starts, whatever
    number of workers wrote the checkpoint: the zoo model is rebuilt from
    ``model.json`` (sharded over the workers), each worker loads the buckets
    it owns with ``load_weights`` and writes their dictionary shards
    (:func:`tnrec.export.export`), and rank 0 the dense graph and the
    manifest, which records the checkpoint's provenance (model dir, day,
    generation, global step, complete). With ``delta``, the rows updated and
    keys deleted between the last checkpoints of days ``since`` and ``to``
    (:func:`tnrec.export.export_delta`, also one shard per worker). A
    checkpoint whose manifest marks its day incomplete (a mid-day save) is
    refused unless ``allow_incomplete``. ``out`` must be on a file system
    every worker sees.

    Raises:
        ArgumentError: options that do not go together, ``min_show`` not a
            finite number >= 0, ``out`` exists or cannot be created, or an
            incomplete day without ``allow_incomplete``.
        CheckpointError: no checkpoint (of the day) in ``model_dir``.
        WriteError: a file cannot be written on some worker; nothing is left at ``out``.
    """
    from tnrec import export as export_lib

    if min_show is not None:
        check_number("--min-show", min_show)
    if not delta and (since is not None or to is not None):
        raise ArgumentError("--since and --to go with --delta.")
    if delta and dt is not None:
        raise ArgumentError("--delta takes --since DT1 and --to DT2, not --dt.")
    if delta and (since is None or to is None):
        raise ArgumentError("--delta needs --since DT1 and --to DT2.")
    _check_new_dir(out, "--out")
    root = resolve_model_dir(model_dir)
    if not delta:
        path = checkpoint.latest(root, dt)
        if path is None:
            raise CheckpointError(no_checkpoint_message(root, dt))
        manifest = _checked_manifest(path, allow_incomplete)
        _export_strategy(root)
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
            raise CheckpointError(no_checkpoint_message(root, day))
        _checked_manifest(path, allow_incomplete)
        dirs.append(path)
    _export_strategy(root)
    model, _ = load_model(root, to)  # the delta carries its dense graph: complete
    return export_lib.export_delta(dirs[0], dirs[1], out, min_show=min_show, model=model)


def write_latest(out: str) -> str:
    """Make ``<parent of out>/_latest`` name the export ``out`` (what ``tnrec serve --watch``
    serves); return the pointer's path."""
    pointer = _fileio.join(_fileio.parent(_fileio.absolute(out).rstrip("/")), "_latest")
    name = os.path.basename(out.rstrip("/"))
    _fileio.write_atomic(pointer, lambda f: f.write(to_json({"export": name}).encode()))
    return pointer
