"""Run logs: per-step and per-epoch metrics, samples/s, input wait; JSON lines and TensorBoard.

A :class:`RunLog` is a :class:`tnrec.callbacks.Callback`; wrap the training
data with :meth:`RunLog.wrap` so it can count rows and time the waits for
input::

    log = RunLog("runs/deepfm", every=10)
    model.fit(log.wrap(reader), epochs=2, callbacks=[log])

``runs/deepfm/runlog.jsonl`` then holds one JSON object a line::

    {"event": "step", "epoch": 0, "step": 10, "global_step": 10, "loss": 0.41,
     "rows": 40960, "time_s": 3.2, "samples_per_s": 12800.0, "input_wait_s": 0.01}
    {"event": "epoch", "epoch": 0, "steps": 245, "rows": 1000000, "time_s": 78.1,
     "samples_per_s": 12804.0, "input_wait_s": 0.4, "input_wait_share": 0.005,
     "loss": 0.44, "auc": 0.77, "val_auc": 0.78, ...}

    {"event": "memory", "epoch": 0, "step": 100, "global_step": 100, "world_size": 2,
     "peak_rss_bytes": 912261120, "peak_rss_bytes_per_worker": [912261120, 870244352],
     "tables": {"emb": {"rows": 81234, "bytes": 9437184, "skew": 1.02,
                        "keys_admitted": 0, "keys_refused": 0, ..., "per_worker": {...}}}}

Step records cover the ``every`` steps since the previous one (rates and
waits of that interval); epoch records cover the epoch; memory records
(:func:`tnrec.memory.memory_report`) come every ``log_every`` steps of ``fit``
and at the end of every epoch, with TensorBoard scalars
``memory/<table>/rows``, ``memory/<table>/bytes``, ``memory/<table>/skew``,
``memory/peak_rss``, ... When
``torch.utils.tensorboard`` and ``tensorboard`` are installed, the same scalars
also go to a TensorBoard event file in the same directory.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tnrec import _fileio
from tnrec.callbacks import Callback
from tnrec.errors import ArgumentError
from tnrec.memory import memory_scalars

__all__ = ["RunLog", "TimedData", "read_runlog"]

RUNLOG_FILE = "runlog.jsonl"


class TimedData:
    """Wrap a re-iterable of batches; count the rows taken and time every wait for the next one.

    Attributes:
        rows: rows of every batch taken so far (all epochs).
        batches: batches taken so far.
        wait_s: seconds spent waiting inside the wrapped iterator's ``next``.
    """

    def __init__(self, data: Iterable[Any]) -> None:
        self.data = data
        self.rows = 0
        self.batches = 0
        self.wait_s = 0.0

    def __getattr__(self, name: str) -> Any:
        # The reader's own methods (position, seek, empty_batch, world_size, ...) pass through.
        if name == "data":
            raise AttributeError(name)
        return getattr(self.data, name)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.data)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                self.wait_s += time.perf_counter() - t0
            self.rows += int(getattr(batch, "size", 0))
            self.batches += 1
            yield batch


def _json_value(v: Any) -> Any:
    """Floats that JSON cannot hold (nan, inf) become None."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _json_ready(v: Any) -> Any:
    """:func:`_json_value` applied through dicts and lists (a memory report nests)."""
    if isinstance(v, dict):
        return {k: _json_ready(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_ready(x) for x in v]
    return _json_value(v)


class RunLog(Callback):
    """Write training progress to ``out_dir/runlog.jsonl`` (and TensorBoard when installed).

    Args:
        out_dir: the directory (created if needed); the file is appended to, so
            several ``fit`` calls (days) make one log. A URI (``s3://...``)
            works too: the records are then uploaded at the end of each epoch
            and of training (the object is read and written back whole), and
            no TensorBoard events are written.
        every: write a step record every this many steps (0: epoch records only).
        tensorboard: also write TensorBoard events when the package is installed.
        filename: the JSON-lines file's name.

    Example:
        >>> import tempfile
        >>> import tnrec as tn
        >>> from tnrec.data.synthetic import SyntheticConfig, generate
        >>> from tnrec.models import LR
        >>> data = generate(tempfile.mkdtemp(), SyntheticConfig(rows_per_day=200, num_days=1))
        >>> cols = tn.data.criteo_columns()
        >>> reader = tn.data.read_parquet(data.train_files["2024-05-10"], cols, batch_size=50)
        >>> model = LR(cols)
        >>> model.compile()
        >>> log = RunLog(tempfile.mkdtemp(), every=2)
        >>> _ = model.fit(log.wrap(reader), callbacks=[log], verbose=0)
        >>> [(r["event"], r.get("step")) for r in read_runlog(log.out_dir)]
        [('step', 2), ('step', 4), ('memory', 4), ('epoch', None)]
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        every: int = 10,
        tensorboard: bool = True,
        filename: str = RUNLOG_FILE,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ArgumentError(f"RunLog: `every` must be an int >= 0. Received: every={every!r}.")
        self.out_dir = os.fspath(out_dir)
        self.path = os.path.join(self.out_dir, filename)
        self._remote = _fileio.is_remote(self.out_dir)
        self._pending: list[str] = []  # a remote log's records not uploaded yet
        self.every = every
        self.want_tensorboard = tensorboard
        self.data: TimedData | None = None
        self.global_step = 0
        self._file: IO[str] | None = None
        self._open = False  # a remote log between on_train_begin and on_train_end
        self._writer: Any = None
        self._epoch = 0
        self._mark: tuple[float, int, float] = (
            0.0,
            0,
            0.0,
        )  # (time, rows, wait) of the last record
        self._epoch_mark: tuple[float, int, float, int] = (0.0, 0, 0.0, 0)
        self._rows = 0  # rows of the steps taken (all epochs): the steps', not the read-ahead's

    def wrap(self, data: Iterable[Any]) -> TimedData:
        """Return ``data`` wrapped so this log sees its rows and input waits; pass it to ``fit``."""
        self.data = data if isinstance(data, TimedData) else TimedData(data)
        return self.data

    # ------------------------------------------------------------------ output

    def _now(self) -> tuple[float, int, float]:
        return (time.perf_counter(), self._rows, self._input_wait_s())

    def _input_wait_s(self) -> float:
        """Seconds the steps waited for input so far.

        A pipelined ``fit`` reads in its input thread, so the wrapped data's
        ``next`` times that thread's reads; the steps' wait is the pipeline's.
        """
        seconds = getattr(self.model, "input_seconds", None)
        if getattr(self.model, "fit_pipelined", False) and seconds is not None:
            return float(seconds["wait"])
        return self.data.wait_s if self.data is not None else 0.0

    def write(self, record: dict[str, Any], scalars: dict[str, float] | None = None) -> None:
        """Append one record to the file (and its scalars to TensorBoard).

        Args:
            record: a JSON-ready dict with an ``"event"``.
            scalars: the TensorBoard scalars by tag; default: every number at the
                record's top level, tagged ``<event>/<key>``.
        """
        line = json.dumps(_json_ready(record)) + "\n"
        if self._remote and self._open:
            self._pending.append(line)
        elif self._file is None:
            raise ArgumentError("RunLog.write: the log is not open (fit opens it).")
        else:
            self._file.write(line)
            self._file.flush()
        if self._writer is not None:
            if scalars is None:
                prefix = record["event"]
                scalars = {
                    f"{prefix}/{k}": v
                    for k, v in record.items()
                    if k not in ("event", "epoch", "step", "global_step")
                    and isinstance(v, (int, float))
                }
            for tag, v in scalars.items():
                self._writer.add_scalar(tag, v, self.global_step)

    def _upload(self) -> None:
        """Append a remote log's pending records to its object (read and written back whole)."""
        if self._pending:
            _fileio.append_text(self.path, "".join(self._pending))
            self._pending = []

    def _open_tensorboard(self) -> None:
        if not self.want_tensorboard or self._remote:  # event files are written locally only
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            return
        self._writer = SummaryWriter(log_dir=self.out_dir)

    # ------------------------------------------------------------------ hooks

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        if self._remote:
            self._open = True
            self._open_tensorboard()
            return
        os.makedirs(self.out_dir, exist_ok=True)
        try:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed at train end
        except OSError as e:
            raise OSError(f"RunLog: cannot open {self.path}: {e}") from e
        self._open_tensorboard()

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self._epoch = epoch
        now = self._now()
        self._mark = now
        self._epoch_mark = (*now, self.global_step)

    def on_train_batch_end(self, step: int, logs: dict[str, float] | None = None) -> None:
        self.global_step += 1
        self._rows += int((logs or {}).get("batch_size", 0))
        if not self.every or step % self.every:
            return
        t, rows, wait = self._now()
        t0, rows0, wait0 = self._mark
        self._mark = (t, rows, wait)
        secs = max(t - t0, 1e-9)
        record: dict[str, Any] = {
            "event": "step",
            "epoch": self._epoch,
            "step": step,
            "global_step": self.global_step,
            **(logs or {}),
            "time_s": round(t - self._epoch_mark[0], 4),
        }
        if self.data is not None:
            record.update(
                rows=rows - self._epoch_mark[1],
                samples_per_s=(rows - rows0) / secs,
                input_wait_s=wait - wait0,
            )
        self.write(record)

    def on_memory_report(self, step: int, report: dict[str, Any]) -> None:
        """Write a ``memory`` record (the report) and its ``memory/...`` TensorBoard scalars."""
        record = {
            "event": "memory",
            "epoch": self._epoch,
            "step": step,
            "global_step": self.global_step,
            **report,
        }
        self.write(record, scalars=memory_scalars(report))

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        t, rows, wait = self._now()
        t0, rows0, wait0, step0 = self._epoch_mark
        secs = max(t - t0, 1e-9)
        record: dict[str, Any] = {
            "event": "epoch",
            "epoch": epoch,
            "steps": self.global_step - step0,
            "time_s": round(secs, 4),
        }
        if self.data is not None:
            record.update(
                rows=rows - rows0,
                samples_per_s=(rows - rows0) / secs,
                input_wait_s=wait - wait0,
                input_wait_share=(wait - wait0) / secs,
            )
        record.update(logs or {})
        self.write(record)
        self._upload()

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        if self._remote:
            self._upload()
            self._open = False
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_runlog(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Return the records of a run log (a ``runlog.jsonl`` file or the directory holding it)."""
    p = os.fspath(path)
    if _fileio.is_dir(p):
        p = os.path.join(p, RUNLOG_FILE)
    text = _fileio.read_bytes(p).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
