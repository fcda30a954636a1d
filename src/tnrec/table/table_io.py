"""Whole-row access and files of a sparse table: the part of :class:`SparseTable` that
reads and writes complete records (loading, saving, exporting), as a base class."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from tnrec.errors import TableKeyError
from tnrec.table import index, rows, stream, threads

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Self

    from tnrec.table.capacity import MemoryBudget
    from tnrec.table.optimizers import SparseOptimizer
    from tnrec.table.rows import RowStore

Keys = npt.NDArray[np.int64]


class RowAccess:
    """Whole records in and out of a table, and its files; :class:`SparseTable` derives it.

    Reads the index and row store the table owns; every method is documented
    on :class:`SparseTable`.
    """

    name: str
    dim: int
    optimizer: SparseOptimizer
    generation: int
    memory_budget: MemoryBudget | None
    _count: int
    _slots: np.ndarray
    _store: RowStore
    _bucket_rows: npt.NDArray[np.int64]

    if TYPE_CHECKING:

        def _check_keys(self, keys: object, arg: str = "keys") -> Keys: ...

        def _insert(self, keys: Keys, initialise: bool = True) -> npt.NDArray[np.int32]: ...

        def _insert_new(self, keys: Keys) -> npt.NDArray[np.int32]: ...

    # ------------------------------------------------------------------ whole rows

    def _entries(self) -> tuple[Keys, npt.NDArray[np.int32]]:
        keys = np.empty(self._count, dtype=np.int64)
        rws = np.empty(self._count, dtype=np.int32)
        n = index.entries(self._slots, keys, rws)
        if n != self._count:
            raise RuntimeError(f"internal error: index holds {n} keys, count says {self._count}")
        return keys, rws

    def records(self, keys: Keys | None = None) -> tuple[Keys, npt.NDArray[np.float32]]:
        """Return ``(keys, records[n, stride])``: whole rows, sorted by key when ``keys`` is None.

        Raises:
            TableKeyError: a given key is not in the table.
        """
        if keys is None:
            k, rws = self._entries()
            order = np.argsort(k, kind="stable")
            k, rws = k[order], rws[order]
        else:
            k = self._check_keys(keys)
            rws = np.empty(k.shape[0], dtype=np.int32)
            missing = index.lookup(self._slots, k, rws)
            if missing:
                raise TableKeyError(
                    f'Table "{self.name}": {missing} of {k.shape[0]} keys are unknown.'
                )
        st = self._store
        out = np.empty((k.shape[0], st.stride), dtype=np.float32)  # [n, stride]
        rows.gather_records(*st.loc, rws, out)
        return k, out

    def split_records(self, keys: Keys, rec: npt.NDArray[np.float32]) -> dict[str, np.ndarray]:
        """Split whole records into named arrays (``keys``, ``weights``, state, stats)."""
        D = self.dim
        ints = rec.view(np.int32)
        out: dict[str, np.ndarray] = {"keys": keys, "weights": np.ascontiguousarray(rec[:, :D])}
        col = D
        for name, width, dtype in self.optimizer.state_arrays(D):
            src = ints if dtype == "int32" else rec
            if width:
                out[name] = np.ascontiguousarray(src[:, col : col + width])
                col += width
            else:
                out[name] = np.ascontiguousarray(src[:, col])
                col += 1
        out["show"] = np.ascontiguousarray(rec[:, col])
        out["click"] = np.ascontiguousarray(rec[:, col + 1])
        out["unseen_days"] = np.ascontiguousarray(ints[:, col + 2])
        out["marker"] = np.ascontiguousarray(ints[:, col + 3])
        return out

    def rows(self, keys: Keys | None = None) -> dict[str, np.ndarray]:
        """Return the rows as arrays: keys, weights, state, show, click, unseen_days, marker.

        Args:
            keys: the keys to read (all present), or None for every key sorted ascending.
        """
        k, rec = self.records(keys)
        return self.split_records(k, rec)

    def write_records(self, keys: Keys, rec: npt.NDArray[np.float32]) -> None:
        """Set whole rows (creating absent keys); used by loading. ``keys`` must be unique."""
        k = self._check_keys(keys)
        if rec.dtype != np.float32 or rec.shape != (k.shape[0], self._store.stride):
            raise RuntimeError("internal error: write_records got a block of the wrong shape")
        rws = self.rows_for(k)
        st = self._store
        rows.scatter_column(*st.loc, rws, 0, np.ascontiguousarray(rec))

    def write_bucket_files(
        self, directory: str, lo: int, hi: int
    ) -> tuple[npt.NDArray[np.int64], dict[str, str]]:
        """Stream the rows of buckets ``[lo, hi)`` to column files in ``directory``, grouped by
        bucket (:mod:`tnrec.table.stream`); return the bucket offsets and
        ``{file: XXH3 digest}``."""
        order, offsets = stream.bucket_order(self._slots, self._bucket_rows, lo, hi)
        cols = stream.columns(self.dim, self.optimizer.state_arrays(self.dim))
        return offsets, stream.write_columns(self._slots, self._store, directory, order, cols)

    def rows_for(self, keys: Keys, new: bool = False) -> npt.NDArray[np.int32]:
        """Return the row of each of ``keys`` (unique int64), inserting absent ones with rows
        left as they are: for loaders that write every slot of them next.

        ``new``: the caller knows every key is absent (a load into a table that
        was empty, no evicted rows): they are inserted without a lookup, by
        several threads (:meth:`SparseTable._insert_new`).
        """
        if new and self._store.free_top == 0:
            return self._insert_new(keys)
        rws = np.empty(keys.shape[0], dtype=np.int32)
        index.lookup(self._slots, keys, rws)
        absent = np.flatnonzero(rws < 0)
        if absent.shape[0]:
            rws[absent] = self._insert(keys[absent], initialise=False)
        return rws

    def write_blocks(
        self, rws: npt.NDArray[np.int32], blocks: list[tuple[int, np.ndarray]]
    ) -> None:
        """Write several ``(start, block[n, w])`` column blocks (4-byte values, C-contiguous)
        into rows ``rws`` in one pass over the rows, on the table's threads."""
        n = rws.shape[0]
        for _, block in blocks:
            if (
                block.dtype.itemsize != 4
                or block.ndim != 2
                or block.shape[0] != n
                or not block.flags.c_contiguous
            ):
                raise RuntimeError("internal error: write_blocks got a block of the wrong shape")
        if not n or not blocks:
            return
        addrs = np.array([b.ctypes.data for _, b in blocks], np.int64)
        starts = np.array([s for s, _ in blocks], np.int64)
        widths = np.array([b.shape[1] for _, b in blocks], np.int64)
        loc = self._store.loc
        threads.run(
            threads.slices(n),
            lambda a, b: rows.scatter_records(
                *loc, rws[a:b], addrs + a * widths * 4, starts, widths
            ),
        )

    # ------------------------------------------------------------------ files

    def save(self, path: str, storage: str = "npy", order: str = "key") -> None:
        """Save every row to directory ``path`` atomically (see :mod:`tnrec.table.files`).

        ``order="bucket"`` streams the rows in bounded chunks (what checkpoints
        use; for big tables); ``"key"`` writes them sorted by key (a sorted copy).
        """
        from tnrec.table import files

        files.save(cast("files.TableRows", self), path, storage=storage, order=order)

    def save_range(
        self, path: str, lo: int, hi: int, storage: str = "npy", order: str = "key"
    ) -> None:
        """Save the rows whose ``bucket_of(key)`` is in ``[lo, hi)`` to ``path`` atomically."""
        from tnrec.table import files

        files.save(
            cast("files.TableRows", self), path, storage=storage, bucket_range=(lo, hi), order=order
        )

    @classmethod
    def load(
        cls,
        path: str,
        key_filter: Callable[[Keys], npt.NDArray[np.bool_]] | None = None,
        *,
        dim: int | None = None,
        optimizer: SparseOptimizer | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> Self:
        """Load a table saved by :meth:`save`; optionally only keys passing ``key_filter``.

        Args:
            path: the directory written by :meth:`save` or :meth:`save_range`.
            key_filter: ``f(keys) -> bool mask``; rows whose mask is False are skipped.
            dim: if given, refuse a table of another dimension.
            optimizer: if given, refuse a table of another optimizer type; the
                loaded table uses this config's hyper-parameters.
            memory_budget: count the loaded table against this budget (a load
                that would pass it stops with MemoryLimitError before allocating).

        Raises:
            CheckpointError: missing or unreadable files; ChecksumError, FormatVersionError,
                MismatchError for the specific faults, each naming the file.
        """
        from tnrec.table import files

        args, header = files.table_args(path, dim=dim, optimizer=optimizer)
        table = cls(**args)
        table.memory_budget = memory_budget
        table.generation = int(header.get("generation", 0))
        files.load_into(cast("files.TableRows", table), header["_dir"], key_filter, header=header)
        return table

    def load_rows(
        self, path: str, key_filter: Callable[[Keys], npt.NDArray[np.bool_]] | None = None
    ) -> int:
        """Merge the rows saved in ``path`` into this table; return how many were read.

        Saved rows replace rows of the same key. The saved dim and optimizer type
        must match this table's.
        """
        from tnrec.table import files

        return files.load_into(cast("files.TableRows", self), path, key_filter)
