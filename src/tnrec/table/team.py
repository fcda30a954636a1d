"""The step's hot table kernels on torch's own OpenMP team.

When torch's intra-op threads fill the cores, the workers of torch's OpenMP
runtime keep spinning for a while after each torch operation (libgomp's
``GOMP_SPINCOUNT``). A table kernel cut over Python threads
(:func:`tnrec.table.threads.run`) then shares a core with a spinning worker,
and in two threads it takes longer than in one. The kernels a training
step runs in several slices -- the pull's lookup and gather
(:func:`tnrec.table.rows.lookup_gather`), the new rows' initial values
(:func:`tnrec.table.rows.create_rows`), the push's optimizer rule
(:func:`tnrec.table.rows.apply_push`), the one-key pooling's forward
(:mod:`tnrec.layers.pooling`), and a creating pull's inserts and index growth
by region (:func:`tnrec.table.index.insert_new_regions`,
:func:`~tnrec.table.index.find_or_insert_regions`,
:func:`~tnrec.table.index.rehash_regions`; a slice is then a run of the
index's regions) -- therefore run on that very team when they can:
``GOMP_parallel`` of the OpenMP runtime torch loaded, with a compiled numba
``cfunc`` (a :class:`Body`) as the team's body. The spinning workers
take the slices at once, and no thread of ours competes with them.

The slices are cut as :func:`tnrec.table.threads.slices` cuts them, but
down to :data:`MIN_SLICE` keys (:func:`slices`): the team's workers are
already spinning, so a slice is worth handing over at a quarter of the
Python threads' minimum. Each slice is computed by the same kernel as on the
Python threads, so the results are the same whichever way a call runs (each
slice writes its own keys' outputs and rows). The team's threads take the
slices in turn from a shared counter.

A call runs on the team (:func:`usable`) when all of these hold; otherwise it
runs on the Python threads:

* ``TNREC_TABLE_TEAM`` is not ``0`` (``1`` runs every call of two or more
  slices on the team, whatever the thread and torch's thread count, as long
  as the runtime is found);
* torch is imported, its parallel backend is OpenMP, and exactly one
  OpenMP runtime is loaded, or one in torch's own ``lib`` directory (Linux:
  read from ``/proc/self/maps``; elsewhere the team is not used);
* the call comes from the main thread, whose OpenMP team torch's operations
  use, and torch runs at least as many threads as the call has slices, so
  the team's workers exist and would be spinning anyway.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt
from numba import types

from tnrec.table import index, rows, threads
from tnrec.table._llvm import (
    _f32_ptr,
    _f64_ptr,
    _fetch_add,
    _i32_ptr,
    _i64_ptr,
    _u8_ptr,
    _u64_ptr,
)

__all__ = [
    "HEAD",
    "Body",
    "address",
    "apply_push",
    "create_rows",
    "insert_regions",
    "lookup_gather",
    "MIN_SLICE",
    "next_slice",
    "rehash_regions",
    "run",
    "slices",
    "usable",
    "warm",
]

_ENV = "TNREC_TABLE_TEAM"

# The block a team's body reads, int64 throughout:
#   [0]               the next slice to take (the threads add 1 atomically)
#   [1]               P, the slices
#   [2 .. P + 2]      the bounds: slice p is [bounds[p], bounds[p + 1])
#   [P + 3 .. 2P + 3) each slice's result
#   [2P + 3 ..]       the kernel's arguments (addresses, sizes, scalars)
HEAD = 3


@nb.njit(nogil=True, cache=True, inline="always")
def next_slice(addr: int) -> int:  # pragma: no cover - compiled
    """The next slice for this thread to take from the block at ``addr`` (>= P: none left)."""
    return _fetch_add(addr, 1)


class Body:
    """A team's body: ``fn(addr)``, compiled as a numba ``cfunc`` on first use.

    ``fn`` reads the block at ``addr`` (layout above) and, until
    :func:`next_slice` returns P or more, runs its kernel on slice
    ``[bounds[p], bounds[p + 1])``, writing the slice's result (if any) to
    ``block[HEAD + P + p]``. Every body made is compiled by :func:`warm`.
    """

    def __init__(self, fn: Callable[[int], None]) -> None:
        self.fn = fn
        self._cfunc: Any = None  # kept alive: the team calls its address
        _made.append(self)

    def address(self) -> int:
        """The compiled body's address (compiled, or loaded from numba's cache, once)."""
        if self._cfunc is None:
            with _lock:
                if self._cfunc is None:
                    self._cfunc = nb.cfunc(types.void(types.int64), cache=True)(self.fn)
        got = self._cfunc.address
        if got is None:  # pragma: no cover - a compiled cfunc has one
            raise RuntimeError(f"internal error: the team body {self.fn.__name__} has no address")
        return int(got)


_made: list[Body] = []
_lock = threading.Lock()


@nb.njit(nogil=True, cache=True, inline="always")
def _loc_at(addr: int, at: int) -> Any:  # pragma: no cover - compiled
    """The row chunks' location ``(bases, stride, shift, lmask)`` that the block at ``addr``
    holds from ``block[at]`` on (written by :func:`_loc_args`)."""
    b = _i64_ptr(addr)
    return nb.carray(_i64_ptr(b[at]), (b[at + 1],)), b[at + 2], b[at + 3], b[at + 4]


def _lookup_gather_body(addr: int) -> None:  # pragma: no cover - compiled
    b = _i64_ptr(addr)
    P = b[1]
    a = HEAD + 2 * P
    slots = nb.carray(_i32_ptr(b[a]), (b[a + 1], 3))
    bases, stride, shift, lmask = _loc_at(addr, a + 2)
    n, D = b[a + 7], b[a + 8]
    keys = nb.carray(_i64_ptr(b[a + 9]), (n,))
    found = nb.carray(_i32_ptr(b[a + 10]), (n,))
    out = nb.carray(_f32_ptr(b[a + 11]), (n, D))
    while True:
        p = next_slice(addr)
        if p >= P:
            return
        lo, hi = b[2 + p], b[3 + p]
        b[HEAD + P + p] = rows.lookup_gather(
            slots, bases, stride, shift, lmask, keys[lo:hi], found[lo:hi], out[lo:hi], D
        )


def _apply_push_body(addr: int) -> None:  # pragma: no cover - compiled
    b = _i64_ptr(addr)
    P = b[1]
    a = HEAD + 2 * P
    bases, stride, shift, lmask = _loc_at(addr, a)
    n, D, S, kind, gen = b[a + 5], b[a + 6], b[a + 7], b[a + 8], np.int32(b[a + 9])
    hp = nb.carray(_f64_ptr(b[a + 10]), (b[a + 11],))
    found = nb.carray(_i32_ptr(b[a + 12]), (n,))
    grads = nb.carray(_f32_ptr(b[a + 13]), (n, D))
    show = nb.carray(_f32_ptr(b[a + 14]), (n,))
    click = nb.carray(_f32_ptr(b[a + 15]), (n,))
    while True:
        p = next_slice(addr)
        if p >= P:
            return
        lo, hi = b[2 + p], b[3 + p]
        rows.apply_push(
            bases, stride, shift, lmask, found[lo:hi], grads[lo:hi], show[lo:hi],
            click[lo:hi], kind, hp, D, S, gen,
        )  # fmt: skip


def _create_rows_body(addr: int) -> None:  # pragma: no cover - compiled
    b = _i64_ptr(addr)
    P = b[1]
    a = HEAD + 2 * P
    bases, stride, shift, lmask = _loc_at(addr, a)
    n, D, S = b[a + 5], b[a + 6], b[a + 7]
    keys = nb.carray(_i64_ptr(b[a + 8]), (n,))
    made = nb.carray(_i32_ptr(b[a + 9]), (n,))
    seed = _u64_ptr(b[a + 10])[0]
    init_kind, init_param = b[a + 11], _f64_ptr(b[a + 12])[0]
    kind, gen = b[a + 13], np.int32(b[a + 14])
    hp = nb.carray(_f64_ptr(b[a + 15]), (b[a + 16],))
    out = nb.carray(_f32_ptr(b[a + 17]), (b[a + 18], b[a + 19]))
    dest = nb.carray(_i64_ptr(b[a + 20]), (b[a + 21],))
    while True:
        p = next_slice(addr)
        if p >= P:
            return
        lo, hi = b[2 + p], b[3 + p]
        rows.create_rows(
            bases, stride, shift, lmask, keys[lo:hi], made[lo:hi], seed, init_kind,
            init_param, kind, hp, D, S, gen, out, dest[lo:hi],
        )  # fmt: skip


def _insert_regions_body(addr: int) -> None:  # pragma: no cover - compiled
    # A slice is a run of the index's regions, [bounds[p], bounds[p + 1]).
    b = _i64_ptr(addr)
    P = b[1]
    a = HEAD + 2 * P
    slots = nb.carray(_i32_ptr(b[a]), (b[a + 1], 3))
    n, shift, first, track = b[a + 2], b[a + 3], b[a + 4], b[a + 5]
    keys = nb.carray(_i64_ptr(b[a + 6]), (n,))
    homes = nb.carray(_i64_ptr(b[a + 7]), (n,))
    deferred = nb.carray(_u8_ptr(b[a + 8]), (n,))
    found = nb.carray(_i32_ptr(b[a + 9]), (b[a + 10],))
    where = nb.carray(_i64_ptr(b[a + 11]), (b[a + 12],))
    while True:
        p = next_slice(addr)
        if p >= P:
            return
        r0, r1 = b[2 + p], b[3 + p]
        if track:
            b[HEAD + P + p] = index.find_or_insert_regions(
                slots, keys, homes, r0, r1, shift, first, deferred, found, where
            )
        else:
            b[HEAD + P + p] = index.insert_new_regions(
                slots, keys, homes, r0, r1, shift, first, deferred
            )


def _rehash_regions_body(addr: int) -> None:  # pragma: no cover - compiled
    # A slice is a run of the old index's regions; region r's deferred slots go to
    # deferred[r << old_shift ...], so that runs never share an element.
    b = _i64_ptr(addr)
    P = b[1]
    a = HEAD + 2 * P
    old = nb.carray(_i32_ptr(b[a]), (b[a + 1], 3))
    new = nb.carray(_i32_ptr(b[a + 2]), (b[a + 3], 3))
    old_shift, new_shift = b[a + 4], b[a + 5]
    deferred = nb.carray(_i32_ptr(b[a + 6]), (b[a + 1],))
    while True:
        p = next_slice(addr)
        if p >= P:
            return
        r0, r1 = b[2 + p], b[3 + p]
        b[HEAD + P + p] = index.rehash_regions(
            old, new, old_shift, new_shift, r0, r1, deferred[r0 << old_shift : r1 << old_shift]
        )


_LOOKUP_GATHER = Body(_lookup_gather_body)
_APPLY_PUSH = Body(_apply_push_body)
_CREATE_ROWS = Body(_create_rows_body)
_INSERT_REGIONS = Body(_insert_regions_body)
_REHASH_REGIONS = Body(_rehash_regions_body)


class _Team:
    """The OpenMP runtime torch loaded."""

    def __init__(self, parallel: Any) -> None:
        self.parallel = parallel  # GOMP_parallel(fn, data, num_threads, flags)


_team: _Team | None = None
_looked = False


def _find_runtime(torch: Any) -> _Team | None:
    """Return the OpenMP runtime of ``torch`` (the module), or None when it cannot be told
    for sure."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps") as f:
            paths = {
                line.split()[-1] for line in f if line.rstrip().endswith((".so", ".so.1", ".so.5"))
            }
    except OSError:
        return None
    names = ("libgomp", "libomp", "libiomp5")
    found = sorted(p for p in paths if os.path.basename(p).startswith(names))
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib") + os.sep
    own = [p for p in found if p.startswith(torch_lib)]
    candidates = own if own else found
    if len(candidates) != 1:
        return None
    try:  # RTLD_NOLOAD: the copy already in the process, never a second one
        lib = ctypes.CDLL(candidates[0], mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
        parallel = lib.GOMP_parallel
    except (OSError, AttributeError):
        return None
    parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    parallel.restype = None
    return _Team(parallel)


def _get_team() -> _Team | None:
    """torch's OpenMP runtime; None while torch is not imported (tnrec's tables do not
    import it: a process that never runs a torch operation has no team to share)."""
    global _team, _looked
    if not _looked:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        with _lock:
            if not _looked:
                _team = _find_runtime(torch)
                _looked = True
    return _team


def _forget_in_child() -> None:
    # A forked child has none of the parent's OpenMP threads: it keeps to the Python threads.
    global _team, _looked
    _team, _looked = None, True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def warm() -> None:
    """Compile (or load from numba's cache) every body made so far."""
    for body in list(_made):
        body.address()


def usable(parts: Sequence[tuple[int, int]], *arrays: np.ndarray) -> bool:
    """Whether a call cut into ``parts`` over ``arrays`` runs on torch's OpenMP team (the
    module docstring; the arrays must be C-contiguous)."""
    if len(parts) < 2 or not all(a.flags.c_contiguous for a in arrays):
        return False
    mode = os.environ.get(_ENV, "").strip()
    if mode == "0" or _get_team() is None:
        return False
    if mode == "1":
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    return bool(sys.modules["torch"].get_num_threads() >= len(parts))


#: Keys a slice of a call on the team gets at least (four times fewer than
#: :data:`tnrec.table.threads.MIN_SLICE`): the workers take a slice as soon as
#: it is posted, where a Python thread is woken and must get the GIL. Pull and push
#: of a 1M-key table of dim 16 right after a torch operation, at 2 threads: two
#: slices beat one from about 3,000 keys (ad hoc, CHANGELOG stop 61).
MIN_SLICE = 2048


def slices(n: int, *arrays: np.ndarray) -> list[tuple[int, int]] | None:
    """The slices a call over ``n`` keys of ``arrays`` runs in on the team (two or more of
    at least :data:`MIN_SLICE` keys), or None where it runs on the Python threads
    (:func:`usable` says no)."""
    parts = threads.slices(n, MIN_SLICE)
    return parts if usable(parts, *arrays) else None


def run(body: Body, parts: Sequence[tuple[int, int]], args: list[int]) -> npt.NDArray[np.int64]:
    """Run ``body`` over ``parts`` with ``args`` on the team (after :func:`usable` said so);
    return each slice's result."""
    team = _get_team()
    if team is None:  # pragma: no cover - callers check usable() first
        raise RuntimeError("internal error: no OpenMP team to run a table kernel on")
    P = len(parts)
    if any(parts[i][1] != parts[i + 1][0] for i in range(P - 1)):
        raise RuntimeError(f"internal error: a team's slices must follow each other: {parts}")
    block = np.empty(HEAD + 2 * P + len(args), np.int64)
    block[0] = 0
    block[1] = P
    block[2 : 3 + P] = [a for a, _ in parts] + [parts[-1][1]]
    block[HEAD + P : HEAD + 2 * P] = 0
    block[HEAD + 2 * P :] = args
    team.parallel(body.address(), block.ctypes.data, P, 0)
    return block[HEAD + P : HEAD + 2 * P].copy()


def address(a: np.ndarray, dtype: Any, ndim: int) -> int:
    """The address of ``a``'s data, for a block; an internal error unless ``a`` is a
    C-contiguous ``dtype`` array of ``ndim`` dimensions."""
    if a.dtype != dtype or a.ndim != ndim or not a.flags.c_contiguous:
        raise RuntimeError(
            f"internal error: a team kernel got a {a.dtype} array of {a.ndim} dimension(s) "
            f"(C-contiguous: {a.flags.c_contiguous}); expected C-contiguous {np.dtype(dtype)}, "
            f"{ndim} dimension(s)"
        )
    return int(a.ctypes.data)


def _same_rows(*arrays: np.ndarray) -> None:
    """An internal error unless ``arrays`` have as many rows each (a body reads ``n`` of each)."""
    if len({a.shape[0] for a in arrays}) != 1:
        raise RuntimeError(
            f"internal error: a team kernel got arrays of {[a.shape[0] for a in arrays]} rows"
        )


def _loc_args(loc: tuple[np.ndarray, int, int, int]) -> list[int]:
    """The block's entries for the row chunks' location ``loc`` (read by :func:`_loc_at`)."""
    bases, stride, shift, lmask = loc
    return [address(bases, np.int64, 1), bases.shape[0], stride, shift, lmask]


def lookup_gather(
    parts: Sequence[tuple[int, int]],
    slots: np.ndarray,
    loc: tuple[np.ndarray, int, int, int],
    keys: np.ndarray,
    found: np.ndarray,
    out: np.ndarray,
) -> int:
    """:func:`tnrec.table.rows.lookup_gather` over ``parts`` on the team; return the
    keys absent from the index."""
    _same_rows(keys, found, out)
    args = [
        address(slots, np.int32, 2), slots.shape[0], *_loc_args(loc), keys.shape[0], out.shape[1],
        address(keys, np.int64, 1), address(found, np.int32, 1), address(out, np.float32, 2),
    ]  # fmt: skip
    return int(run(_LOOKUP_GATHER, parts, args).sum())


def apply_push(
    parts: Sequence[tuple[int, int]],
    loc: tuple[np.ndarray, int, int, int],
    found: np.ndarray,
    grads: np.ndarray,
    show: np.ndarray,
    click: np.ndarray,
    kind: int,
    hp: np.ndarray,
    S: int,
    gen: int | np.int32,
) -> None:
    """:func:`tnrec.table.rows.apply_push` over ``parts`` on the team."""
    _same_rows(found, grads, show, click)
    args = [
        *_loc_args(loc), found.shape[0], grads.shape[1], S, kind, int(gen),
        address(hp, np.float64, 1), hp.shape[0],
        address(found, np.int32, 1), address(grads, np.float32, 2),
        address(show, np.float32, 1), address(click, np.float32, 1),
    ]  # fmt: skip
    run(_APPLY_PUSH, parts, args)


def create_rows(
    parts: Sequence[tuple[int, int]],
    loc: tuple[np.ndarray, int, int, int],
    keys: np.ndarray,
    made: np.ndarray,
    seed: np.uint64,
    init: tuple[int, float],
    kind: int,
    hp: np.ndarray,
    D: int,
    S: int,
    gen: int | np.int32,
    out: np.ndarray,
    dest: np.ndarray,
) -> None:
    """:func:`tnrec.table.rows.create_rows` over ``parts`` on the team (``init``: the
    initializer's code and parameter; ``dest`` empty, or one row of ``out`` a key)."""
    _same_rows(keys, made)
    if dest.shape[0] and dest.shape[0] != keys.shape[0]:
        raise RuntimeError(
            f"internal error: a team kernel got {dest.shape[0]} output rows "
            f"for {keys.shape[0]} keys"
        )
    seed_at = np.array([seed], np.uint64)  # the body reads both through their addresses
    param_at = np.array([init[1]], np.float64)
    args = [
        *_loc_args(loc), keys.shape[0], D, S,
        address(keys, np.int64, 1), address(made, np.int32, 1),
        address(seed_at, np.uint64, 1), init[0], address(param_at, np.float64, 1),
        kind, int(gen), address(hp, np.float64, 1), hp.shape[0],
        address(out, np.float32, 2), out.shape[0], out.shape[1],
        address(dest, np.int64, 1), dest.shape[0],
    ]  # fmt: skip
    run(_CREATE_ROWS, parts, args)


def insert_regions(
    runs: Sequence[tuple[int, int]],
    slots: np.ndarray,
    keys: np.ndarray,
    homes: np.ndarray,
    shift: int,
    first: int,
    deferred: np.ndarray,
    found: np.ndarray | None = None,
    where: np.ndarray | None = None,
) -> int:
    """:func:`tnrec.table.index.insert_new_regions` (or, given ``found`` and ``where``,
    :func:`~tnrec.table.index.find_or_insert_regions`) over ``runs`` of the index's
    regions on the team, one run a slice; return the repeats found. The runs must
    follow each other, and each should hold keys: a run reads every key's home
    to pick its own."""
    _same_rows(keys, homes, deferred)
    track = found is not None and where is not None
    f = found if found is not None and track else np.empty(0, np.int32)
    w = where if where is not None and track else np.empty(0, np.int64)
    if track:
        _same_rows(keys, f, w)
    args = [
        address(slots, np.int32, 2), slots.shape[0], keys.shape[0], shift, first, int(track),
        address(keys, np.int64, 1), address(homes, np.int64, 1),
        address(deferred.view(np.uint8), np.uint8, 1),
        address(f, np.int32, 1), f.shape[0], address(w, np.int64, 1), w.shape[0],
    ]  # fmt: skip
    return int(run(_INSERT_REGIONS, runs, args).sum())


def rehash_regions(
    runs: Sequence[tuple[int, int]],
    old: np.ndarray,
    new: np.ndarray,
    old_shift: int,
    new_shift: int,
) -> npt.NDArray[np.int32]:
    """:func:`tnrec.table.index.rehash_regions` over ``runs`` of the old index's regions on
    the team, one run a slice; return the deferred old slots, in slot order (for
    :func:`~tnrec.table.index.rehash_deferred`)."""
    deferred = np.empty(old.shape[0], np.int32)
    args = [
        address(old, np.int32, 2), old.shape[0], address(new, np.int32, 2), new.shape[0],
        old_shift, new_shift, address(deferred, np.int32, 1),
    ]  # fmt: skip
    got = run(_REHASH_REGIONS, runs, args)
    starts = [r0 << old_shift for r0, _ in runs]
    return np.concatenate([deferred[a : a + m] for a, m in zip(starts, got, strict=True)])
