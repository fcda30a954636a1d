"""Run a table kernel over slices of one batch in a few threads.

The table kernels are numba functions compiled with ``nogil=True`` and cached.
A large batch is cut into contiguous slices, one a thread; each thread runs
the same compiled kernel on its slice's views, and the calling thread runs the
first slice itself. Slices never share an output element, and the kernels run
this way only read the index (lookups) or write rows that are distinct by
contract (a push's keys are unique), so no locking is needed. Inserting keys
into the index stays single-threaded.

Why not numba's ``parallel=True``: kernels compiled with it and loaded from
numba's on-disk cache crashed (segfault) in processes that had imported torch,
under both the OpenMP and the workqueue threading layers. Plain threads over
cached ``nogil`` kernels avoid numba's threading layer altogether.

The thread count is ``TNREC_TABLE_THREADS`` when set, else the number of CPUs
this process may run on divided by the workers sharing this machine, at least
1 and at most 4; :func:`set_num_threads` changes it. The table does not read
the launcher's environment: :class:`tnrec.distribute.PsStrategy`, which does,
tells it how many workers share the machine (``LOCAL_WORLD_SIZE``) through
:func:`set_local_workers`; without a strategy a process counts as alone. Batches
below ``2 * MIN_SLICE`` keys run in the calling thread alone (a thread
hand-off costs tens of microseconds, about a thousand keys of work).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

from tnrec.errors import ArgumentError

__all__ = [
    "MIN_SLICE",
    "core_beside_torch",
    "cpus_per_worker",
    "get_local_workers",
    "get_num_threads",
    "run",
    "set_local_workers",
    "set_num_threads",
    "side_thread",
    "slices",
    "spare_core",
]

MIN_SLICE = 8192  # keys a thread gets at least
_MAX_DEFAULT = 4
_ENV = "TNREC_TABLE_THREADS"

T = TypeVar("T")


def _default_threads() -> int:
    text = os.environ.get(_ENV)
    if text is not None and text.strip():
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise ArgumentError(
                f"{_ENV} must be an integer >= 1 (the table kernels' thread count). "
                f"Received: {text!r}."
            )
        return n
    return max(1, min(cpus_per_worker(), _MAX_DEFAULT))


def cpus_per_worker() -> int:
    """The CPUs this process may run on, divided by the workers sharing the machine
    (:func:`set_local_workers`), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // _local_workers)


def spare_core(busy: int) -> bool:
    """Whether this worker's CPUs (:func:`cpus_per_worker`) hold ``busy`` threads (torch's,
    the caller passes them) and the table kernels' (:func:`get_num_threads`) together:
    whether a second thread of table work beside the caller has a core to itself."""
    return busy + get_num_threads() <= cpus_per_worker()


def core_beside_torch() -> bool:
    """Whether this worker's CPUs (:func:`cpus_per_worker`) hold more threads than torch's
    (one when torch is not imported): whether a thread that works beside the step all
    along, as a reader's prefetch thread does (:func:`tnrec.data.prefetch_depth`), has a
    core to itself. Unlike :func:`spare_core` it does not count the table kernels'
    threads, which run only inside the step's own table calls."""
    import sys

    torch = sys.modules.get("torch")
    busy = torch.get_num_threads() if torch is not None else 1
    return busy < cpus_per_worker()


_local_workers = 1  # workers sharing this machine's CPUs (set_local_workers)
_num_threads: int | None = None  # None: the default, computed on first use
_explicit = False  # set_num_threads chose the count: set_local_workers keeps it
_pool: ThreadPoolExecutor | None = None
_side: ThreadPoolExecutor | None = None  # side_thread()
_lock = threading.Lock()


def get_num_threads() -> int:
    """Return how many threads a large table call uses (the caller included)."""
    global _num_threads
    if _num_threads is None:
        _num_threads = _default_threads()
    return _num_threads


def set_num_threads(n: int) -> None:
    """Use ``n`` threads (the caller included) for large pulls, pushes and inserts.

    ``1`` runs every kernel in the calling thread. Results do not depend on
    the thread count: each key's row is read or written by exactly one thread.

    Raises:
        ArgumentError: ``n`` is not an int >= 1.
    """
    global _num_threads, _explicit
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"set_num_threads(n): n must be an int >= 1. Received: {n!r}.")
    with _lock:
        _num_threads = n
        _explicit = True
        _drop_pool()


def get_local_workers() -> int:
    """Return how many workers share this machine's CPUs (1 without a strategy)."""
    return _local_workers


def set_local_workers(n: int) -> None:
    """Share this machine's CPUs among ``n`` workers: the default count is ``CPUs // n``.

    The default stays at least 1 and at most 4.

    :class:`tnrec.distribute.PsStrategy` calls it with the launcher's
    ``LOCAL_WORLD_SIZE`` when it is created and with 1 when it shuts down. A
    count chosen by :func:`set_num_threads` or ``TNREC_TABLE_THREADS`` is kept.

    Raises:
        ArgumentError: ``n`` is not an int >= 1.
    """
    global _local_workers, _num_threads
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"set_local_workers(n): n must be an int >= 1. Received: {n!r}.")
    with _lock:
        if n == _local_workers:
            return
        _local_workers = n
        if not _explicit:
            _num_threads = None  # recomputed on next use
            _drop_pool()


def _drop_pool() -> None:
    """Shut the pool down (under ``_lock``); the next threaded call starts one of the new size."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    workers = max(1, get_num_threads() - 1)
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tnrec-table")
        return _pool


def side_thread() -> ThreadPoolExecutor:
    """One thread for work beside the caller's own (the push beside the dense optimizer
    step, :func:`tnrec.steps.push_beside_dense_step`), started on first use."""
    global _side
    with _lock:
        if _side is None:
            _side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tnrec-side")
        return _side


def _forget_pool_in_child() -> None:
    # A forked child inherits the pool objects but not their threads.
    global _pool, _side
    _pool = None
    _side = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def slices(n: int, min_slice: int | None = None) -> list[tuple[int, int]]:
    """Cut ``range(n)`` into at most :func:`get_num_threads` slices of >= ``min_slice``
    keys (default :data:`MIN_SLICE`)."""
    least = MIN_SLICE if min_slice is None else min_slice
    parts = max(1, min(get_num_threads(), n // least))
    if parts == 1:
        return [(0, n)]
    step = -(-n // parts)
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def run(parts: list[tuple[int, int]], fn: Callable[[int, int], T]) -> list[T]:
    """Call ``fn(a, b)`` for each slice, the first in this thread; return results in order.

    An exception in any slice is raised here after every slice has finished.
    """
    if len(parts) == 1:
        return [fn(*parts[0])]
    pool = _get_pool()
    futures: list[Future[T]] = [pool.submit(fn, a, b) for a, b in parts[1:]]
    try:
        first = fn(*parts[0])
    except BaseException:
        wait(futures)  # no slice may still be writing when the caller sees the error
        raise
    wait(futures)
    return [first, *(f.result() for f in futures)]
