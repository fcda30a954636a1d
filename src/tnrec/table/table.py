"""SparseTable: a hash table from 64-bit keys to rows of weights, optimizer state and statistics."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tnrec._hashing import NUM_BUCKETS
from tnrec.errors import ArgumentError, NonFiniteError, TableKeyError
from tnrec.table import capacity, index, rows, team, threads
from tnrec.table.admission import AdmissionPolicy, CountMinSketch, admission_passes
from tnrec.table.init import Initializer, normal, table_stream_seed
from tnrec.table.optimizers import SparseOptimizer
from tnrec.table.policy import EvictionPolicy
from tnrec.table.table_io import RowAccess

if TYPE_CHECKING:
    from tnrec.table.capacity import MemoryBudget

Keys = npt.NDArray[np.int64]
_NO_OUT = np.empty((0, 0), np.float32)  # create_rows without a copy of the new weights
_NO_DEST = np.empty(0, np.intp)
# Inserts of at least this many new keys go by region on the table's threads; the
# choice depends on the count only, so the index a run leaves does not depend on
# the thread count.
REGION_INSERT_MIN = 2 * threads.MIN_SLICE
# A create pull of at least INSERT_FIRST_MIN keys finds or inserts them in one pass
# when the previous create pull missed at least INSERT_FIRST_MISS_RATE of its keys.
INSERT_FIRST_MIN = 4096
INSERT_FIRST_MISS_RATE = 0.6


@dataclass(frozen=True)
class TableStats:
    """Size figures of a table (see :meth:`SparseTable.stats`).

    ``bytes_held`` is ``index_bytes + row_bytes + sketch_bytes``; ``row_bytes``
    counts every allocated row (free and unused ones too) plus the free list
    and a scratch bitmap; ``weight_bytes`` and ``state_bytes`` (the
    optimizer's) are its weight and state columns. ``sketch_bytes`` is the
    admission sketch's allocation.
    """

    count: int
    capacity: int
    rows_allocated: int
    load_factor: float
    bytes_held: int
    bytes_per_key: float
    index_bytes: int = 0
    row_bytes: int = 0
    weight_bytes: int = 0
    state_bytes: int = 0
    sketch_bytes: int = 0


class SparseTable(RowAccess):
    """A sparse embedding table: unbounded int64 keys -> rows, updated by a sparse optimizer.

    Every int64 value is a valid key. A row holds the key's weights ``[dim]``,
    the optimizer's state, ``show`` and ``click`` (float32), days since the last
    push (int32) and an update marker (the table's :attr:`generation` when the
    row was created or last pushed, for delta exports).

    The table is not thread-safe: one caller at a time. The numba kernels
    release the GIL, so other Python threads run while it works.

    Args:
        dim: embedding dimension ``D`` (>= 1).
        optimizer: a sparse optimizer config (:class:`AdaGrad`, :class:`Adam`,
            :class:`Ftrl`, :class:`SGD`).
        name: the table's name; part of every key's initial vector.
        initializer: :func:`normal` (default, TensorNet's), :func:`uniform`, :func:`zeros`.
        seed: part of every key's initial vector.
        policy: statistics decay rate, eviction tests and the row cap; the
            default deletes nothing.
        admission: when an absent key gets a row (:class:`AdmissionPolicy`);
            ``None`` (default): at its first training pull.

    Example:
        >>> import numpy as np
        >>> from tnrec.table import SparseTable, AdaGrad
        >>> t = SparseTable(4, AdaGrad(learning_rate=0.1), name="user")
        >>> keys = np.array([7, -1, 2**63 - 1], dtype=np.int64)
        >>> t.pull(keys).shape
        (3, 4)
        >>> ones = np.ones(3, np.float32)
        >>> t.push(keys, np.ones((3, 4), np.float32), ones, ones)
        >>> len(t)
        3
    """

    def __init__(
        self,
        dim: int,
        optimizer: SparseOptimizer,
        *,
        name: str = "table",
        initializer: Initializer | None = None,
        seed: int = 0,
        policy: EvictionPolicy | None = None,
        admission: AdmissionPolicy | None = None,
    ) -> None:
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim < 1:
            raise ArgumentError(
                f'Table "{name}": `dim` must be a positive int. Received: dim={dim!r}.'
            )
        if not isinstance(optimizer, SparseOptimizer):
            raise ArgumentError(
                f'Table "{name}": `optimizer` must be a sparse optimizer config '
                f"(AdaGrad, Adam, Ftrl, SGD). Received: {type(optimizer).__name__}."
            )
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"Table name must be a non-empty str. Received: name={name!r}.")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise ArgumentError(f'Table "{name}": `seed` must be an int. Received: seed={seed!r}.')
        initializer = normal() if initializer is None else initializer
        if not isinstance(initializer, Initializer):
            raise ArgumentError(
                f'Table "{name}": `initializer` must come from normal(), uniform() or zeros(). '
                f"Received: {initializer!r}."
            )
        policy = EvictionPolicy() if policy is None else policy
        if not isinstance(policy, EvictionPolicy):
            raise ArgumentError(
                f'Table "{name}": `policy` must be an EvictionPolicy. Received: {policy!r}.'
            )
        if admission is not None and not isinstance(admission, AdmissionPolicy):
            raise ArgumentError(
                f'Table "{name}": `admission` must be an AdmissionPolicy or None. '
                f"Received: {admission!r}."
            )
        self.dim = int(dim)
        self.optimizer = optimizer
        self.name = name
        self.initializer = initializer
        self.seed = int(seed)
        self.policy = policy
        self.generation = 0
        self._learning_rate: float | None = None  # set_learning_rate's, else the optimizer's
        self._state_width = optimizer.state_width(self.dim)
        self._table_seed = table_stream_seed(self.seed, name)
        self._store = rows.RowStore(self.dim + self._state_width + 4)
        self._slots = index.new_index(index.MIN_CAPACITY)
        self._count = 0
        # Bumped whenever a key gains or loses its row; a remembered lookup
        # (below) is valid only while it has not changed.
        self._key_version = 0
        # The keys of the last pull, their rows and the key version then: a
        # push of the same keys (the training step's pull -> push) reuses the
        # rows instead of looking every key up again. Rows never move.
        self._last_lookup: tuple[Keys, npt.NDArray[np.int32], int] | None = None
        self._miss_rate = 1.0  # the share of keys the last create pull did not find
        self.admission = admission
        self._sketch = (
            CountMinSketch(admission.width, self._table_seed)
            if admission is not None and admission.min_show is not None
            else None
        )
        self._bucket_rows = np.zeros(NUM_BUCKETS, dtype=np.int64)  # rows per bucket
        self._caps = capacity.bucket_caps(policy.max_rows) if policy.max_rows is not None else None
        self.memory_budget: MemoryBudget | None = None
        # Cumulative since the table was built: keys given a row by admission,
        # training pulls of keys refused a row, rows evicted by the cap.
        self.counters = {"keys_admitted": 0, "keys_refused": 0, "keys_evicted_cap": 0}
        # The last streamed load's wall time and the part spent inserting into the index.
        self.load_timings: dict[str, float] = {}

    # ------------------------------------------------------------------ learning rate

    @property
    def learning_rate(self) -> float:
        """The learning rate of the next push: :meth:`set_learning_rate`'s, else the optimizer's."""
        lr = self._learning_rate
        return float(self.optimizer.learning_rate) if lr is None else lr

    def set_learning_rate(self, lr: float | None) -> None:
        """Use ``lr`` instead of the optimizer's ``learning_rate`` from the next push on.

        A schedule calls it between steps: the kernels read the rate with the
        other hyper-parameters at every push, so nothing is recompiled. For
        :class:`Ftrl` it is ``alpha``. ``None`` goes back to the optimizer's.

        Raises:
            ArgumentError: ``lr`` is not a finite number >= 0 (> 0 for Ftrl).
        """
        if lr is not None:
            ftrl = type(self.optimizer).__name__ == "Ftrl"  # alpha divides
            ok = isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr)
            if not ok or lr < 0 or (ftrl and lr == 0):
                least = "> 0 (Ftrl divides by it)" if ftrl else ">= 0"
                raise ArgumentError(
                    f'Table "{self.name}": the learning rate must be a finite number {least}. '
                    f"Received: {lr!r}."
                )
            lr = float(lr)
        self._learning_rate = lr

    @property
    def scheduled_learning_rate(self) -> float | None:
        """The rate :meth:`set_learning_rate` set (None: the optimizer's is used)."""
        return self._learning_rate

    def _hyper_params(self) -> npt.NDArray[np.float64]:
        """The optimizer's hyper-parameter vector with the table's learning rate first."""
        hp = self.optimizer.hyper_params()
        if self._learning_rate is not None:
            hp[0] = self._learning_rate
        return hp

    # ------------------------------------------------------------------ info

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return (
            f"SparseTable(name={self.name!r}, dim={self.dim}, "
            f"optimizer={type(self.optimizer).__name__}, keys={self._count})"
        )

    @property
    def stats_offset(self) -> int:
        """Column of ``show`` in a row record (``D + S``)."""
        return self.dim + self._state_width

    def stats(self) -> TableStats:
        """Return count, index capacity, rows allocated, load factor, bytes held, bytes per key.

        ``bytes_held`` counts the index, every allocated row chunk and the free list.
        """
        cap = self._slots.shape[0]
        st = self._store
        sketch = self._sketch.nbytes if self._sketch is not None else 0
        held = self._slots.nbytes + st.nbytes() + sketch
        return TableStats(
            count=self._count,
            capacity=cap,
            rows_allocated=st.capacity,
            load_factor=self._count / cap,
            bytes_held=held,
            bytes_per_key=held / max(self._count, 1),
            index_bytes=int(self._slots.nbytes),
            row_bytes=st.nbytes(),
            weight_bytes=st.capacity * self.dim * 4,
            state_bytes=st.capacity * self._state_width * 4,
            sketch_bytes=sketch,
        )

    def memory(self) -> dict[str, float]:
        """Return rows, bytes by kind, rows per bucket (max / mean) and the admission counters.

        Keys: ``rows``, ``bytes``, ``index_bytes``, ``row_bytes``, ``weight_bytes``,
        ``state_bytes``, ``sketch_bytes``, ``sketch_fill`` (share of non-zero
        counters in the buckets touched), ``keys_admitted``, ``keys_refused``,
        ``keys_evicted_cap``.
        """
        s = self.stats()
        out: dict[str, float] = {
            "rows": s.count,
            "bytes": s.bytes_held,
            "index_bytes": s.index_bytes,
            "row_bytes": s.row_bytes,
            "weight_bytes": s.weight_bytes,
            "state_bytes": s.state_bytes,
            "sketch_bytes": s.sketch_bytes,
            "sketch_fill": self._sketch.fill() if self._sketch is not None else 0.0,
        }
        out.update(self.counters)
        return out

    @property
    def sketch(self) -> CountMinSketch | None:
        """The admission sketch (with ``AdmissionPolicy(min_show=...)``), else None."""
        return self._sketch

    def bucket_rows(self) -> npt.NDArray[np.int64]:
        """Return the number of rows of each of the 1024 buckets (a copy)."""
        return self._bucket_rows.copy()

    def contains(self, keys: Keys) -> npt.NDArray[np.bool_]:
        """Return which of the int64 ``keys`` have a row (``bool[n]``)."""
        found = np.empty(keys.shape[0], dtype=np.int32)
        rows.lookup_rows(self._slots, keys, found)
        return found >= 0

    def keys(self) -> Keys:
        """Return every key, sorted ascending (8 bytes a key; sorted in place)."""
        keys = np.empty(self._count, dtype=np.int64)
        n = index.entry_keys(self._slots, keys)
        if n != self._count:
            raise RuntimeError(f"internal error: index holds {n} keys, count says {self._count}")
        keys.sort()
        return keys

    def read_column(self, keys: Keys, start: int, width: int) -> npt.NDArray[np.float32]:
        """Return record slots ``start:start+width`` of present ``keys`` (``float32[n, width]``;
        view int32 slots with ``.view(np.int32)``): a few columns of some rows, no full record.

        Raises:
            TableKeyError: a key is not in the table.
        """
        k = self._check_keys(keys)
        rws = np.empty(k.shape[0], dtype=np.int32)
        missing = index.lookup(self._slots, k, rws)
        if missing:
            raise TableKeyError(f'Table "{self.name}": {missing} of {k.shape[0]} keys are unknown.')
        out = np.empty((k.shape[0], width), dtype=np.float32)
        rows.gather_slots(*self._store.loc, rws, start, out)
        return out

    # ------------------------------------------------------------------ checks

    def _check_keys(self, keys: object, arg: str = "keys") -> Keys:
        arr = np.asarray(keys)
        if arr.dtype != np.int64 or arr.ndim != 1:
            raise ArgumentError(
                f'Table "{self.name}": `{arg}` must be a 1-D int64 array. '
                f"Received: dtype={arr.dtype}, shape={arr.shape}."
            )
        return np.ascontiguousarray(arr)

    def _check_float(self, a: object, arg: str, shape: tuple[int, ...]) -> np.ndarray:
        arr = np.asarray(a)
        if arr.dtype != np.float32 or arr.shape != shape:
            raise ArgumentError(
                f'Table "{self.name}": `{arg}` must be a float32 array of shape {shape}. '
                f"Received: dtype={arr.dtype}, shape={arr.shape}."
            )
        return np.ascontiguousarray(arr)

    # ------------------------------------------------------------------ pull

    def pull(self, keys: Keys, create: bool = True) -> npt.NDArray[np.float32]:
        """Return the weights of ``keys``, creating missing rows when ``create``.

        Args:
            keys: ``int64[n]``, no key twice.
            create: create missing keys with the initializer (training); with
                ``False`` (evaluation, prediction) missing keys read as zeros and
                nothing is created.

        Returns:
            ``float32[n, D]``, a copy.

        Raises:
            ArgumentError: ``keys`` is not a 1-D int64 array.
            TableKeyError: a key appears more than once.
        """
        k = self._check_keys(keys)
        return self._pull(k, create, checked=True)

    def pull_unchecked(self, keys: Keys, create: bool = True) -> npt.NDArray[np.float32]:
        """Like :meth:`pull` for callers whose keys are unique int64 by construction."""
        return self._pull(keys, create, checked=False)

    def _pull(self, keys: Keys, create: bool, checked: bool) -> npt.NDArray[np.float32]:
        n = keys.shape[0]
        out = np.empty((n, self.dim), dtype=np.float32)  # [n, D]
        if create and self._inserts_first(n):
            made = self._pull_inserting(keys, out, checked)
            if made is not None:
                self._last_lookup = (keys.copy(), made, self._key_version)
                return out
        rws = np.empty(n, dtype=np.int32)
        st = self._store
        slots, loc, dim = self._slots, st.loc, self.dim
        on_team = team.slices(n, keys)
        if on_team is not None:
            missing = team.lookup_gather(on_team, slots, loc, keys, rws, out)
        else:
            parts = threads.slices(n)
            missing = sum(
                threads.run(
                    parts,
                    lambda a, b: rows.lookup_gather(
                        slots, *loc, keys[a:b], rws[a:b], out[a:b], dim
                    ),
                )
            )
        if create and n:
            self._miss_rate = missing / n
        # A checked pull that creates finds repeated absent keys while inserting
        # them, and then takes the keys it inserted out again.
        in_insert = checked and create and missing > 0 and self.admission is None
        if checked and rows.count_key_duplicates(keys, rws, 0 if in_insert else missing, st.bitmap):
            self._refuse_duplicates(keys, rws, missing)  # ``out`` is this call's own array
        if missing and create:
            where = np.flatnonzero(rws < 0)
            if self.admission is not None:
                where = self._admit(keys, where, out)
            if where.shape[0]:
                made = self._try_insert(
                    keys[where], initialise=True, into=(out, where), repeats=in_insert
                )
                if made is None:  # a key repeats: nothing was created
                    self._refuse_duplicates(keys, rws, missing)
                    raise RuntimeError("internal error: an insert saw a repeat the count missed")
                rws[where] = made
        self._last_lookup = (keys.copy(), rws, self._key_version)
        return out

    def _inserts_first(self, n: int) -> bool:
        """Whether a create pull of ``n`` keys goes by :meth:`_pull_inserting`: one of
        :data:`INSERT_FIRST_MIN` keys or more right after a create pull that missed at
        least :data:`INSERT_FIRST_MISS_RATE` of its keys, into a table whose rows all come
        from the unused tail (nothing evicted), without admission, row cap or memory
        budget (which count the keys that are absent before anything is allocated)."""
        return (
            n >= INSERT_FIRST_MIN
            and self._miss_rate >= INSERT_FIRST_MISS_RATE
            and self._store.free_top == 0
            and self.admission is None
            and self._caps is None
            and self.memory_budget is None
        )

    def _pull_inserting(
        self, keys: Keys, out: npt.NDArray[np.float32], checked: bool
    ) -> npt.NDArray[np.int32] | None:
        """Pull ``keys`` creating the absent ones in one pass over the index: each key is
        found or inserted by region (:func:`index.find_or_insert_regions`, on torch's
        OpenMP team or the table's threads, :meth:`_by_region`), instead of a lookup of
        every key and then a second probe of the absent ones. Writes the weights to
        ``out`` and returns the rows: the rows a lookup and then an insert of the absent
        keys give (the new keys get ``next_row, next_row + 1, ...`` in key order).

        Returns None, with the index holding the keys it held (the room reserved
        for the pull stays), when a key repeats: the caller's two-pass pull then
        refuses or reports it as it does.
        """
        n = keys.shape[0]
        st = self._store
        self._reserve(n)
        self._key_version += 1
        first = st.next_row
        slots = self._slots
        rws = np.empty(n, np.int32)
        where = np.empty(n, np.int64)
        deferred, dups, buckets = self._by_region(keys, first, rws, where)
        dups += index.find_or_insert_serial(slots, keys, first, deferred, rws, where)
        new = rws < 0
        if dups or (checked and rows.count_row_duplicates(rws, st.bitmap)):  # present repeats
            index.delete(slots, keys[new], np.empty(n, np.int32), 0)  # rows never handed out
            return None
        made = int(index.number_new_rows(slots, rws, where, first))
        self._count += made
        st.next_row += made
        self._bucket_rows += buckets
        if made == n:  # every key new (a table filling up): nothing to gather
            self._initialise(keys, rws, True, (out, np.arange(n)))
        else:
            capacity.bucket_counts(keys[~new], self._bucket_rows, -1)
            loc, dim = st.loc, self.dim
            threads.run(
                threads.slices(n),
                lambda a, b: rows.gather_below(*loc, rws[a:b], first, dim, out[a:b]),
            )
            if made:
                dest = np.flatnonzero(new)
                self._initialise(keys[dest], rws[dest], True, (out, dest))
        self._miss_rate = made / n
        return rws

    def _refuse_duplicates(self, keys: Keys, rws: npt.NDArray[np.int32], missing: int) -> None:
        """Raise :class:`TableKeyError` when a key of a looked-up batch repeats (the absent
        ones, ``rws < 0``, are checked only when ``missing`` counts them)."""
        dups = rows.count_key_duplicates(keys, rws, missing, self._store.bitmap)
        if dups:  # counted over the whole batch, the absent keys too
            raise TableKeyError(
                f'Table "{self.name}": pull got {dups} duplicate key(s) among {keys.shape[0]}; '
                "keys must be unique (de-duplicate the batch first)."
            )

    def read_stats_unchecked(self, keys: Keys) -> npt.NDArray[np.float32]:
        """Return ``[show, click]`` of unique ``keys`` (``float32[n, 2]``; absent keys read 0).

        Reuses the rows of the last pull when ``keys`` are its keys (the
        training step's pull, then its CVM inputs), else looks them up.
        """
        n = keys.shape[0]
        rws = self._remembered_rows(keys)
        if rws is None:
            rws = np.empty(n, dtype=np.int32)
            rows.lookup_rows(self._slots, keys, rws)
        out = np.zeros((n, 2), dtype=np.float32)  # [n, 2]
        present = np.flatnonzero(rws >= 0)
        if present.shape[0]:
            got = np.empty((present.shape[0], 2), dtype=np.float32)
            rows.gather_slots(*self._store.loc, rws[present], self.stats_offset, got)
            out[present] = got
        return out

    def _admit(
        self, keys: Keys, where: npt.NDArray[np.intp], out: npt.NDArray[np.float32]
    ) -> npt.NDArray[np.intp]:
        """Return the positions of the absent keys admitted now; fill the refused ones' output.

        A key is admitted when its sketch count reaches ``min_show`` and it
        passes the probability test (each test only when set).
        """
        adm = self.admission
        if adm is None:
            return where
        absent = keys[where]
        ok = np.ones(absent.shape[0], dtype=np.bool_)
        if self._sketch is not None and adm.min_show is not None:
            ok &= self._sketch.estimate(absent) >= np.float32(adm.min_show)
        if adm.probability is not None and adm.probability < 1.0:
            ok &= admission_passes(absent, adm.probability, self._table_seed)
        refused = where[~ok]
        self.counters["keys_admitted"] += int(ok.sum())
        self.counters["keys_refused"] += int(refused.shape[0])
        if adm.read_unadmitted == "init" and refused.shape[0]:
            out[refused] = self.initial_vectors(keys[refused])
        return where[ok]

    def initial_vectors(self, keys: Keys) -> npt.NDArray[np.float32]:
        """Return the initial vector each key gets when its row is created (``float32[n, D]``)."""
        k = self._check_keys(keys)
        init = self.initializer
        out = np.empty((k.shape[0], self.dim), dtype=np.float32)
        rows.init_vectors(k, self._table_seed, init.code(), init.param, self.dim, out)
        return out

    def _remembered_rows(self, keys: Keys) -> npt.NDArray[np.int32] | None:
        """Return the rows of ``keys`` if they are exactly the last pull's keys and still valid."""
        last = self._last_lookup
        if (
            last is None
            or last[2] != self._key_version
            or last[0].shape != keys.shape
            or not np.array_equal(last[0], keys)
        ):
            return None
        return last[1]

    def _insert(
        self,
        keys: Keys,
        initialise: bool = True,
        into: tuple[npt.NDArray[np.float32], npt.NDArray[np.intp]] | None = None,
    ) -> npt.NDArray[np.int32]:
        """Insert absent ``keys`` (unique, none present); return their rows, initialised
        unless ``initialise`` is False (the caller writes every slot of them).

        ``into=(out, where)`` also writes key ``i``'s initial weights to ``out[where[i]]``.
        """
        made = self._try_insert(keys, initialise, into, repeats=False)
        if made is None:  # pragma: no cover - repeats=False raises instead
            raise RuntimeError("internal error: _insert got repeated keys")
        return made

    def _try_insert(
        self,
        keys: Keys,
        initialise: bool,
        into: tuple[npt.NDArray[np.float32], npt.NDArray[np.intp]] | None,
        repeats: bool,
    ) -> npt.NDArray[np.int32] | None:
        """:meth:`_insert`; with ``repeats`` the keys may repeat: a key that does is found
        while inserting, the keys inserted are deleted again, and None is returned
        with the table's keys in the slots they had (linear probing never moves a
        key to insert another, and no key sits past an empty slot of its probe
        run, so deleting the new keys moves no old one). The index and row blocks
        reserved for the keys stay.

        At least :data:`REGION_INSERT_MIN` keys into a table without evicted rows
        are inserted by region on the table's threads (:meth:`_insert_regions`),
        fewer (or rows to reuse) by one thread; both give key ``i`` the same row.
        """
        n = keys.shape[0]
        st = self._store
        self._reserve(n)
        self._key_version += 1
        if st.free_top == 0 and n >= REGION_INSERT_MIN:
            made, _ = self._insert_regions(keys)
            if made is None:
                if not repeats:
                    raise RuntimeError("internal error: _insert got keys that were already present")
                # Rows past next_row were never handed out: nothing goes to the free list.
                index.delete(self._slots, keys, np.empty(n, np.int32), 0)
                return None
            return self._initialise(keys, made, initialise, into)
        out_rows = np.empty(n, dtype=np.int32)
        start = 0
        while True:
            limit = index.max_count(self._slots.shape[0])
            stop, self._count, st.next_row, st.free_top, _ = index.insert_missing(
                self._slots,
                keys,
                out_rows,
                start,
                self._count,
                limit,
                st.next_row,
                st.capacity,
                st.free_rows,
                st.free_top,
            )
            if stop == n:
                break
            start = stop
            if self._count >= limit:
                self._grow_index(self._count + (n - stop))
            else:
                st.add_chunk()
        created = out_rows < -1
        out_rows[created] = -2 - out_rows[created]
        if not created.all():
            if not repeats:
                raise RuntimeError("internal error: _insert got keys that were already present")
            inserted = keys[created]
            st.reserve_free_slots(inserted.shape[0])
            deleted, st.free_top = index.delete(self._slots, inserted, st.free_rows, st.free_top)
            self._count -= deleted
            return None
        capacity.bucket_counts(keys, self._bucket_rows, 1)
        return self._initialise(keys, out_rows, initialise, into)

    def _initialise(
        self,
        keys: Keys,
        out_rows: npt.NDArray[np.int32],
        initialise: bool,
        into: tuple[npt.NDArray[np.float32], npt.NDArray[np.intp]] | None,
    ) -> npt.NDArray[np.int32]:
        """When ``initialise``, write the initial values of the rows ``out_rows`` of the new
        ``keys`` (and to ``out[where]``); return ``out_rows``."""
        if not initialise:
            return out_rows
        st = self._store
        opt = self.optimizer
        loc, seed, init = st.loc, self._table_seed, self.initializer
        kind, hp, dim, width = opt.kind, self._hyper_params(), self.dim, self._state_width
        gen = np.int32(self.generation)
        out, dest = into if into is not None else (_NO_OUT, _NO_DEST)
        on_team = team.slices(keys.shape[0], keys, out_rows, out, dest)
        if on_team is not None:
            code = (init.code(), float(init.param))
            team.create_rows(
                on_team, loc, keys, out_rows, seed, code, kind, hp, dim, width, gen, out, dest
            )
            return out_rows
        threads.run(
            threads.slices(keys.shape[0]),
            lambda a, b: rows.create_rows(
                *loc, keys[a:b], out_rows[a:b], seed, init.code(), init.param,
                kind, hp, dim, width, gen, out, dest[a:b],
            ),
        )  # fmt: skip
        return out_rows

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more keys now (index and row chunks), so inserting them later
        neither rehashes nor allocates.

        Raises:
            MemoryLimitError: the room would pass the memory budget (nothing is allocated).
        """
        self._reserve(int(n))

    def _insert_new(self, keys: Keys) -> npt.NDArray[np.int32]:
        """Insert ``keys``, all absent and unique (a load into a table that was empty), into
        uninitialised rows; return their rows (``next_row + i`` for key ``i``), inserted by
        region on the table's threads (:meth:`_insert_regions`).

        Raises:
            TableKeyError: a key repeats or is already present (a damaged file).
        """
        n = keys.shape[0]
        self._reserve(n)
        self._key_version += 1
        made, dups = self._insert_regions(keys)
        if made is None:
            raise TableKeyError(
                f'Table "{self.name}": {dups} key(s) of a load repeat or are already present; '
                "the index is no longer usable. Load into a new table."
            )
        return made

    def _insert_regions(self, keys: Keys) -> tuple[npt.NDArray[np.int32] | None, int]:
        """Put absent ``keys`` into the index, key ``i`` with row ``next_row + i``, count them
        (keys, rows, buckets) and return ``(rows, 0)``; return ``(None, found)``, counting
        nothing, when ``found`` keys were already there (repeats: the other keys stay in
        the index).

        The home slots are hashed on the table's threads; the index's 16 fixed
        regions are cut into runs of about equal keys, one a thread (of torch's
        OpenMP team or the table's, :meth:`_by_region`), and each thread inserts
        the keys of its runs in key order. Keys whose probe would
        leave their region go in afterwards, in one thread. The caller has
        reserved the room (index and rows, none from the free list).
        """
        n = keys.shape[0]
        st = self._store
        first = st.next_row
        if st.free_top or self._count + n > index.max_count(self._slots.shape[0]):
            raise RuntimeError("internal error: a region insert needs reserved, never-used rows")
        deferred, dups, buckets = self._by_region(keys, first)
        dups += index.insert_new_serial(self._slots, keys, first, deferred)
        if dups:
            return None, int(dups)
        self._bucket_rows += buckets
        self._count += n
        st.next_row += n
        return np.arange(first, first + n, dtype=np.int32), 0

    def _by_region(
        self,
        keys: Keys,
        first: int,
        found: npt.NDArray[np.int32] | None = None,
        where: npt.NDArray[np.int64] | None = None,
    ) -> tuple[npt.NDArray[np.bool_], int, npt.NDArray[np.int64]]:
        """Insert ``keys`` by region (:func:`index.insert_new_regions`; given ``found`` and
        ``where``, find or insert them, :func:`index.find_or_insert_regions`), the runs
        of regions on torch's OpenMP team where it takes the call
        (:func:`team.insert_regions`), else on the table's threads. Return the keys
        deferred to a one-thread insert, the repeats found and the keys a bucket."""
        slots = self._slots
        homes, buckets, runs, shift, on_team = self._region_runs(keys)
        deferred = np.zeros(keys.shape[0], np.bool_)
        if on_team:
            dups = team.insert_regions(
                runs, slots, keys, homes, shift, first, deferred, found, where
            )
        else:

            def one_run(r0: int, r1: int) -> int:
                if found is None or where is None:
                    return index.insert_new_regions(
                        slots, keys, homes, r0, r1, shift, first, deferred
                    )
                return index.find_or_insert_regions(
                    slots, keys, homes, r0, r1, shift, first, deferred, found, where
                )

            dups = sum(threads.run(runs, one_run))
        return deferred, int(dups), buckets

    def _region_runs(
        self, keys: Keys
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], list[tuple[int, int]], int, bool]:
        """Hash ``keys`` to their home slots on the table's threads; return the homes, the
        keys a bucket, the runs of regions (one a thread, about equal keys each), the
        shift from a slot to its region and whether the runs go to torch's OpenMP team
        (where it takes a call of as many keys, :func:`team.slices`; the runs then
        follow each other, a run taking the regions without keys after it)."""
        n = keys.shape[0]
        slots = self._slots
        shift = (slots.shape[0] // index.REGIONS).bit_length() - 1
        homes = np.empty(n, np.int64)
        mask = slots.shape[0] - 1
        buckets: npt.NDArray[np.int64] = np.sum(
            threads.run(
                threads.slices(n), lambda a, b: index.homes_and_buckets(keys[a:b], mask, homes[a:b])
            ),
            axis=0,
        )
        per_region = buckets.reshape(index.REGIONS, -1).sum(axis=1)
        starts = np.concatenate([[0], np.cumsum(per_region)])
        on_team = team.slices(n, keys)
        if on_team is not None:
            runs = _region_parts(starts, len(on_team))
            if len(runs) > 1:
                ends = [a for a, _ in runs[1:]] + [runs[-1][1]]
                runs = [(a, e) for (a, _), e in zip(runs, ends, strict=True)]
                return homes, buckets, runs, shift, True
        runs = _region_parts(starts, threads.get_num_threads() if n >= threads.MIN_SLICE else 1)
        return homes, buckets, runs, shift, False

    def _reserve(self, n: int) -> None:
        """Allocate what ``n`` new keys need (index, row chunks), checking the memory budget
        first: on :class:`~tnrec.errors.MemoryLimitError` nothing has changed."""
        st = self._store
        new_rows = max(0, n - st.free_top - (st.capacity - st.next_row))
        chunks = -(-new_rows // st.chunk_rows)
        cap = self._slots.shape[0]
        grow = self._count + n > index.max_count(cap)
        if self.memory_budget is not None and (chunks or grow):
            extra = chunks * st.chunk_rows * st.stride * 4
            if grow:
                extra += index.capacity_for(self._count + n) * 12
            self.memory_budget.check(self, extra, f"adding {n} keys")
        if grow:
            self._grow_index(self._count + n)
        st.add_chunks(chunks)

    def _grow_index(self, need: int) -> None:
        """Rebuild the index with room for ``need`` keys. A big one is rebuilt region by
        region (:func:`index.rehash_regions`) on torch's OpenMP team where it takes the
        call (:func:`team.usable`), else on the table's threads; the result does not
        depend on the thread count."""
        cap = index.capacity_for(need)
        new = index.new_index(cap)
        old = self._slots
        if old.shape[0] < REGION_INSERT_MIN:
            index.rehash(old, new)
        else:
            per = old.shape[0] // index.REGIONS
            shifts = (per.bit_length() - 1, (cap // index.REGIONS).bit_length() - 1)
            k = threads.get_num_threads()
            runs = [(j * index.REGIONS // k, (j + 1) * index.REGIONS // k) for j in range(k)]
            runs = [(a, b) for a, b in runs if b > a]
            if team.usable(runs, old, new):
                deferred = team.rehash_regions(runs, old, new, *shifts)
            else:
                bufs = [np.empty((b - a) * per, np.int32) for a, b in runs]
                got = threads.run(
                    [(j, j + 1) for j in range(len(runs))],
                    lambda j, _: index.rehash_regions(old, new, *shifts, *runs[j], bufs[j]),
                )
                deferred = np.concatenate([b[:m] for b, m in zip(bufs, got, strict=True)])
            index.rehash_deferred(old, new, deferred)
        self._slots = new

    # ------------------------------------------------------------------ push

    def push(
        self,
        keys: Keys,
        grads: npt.NDArray[np.float32],
        show: npt.NDArray[np.float32],
        click: npt.NDArray[np.float32],
    ) -> None:
        """Apply one optimizer step to each key's row and add its statistics.

        Every key must be present and appear once; the optimizer rule runs
        exactly once per key. ``show`` and ``click`` are added to the row's
        counters, its unseen-days counter is reset to 0 and its marker set to
        :attr:`generation`. All inputs are validated in one compiled pass
        before anything is written: on error the table is unchanged.

        Args:
            keys: ``int64[n]``, unique, present.
            grads: ``float32[n, D]``, the gradient of each key summed over the step.
            show: ``float32[n]``, occurrences (or sample-weighted occurrences).
            click: ``float32[n]``, label-weighted occurrences.

        Raises:
            ArgumentError: wrong dtype or shape.
            TableKeyError: unknown or duplicate keys (with their counts).
            NonFiniteError: NaN or infinite gradient, show or click (with the count of keys).
        """
        k = self._check_keys(keys)
        n = k.shape[0]
        g = self._check_float(grads, "grads", (n, self.dim))
        s = self._check_float(show, "show", (n,))
        c = self._check_float(click, "click", (n,))
        st = self._store
        parts = threads.slices(n)
        known = self._remembered_rows(k)
        if known is not None:
            rws = known
            counts = threads.run(
                parts, lambda a, b: rows.check_rows(g[a:b], s[a:b], c[a:b], rws[a:b])
            )
        else:
            rws = np.empty(n, dtype=np.int32)
            slots = self._slots
            counts = threads.run(
                parts,
                lambda a, b: rows.check_lookup(slots, k[a:b], g[a:b], s[a:b], c[a:b], rws[a:b]),
            )
        unknown = sum(u for u, _ in counts)
        bad = sum(b for _, b in counts)
        dup = rows.count_row_duplicates(rws, st.bitmap)
        if self.admission is not None and unknown:
            # keys without a row are keys not admitted yet: they feed the sketch
            dup += index.count_duplicates(np.ascontiguousarray(k[rws < 0]))
            unknown = 0
        if unknown or dup:
            raise TableKeyError(
                f'Table "{self.name}": push got {unknown} unknown and {dup} duplicate key(s) '
                f"among {n}; nothing was updated. "
                "Push only keys pulled with create=True, once each."
            )
        if bad:
            raise NonFiniteError(
                f'Table "{self.name}": push got {bad} key(s) with a NaN or infinite gradient, '
                "show or click; nothing was updated."
            )
        self._apply(parts, rws, g, s, c)
        self._after_push(k, rws, s)

    def _after_push(self, keys: Keys, rws: npt.NDArray[np.int32], show: np.ndarray) -> None:
        """Count the shows of keys not admitted into the sketch; enforce the row cap."""
        if self._sketch is not None:
            miss = rws < 0
            if miss.any():
                self._sketch.add(keys[miss], show[miss])
        if self._caps is not None:
            self._enforce_cap(rws)

    def _enforce_cap(self, protect: npt.NDArray[np.int32]) -> None:
        """Evict every bucket above its share of ``max_rows`` down to its low water mark,
        never the rows in ``protect`` (the batch just pushed)."""
        caps = self._caps
        if caps is None:
            return
        over = self._bucket_rows > caps
        if not over.any():
            return
        low = np.floor(self.policy.low_water * caps).astype(np.int64)
        excess = np.where(over, self._bucket_rows - low, 0)
        bitmap = self._store.bitmap
        capacity.set_bits(bitmap, protect, True)
        try:
            victims = capacity.select_cap_victims(
                self._slots, self._store, self.stats_offset, self._bucket_rows, over, excess
            )
        finally:
            capacity.set_bits(bitmap, protect, False)
        self.counters["keys_evicted_cap"] += self.delete(victims)

    def _apply(
        self,
        parts: list[tuple[int, int]],
        rws: npt.NDArray[np.int32],
        g: npt.NDArray[np.float32],
        s: npt.NDArray[np.float32],
        c: npt.NDArray[np.float32],
    ) -> None:
        """Run the optimizer rule on ``rws`` (unique; ``-1`` skipped): on torch's team in its
        own slices (:func:`tnrec.table.team.slices`) where it can, else ``parts`` one a thread."""
        opt, loc = self.optimizer, self._store.loc
        kind, hp, dim, width = opt.kind, self._hyper_params(), self.dim, self._state_width
        gen = np.int32(self.generation)
        on_team = team.slices(rws.shape[0], rws, g, s, c)
        if on_team is not None:
            team.apply_push(on_team, loc, rws, g, s, c, kind, hp, width, gen)
            return
        threads.run(
            parts,
            lambda a, b: rows.apply_push(
                *loc, rws[a:b], g[a:b], s[a:b], c[a:b], kind, hp, dim, width, gen
            ),
        )

    def push_unchecked(
        self,
        keys: Keys,
        grads: npt.NDArray[np.float32],
        show: npt.NDArray[np.float32],
        click: npt.NDArray[np.float32],
    ) -> None:
        """Like :meth:`push` without validation, for inputs correct by construction.

        The caller guarantees unique present keys, contiguous float32 arrays of
        the right shapes and finite values. An unknown key is skipped and then
        reported as an internal error (a bug in the caller).
        """
        st = self._store
        opt = self.optimizer
        parts = threads.slices(keys.shape[0])
        known = self._remembered_rows(keys)
        if known is None and (self.admission is not None or self._caps is not None):
            known = np.empty(keys.shape[0], dtype=np.int32)
            rows.lookup_rows(self._slots, keys, known)
        if known is not None:
            unknown = int(np.count_nonzero(known < 0))
            self._apply(parts, known, grads, show, click)
            if self.admission is not None:
                unknown = 0
            self._after_push(keys, known, show)
        else:
            slots, loc = self._slots, st.loc
            kind, hp, dim, width = opt.kind, self._hyper_params(), self.dim, self._state_width
            gen = np.int32(self.generation)
            unknown = sum(
                threads.run(
                    parts,
                    lambda a, b: rows.lookup_apply(
                        slots, *loc, keys[a:b], grads[a:b], show[a:b], click[a:b],
                        kind, hp, dim, width, gen,
                    ),
                )
            )  # fmt: skip
        if unknown:
            raise RuntimeError(
                f'internal error: table "{self.name}": push_unchecked got {unknown} unknown key(s)'
            )

    # ------------------------------------------------------------------ lifecycle

    def show_decay(self, delta_days: int) -> None:
        """Decay statistics by elapsed days: ``show, click *= rate**delta_days``; age unseen days.

        Args:
            delta_days: whole days since the last decay, >= 0.

        Raises:
            ArgumentError: ``delta_days`` is not an int >= 0.
        """
        if (
            not isinstance(delta_days, (int, np.integer))
            or isinstance(delta_days, bool)
            or delta_days < 0
        ):
            raise ArgumentError(
                f'Table "{self.name}": `delta_days` must be an int >= 0. Received: {delta_days!r}.'
            )
        if delta_days == 0:
            return
        factor = float(self.policy.show_decay_rate) ** int(delta_days)
        st = self._store
        rows.decay(
            self._slots,
            *st.loc,
            factor,
            int(delta_days),
            self.stats_offset,
        )
        if self._sketch is not None:
            self._sketch.decay(factor)

    def evict(self) -> int:
        """Delete the rows the table's policy selects; free their rows for reuse.

        Returns:
            The number of keys deleted.
        """
        p = self.policy
        if not p.evicts or self._count == 0:
            return 0
        st = self._store
        victims = np.empty(self._count, dtype=np.int64)
        n = rows.select_evict(
            self._slots,
            *st.loc,
            self.stats_offset,
            p.show_threshold is not None,
            float(p.show_threshold if p.show_threshold is not None else 0.0),
            p.max_unseen_days is not None,
            int(p.max_unseen_days if p.max_unseen_days is not None else 0),
            p.combine == "all",
            victims,
        )
        return self.delete(victims[:n])

    def delete(self, keys: Keys) -> int:
        """Delete ``keys`` (absent keys are ignored); return how many were deleted."""
        k = self._check_keys(keys)
        st = self._store
        st.reserve_free_slots(k.shape[0])
        found = np.empty(k.shape[0], dtype=np.int32)
        index.lookup(self._slots, k, found)
        self._key_version += 1
        deleted, st.free_top = index.delete(self._slots, k, st.free_rows, st.free_top)
        capacity.bucket_counts(k[found >= 0], self._bucket_rows, -1)
        self._count -= deleted
        return int(deleted)


def _region_parts(starts: npt.NDArray[np.int64], k: int) -> list[tuple[int, int]]:
    """Cut the index's regions into at most ``k`` runs of about equal keys (``starts[r]``:
    how many keys the regions before ``r`` have), leaving out runs without keys. Keys in
    bucket order (a load) fall in one or two regions: they are inserted in the calling
    thread (their homes are still hashed on the table's threads)."""
    n = int(starts[-1])
    cuts = [0]
    for j in range(1, k):
        r = int(np.searchsorted(starts, j * n // k, side="left"))
        if cuts[-1] < r < index.REGIONS:
            cuts.append(r)
    cuts.append(index.REGIONS)
    runs = [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if starts[b] > starts[a]]
    return runs or [(0, 1)]
