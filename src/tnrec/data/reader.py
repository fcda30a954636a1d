"""The reader: units → raw chunks → hashed windows → (shuffled) batches, with positions.

One epoch of one worker is a deterministic stream::

    units (files / row groups / byte ranges of this worker; order shuffled per epoch)
      └─ raw chunks (pyarrow) ─ decode + hash ─ good rows only (bad rows raise or are skipped)
          └─ windows of `window_rows` rows, each permuted by rng(seed, epoch, window)
              └─ batches of `batch_size` rows (the last one may be shorter)

A window is "the next `window_rows` good rows from coordinate (unit, row)", so
a position ``(epoch, window, unit, row, offset)`` resumes exactly: read the
window again from its coordinate, permute it the same way, drop ``offset`` rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from tnrec import _fileio
from tnrec.data.batch import Batch
from tnrec.data.decode import Schema, decode
from tnrec.data.files import Unit, check_split, split_units
from tnrec.data.handoff import put_unless_stopped
from tnrec.data.sources import ROW_BITS, ParquetSource, Source
from tnrec.errors import ArgumentError, DataError

POSITION_VERSION = 1

#: Batches a reader built with ``prefetch=None`` (the default) reads ahead in its thread
#: when a core is free for it (:func:`prefetch_depth`).
PREFETCH_BATCHES = 2


def prefetch_depth(prefetch: int | None) -> int:
    """The batches an iteration reads ahead in a background thread (0: inline).

    An int is taken as it is. ``None`` gives :data:`PREFETCH_BATCHES` when this
    worker's CPUs hold more threads than torch's
    (:func:`tnrec.table.threads.core_beside_torch`), and 0 when torch's threads
    take every core: there a reading thread beside them slowed the micro model's
    step through ``fit`` by more than reading inline cost it (docs/performance.md,
    What the reader costs a step through ``fit``).
    """
    if prefetch is not None:
        return prefetch
    from tnrec.table.threads import core_beside_torch

    return PREFETCH_BATCHES if core_beside_torch() else 0


@dataclass
class ReaderStats:
    """What a reader did, counted over the batches the consumer took.

    Attributes:
        rows: rows yielded.
        batches: batches yielded.
        bad_rows: rows skipped with ``on_bad_row="skip"``.
        missing: per column, rows where the value was missing (empty bag, or
            the numeric default used).
        input_wait_s: seconds the consumer waited for the next batch (with
            prefetch, only the time the background thread was behind).
    """

    rows: int = 0
    batches: int = 0
    bad_rows: int = 0
    missing: dict[str, int] = field(default_factory=dict)
    input_wait_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Return the stats as a JSON-ready dict."""
        return {
            "rows": self.rows,
            "batches": self.batches,
            "bad_rows": self.bad_rows,
            "missing": dict(self.missing),
            "input_wait_s": self.input_wait_s,
        }


@dataclass(frozen=True)
class _Pos:
    epoch: int = 0
    window: int = 0
    unit: int = 0  # index into the epoch's unit order
    row: int = 0  # row of that unit where the window starts
    offset: int = 0  # rows of the (permuted) window already taken


@dataclass
class _Window:
    index: int
    start: tuple[int, int]
    batch: Batch
    next_start: tuple[int, int]
    bad_rows: int
    missing: Counter[str]


@dataclass
class _Item:
    batch: Batch | None  # None: end of the epoch (stats only)
    pos: _Pos
    bad_rows: int
    missing: Counter[str]


_END = object()


class _Prefetcher:
    """Runs a generator in a daemon thread, ``depth`` items ahead."""

    def __init__(self, gen: Iterator[_Item], depth: int) -> None:
        self._gen = gen
        self._q: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tnrec-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        return put_unless_stopped(self._q, item, self._stop, 0.05)

    def _run(self) -> None:
        try:
            for item in self._gen:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(e)
        finally:
            close = getattr(self._gen, "close", None)
            if close is not None:
                close()

    def get(self) -> object:
        item = self._q.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=30)


class Reader:
    r"""Reads hashed batches from files, resumably, split across workers.

    Build one with :func:`read_parquet`, :func:`read_csv`, :func:`read_criteo` or
    :func:`read_tfrecord`.
    Iterating yields one epoch from the current position; the next iteration
    starts the next epoch (reshuffled when ``shuffle=True``).

    Example:
        >>> import os, tempfile
        >>> from tnrec.data import read_criteo
        >>> path = os.path.join(tempfile.mkdtemp(), "day_0.tsv")
        >>> row = "\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26)  # label, I1..I13, C1..C26
        >>> with open(path, "w") as f:
        ...     _ = f.write((row + "\n") * 10)
        >>> reader = read_criteo(path, batch_size=4, shuffle=True, seed=1)
        >>> part = reader.split(0, 1)        # rank, world_size
        >>> for batch in part:
        ...     # train(batch)
        ...     state = part.position()      # JSON-ready; save it with a checkpoint
        ...     break                        # the job stops here
        >>> part.seek(state)                 # a restarted job resumes after that batch
        >>> [batch.size for batch in part]
        [4, 2]
    """

    def __init__(
        self,
        files: Sequence[str],
        source: Source,
        schema: Schema,
        *,
        batch_size: int = 1024,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_buffer_rows: int = 65536,
        prefetch: int | None = None,
        on_bad_row: Literal["raise", "skip"] = "raise",
        drop_last: bool = False,
        value_sep: str | None = None,
    ) -> None:
        for name, value, lo in (
            ("batch_size", batch_size, 1),
            ("shuffle_buffer_rows", shuffle_buffer_rows, 1),
            ("prefetch", 0 if prefetch is None else prefetch, 0),
            ("seed", seed, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
                also = " or None" if name == "prefetch" else ""
                raise ArgumentError(
                    f"Reader: `{name}` must be an int >= {lo}{also}. Received: {name}={value!r}."
                )
        if on_bad_row not in ("raise", "skip"):
            raise ArgumentError(
                'Reader: `on_bad_row` must be "raise" or "skip". '
                f"Received: on_bad_row={on_bad_row!r}."
            )
        self._files = list(files)
        self._source = source
        self.schema = schema
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.prefetch = None if prefetch is None else int(prefetch)
        self.on_bad_row = on_bad_row
        self.drop_last = bool(drop_last)
        self.value_sep = value_sep
        self._window_rows = int(shuffle_buffer_rows) if shuffle else max(self.batch_size, 16384)
        self.rank, self.world_size = 0, 1
        self._units = [Unit(i, p) for i, p in enumerate(self._files)]
        self._pos = _Pos()
        self._active: _Prefetcher | None = None
        self._gen: Iterator[Batch] | None = None
        self.stats = ReaderStats()
        self._salt: tuple[int, ...] = ()  # extra seed of the row shuffle (a unit's own stream)
        self._fingerprint = self._make_fingerprint()

    # ------------------------------------------------------------------ public

    @property
    def files(self) -> list[str]:
        """All input files of the reader (before any split)."""
        return list(self._files)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._pos.epoch

    def split(self, rank: int, world_size: int) -> Reader:
        """Return the part of worker ``rank`` among ``world_size``.

        Parts are disjoint and cover every row once: files go round-robin; with
        fewer files than workers, Parquet row groups, text byte ranges
        (aligned to line starts) or TFRecord record strides do. A part may be empty.

        Raises:
            ArgumentError: ``rank``/``world_size`` are invalid, or this reader is
                already a part.
        """
        rank, world_size = check_split(rank, world_size)
        if self.world_size != 1:
            raise ArgumentError(
                f"Reader.split: this reader is already part {self.rank} of {self.world_size}; "
                "split the full reader."
            )
        part = Reader.__new__(Reader)
        part.__dict__.update(self.__dict__)
        part.rank, part.world_size = rank, world_size
        info: dict[str, Any] = {}
        if len(self._files) < world_size:
            info = self._source.split_info(self._files)
        kinds: dict[str, Literal["parquet", "text", "records"]] = {
            "parquet": "parquet",
            "tfrecord": "records",
        }
        part._units = split_units(
            self._files,
            kinds.get(self._source.kind, "text"),
            rank,
            world_size,
            row_group_counts=info.get("row_group_counts"),
            data_bounds=info.get("data_bounds"),
        )
        part._pos = _Pos()
        part._active = None
        part._gen = None
        part.stats = ReaderStats()
        part._fingerprint = part._make_fingerprint()
        return part

    def balance_units(self, min_rows: int = 1) -> list[Unit]:
        """Return the units a balanced ``fit`` hands out, in file order.

        Parquet: runs of consecutive row groups of one file, each of at least
        ``min_rows`` rows (a file's last run may hold fewer; row groups without
        rows are left out); text and TFRecord: one unit per file.

        Raises:
            ArgumentError: this reader is already a part of a split.
        """
        if self.world_size != 1:
            raise ArgumentError(
                f"Reader.balance_units: this reader is part {self.rank} of {self.world_size}; "
                "balance the full reader."
            )
        if not isinstance(self._source, ParquetSource):
            return list(self._units)
        units = []
        for i, sizes in enumerate(self._source.row_group_rows(self._files)):
            run: list[int] = []
            rows = 0
            for g, n in enumerate(sizes):
                if n:
                    run.append(g)
                    rows += n
                if run and (rows >= min_rows or g == len(sizes) - 1):
                    units.append(Unit(i, self._files[i], row_groups=tuple(run)))
                    run, rows = [], 0
        return units

    def unit_reader(self, unit: Unit, epoch: int, stream: int) -> Reader:
        """Return a reader of ``unit`` alone, at the start of ``epoch``.

        Its windows are shuffled (with ``shuffle=True``) by ``rng(seed, epoch,
        window, stream)``, so units read in one epoch get different permutations.
        It shares this reader's :attr:`stats`.
        """
        part = Reader.__new__(Reader)
        part.__dict__.update(self.__dict__)
        part._units = [unit]
        part._salt = (int(stream),)
        part._pos = _Pos(epoch=int(epoch))
        part._active = None
        part._gen = None
        part._fingerprint = part._make_fingerprint()
        return part

    def position(self) -> dict[str, Any]:
        """Return where the next batch starts (after the last batch taken), JSON-ready."""
        p = self._pos
        return {
            "format_version": POSITION_VERSION,
            "fingerprint": self._fingerprint,
            "epoch": p.epoch,
            "window": p.window,
            "unit": p.unit,
            "row": p.row,
            "offset": p.offset,
        }

    def seek(self, position: dict[str, Any]) -> None:
        """Continue from a :meth:`position` of a reader over the same input and settings.

        Raises:
            ArgumentError: ``position`` is malformed, of another version, or from
                a reader with other files, split, shuffle, seed or buffer size.
        """
        if not isinstance(position, dict):
            raise ArgumentError(f"Reader.seek: `position` must be a dict. Received: {position!r}.")
        version = position.get("format_version", position.get("version"))  # the older key
        if version != POSITION_VERSION:
            raise ArgumentError(
                f"Reader.seek: unsupported position format_version {version!r}; "
                f"this tnrec reads format version {POSITION_VERSION}."
            )
        if position.get("fingerprint") != self._fingerprint:
            raise ArgumentError(
                "Reader.seek: the position was taken on a reader with other input files, "
                "split, shuffle, seed, buffer size or on_bad_row; it cannot resume this one."
            )
        values = {}
        for k in ("epoch", "window", "unit", "row", "offset"):
            v = position.get(k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ArgumentError(
                    f"Reader.seek: `position[{k!r}]` must be an int >= 0. Received: {v!r}."
                )
            values[k] = v
        self.close()
        self._pos = _Pos(**values)

    def close(self) -> None:
        """Stop the prefetch thread of an unfinished iteration (position kept)."""
        if self._gen is not None:
            gen, self._gen = self._gen, None
            close = getattr(gen, "close", None)
            if close is not None:
                close()
        if self._active is not None:
            self._active.close()
            self._active = None

    def empty_batch(self) -> Batch:
        """Return a batch with no rows and this reader's columns."""
        return self.schema.empty_batch()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Batch]:
        self.close()
        gen = self._consume()
        self._gen = gen
        return gen

    # ------------------------------------------------------------------ internals

    def _make_fingerprint(self) -> str:
        doc = {
            "files": [[os.path.basename(p), _size(p)] for p in self._files],
            "units": [u.describe() for u in self._units],
            "shuffle": self.shuffle,
            "seed": self.seed,
            "window_rows": self._window_rows,
            "on_bad_row": self.on_bad_row,
        }
        if self._salt:
            doc["stream"] = list(self._salt)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def _consume(self) -> Iterator[Batch]:
        start = self._pos
        items = self._produce(start)
        depth = prefetch_depth(self.prefetch)
        pf = _Prefetcher(items, depth) if depth > 0 else None
        self._active = pf
        try:
            while True:
                t0 = time.perf_counter()
                item: object = pf.get() if pf is not None else next(items, _END)
                self.stats.input_wait_s += time.perf_counter() - t0
                if item is _END:
                    break
                if not isinstance(item, _Item):
                    raise RuntimeError("internal error: unexpected prefetch item")
                self.stats.bad_rows += item.bad_rows
                for k, v in item.missing.items():
                    self.stats.missing[k] = self.stats.missing.get(k, 0) + v
                if item.batch is None:
                    continue
                self._pos = item.pos
                self.stats.rows += item.batch.size
                self.stats.batches += 1
                yield item.batch
            self._pos = _Pos(epoch=start.epoch + 1)
        finally:
            if pf is not None:
                pf.close()
            if self._active is pf:
                self._active = None

    def _unit_order(self, epoch: int) -> list[Unit]:
        if not self.shuffle:
            return list(self._units)
        perm = np.random.default_rng([self.seed, epoch, 0]).permutation(len(self._units))
        return [self._units[i] for i in perm]

    def _produce(self, start: _Pos) -> Iterator[_Item]:
        """Yield the epoch's batches from ``start``, each with the position after it."""
        epoch = start.epoch
        parts: list[Batch] = []
        have = 0
        bad, missing = 0, Counter[str]()
        skip = start.offset
        last: _Window | None = None
        for win in self._windows(epoch, start):
            last = win
            bad += win.bad_rows
            missing.update(win.missing)
            b = win.batch
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch, 1, win.index, *self._salt])
                b = b.take(rng.permutation(b.size))
            at, skip = skip, 0
            while at < b.size:
                take = min(self.batch_size - have, b.size - at)
                parts.append(b.slice(at, at + take))
                have += take
                at += take
                if have == self.batch_size:
                    if at < b.size:
                        pos = _Pos(epoch, win.index, win.start[0], win.start[1], at)
                    else:
                        pos = _Pos(epoch, win.index + 1, win.next_start[0], win.next_start[1], 0)
                    yield _Item(Batch.concat(parts), pos, bad, missing)
                    parts, have, bad, missing = [], 0, 0, Counter()
        end = _Pos(epoch, start.window, start.unit, start.row, start.offset)
        if last is not None:
            end = _Pos(epoch, last.index + 1, last.next_start[0], last.next_start[1], 0)
        if parts and not self.drop_last:
            yield _Item(Batch.concat(parts), end, bad, missing)
        elif bad or missing:
            yield _Item(None, end, bad, missing)

    def _windows(self, epoch: int, start: _Pos) -> Iterator[_Window]:
        """Yield consecutive windows of good rows, the first at ``start``'s coordinate."""
        order = self._unit_order(epoch)
        fields = self.schema.fields
        pieces: list[tuple[int, np.ndarray, Batch]] = []  # (unit pos, unit rows [n], rows)
        have = 0
        index = start.window
        bad, missing = 0, Counter[str]()
        for upos in range(start.unit, len(order)):
            unit = order[upos]
            first = start.row if upos == start.unit else 0
            where = f'file "{unit.path}": '
            for chunk in self._source.read(unit, first, fields):
                ids = (np.int64(unit.file_index) << ROW_BITS) | chunk.file_rows  # [B]
                d = decode(self.schema, chunk.table, ids, value_sep=self.value_sep, where=where)
                missing.update(d.missing)
                problems = [(r, w) for r, w in chunk.dropped]
                if d.first_bad is not None:
                    problems.append((int(chunk.file_rows[d.first_bad[0]]), d.first_bad[1]))
                if problems and self.on_bad_row == "raise":
                    row, what = min(problems)
                    raise DataError(f"{self._source.locate(unit, row)}: {what}.")
                batch, rows = d.batch, chunk.rows
                bad += len(chunk.dropped)
                if d.bad is not None:
                    keep = np.flatnonzero(~d.bad)
                    bad += int(d.bad.size - keep.size)
                    batch, rows = batch.take(keep), rows[keep]
                if batch.size:
                    pieces.append((upos, rows, batch))
                    have += batch.size
                while have >= self._window_rows:
                    yield self._cut(
                        index, pieces, self._window_rows, (upos, chunk.end_row), bad, missing
                    )
                    index += 1
                    have -= self._window_rows
                    bad, missing = 0, Counter()
        if have:
            yield self._cut(index, pieces, have, (len(order), 0), bad, missing)
        elif bad or missing:
            empty = self.schema.empty_batch()
            yield _Window(index, (len(order), 0), empty, (len(order), 0), bad, missing)

    @staticmethod
    def _cut(
        index: int,
        pieces: list[tuple[int, np.ndarray, Batch]],
        n: int,
        after: tuple[int, int],
        bad: int,
        missing: Counter[str],
    ) -> _Window:
        """Take the first ``n`` rows of ``pieces`` (in place) as window ``index``."""
        start = (pieces[0][0], int(pieces[0][1][0]))
        taken: list[Batch] = []
        need = n
        while need:
            upos, rows, batch = pieces[0]
            if batch.size <= need:
                taken.append(batch)
                need -= batch.size
                pieces.pop(0)
            else:
                taken.append(batch.slice(0, need))
                pieces[0] = (upos, rows[need:], batch.slice(need, batch.size))
                need = 0
        next_start = (pieces[0][0], int(pieces[0][1][0])) if pieces else after
        return _Window(index, start, Batch.concat(taken), next_start, bad, missing)


def _size(path: str) -> int:
    try:
        return _fileio.size(path)
    except OSError:
        return -1
