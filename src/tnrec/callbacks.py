"""Callbacks run by ``Model.fit``, the ``History`` it returns, and its progress display."""

from __future__ import annotations

import datetime as _dt
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from tnrec.errors import ArgumentError
from tnrec.schedules import Schedule


class Callback:
    """Base class: override the hooks you need. ``self.model`` is set by ``fit``."""

    model: Any = None

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        """Called once before the first epoch."""

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        """Called once after the last epoch."""

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        """Called before each epoch."""

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        """Called after each epoch with its metrics (and ``val_*`` ones)."""

    def on_train_batch_begin(self, step: int, logs: dict[str, float] | None = None) -> None:
        """Called before every training step (``step`` counts the epoch's steps from 1)."""

    def on_train_batch_end(self, step: int, logs: dict[str, float] | None = None) -> None:
        """Called after every training step with its logs (``loss``, ``batch_size``: this
        worker's rows)."""

    def on_memory_report(self, step: int, report: dict[str, Any]) -> None:
        """Called every ``log_every`` steps of ``fit`` and at each epoch's end with
        :func:`tnrec.memory.memory_report` (every worker's tables and peak RSS; ``step``
        counts the epoch's steps). Every worker gets the same report."""


class History(Callback):
    """What ``fit`` returns: ``history[name]`` is one value per epoch.

    Example:
        >>> h = History()
        >>> h.on_epoch_end(0, {"loss": 0.5})
        >>> h.history
        {'loss': [0.5]}
    """

    def __init__(self) -> None:
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self.epoch.append(epoch)
        for k, v in (logs or {}).items():
            self.history.setdefault(k, []).append(v)


def format_logs(logs: dict[str, float]) -> str:
    """Return ``name: value`` pairs, 4 significant digits."""
    return " - ".join(f"{k}: {v:.4g}" for k, v in logs.items())


class ProgressBar:
    """A one-line bar on a terminal; plain log lines every ``log_every`` steps otherwise.

    Args:
        total: steps in the epoch, if known.
        stream: where to write (stdout by default).
        log_every: steps between lines when the stream is not a terminal.
    """

    def __init__(
        self, total: int | None = None, stream: IO[str] | None = None, log_every: int = 100
    ):
        self.total = total
        self.stream = stream if stream is not None else sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.log_every = max(1, log_every)
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self.samples = 0
        self.memory = ""  # the latest memory line (tnrec.memory.format_memory), if any

    def due(self, step: int) -> bool:
        """Whether ``update`` would show something for ``step`` (so logs are worth computing).

        On a terminal at most 5 refreshes a second; otherwise every ``log_every`` steps.
        """
        if self.tty:
            return time.perf_counter() - self._last_draw >= 0.2
        return step % self.log_every == 0

    def _memory_text(self) -> str:
        return f" - memory: {self.memory}" if self.memory else ""

    def update(self, step: int, samples: int, logs: dict[str, float]) -> None:
        """Report that ``step`` (1-based) finished, having trained ``samples`` rows in total.

        The line ends with :attr:`memory` when set (``fit`` sets it every
        ``log_every`` steps).
        """
        self.samples = samples
        now = time.perf_counter()
        rate = samples / max(now - self.start, 1e-9)
        logs_text = format_logs(logs) + self._memory_text()
        if self.tty:
            self._last_draw = now
            if self.total:
                done = int(30 * step / self.total)
                bar = f"[{'=' * done}{'.' * (30 - done)}] {step}/{self.total}"
            else:
                bar = f"step {step}"
            self.stream.write(f"\r{bar} - {rate:,.0f} samples/s - {logs_text}")
            self.stream.flush()
        elif step % self.log_every == 0:
            self.stream.write(f"step {step} - {rate:,.0f} samples/s - {logs_text}\n")
            self.stream.flush()

    def close(self, epoch: int, logs: dict[str, float]) -> None:
        """Finish the epoch's display with its final metrics."""
        secs = time.perf_counter() - self.start
        rate = self.samples / max(secs, 1e-9)
        end = "\n" if self.tty else ""
        self.stream.write(
            f"{end}epoch {epoch + 1} - {secs:.1f}s - {rate:,.0f} samples/s - {format_logs(logs)}"
            f"{self._memory_text()}\n"
        )
        self.stream.flush()


def _parse_day(dt: str) -> _dt.date | None:
    for fmt in ("%Y-%m-%d", "%Y%m%d"):
        try:
            return _dt.datetime.strptime(dt, fmt).date()
        except ValueError:
            pass
    return None


def days_between(earlier: str | None, later: str) -> int:
    """Return the days to decay by between two day labels (1 when they are not dates).

    Example:
        >>> days_between("2024-05-10", "2024-05-13"), days_between("a", "b")
        (3, 1)
    """
    if earlier is None:
        return 0
    a, b = _parse_day(earlier), _parse_day(later)
    if a is None or b is None:
        return 1
    return max((b - a).days, 0)


def end_day(model: Any, dt: str) -> dict[str, int]:
    """Close day ``dt`` in memory: decay every table's statistics, evict, remember ``dt``.

    The decay is ``show_decay(days_between(model.last_decayed_day, dt))``, 1
    day for a model that never decayed; then each table's policy evicts. The
    day's save comes after, so a checkpoint holds its day's decayed tables and
    ``last_decayed_day = dt``: resuming from it never decays the day again.
    :class:`Checkpoint` and :func:`tnrec.daily.train_days` both close days here.

    Returns:
        The rows this worker evicted, by table.
    """
    last = model.last_decayed_day
    delta = days_between(last, dt) if last is not None else 1
    evicted = {}
    for name, table in sorted(model.tables.items()):
        table.show_decay(delta)
        evicted[name] = table.evict()
    model.last_decayed_day = dt
    return evicted


class Checkpoint(Callback):
    """Load the last checkpoint when ``fit`` starts; close the day and save when it ends.

    Saves go to ``model_dir/<dt>/<generation>`` (see :mod:`tnrec.checkpoint`).
    A mid-day save (every ``save_every_n_steps``) records each worker's input
    position; when ``fit`` starts from such a checkpoint on the same number of
    workers, the reader resumes after the last row trained.

    When ``fit`` ends the day is closed as TensorNet's ``on_train_end`` does,
    in this order: the tables' statistics decay by the days elapsed since the
    last decayed day (:func:`end_day`; 1 for the first day, 0 when ``dt`` is
    that day again, so decay never happens twice), each table's policy
    evicts, and then the day is saved, marked complete. A loop of
    ``model.fit(day_reader, callbacks=[Checkpoint(model_dir, dt=day)])``
    over days leaves the same tables as :func:`tnrec.daily.train_days` over
    them.

    With several workers and uneven data, a worker whose part ran out before
    a mid-day save has a position in the next epoch, and ``fit`` would read
    its part again: resume multi-worker days with :func:`tnrec.daily.train_days`
    (``tnrec train``), which aligns the workers' epochs; this callback is exact
    for one worker.

    Args:
        model_dir: the checkpoint root.
        dt: the day being trained (e.g. ``"2024-05-10"``).
        save_every_n_steps: also save every n training steps.
        keep: keep only this many newest generations.
        load: load the last checkpoint at the start of ``fit``.
        save_at_end: close the day and save it when ``fit`` ends; the daily
            cycle turns it off to close days itself.

    Example:
        >>> cb = Checkpoint("model_dir", dt="2024-05-10", save_every_n_steps=1000)
        >>> # model.fit(reader, callbacks=[cb])
    """

    def __init__(
        self,
        model_dir: str,
        dt: str,
        save_every_n_steps: int | None = None,
        keep: int | None = None,
        load: bool = True,
        save_at_end: bool = True,
    ) -> None:
        if save_every_n_steps is not None and (
            not isinstance(save_every_n_steps, int) or save_every_n_steps < 1
        ):
            raise ArgumentError(
                f"Checkpoint: `save_every_n_steps` must be an int >= 1 or None. "
                f"Received: {save_every_n_steps!r}."
            )
        self.model_dir = model_dir
        self.dt = dt
        self.save_every_n_steps = save_every_n_steps
        self.keep = keep
        self.load = load
        self.save_at_end = save_at_end
        self.report: Any = None

    def _position(self) -> Any:
        data = self.model.fit_data
        return data.position() if hasattr(data, "position") else None

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        if self.save_every_n_steps is not None and self.model.ps.asynchronous:
            raise ArgumentError(
                "Checkpoint: `save_every_n_steps` saves in the middle of an epoch, a collective "
                "at the same step on every worker; in async mode workers take different numbers "
                "of steps, so checkpoints are taken at the end of the day "
                "(save_every_n_steps=None)."
            )
        if not self.load:
            return
        self.report = self.model.load_weights(self.model_dir)
        if self.report is None:
            return
        same_day = self.report.resume.get("dt") == self.dt
        pos = self.report.position
        if same_day and not self.report.resume.get("day_complete") and pos is not None:
            if hasattr(self.model.fit_data, "seek"):
                self.model.fit_data.seek(pos)

    def on_train_batch_end(self, step: int, logs: dict[str, float] | None = None) -> None:
        n = self.save_every_n_steps
        if n is not None and self.model.global_step % n == 0:
            self.model.save_weights(
                self.model_dir,
                self.dt,
                resume={"dt": self.dt, "day_complete": False},
                position=self._position(),
                keep=self.keep,
            )

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        if not self.save_at_end:
            return
        end_day(self.model, self.dt)
        self.model.save_weights(
            self.model_dir,
            self.dt,
            resume={"dt": self.dt, "day_complete": True},
            position=self._position(),
            keep=self.keep,
        )


LrFunction = Callable[[int, float], float]


class LearningRateScheduler(Callback):
    """Set the dense and sparse learning rates before every training step.

    ``schedule`` is either a :class:`tnrec.schedules.Schedule` (each
    optimizer's rate becomes its base rate times ``schedule(step)``; the base
    is the dense param group's ``initial_lr``, set from its ``lr`` on first
    use, and the table optimizer's ``learning_rate``), or Keras's shape, a
    function ``schedule(step, lr) -> lr`` called once per optimizer with its
    current rate. ``step`` is ``model.global_step`` before the step: training
    steps since the model was created, the same on every worker and saved in
    checkpoints, with the dense rates (the optimizer's state) and the tables'
    rates (:meth:`tnrec.table.SparseTable.set_learning_rate`), so a resumed
    run continues the schedule exactly. The granularity is the step; an epoch
    schedule is a step schedule over ``steps_per_epoch``. Each epoch's logs
    (``fit``'s History) get ``learning_rate``: the first dense group's rate,
    else the first scheduled table's.

    Args:
        schedule: a schedule, or ``f(step, lr) -> lr``.
        dense: schedule the dense optimizer's param groups.
        tables: the tables to schedule by name (None: every table; ``()``: none).

    Raises:
        ArgumentError: ``schedule`` is not callable, ``tables`` names a table
            the model lacks (when ``fit`` starts), or a function returns a
            rate that is not a finite number >= 0.

    Example:
        >>> from tnrec.schedules import WarmUp, CosineDecay
        >>> cb = LearningRateScheduler(WarmUp(1000, 0.1, then=CosineDecay(100_000, 0.05)))
        >>> # model.fit(reader, callbacks=[cb])
    """

    def __init__(
        self,
        schedule: Schedule | LrFunction,
        *,
        dense: bool = True,
        tables: Sequence[str] | None = None,
    ) -> None:
        if not callable(schedule):
            raise ArgumentError(
                "LearningRateScheduler: `schedule` must be a tnrec schedule or a function "
                f"(step, lr) -> lr. Received: {schedule!r}."
            )
        if isinstance(tables, str):
            raise ArgumentError(
                f"LearningRateScheduler: `tables` must be a list of table names or None. "
                f"Received: {tables!r}."
            )
        self.schedule = schedule
        self.dense = bool(dense)
        self.tables = None if tables is None else list(tables)

    def _table_names(self) -> list[str]:
        have = sorted(self.model.tables)
        if self.tables is None:
            return have
        missing = [t for t in self.tables if t not in have]
        if missing:
            raise ArgumentError(
                f"LearningRateScheduler: `tables` names {missing}, which the model lacks; its "
                f"tables are {have}."
            )
        return list(self.tables)

    def _groups(self) -> list[dict[str, Any]]:
        opt = self.model.optimizer if self.dense else None
        return list(getattr(opt, "param_groups", []) or [])

    def _rate(self, step: int, base: float, current: float, what: str) -> float:
        if isinstance(self.schedule, Schedule):
            return float(base) * self.schedule(step)
        lr = self.schedule(step, float(current))
        number = isinstance(lr, (int, float)) and not isinstance(lr, bool)
        if not (number and math.isfinite(lr) and lr >= 0):
            raise ArgumentError(
                f"LearningRateScheduler: the schedule returned {lr!r} for {what} at step {step}; "
                "a learning rate must be a finite number >= 0."
            )
        return float(lr)

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._names = self._table_names()

    def on_train_batch_begin(self, step: int, logs: dict[str, float] | None = None) -> None:
        t = int(self.model.global_step)
        for group in self._groups():
            base = group.setdefault("initial_lr", group["lr"])
            group["lr"] = self._rate(t, base, group["lr"], "the dense optimizer")
        tables = self.model.tables
        for name in self._names:
            table = tables[name]
            lr = self._rate(
                t, table.optimizer.learning_rate, table.learning_rate, f'table "{name}"'
            )
            table.set_learning_rate(lr)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if logs is None:
            return
        groups = self._groups()
        if groups:
            logs["learning_rate"] = float(groups[0]["lr"])
        elif self._names:
            logs["learning_rate"] = self.model.tables[self._names[0]].learning_rate
