"""Callbacks run by ``Model.fit``, the ``History`` it returns, and its progress display."""

from __future__ import annotations

import sys
import time
from typing import IO, Any


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
        """Called after every training step with that step's logs (its loss)."""


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

    def due(self, step: int) -> bool:
        """Whether ``update`` would show something for ``step`` (so logs are worth computing).

        On a terminal at most 5 refreshes a second; otherwise every ``log_every`` steps.
        """
        if self.tty:
            return time.perf_counter() - self._last_draw >= 0.2
        return step % self.log_every == 0

    def update(self, step: int, samples: int, logs: dict[str, float]) -> None:
        """Report that ``step`` (1-based) finished, having trained ``samples`` rows in total."""
        self.samples = samples
        now = time.perf_counter()
        rate = samples / max(now - self.start, 1e-9)
        if self.tty:
            self._last_draw = now
            if self.total:
                done = int(30 * step / self.total)
                bar = f"[{'=' * done}{'.' * (30 - done)}] {step}/{self.total}"
            else:
                bar = f"step {step}"
            self.stream.write(f"\r{bar} - {rate:,.0f} samples/s - {format_logs(logs)}")
            self.stream.flush()
        elif step % self.log_every == 0:
            self.stream.write(f"step {step} - {rate:,.0f} samples/s - {format_logs(logs)}\n")
            self.stream.flush()

    def close(self, epoch: int, logs: dict[str, float]) -> None:
        """Finish the epoch's display with its final metrics."""
        secs = time.perf_counter() - self.start
        rate = self.samples / max(secs, 1e-9)
        end = "\n" if self.tty else ""
        self.stream.write(
            f"{end}epoch {epoch + 1} - {secs:.1f}s - {rate:,.0f} samples/s - {format_logs(logs)}\n"
        )
        self.stream.flush()
