"""``tnrec train``: the config's days in order into the model dir, one checkpoint a day."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tnrec import _fileio, checkpoint
from tnrec.callbacks import Callback, LearningRateScheduler
from tnrec.cli.artifacts import (
    MODEL_FILE,
    model_doc,
    read_model_json,
    write_model_json,
)
from tnrec.cli.common import (
    CONFIG_FILE,
    GLOB_DAY,
    build_model,
    current_or_new_strategy,
    dir_problem,
    make_dir,
    model_params,
    to_json,
)
from tnrec.cli.config import (
    ConfigError,
    RunConfig,
    key_digests,
    make_policy,
    make_schedule,
)
from tnrec.cli.inputs import check_inputs, make_reader
from tnrec.daily import DayReport, train_days
from tnrec.data import Reader
from tnrec.distribute import PsStrategy
from tnrec.errors import ArgumentError, DistributedError, TnrecError
from tnrec.feature_column import canonical_spec
from tnrec.layers.device import check_device
from tnrec.runlog import RUNLOG_FILE, RunLog


def _days(cfg: RunConfig) -> list[tuple[str, Callable[[], Reader]]]:
    """``(dt, make_reader)`` of every training day, in order (check the inputs first)."""
    shuffle = cfg.data.shuffle
    if cfg.data.train:
        return [(GLOB_DAY, lambda: make_reader(cfg, "train", shuffle=shuffle))]

    def maker(dt: str) -> Callable[[], Reader]:
        return lambda: make_reader(cfg, "train", days=[dt], shuffle=shuffle)

    return [(dt, maker(dt)) for dt in cfg.data.train_days or []]


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


def train_device(cfg: RunConfig, world_size: int, local_rank: int = 0) -> torch.device:
    """Return the dense part's device of ``train.device``, checked before anything is built.

    With several workers, ``"cuda"`` (no index) is each worker's own GPU:
    ``cuda:<local rank modulo the GPUs this machine has>``, so the workers on one
    machine spread over its GPUs and their dense all-reduce runs on NCCL
    (:mod:`tnrec.ps.dense`).

    Raises:
        ConfigError: the device is not one this process has (CUDA not
            available, or ``cuda:N`` past the devices there are), or is CUDA
            with several workers in async mode (its dense server is on the host).
    """
    try:
        device = check_device(cfg.train.device)
    except ArgumentError as e:
        raise ConfigError(f'{cfg.source}: "train.device": {e}') from None
    if device.type != "cuda" or world_size == 1:
        return device
    if cfg.distributed.mode == "async":
        raise ConfigError(
            f'{cfg.source}: "train.device" is {cfg.train.device!r} with {world_size} workers in '
            "async mode, whose dense server is on the host; train on CUDA in sync mode "
            '("distributed.mode" = "sync"), or with device = "cpu".'
        )
    if device.index is None:
        device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
    return device


def _has_checkpoint(model_dir: str) -> bool:
    """Whether ``model_dir`` holds a checkpoint (a ``_checkpoint`` pointer or a generation)."""
    pointer = os.path.join(model_dir, checkpoint.POINTER)
    there = _fileio.exists(pointer) if _fileio.is_remote(pointer) else os.path.lexists(pointer)
    return there or bool(checkpoint.generations(model_dir))


def _check_same_model(model_dir: str, doc: dict[str, Any]) -> None:
    """Refuse to train into a model dir whose checkpoint belongs to another model.

    A ``model.json`` without a checkpoint (a run that failed before its first
    save) is replaced by the new one.
    """
    if not _fileio.is_file(os.path.join(model_dir, MODEL_FILE)) or not _has_checkpoint(model_dir):
        return
    old = dict(read_model_json(model_dir))
    old["feature_spec"] = canonical_spec(old.get("feature_spec"))
    for key in ("model", "params", "sparse_optimizer", "feature_spec"):
        if old.get(key) != doc[key]:
            raise ConfigError(
                f"{model_dir}/{MODEL_FILE}: the model dir holds another model ({key} "
                f"{old.get(key)!r} != {doc[key]!r}); train into a new checkpoint.dir."
            )


def _check_run_dirs(cfg: RunConfig) -> None:
    """Refuse an ``output_dir`` or model dir that is a file (or lies under one)."""
    key = '"checkpoint.dir"' if cfg.checkpoint.dir else '"output_dir"'
    for label, path in (('"output_dir"', cfg.output_dir), (key, cfg.model_dir)):
        problem = dir_problem(path)
        if problem is not None:
            raise ConfigError(f"{cfg.source}: {label}: {problem}.")


def _write_run_files(cfg: RunConfig, doc: dict[str, Any]) -> None:
    """Rank 0: check the model dir, create the dirs, write ``model.json`` and ``config.json``."""
    _check_same_model(cfg.model_dir, doc)
    key = '"checkpoint.dir"' if cfg.checkpoint.dir else '"output_dir"'
    make_dir(cfg.output_dir, f'{cfg.source}: "output_dir"')
    make_dir(cfg.model_dir, f"{cfg.source}: {key}")
    write_model_json(cfg.model_dir, doc)
    text = to_json(cfg.to_dict(), indent=2).encode()
    _fileio.write_atomic(os.path.join(cfg.output_dir, CONFIG_FILE), lambda f: f.write(text))


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
    _fileio.append_text(path, "".join(to_json(r) + "\n" for r in records))
    return path


def _day_record(day: DayReport) -> dict[str, Any]:
    return {
        "event": "day",
        "dt": day.dt,
        "skipped": day.skipped,
        "resumed": day.resumed,
        "saved": day.saved,
        "rows": day.rows_trained,
        "keys_created": day.keys_created,
        "keys_evicted": day.keys_evicted,
        "keys_admitted": day.keys_admitted,
        "keys_refused": day.keys_refused,
        "keys_evicted_cap": day.keys_evicted_cap,
        "table_sizes": day.table_sizes,
        "tables": day.tables,
        "next_day_auc": day.next_day_auc,
    }


def train(cfg: RunConfig, verbose: int = 1, eval_next_day: bool = False) -> dict[str, Any]:
    """Train the configured days in order into the model dir (checkpoint root); evaluate on test.

    Before anything is built or written, the workers compare their configs and
    model dirs, and every input (each day, the test data) is checked. A day
    already complete in the checkpoint is skipped; an interrupted day resumes
    from its saved input position (``checkpoint.save_every_n_steps``). Before
    each day's save the tables decay and evict by ``[eviction]``; with
    ``checkpoint.save_every_days`` only every N-th day and the last are saved
    (a stopped run trains the days after the last saved one again), and
    ``[schedule]`` sets both optimizers' learning rates before every step. Rank 0
    writes ``model.json``, ``config.json``, prints one line per day and
    appends them to ``runlog.jsonl`` (with each table's keys admitted and
    refused, rows evicted by the cap and at the day's end, rows, bytes and
    sketch fill), after the ``memory`` records of every ``train.log_every``
    steps.

    Args:
        cfg: the run config.
        verbose: 1 prints the per-day lines (rank 0).
        eval_next_day: before training a day, report the AUC on it of the model so far.

    Returns:
        ``days`` (one record per day), ``rows``, ``samples_per_s``, ``train_s``,
        and ``val_*`` metrics on the test data when the config has some.

    Raises:
        ConfigError: ``train.device`` is not a device this process can train
            on (:func:`train_device`), ``train.steps_per_epoch`` is set, the workers' configs or
            model dirs differ, an input matches no file or holds no rows,
            ``output_dir`` or the model dir is a file, or the model dir holds
            another model's checkpoint.
        DistributedError: on the other workers when rank 0 cannot write the model dir.
    """
    d = cfg.distributed
    strategy = current_or_new_strategy(d.timeout_s, d.memory_limit_bytes, d.mode, d.staleness)
    rank = strategy.rank
    device = train_device(cfg, strategy.world_size, strategy.env.local_rank)
    _check_same_config(strategy, cfg)
    if cfg.train.steps_per_epoch is not None:
        raise ConfigError(
            f'{cfg.source}: "train.steps_per_epoch" is not supported by the daily cycle of '
            "`tnrec train` (every day is trained in full); remove it."
        )
    _check_run_dirs(cfg)
    check_inputs(cfg)
    days = _days(cfg)
    model = build_model(cfg).to(device)  # the dense part; the tables stay on the host
    model_dir = cfg.model_dir
    doc = model_doc(model, model_params(cfg), make_policy(cfg), cfg.to_dict())
    _on_rank0(strategy, lambda: _write_run_files(cfg, doc), "prepare the model dir")
    start = time.perf_counter()
    ck = cfg.checkpoint
    # Per-step and per-epoch records (rows, samples/s, input wait, metrics): rank 0 only.
    log = RunLog(cfg.output_dir, every=cfg.train.log_every) if rank == 0 else None
    schedule = make_schedule(cfg)
    callbacks: list[Callback] = [log] if log is not None else []
    if schedule is not None:
        callbacks.append(LearningRateScheduler(schedule))
    reports = train_days(
        model,
        days,
        model_dir,
        epochs=cfg.train.epochs,
        save_every_n_steps=ck.save_every_n_steps,
        save_every_days=ck.save_every_days,
        keep=ck.keep,
        eval_next_day=eval_next_day,
        verbose=verbose,
        callbacks=callbacks,
        wrap=log.wrap if log is not None else None,
        log_every=cfg.train.log_every,  # memory reports: on every worker, same steps
        pipeline=cfg.train.pipeline,
        balance=cfg.train.balance,
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
