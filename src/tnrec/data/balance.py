"""Balanced epochs: the units of one reader handed out from a shared queue (TensorNet's
``BalanceDataset``), so a worker that finishes its units takes more.

Every worker holds the same queue, the epoch's units in order (shuffled per
epoch with ``shuffle=True``); nothing but a per-step flag crosses workers::

    step t, every worker:  batch = next batch of its unit (None: no unit, or it ran out)
                           had   = all-reduce of the [W] vector  e_rank * (batch is not None)
                           ranks r with had[r] == 0 take the next queue units, in rank order
                           (the same on every worker: the same flags, the same queue)
                           a rank given a unit takes its first batch now, for this step
    the epoch ends when no worker had a batch and the queue is empty

Each unit is read as a stream of its own: its rows are shuffled in windows
inside the unit, and its last batch may be shorter than ``batch_size`` (a batch
never spans two units, so a worker needs the next unit only when it has no
batch). Units are runs of Parquet row groups of at least :data:`UNIT_BATCHES`
batches' rows (so the short last batches cost at most about 1 step in 8), or
whole files for text and TFRecord (:meth:`tnrec.data.Reader.balance_units`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from tnrec.data.batch import Batch
from tnrec.data.files import Unit, check_split
from tnrec.data.reader import POSITION_VERSION, Reader, ReaderStats
from tnrec.errors import ArgumentError

UNIT_BATCHES = 8  # a Parquet unit holds row groups of at least this many batches' rows
AllReduce = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]


def assign_units(had: Sequence[bool], next_unit: int, num_units: int) -> tuple[dict[int, int], int]:
    """Give the next queue units to the ranks without a batch, in rank order.

    Args:
        had: per rank (``[W]``), whether it had a batch this step.
        next_unit: the queue position of the next unassigned unit.
        num_units: the queue's length.

    Returns:
        ``({rank: queue position}, next_unit after)``; ranks without a batch
        beyond the queue's end get nothing.

    Example:
        >>> assign_units([True, False, False], 4, 5)   # ranks 1, 2 ran dry; unit 4 is last
        ({1: 4}, 5)
    """
    given: dict[int, int] = {}
    for rank, has in enumerate(had):
        if not has and next_unit < num_units:
            given[rank] = next_unit
            next_unit += 1
    return given, next_unit


class BalancedReader:
    """One worker's side of a balanced epoch over a whole reader (``fit(balance=True)``).

    Iterating it is not how its batches are taken: ``fit`` calls
    :meth:`next_step` once per step with the step's all-reduce. Every row is
    read once per epoch, by whichever worker took its unit.

    :meth:`position` records the epoch, the queue (the next unassigned unit
    and each rank's current unit) and how far this worker is in its unit; on
    every worker the queue part is the same at a given step, so a job whose
    workers all :meth:`seek` to positions saved at one step resumes exactly.

    Args:
        reader: the whole reader (not split); ``drop_last`` must be False.
        rank: this worker.
        world_size: the number of workers W.

    Raises:
        ArgumentError: ``reader`` is not a whole tnrec reader, drops its last
            batch, or ``rank``/``world_size`` are invalid.

    Example:
        >>> # part = model.worker_part(tn.data.read_parquet(files, cols), balance=True)
        >>> # part.seek(position); model.fit(part, balance=True)   # an exact resume
    """

    def __init__(self, reader: Reader, rank: int, world_size: int) -> None:
        if not isinstance(reader, Reader):
            raise ArgumentError(
                "BalancedReader: `reader` must be a tnrec reader (read_parquet, read_csv, "
                f"read_criteo, read_tfrecord). Received: {type(reader).__name__}."
            )
        if reader.drop_last:
            raise ArgumentError(
                "BalancedReader: the reader has drop_last=True; a balanced epoch reads each unit "
                "on its own, so the last batch of every unit would be dropped. Use "
                "drop_last=False."
            )
        self.rank, self.world_size = check_split(rank, world_size)
        # raises for a part of a split
        self.units: list[Unit] = reader.balance_units(UNIT_BATCHES * reader.batch_size)
        self.reader = reader
        self.stats: ReaderStats = reader.stats
        doc = {"reader": reader.position()["fingerprint"], "units": len(self.units)}
        self._fingerprint = hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]
        self._stream: Reader | None = None
        self._it: Iterator[Batch] | None = None
        self._done = True  # this worker's unit has no batch left (or it has none)
        self._epoch = 0
        self._order: list[int] = []  # the epoch's queue: indexes into ``units``
        self._current: list[int] = []  # [W] each rank's queue position (-1: none)
        self._next = 0  # queue position of the next unassigned unit
        self._start_epoch(0)

    # ------------------------------------------------------------------ public

    def next_step(self, all_reduce_sum: AllReduce) -> Batch | None:
        """Return this worker's batch of the next step (maybe empty), or None: the epoch ended.

        Every worker calls it once per step, with the same all-reduce: one
        all-reduce of a ``[W]`` vector, two when every worker ran dry at once
        (they all take a unit, then ask again).
        """
        batch = self._take()
        while True:
            flags = np.zeros(self.world_size, np.float64)  # [W]
            flags[self.rank] = batch is not None
            had = all_reduce_sum(flags) > 0  # [W]
            given, self._next = assign_units(had.tolist(), self._next, len(self._order))
            for r in range(self.world_size):
                if not had[r]:
                    self._current[r] = given.get(r, -1)
            if not had[self.rank]:
                self._open(self._current[self.rank])
                batch = self._take()
            if had.any():
                return batch if batch is not None else self.reader.empty_batch()
            if not given:  # nobody had a batch and the queue is empty
                self._start_epoch(self.epoch + 1)
                return None

    def position(self) -> dict[str, Any]:
        """Return this worker's place in the balanced epoch, JSON-ready."""
        stream = self._stream
        return {
            "format_version": POSITION_VERSION,
            "balanced": True,
            "fingerprint": self._fingerprint,
            "world_size": self.world_size,
            "rank": self.rank,
            "epoch": self.epoch,
            "next": self._next,
            "units": list(self._current),
            "unit_done": self._done,
            "in_unit": None if self._done or stream is None else stream.position(),
        }

    def seek(self, position: dict[str, Any]) -> None:
        """Continue from a :meth:`position` saved by this rank with as many workers.

        Raises:
            ArgumentError: ``position`` is malformed, not a balanced position,
                from another number of workers or another rank, or from a
                reader with other input files or settings.
        """
        if not isinstance(position, dict) or not position.get("balanced"):
            raise ArgumentError(
                "BalancedReader.seek: `position` must be a dict from BalancedReader.position(). "
                f"Received: {position!r}."
            )
        if position.get("format_version") != POSITION_VERSION:
            raise ArgumentError(
                "BalancedReader.seek: unsupported position format_version "
                f"{position.get('format_version')!r}; this tnrec reads {POSITION_VERSION}."
            )
        saved_w = position.get("world_size")
        if saved_w != self.world_size:
            raise ArgumentError(
                f"BalancedReader.seek: the position was saved by a job of {saved_w} workers; "
                f"this job has {self.world_size}. The units in progress on the other workers "
                "are not recorded here, so it cannot be resumed exactly: resume with "
                f"{saved_w} workers, or start the epoch over (no seek)."
            )
        if position.get("rank") != self.rank:
            raise ArgumentError(
                f"BalancedReader.seek: the position is rank {position.get('rank')!r}'s; this "
                f"is rank {self.rank}. Every worker seeks to its own position."
            )
        if position.get("fingerprint") != self._fingerprint:
            raise ArgumentError(
                "BalancedReader.seek: the position was taken on a reader with other input "
                "files, units, shuffle, seed, buffer size or on_bad_row; it cannot resume this one."
            )
        epoch, nxt, units = position.get("epoch"), position.get("next"), position.get("units")
        n = len(self.units)
        if (
            not _is_int(epoch, 0)
            or not _is_int(nxt, 0, n)
            or not isinstance(units, list)
            or len(units) != self.world_size
            or not all(_is_int(u, -1, n - 1) for u in units)
        ):
            raise ArgumentError(
                "BalancedReader.seek: `position` has a malformed epoch, next or units. "
                f"Received: epoch={epoch!r}, next={nxt!r}, units={units!r}."
            )
        self._start_epoch(cast(int, epoch))
        self._next = cast(int, nxt)
        self._current = [int(u) for u in units]
        self._open(self._current[self.rank])
        in_unit = position.get("in_unit")
        if position.get("unit_done") or self._stream is None:
            self._done = True
        elif isinstance(in_unit, dict):
            self._stream.seek(in_unit)
        else:
            raise ArgumentError(
                f"BalancedReader.seek: `position['in_unit']` must be a dict. Received: {in_unit!r}."
            )

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._epoch

    def empty_batch(self) -> Batch:
        """Return a batch with no rows and the reader's columns."""
        return self.reader.empty_batch()

    def close(self) -> None:
        """Stop the read-ahead thread of this worker's unit (position kept)."""
        if self._stream is not None:
            self._stream.close()

    def __iter__(self) -> Iterator[Batch]:
        raise ArgumentError(
            "BalancedReader: its batches are taken by fit(data, balance=True), one step at a "
            "time on every worker; evaluate and predict take the reader itself."
        )

    # ------------------------------------------------------------------ internals

    def _start_epoch(self, epoch: int) -> None:
        """Set up ``epoch``'s queue; units 0..W-1 go to ranks 0..W-1 (no message needed)."""
        self._epoch = epoch
        n = len(self.units)
        order = np.arange(n)
        if self.reader.shuffle:
            order = np.random.default_rng([self.reader.seed, epoch, 0]).permutation(n)
        self._order = [int(i) for i in order]
        self._current = [r if r < n else -1 for r in range(self.world_size)]
        self._next = min(self.world_size, n)
        self._open(self._current[self.rank])

    def _open(self, queue_pos: int) -> None:
        """Make the unit at ``queue_pos`` (-1: none) this worker's, from its start."""
        self.close()
        self._it = None
        if queue_pos < 0:
            self._stream, self._done = None, True
            return
        index = self._order[queue_pos]
        self._stream = self.reader.unit_reader(self.units[index], self._epoch, index)
        self._done = False

    def _take(self) -> Batch | None:
        """Return the next batch of this worker's unit, or None when it has none left."""
        if self._done or self._stream is None:
            return None
        if self._it is None:
            self._it = iter(self._stream)
        batch = next(self._it, None)
        if batch is None:
            self._done = True
            self._it = None
            self._stream.close()
        return batch


def _is_int(v: object, lo: int, hi: int | None = None) -> bool:
    if isinstance(v, bool) or not isinstance(v, int):
        return False
    return v >= lo and (hi is None or v <= hi)
