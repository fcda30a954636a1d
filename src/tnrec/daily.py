"""TensorNet's daily incremental cycle, made restartable: train a list of days in order.

For each day, in order:

1. skip it if the checkpoint says it is complete;
2. optionally evaluate on it before training (next-day AUC: the model trained
   up to yesterday, scored on today);
3. train it (resuming after the last row trained if a mid-day checkpoint of
   this day exists on the same number of workers; with ``save_every_n_steps``
   mid-day checkpoints are written);
4. ``show_decay(days since the last decayed day)``, then ``evict()`` by each
   table's policy (:func:`tnrec.callbacks.end_day`, as the ``Checkpoint``
   callback does at the end of ``fit``);
5. save the day's checkpoint, marked complete -- with ``save_every_days=N``
   only every N-th day of ``days`` and the last one.

A day label that parses as ``YYYY-MM-DD`` (or ``YYYYMMDD``) decays by the
calendar days elapsed; other labels count one day each.

Days between two saves are trained, decayed and evicted in memory only. A
run stopped between saves (killed, or an error) resumes from the last
checkpoint written -- the last saved day, or a mid-day checkpoint with
``save_every_n_steps`` -- and trains the days after it again; which days are
saved depends only on their place in ``days``, so the resumed run saves the
same days and ends with the same tables and weights as a run never stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tnrec.callbacks import Callback, Checkpoint, end_day
from tnrec.checkpoint import lock_for_run
from tnrec.errors import ArgumentError, EmptyInputError
from tnrec.model import Model


@dataclass
class DayReport:
    """What one day did (global over workers).

    ``keys_evicted`` counts the rows deleted at the day's end by each table's
    policy; ``keys_admitted``, ``keys_refused`` and ``keys_evicted_cap`` the
    keys given a row by admission, the training pulls of keys refused one, and
    the rows evicted by the row cap during the day. ``tables`` holds, per
    table, those four (:data:`DAY_TABLE_FIELDS`) and, at the day's end, its
    ``rows``, ``bytes`` (summed over workers) and ``sketch_fill`` (the mean of
    the workers' admission-sketch fill). A resumed day counts from the resume
    (the counters are not saved in checkpoints). ``saved``: the day's end
    was checkpointed (``train_days(save_every_days=...)`` saves some days only).
    """

    dt: str
    skipped: bool = False
    rows_trained: int = 0
    keys_created: int = 0
    keys_evicted: int = 0
    table_sizes: dict[str, int] = field(default_factory=dict)
    next_day_auc: float | None = None
    resumed: bool = False
    keys_admitted: int = 0
    keys_refused: int = 0
    keys_evicted_cap: int = 0
    tables: dict[str, dict[str, float]] = field(default_factory=dict)
    saved: bool = True


# Per table and day: counters taken as end-of-day minus start-of-day (keys_evicted: the
# day's policy eviction), then rows, bytes and sketch fill at the day's end.
DAY_TABLE_FIELDS = (
    "keys_admitted",
    "keys_refused",
    "keys_evicted_cap",
    "keys_evicted",
    "rows",
    "bytes",
    "sketch_fill",
)


def train_days(
    model: Model,
    days: Sequence[tuple[str, Callable[[], Any]]],
    model_dir: str,
    *,
    epochs: int = 1,
    save_every_n_steps: int | None = None,
    save_every_days: int = 1,
    keep: int | None = None,
    eval_next_day: bool = False,
    verbose: int = 0,
    callbacks: Sequence[Callback] = (),
    wrap: Callable[[Any], Any] | None = None,
    log_every: int = 100,
    pipeline: bool | None = None,
    balance: bool = False,
) -> list[DayReport]:
    """Train ``days`` (``(dt, make_reader)`` pairs, in order) with checkpoints in ``model_dir``.

    Every worker calls it with the same days; each reader is split per worker.

    Args:
        model: a compiled model.
        days: ``(dt, make_reader)`` pairs, oldest first.
        model_dir: the checkpoint root.
        epochs: passes over each day.
        save_every_n_steps: also checkpoint mid-day (resumable).
        save_every_days: save the end of every N-th day of ``days`` (the N-th,
            2N-th, ...; positions count from the first of ``days``, skipped
            ones included) and of the last; the days between are trained,
            decayed and evicted but not saved (TensorNet's
            ``SAVE_MODEL_INTERVAL_DAYS``).
        keep: keep only this many newest checkpoint generations.
        eval_next_day: before training each day after the first, report the AUC
            of the model so far on it.
        verbose: 1 prints one line per day (rank 0).
        callbacks: more callbacks for every day's ``fit`` (a run log, ...).
        wrap: applied to each day's worker part before ``fit`` (e.g. ``RunLog.wrap``).
        log_every: ``fit``'s steps between log lines and memory reports.
        pipeline: ``fit``'s input pipeline (the next batch read and prepared
            while a step computes; bit-identical either way; None: on where it
            pays, see :meth:`tnrec.Model.fit`).
        balance: hand out each day's units (Parquet row groups, files) to the
            workers as they run dry (``fit(balance=True)``, sync mode on
            W > 1 workers); the day's parts are then not wrapped by ``wrap``.

    Returns:
        One :class:`DayReport` per day.

    Raises:
        ArgumentError: repeated day labels, ``epochs < 1`` or ``save_every_days < 1``.
        WriteError: another run holds the model dir.
    """
    labels = [dt for dt, _ in days]
    if len(set(labels)) != len(labels):
        raise ArgumentError(f"train_days: day labels must be unique. Received: {labels}.")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ArgumentError(
            f"train_days: `epochs` must be an int >= 1 (a day trained on no rows is not "
            f"complete). Received: epochs={epochs!r}."
        )
    n = save_every_days
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(
            f"train_days: `save_every_days` must be an int >= 1. Received: save_every_days={n!r}."
        )
    with lock_for_run(model.ps, model_dir):
        return _train_days(
            model,
            days,
            model_dir,
            epochs=epochs,
            save_every_n_steps=save_every_n_steps,
            save_every_days=save_every_days,
            keep=keep,
            eval_next_day=eval_next_day,
            verbose=verbose,
            callbacks=callbacks,
            wrap=wrap,
            log_every=log_every,
            pipeline=pipeline,
            balance=balance,
        )


def _train_days(
    model: Model,
    days: Sequence[tuple[str, Callable[[], Any]]],
    model_dir: str,
    *,
    epochs: int,
    save_every_n_steps: int | None,
    save_every_days: int,
    keep: int | None,
    eval_next_day: bool,
    verbose: int,
    callbacks: Sequence[Callback],
    wrap: Callable[[Any], Any] | None,
    log_every: int,
    pipeline: bool | None,
    balance: bool,
) -> list[DayReport]:
    """:func:`train_days` under the model-dir lock."""
    labels = [dt for dt, _ in days]
    report = model.load_weights(model_dir)
    resume = report.resume if report is not None else {}
    done_dt, done = resume.get("dt"), bool(resume.get("day_complete"))
    start = labels.index(done_dt) if done_dt in labels else 0
    reports = []
    ps = model.ps
    have_model = report is not None  # a model trained up to yesterday exists (next-day AUC)
    for i, (dt, make_reader) in enumerate(days):
        if i < start or (i == start and dt == done_dt and done):
            reports.append(DayReport(dt, skipped=True))
            if verbose and ps.rank == 0:
                print(format_day(reports[-1]), flush=True)
            continue
        day = DayReport(dt)
        if eval_next_day and have_model:
            try:
                day.next_day_auc = model.evaluate(make_reader(), verbose=0).get("auc")
            except EmptyInputError:
                day.next_day_auc = None  # nothing to score; training the day says why
        part = model.worker_part(make_reader(), balance=balance)
        position = report.position if report is not None and dt == done_dt and not done else None
        part, first_epoch = _resumed(model, part, position, balance)
        day.resumed = position is not None and hasattr(part, "seek")
        before = _sizes(model)
        start_counters = _counters(model)
        counter = _RowCounter()
        cbs: list[Callback] = [counter]
        if save_every_n_steps is not None:
            cbs.append(
                Checkpoint(
                    model_dir, dt, save_every_n_steps, keep=keep, load=False, save_at_end=False
                )
            )
        model.fit(
            wrap(part) if wrap is not None and not balance else part,
            epochs=max(epochs - first_epoch, 0),
            callbacks=[*cbs, *callbacks],
            verbose=verbose,
            log_every=log_every,
            pipeline=pipeline,
            balance=balance,
        )
        created = {n: _sizes(model)[n] - before[n] for n in before}  # global already
        evicted = end_day(model, dt)
        stats = getattr(part, "stats", None)
        bad = int(getattr(stats, "bad_rows", 0) or 0)
        bad = _count_day(model, day, counter.rows, bad, start_counters, evicted)  # one all-reduce
        if day.rows_trained == 0 and bad > 0 and not day.resumed:
            raise EmptyInputError(
                f"day {dt}: no row was trained: all {bad} rows of its input were bad and "
                "skipped (on_bad_row='skip'). The day is not marked complete; fix the input "
                "and run again."
            )
        day.keys_created = sum(created.values())
        day.saved = (i + 1) % save_every_days == 0 or i == len(days) - 1
        if day.saved:
            model.save_weights(
                model_dir,
                dt,
                resume={"dt": dt, "day_complete": True},
                position=part.position() if hasattr(part, "position") else None,
                keep=keep,
            )
        report = None  # later days start fresh: no position to resume
        have_model = True
        reports.append(day)
        if verbose and ps.rank == 0:
            print(format_day(day), flush=True)
    return reports


def _resumed(model: Model, part: Any, position: Any, balance: bool) -> tuple[Any, int]:
    """Seek ``part`` to ``position`` (if any); return it and the first epoch ``fit`` trains."""
    if position is None or not hasattr(part, "seek"):
        return part, 0
    part.seek(position)
    if balance:  # every worker is in the same balanced epoch
        return part, int(getattr(part, "epoch", 0))
    # A worker may already be in a later epoch (its part ran out first): resume from the
    # earliest epoch any worker is in; the others join those steps empty-handed.
    first = int(model.ps.all_gather(np.array([getattr(part, "epoch", 0)], np.float64)).min())
    return _FromEpoch(part, first), first


class _FromEpoch:
    """A resumed reader whose ``fit`` epochs start at global epoch ``first``.

    Iterating it for global epoch ``g`` yields the reader's rows of ``g`` (the
    rest of it, after a seek) or nothing when this worker already finished
    ``g``. Everything else (position, seek, empty_batch, ...) is the reader's.
    """

    def __init__(self, part: Any, first: int) -> None:
        self.part = part
        self.next_epoch = first

    def __getattr__(self, name: str) -> Any:
        if name == "part":
            raise AttributeError(name)
        return getattr(self.part, name)

    def __iter__(self) -> Any:
        g = self.next_epoch
        self.next_epoch += 1
        if getattr(self.part, "epoch", g) > g:
            return iter(())
        return iter(self.part)


def _counters(model: Model) -> dict[str, dict[str, int]]:
    """This worker's cumulative admission and cap counters of every table (a copy)."""
    return {name: dict(t.counters) for name, t in model.tables.items()}


def _count_day(
    model: Model,
    day: DayReport,
    rows: int,
    bad: int,
    start: dict[str, dict[str, int]],
    evicted: dict[str, int],
) -> int:
    """Fill ``day``'s rows, evictions, admission counters and per-table figures (global);
    return the bad rows skipped on all workers.

    One all-reduce sums ``[rows, bad, per table: DAY_TABLE_FIELDS]`` over the
    workers: the counters as this worker's end-of-day minus ``start``, the
    policy evictions ``evicted``, and the table's rows, bytes and sketch fill
    now. A worker whose input ran out takes part like the others.
    """
    names = sorted(model.tables)
    local = [float(rows), float(bad)]
    for name in names:
        mem = model.tables[name].memory()
        local += [float(mem[c]) - start[name][c] for c in DAY_TABLE_FIELDS[:3]]
        local += [float(evicted[name]), float(mem["rows"]), float(mem["bytes"])]
        local.append(float(mem["sketch_fill"]))
    totals = model.ps.all_reduce_sum(np.array(local, np.float64))
    day.rows_trained = int(totals[0])
    n, W = len(DAY_TABLE_FIELDS), model.ps.world_size
    for i, name in enumerate(names):
        figures = dict(zip(DAY_TABLE_FIELDS, totals[2 + i * n : 2 + (i + 1) * n], strict=True))
        day.tables[name] = {f: int(v) for f, v in figures.items() if f != "sketch_fill"}
        day.tables[name]["sketch_fill"] = float(figures["sketch_fill"]) / W
    for c in ("keys_admitted", "keys_refused", "keys_evicted_cap", "keys_evicted"):
        setattr(day, c, sum(int(t[c]) for t in day.tables.values()))
    day.table_sizes = {name: int(t["rows"]) for name, t in day.tables.items()}
    return int(totals[1])


def _sizes(model: Model) -> dict[str, int]:
    """Global key count of every table."""
    names = sorted(model.tables)
    local = np.array([len(model.tables[n]) for n in names], np.float64)
    return {n: int(x) for n, x in zip(names, model.ps.all_reduce_sum(local), strict=True)}


class _RowCounter(Callback):
    """Counts the rows this worker trained."""

    def __init__(self) -> None:
        self.rows = 0

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self.rows = 0

    def on_train_batch_end(self, step: int, logs: dict[str, float] | None = None) -> None:
        self.rows += int((logs or {}).get("batch_size", 0))


def _table_text(figures: dict[str, float] | None) -> str:
    """`` (admitted A, refused R, evicted E, by cap C, sketch fill F)`` without zero parts."""
    if not figures:
        return ""
    parts = [
        f"{label} {int(figures[key])}"
        for label, key in (
            ("admitted", "keys_admitted"),
            ("refused", "keys_refused"),
            ("evicted", "keys_evicted"),
            ("by cap", "keys_evicted_cap"),
        )
        if figures.get(key)
    ]
    if figures.get("sketch_fill"):
        parts.append(f"sketch fill {figures['sketch_fill']:.3f}")
    return f" ({', '.join(parts)})" if parts else ""


def format_day(day: DayReport) -> str:
    """One line per day for logs and the CLI.

    After each table's size, its non-zero day figures: keys admitted, keys
    refused, rows evicted at the day's end and by the cap, sketch fill.

    Example:
        >>> print(format_day(DayReport("2024-05-10", rows_trained=600, keys_created=80,
        ...     keys_evicted=3, keys_evicted_cap=5, table_sizes={"emb": 72, "wide": 40},
        ...     tables={"emb": {"keys_admitted": 80, "keys_refused": 310, "keys_evicted": 3,
        ...                     "keys_evicted_cap": 5, "sketch_fill": 0.0123}})))
        day 2024-05-10: rows 600 - keys created 80 - evicted 3 (+5 by cap) - tables emb=72
        (admitted 80, refused 310, evicted 3, by cap 5, sketch fill 0.012), wide=40
    """
    if day.skipped:
        return f"day {day.dt}: already complete, skipped"
    auc = f" next-day AUC {day.next_day_auc:.4f} -" if day.next_day_auc is not None else ""
    sizes = ", ".join(
        f"{k}={v}{_table_text(day.tables.get(k))}" for k, v in day.table_sizes.items()
    )
    empty = " (its input holds no rows)" if day.rows_trained == 0 and not day.resumed else ""
    cap = f" (+{day.keys_evicted_cap} by cap)" if day.keys_evicted_cap else ""
    tail = (" (resumed)" if day.resumed else "") + ("" if day.saved else " (not saved)")
    return (
        f"day {day.dt}:{auc} rows {day.rows_trained}{empty} - keys created {day.keys_created} - "
        f"evicted {day.keys_evicted}{cap} - tables {sizes}{tail}"
    )
