"""The input pipeline of ``fit``: the next batch is read and prepared while the step computes.

One background thread, one batch ahead::

    main thread    take 1 │ step 1 ........ │ take 2 │ step 2 ........ │ take 3 ...
    input thread   read 1, prepare 1 │ read 2, prepare 2 │ (idle) │ read 3, prepare 3 │ ...
                          ▲ asked for 2 here            ▲ asked for 3 here

The thread reads batch ``i + 1`` from the worker's iterator (the reader's own
prefetch, when it has one, keeps decoding and hashing further ahead) and
prepares it (:func:`tnrec.prepare.prepare_batch`: bag layouts and
de-duplication; :func:`tnrec.prepare.prepare_ahead`: the layers' one-key
bags, the keys' show and click; no table state) only once the consumer
asked for it, which ``fit`` does when step ``i`` starts, after that step's
"is there more data" all-reduce. So the thread never reads a batch the
unpipelined loop would not have read (``steps_per_epoch`` is honoured
exactly), and it never runs more than one batch ahead. Everything that
reads table state -- the row pull -- stays in the step, after step ``i``'s
push: results are bit-identical to the unpipelined loop.

On W > 1 workers the thread also routes the prepared keys to their owners
(:meth:`tnrec.ps.ShardedPS.route`: the all_to_all of key counts and of keys,
and the owners' de-duplication) on a gloo process group of its own, so its
collectives never interleave with the step's on the default group; the
step's pull is left with the owners' row gather and the all_to_all of the
rows. Every worker's thread routes once per step, in step order -- also a
worker whose input ran out (no keys) -- because it is asked for the next
batch at the same step on every worker.

Errors: an exception reading a batch is raised by :meth:`InputPipeline.take`
at the step that batch belongs to, with its own message; an exception
preparing it is raised by that step's pull (as the inline pull would). After
an error the thread stops.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tnrec.data import Batch
from tnrec.data.handoff import put_unless_stopped
from tnrec.layers import EmbeddingFeatures
from tnrec.prepare import PreparedBatch, Router, empty_prepared, prepare_batch

CLOSE_TIMEOUT_S = 60.0  # the longest close() waits for a read in progress to return
_POLL_S = 0.05

#: The trainable dense values from which ``fit`` runs its input pipeline when it is not told
#: (``pipeline=None``; see :func:`pipeline_by_default`). Below it the steps are short and the
#: pipeline did not pay: the micro and Zipf models (33 dense values) trained 0.91-0.99x as fast
#: with it through ``fit`` (docs/performance.md).
PIPELINE_MIN_DENSE = 1 << 18


def pipeline_by_default(
    params: Iterable[torch.Tensor], world_size: int, asynchronous: bool
) -> bool:
    """Whether ``fit(pipeline=None)`` runs the input pipeline: on one synchronous worker
    whose trainable dense parameters ``params`` hold at least :data:`PIPELINE_MIN_DENSE`
    values, however many threads torch uses. It hides the making of batches that are
    made as they are read (DeepFM's steps 1.08-1.10x as fast over 30 steps at 1 torch
    thread in ``bench/dist_bench.py``); over batches already in memory, DeepFM's step through
    ``fit`` took as long with it as without, at 1 and at 2 threads on 2 cores: its
    preparation costs the step about as much in the thread as in the step
    (docs/performance.md).

    Never on W > 1 workers, where every worker must pass ``fit`` the same value and the
    pipeline routes keys on a process group of its own: there it is asked for explicitly.

    Example:
        >>> import torch
        >>> pipeline_by_default([torch.zeros(10)], world_size=1, asynchronous=False)
        False
    """
    if world_size != 1 or asynchronous:
        return False
    return sum(p.numel() for p in params) >= PIPELINE_MIN_DENSE


@dataclass
class _Item:
    """One answer of the input thread."""

    batch: Batch | None  # None: this worker's input is exhausted
    prepared: PreparedBatch | None
    position: dict[str, Any] | None  # the data's position() after the batch (None: none)
    error: BaseException | None = None  # raised reading the batch


class InputPipeline:
    """Read and prepare a worker's next batch in a background thread (one batch ahead).

    ``fit`` makes one per epoch when pipelining is on: :meth:`take` returns
    the batch asked for (None once the input is exhausted), :meth:`request`
    asks for the next one, :meth:`pending` returns what the thread prepared
    (and routed) for the step, and :meth:`close` stops the thread. The data's
    iterator is made in the calling thread, and advanced only by the input
    thread.

    Args:
        part: this worker's data (a tnrec reader or any iterable of batches).
        table_layers: the model's embedding layers by table (what the
            preparation lays out).
        route: called in the input thread with every step's unique keys by
            table, after preparation, also for a worker out of data (no keys):
            a sharded PS's routing (:func:`tnrec.prepare.make_router`); None:
            nothing is routed ahead.
        seconds: the dict :attr:`seconds` adds to (``fit``'s
            ``model.input_seconds``, live); None: a new one.
        ahead: called in the input thread with every prepared batch, after
            preparation, to compute more of its step ahead (``fit``'s: the
            model's, :func:`tnrec.prepare.prepare_ahead`); an exception it
            raises leaves the step to compute that part itself.

    Attributes:
        seconds: time the input thread spent reading (``"read"``), preparing
            (``"prepare"``) and routing (``"route"``), and time the consumer
            waited in :meth:`take` (``"wait"``).
        position: the data's ``position()`` after the last batch taken (the
            data's own position runs one batch ahead while a batch is read);
            None when the data has none.

    Example:
        >>> # pipe = InputPipeline(part, model._table_layers)
        >>> # batch = pipe.take(); pipe.request()   # the next batch is read meanwhile
        >>> # model._prepared = pipe.pending(); model.train_step(batch); pipe.close()
    """

    def __init__(
        self,
        part: Iterable[Batch],
        table_layers: Mapping[str, Sequence[EmbeddingFeatures]],
        route: Router | None = None,
        seconds: dict[str, float] | None = None,
        ahead: Callable[[PreparedBatch], None] | None = None,
    ) -> None:
        self._part = part
        self._table_layers = table_layers
        self._route = route
        self._ahead = ahead
        self._tracks = hasattr(part, "position") and hasattr(part, "seek")
        self.position: dict[str, Any] | None = part.position() if self._tracks else None  # type: ignore[attr-defined]
        self.seconds = seconds if seconds is not None else {}
        for phase in ("read", "prepare", "route", "wait"):
            self.seconds.setdefault(phase, 0.0)
        self._it: Iterator[Batch] = iter(part)  # here: an error in iter() raises in the caller
        self._items: queue.Queue[_Item] = queue.Queue(maxsize=1)
        self._asked = threading.Semaphore(0)
        self._stop = threading.Event()
        self._read = 0  # batches the thread took from the iterator
        self._taken = 0  # batches the consumer took from the thread
        self._asked_n = 0  # batches asked for (request)
        self._answered_n = 0  # answers the thread handed over (batch, end of input or error)
        self._ended = False  # the thread has returned
        self._answers = threading.Condition()
        self._last: _Item | None = None
        self._thread = threading.Thread(target=self._run, name="tnrec-input", daemon=True)
        self._thread.start()
        self.request()  # the first batch

    # ------------------------------------------------------------------ consumer side

    def request(self) -> None:
        """Ask the thread to read and prepare the next batch."""
        with self._answers:
            self._asked_n += 1
        self._asked.release()

    def wait_answered(self, timeout: float | None = None) -> bool:
        """Wait until the thread has answered every batch asked for (read, prepared and
        routed it, or found the input exhausted or an error), without taking the answer.

        A caller that times something beside the steps (a benchmark's own step, run
        between two of ``fit``'s) calls it first, so the input thread's work is not
        done while that runs. Returns whether everything asked for was answered (False:
        ``timeout`` seconds passed, or the thread stopped first).
        """
        with self._answers:
            self._answers.wait_for(
                lambda: self._answered_n >= self._asked_n or self._ended, timeout
            )
            return self._answered_n >= self._asked_n

    def take(self) -> Batch | None:
        """Return the batch asked for last (None: the input is exhausted); wait if needed.

        Raises:
            Any exception reading that batch raised in the thread, as raised.
        """
        start = time.perf_counter()
        item = None
        while item is None:
            try:
                item = self._items.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._items.empty():
                    raise RuntimeError(
                        "internal error: the input thread ended without an answer"
                    ) from None
        self.seconds["wait"] += time.perf_counter() - start
        self._last = item
        if item.error is not None:
            raise item.error
        if item.batch is not None:
            self._taken += 1
            if item.position is not None:
                self.position = item.position
        return item.batch

    def pending(self) -> PreparedBatch | None:
        """Return what the thread prepared (and routed) for the batch taken last.

        For a worker out of data it is the routed empty batch (``batch`` None)
        when routing; :func:`tnrec.prepare.prepared_for_pull` matches it to the
        batch the step pulls.
        """
        item = self._last
        return item.prepared if item is not None else None

    def close(self) -> None:
        """Stop the thread and wait for it; put back a batch it read that no step took.

        A batch read ahead and not trained (an exception ended the epoch) is
        given back by seeking the data to :attr:`position`, so the data's
        position is what the unpipelined loop would leave.
        """
        self._stop.set()
        self._asked.release()  # wake a thread waiting to be asked
        try:  # and one waiting to hand over a batch (put back below by the seek, if read)
            self._items.get_nowait()
        except queue.Empty:
            pass
        self._thread.join(timeout=CLOSE_TIMEOUT_S)
        self._last = None
        if self._thread.is_alive():  # a read that does not return: leave the daemon thread
            return
        if self._read > self._taken and self._tracks and self.position is not None:
            self._part.seek(self.position)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ input thread

    def _run(self) -> None:
        try:
            while self._wait_asked():
                try:
                    item = self._next_item()
                except BaseException as e:  # e.g. the data's position(): raised at the step
                    item = _Item(None, None, None, e)
                if not self._put(item):
                    return
                with self._answers:
                    self._answered_n += 1
                    self._answers.notify_all()
                if item.error is not None:
                    return
        finally:
            with self._answers:
                self._ended = True
                self._answers.notify_all()

    def _next_item(self) -> _Item:
        """Read the next batch and prepare it (an exhausted input answers empty items)."""
        t0 = time.perf_counter()
        try:
            batch = next(self._it, None)
        except BaseException as e:  # handed to the consumer, raised at its step
            return _Item(None, None, None, e)
        t1 = time.perf_counter()
        self.seconds["read"] += t1 - t0
        position = None
        if batch is not None:
            self._read += 1
            position = self._part.position() if self._tracks else None  # type: ignore[attr-defined]
        prepared = None
        if batch is not None:
            try:
                prepared = prepare_batch(self._table_layers, batch)
            except Exception as e:  # raised by the step's pull, where the inline pull raises it
                prepared = PreparedBatch(batch, {}, error=e)
            if self._ahead is not None and prepared.error is None:
                try:
                    self._ahead(prepared)
                except Exception:  # the step computes it itself, and raises there what it raises
                    prepared.shared.clear()
                    prepared.counts = None
        t2 = time.perf_counter()
        self.seconds["prepare"] += t2 - t1
        if self._route is not None:  # every worker routes every step, keys or not
            if prepared is None:
                prepared = empty_prepared(self._table_layers)
            try:
                prepared.route = self._route(prepared.keys())  # no keys when preparing failed
            except BaseException as e:  # handed to the consumer, raised at its step
                return _Item(None, None, None, e)
            self.seconds["route"] += time.perf_counter() - t2
        return _Item(batch, prepared, position)

    def _wait_asked(self) -> bool:
        while not self._stop.is_set():
            if self._asked.acquire(timeout=_POLL_S):
                return not self._stop.is_set()  # close() wakes the thread this way too
        return False

    def _put(self, item: _Item) -> bool:
        return put_unless_stopped(self._items, item, self._stop, _POLL_S)


class PipelinedData:
    """``fit``'s data while pipelined: the worker's part, with the position of the steps.

    While an epoch runs, the input thread has read one batch further than the
    steps took; :meth:`position` answers the position after the last batch a
    step took (what a checkpoint must record), and everything else (``seek``,
    ``empty_batch``, ``stats``, ...) is the part's own.

    Args:
        part: the worker's data; it must have ``position()``.
    """

    def __init__(self, part: Any) -> None:
        self.part = part
        self.pipeline: InputPipeline | None = None

    def __getattr__(self, name: str) -> Any:
        if name in ("part", "pipeline"):
            raise AttributeError(name)
        return getattr(self.part, name)

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.part)

    def position(self) -> Any:
        """Return where the next step's batch starts (after the last batch a step took)."""
        pipe = self.pipeline
        if pipe is not None and pipe.position is not None:
            return dict(pipe.position)
        return self.part.position()
