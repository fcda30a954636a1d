"""TensorNet's daily incremental cycle, made restartable: train a list of days in order.

For each day, in order:

1. skip it if the checkpoint says it is complete;
2. optionally evaluate on it before training (next-day AUC: the model trained
   up to yesterday, scored on today);
3. train it (resuming after the last row trained if a mid-day checkpoint of
   this day exists on the same number of workers; with ``save_every_n_steps``
   mid-day checkpoints are written);
4. ``show_decay(days since the last decayed day)``, then ``evict()`` by each
   table's policy;
5. save the day's checkpoint, marked complete.

A day label that parses as ``YYYY-MM-DD`` (or ``YYYYMMDD``) decays by the
calendar days elapsed; other labels count one day each.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tnrec.callbacks import Callback, Checkpoint
from tnrec.checkpoint import lock_for_run
from tnrec.errors import ArgumentError, EmptyInputError
from tnrec.model import Model


@dataclass
class DayReport:
    """What one day did (global over workers)."""

    dt: str
    skipped: bool = False
    rows_trained: int = 0
    keys_created: int = 0
    keys_evicted: int = 0
    table_sizes: dict[str, int] = field(default_factory=dict)
    next_day_auc: float | None = None
    resumed: bool = False


def _parse_day(dt: str) -> _dt.date | None:
    for fmt in ("%Y-%m-%d", "%Y%m%d"):
        try:
            return _dt.datetime.strptime(dt, fmt).date()
        except ValueError:
            pass
    return None


def days_between(earlier: str | None, later: str) -> int:
    """Return the days to decay by between two day labels (1 when they are not dates)."""
    if earlier is None:
        return 0
    a, b = _parse_day(earlier), _parse_day(later)
    if a is None or b is None:
        return 1
    return max((b - a).days, 0)


def train_days(
    model: Model,
    days: Sequence[tuple[str, Callable[[], Any]]],
    model_dir: str,
    *,
    epochs: int = 1,
    save_every_n_steps: int | None = None,
    keep: int | None = None,
    eval_next_day: bool = False,
    verbose: int = 0,
    callbacks: Sequence[Callback] = (),
    wrap: Callable[[Any], Any] | None = None,
) -> list[DayReport]:
    """Train ``days`` (``(dt, make_reader)`` pairs, in order) with checkpoints in ``model_dir``.

    Every worker calls it with the same days; each reader is split per worker.

    Args:
        model: a compiled model.
        days: ``(dt, make_reader)`` pairs, oldest first.
        model_dir: the checkpoint root.
        epochs: passes over each day.
        save_every_n_steps: also checkpoint mid-day (resumable).
        keep: keep only this many newest checkpoint generations.
        eval_next_day: before training each day after the first, report the AUC
            of the model so far on it.
        verbose: 1 prints one line per day (rank 0).
        callbacks: more callbacks for every day's ``fit`` (a run log, ...).
        wrap: applied to each day's worker part before ``fit`` (e.g. ``RunLog.wrap``).

    Returns:
        One :class:`DayReport` per day.

    Raises:
        ArgumentError: repeated day labels, or ``epochs < 1``.
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
    with lock_for_run(model.ps, model_dir):
        return _train_days(
            model,
            days,
            model_dir,
            epochs=epochs,
            save_every_n_steps=save_every_n_steps,
            keep=keep,
            eval_next_day=eval_next_day,
            verbose=verbose,
            callbacks=callbacks,
            wrap=wrap,
        )


def _train_days(
    model: Model,
    days: Sequence[tuple[str, Callable[[], Any]]],
    model_dir: str,
    *,
    epochs: int,
    save_every_n_steps: int | None,
    keep: int | None,
    eval_next_day: bool,
    verbose: int,
    callbacks: Sequence[Callback],
    wrap: Callable[[Any], Any] | None,
) -> list[DayReport]:
    """:func:`train_days` under the model-dir lock."""
    labels = [dt for dt, _ in days]
    report = model.load_weights(model_dir)
    resume = report.resume if report is not None else {}
    done_dt, done = resume.get("dt"), bool(resume.get("day_complete"))
    last_decayed = resume.get("last_decayed_day")
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
        part = model.worker_part(make_reader())
        position = report.position if report is not None and dt == done_dt and not done else None
        first_epoch = 0
        if position is not None and hasattr(part, "seek"):
            part.seek(position)
            day.resumed = True
            # A worker may already be in a later epoch (its part ran out first): resume from
            # the earliest epoch any worker is in; the others join those steps empty-handed.
            first_epoch = int(
                ps.all_gather(np.array([getattr(part, "epoch", 0)], np.float64)).min()
            )
            part = _FromEpoch(part, first_epoch)
        before = _sizes(model)
        counter = _RowCounter()
        cbs: list[Callback] = [counter]
        if save_every_n_steps is not None:
            cbs.append(
                Checkpoint(
                    model_dir, dt, save_every_n_steps, keep=keep, load=False, save_at_end=False
                )
            )
        model.fit(
            wrap(part) if wrap is not None else part,
            epochs=max(epochs - first_epoch, 0),
            callbacks=[*cbs, *callbacks],
            verbose=verbose,
        )
        created = {n: _sizes(model)[n] - before[n] for n in before}  # global already
        delta = days_between(last_decayed, dt) if last_decayed is not None else 1
        evicted = 0
        for table in model.tables.values():
            table.show_decay(delta)
            evicted += table.evict()
        last_decayed = dt
        stats = getattr(part, "stats", None)
        bad = int(getattr(stats, "bad_rows", 0) or 0)
        totals = ps.all_reduce_sum(np.array([counter.rows, evicted, bad], np.float64))
        day.rows_trained, day.keys_evicted, bad = (int(x) for x in totals)
        if day.rows_trained == 0 and bad > 0 and not day.resumed:
            raise EmptyInputError(
                f"day {dt}: no row was trained: all {bad} rows of its input were bad and "
                "skipped (on_bad_row='skip'). The day is not marked complete; fix the input "
                "and run again."
            )
        day.keys_created = sum(created.values())
        day.table_sizes = _sizes(model)
        model.save_weights(
            model_dir,
            dt,
            resume={"dt": dt, "day_complete": True, "last_decayed_day": dt},
            position=part.position() if hasattr(part, "position") else None,
            keep=keep,
        )
        report = None  # later days start fresh: no position to resume
        have_model = True
        reports.append(day)
        if verbose and ps.rank == 0:
            print(format_day(day), flush=True)
    return reports


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


def format_day(day: DayReport) -> str:
    """One line per day for logs and the CLI."""
    if day.skipped:
        return f"day {day.dt}: already complete, skipped"
    auc = f" next-day AUC {day.next_day_auc:.4f} -" if day.next_day_auc is not None else ""
    sizes = ", ".join(f"{k}={v}" for k, v in day.table_sizes.items())
    empty = " (its input holds no rows)" if day.rows_trained == 0 and not day.resumed else ""
    return (
        f"day {day.dt}:{auc} rows {day.rows_trained}{empty} - keys created {day.keys_created} - "
        f"evicted {day.keys_evicted} - tables {sizes}" + (" (resumed)" if day.resumed else "")
    )
