"""Callbacks run by ``Model.fit``, the ``History`` it returns, and its progress display."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from tnrec.errors import ArgumentError


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


class Checkpoint(Callback):
    """Load the last checkpoint when ``fit`` starts; save when it ends (and every n steps).

    Saves go to ``model_dir/<dt>/<generation>`` (see :mod:`tnrec.checkpoint`).
    A mid-day save records each worker's input position; when ``fit`` starts
    from such a checkpoint on the same number of workers, the reader resumes
    after the last row trained. The final save marks the day complete.

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
        save_at_end: save (day complete) when ``fit`` ends; the daily cycle
            turns it off to decay and evict first.

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
        self.model.save_weights(
            self.model_dir,
            self.dt,
            resume={"dt": self.dt, "day_complete": True},
            position=self._position(),
            keep=self.keep,
        )
