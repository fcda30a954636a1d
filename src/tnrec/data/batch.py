"""The hashed batch every reader yields (NumPy only; the model converts it to tensors)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tnrec.errors import ArgumentError


@dataclass(frozen=True)
class Jagged:
    """The keys of one categorical column: row i's bag is ``keys[offsets[i]:offsets[i+1]]``.

    Example:
        >>> j = Jagged(np.array([7, 8, 9]), np.array([0, 2, 2, 3]))
        >>> j.lengths().tolist()
        [2, 0, 1]
    """

    keys: npt.NDArray[np.int64]  # [N]
    offsets: npt.NDArray[np.int64]  # [B+1], offsets[0] == 0, offsets[B] == N

    def lengths(self) -> npt.NDArray[np.int64]:
        """Return ``int64[B]``: the number of keys of every row."""
        return np.diff(self.offsets)

    def take(self, rows: npt.NDArray[np.int64]) -> Jagged:
        """Return the bags of ``rows``, in that order."""
        starts = self.offsets[:-1][rows]  # [B']
        lengths = self.offsets[1:][rows] - starts  # [B']
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # Key j of the result comes from starts[row] + (j - offsets[row]).
        src = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return Jagged(self.keys[src], offsets)

    def slice(self, start: int, stop: int) -> Jagged:
        """Return rows ``start:stop``."""
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return Jagged(self.keys[lo:hi], self.offsets[start : stop + 1] - lo)

    @staticmethod
    def concat(parts: Sequence[Jagged]) -> Jagged:
        """Return the rows of ``parts`` one after another."""
        if len(parts) == 1:
            return parts[0]
        keys = np.concatenate([p.keys for p in parts]) if parts else np.zeros(0, np.int64)
        lengths = [np.diff(p.offsets) for p in parts]
        flat = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(flat) + 1, dtype=np.int64)
        np.cumsum(flat, out=offsets[1:])
        return Jagged(keys.astype(np.int64, copy=False), offsets)


@dataclass(frozen=True)
class Batch:
    """B hashed rows: jagged keys per categorical column, dense floats, labels.

    ``B = 3`` rows, categorical ``user`` (one key a row, row 1 missing) and
    ``clicks`` (a sequence), two numeric columns, one label::

        sparse["user"]    keys    [u0,     u2]           N = 2
                          offsets [0, 1, 1, 2]           B + 1
        sparse["clicks"]  keys    [c0, c1, c2, c3]       N = 4
                          offsets [0, 3, 3, 4]           row 0: c0 c1 c2 | row 1: - | row 2: c3
        dense             [[I1_0, I2_0],                 float32[B, F], F = len(dense_names)
                           [I1_1, I2_1],
                           [I1_2, I2_2]]
        labels            [[y0], [y1], [y2]]             float32[B, L], L = len(label_names)
        weights           [w0, w1, w2] or None           float32[B]
        row_ids           [r0, r1, r2]                   int64[B]: file_index << 40 | row in file

    ``labels`` is always 2-D (``L`` may be 0 for prediction input); use
    :meth:`label` for the ``float32[B]`` of one label. A batch with ``B = 0``
    is valid (a worker with no data left still joins each step with one).
    Row ids are stable across readers, splits, shuffles and seeks, so the rows a
    set of workers trained on can be counted.

    Example:
        >>> b = Batch.empty(["user"], ["I1"], ["label"])
        >>> b.size, b.dense.shape, b.labels.shape
        (0, (0, 1), (0, 1))
    """

    sparse: Mapping[str, Jagged]
    dense: npt.NDArray[np.float32]  # [B, F]
    dense_names: tuple[str, ...]
    labels: npt.NDArray[np.float32]  # [B, L]
    label_names: tuple[str, ...]
    weights: npt.NDArray[np.float32] | None  # [B]
    row_ids: npt.NDArray[np.int64]  # [B]

    @property
    def size(self) -> int:
        """The number of rows B."""
        return int(self.row_ids.shape[0])

    def __len__(self) -> int:
        return self.size

    def keys(self, column: str) -> npt.NDArray[np.int64]:
        """Return ``int64[N]``: all keys of one categorical column."""
        return self.sparse[column].keys

    def offsets(self, column: str) -> npt.NDArray[np.int64]:
        """Return ``int64[B+1]``: the bag offsets of one categorical column."""
        return self.sparse[column].offsets

    def label(self, name: str | None = None) -> npt.NDArray[np.float32]:
        """Return ``float32[B]``: one label column (the only one when ``name`` is None).

        Raises:
            ArgumentError: ``name`` is None and there is not exactly one label, or
                ``name`` is not a label.
        """
        if name is None:
            if len(self.label_names) != 1:
                raise ArgumentError(
                    f"Batch.label: `name` is required when the batch has {len(self.label_names)} "
                    f"labels {list(self.label_names)}. Received: name=None."
                )
            return self.labels[:, 0]
        if name not in self.label_names:
            raise ArgumentError(
                f"Batch.label: `name` must be one of {list(self.label_names)}. "
                f"Received: name={name!r}."
            )
        return self.labels[:, self.label_names.index(name)]

    @staticmethod
    def empty(
        sparse_names: Sequence[str],
        dense_names: Sequence[str],
        label_names: Sequence[str],
        *,
        weights: bool = False,
    ) -> Batch:
        """Return a batch with no rows and the given columns."""
        z = np.zeros(1, dtype=np.int64)
        return Batch(
            sparse={n: Jagged(np.zeros(0, np.int64), z.copy()) for n in sparse_names},
            dense=np.zeros((0, len(dense_names)), np.float32),
            dense_names=tuple(dense_names),
            labels=np.zeros((0, len(label_names)), np.float32),
            label_names=tuple(label_names),
            weights=np.zeros(0, np.float32) if weights else None,
            row_ids=np.zeros(0, np.int64),
        )

    def take(self, rows: npt.NDArray[np.int64]) -> Batch:
        """Return the rows ``rows`` (indices into this batch), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return Batch(
            sparse={n: j.take(rows) for n, j in self.sparse.items()},
            dense=self.dense[rows],
            dense_names=self.dense_names,
            labels=self.labels[rows],
            label_names=self.label_names,
            weights=None if self.weights is None else self.weights[rows],
            row_ids=self.row_ids[rows],
        )

    def slice(self, start: int, stop: int) -> Batch:
        """Return rows ``start:stop`` (views where possible)."""
        return Batch(
            sparse={n: j.slice(start, stop) for n, j in self.sparse.items()},
            dense=self.dense[start:stop],
            dense_names=self.dense_names,
            labels=self.labels[start:stop],
            label_names=self.label_names,
            weights=None if self.weights is None else self.weights[start:stop],
            row_ids=self.row_ids[start:stop],
        )

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """Return the rows of ``parts`` (same columns) one after another.

        Raises:
            ArgumentError: ``parts`` is empty or the parts have different columns.
        """
        if not parts:
            raise ArgumentError("Batch.concat: `parts` must not be empty. Received: parts=[].")
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        for p in parts[1:]:
            if (
                p.sparse.keys() != first.sparse.keys()
                or p.dense_names != first.dense_names
                or p.label_names != first.label_names
                or (p.weights is None) != (first.weights is None)
            ):
                raise ArgumentError("Batch.concat: all parts must have the same columns.")
        weights = None
        if first.weights is not None:
            weights = np.concatenate([p.weights for p in parts if p.weights is not None])
        return Batch(
            sparse={n: Jagged.concat([p.sparse[n] for p in parts]) for n in first.sparse},
            dense=np.concatenate([p.dense for p in parts]),
            dense_names=first.dense_names,
            labels=np.concatenate([p.labels for p in parts]),
            label_names=first.label_names,
            weights=weights,
            row_ids=np.concatenate([p.row_ids for p in parts]),
        )
