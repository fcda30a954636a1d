"""Threaded table kernels: any thread count gives the same table as one thread.

``MIN_SLICE`` is lowered so that batches of a few hundred keys already run in
several slices; each test compares whole tables (weights, optimizer state,
statistics) after the same calls with 1 thread and with 3.
"""

import os

import numpy as np
import pytest

from tnrec.errors import ArgumentError, NonFiniteError, TableKeyError
from tnrec.table import SGD, AdaGrad, Adam, Ftrl, SparseTable, threads


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(threads, "MIN_SLICE", 16)
    before = threads.get_num_threads()
    yield
    threads.set_num_threads(before)


def _run(opt, n_threads, steps=4):
    """Pull (creating), push checked and unchecked, over overlapping batches."""
    threads.set_num_threads(n_threads)
    rng = np.random.default_rng(3)
    t = SparseTable(6, opt, name="t")
    for step in range(steps):
        keys = np.unique(rng.integers(-400, 400, size=300)).astype(np.int64)
        rng.shuffle(keys)
        t.pull(keys)
        g = rng.standard_normal((keys.shape[0], 6)).astype(np.float32)
        show = np.ones(keys.shape[0], np.float32)
        click = (rng.random(keys.shape[0]) < 0.3).astype(np.float32)
        if step % 2:
            t.push_unchecked(keys, g, show, click)
        else:
            t.push(keys, g, show, click)
        # a push of other keys than the last pull's takes the lookup kernels
        other = keys[::-1].copy()
        t.push(other, 0.1 * g, show, click)
        t.push_unchecked(other, 0.1 * g, show, click)
        t.pull_unchecked(other, create=False)
    return t


@pytest.mark.parametrize(
    "opt", [SGD(0.1), AdaGrad(0.05), Adam(0.01), Ftrl(0.1, l1=0.01)], ids=lambda o: type(o).__name__
)
def test_threads_give_the_same_table_as_one_thread(small_slices, opt):
    threads.set_num_threads(4)
    assert len(threads.slices(300)) == 4  # batches of ~300 keys really run in slices
    one = _run(opt, 1)
    three = _run(opt, 3)
    assert len(threads.slices(300)) == 3
    k1, r1 = one.records()
    k3, r3 = three.records()
    np.testing.assert_array_equal(k1, k3)
    np.testing.assert_array_equal(r1, r3)
    q = np.arange(-500, 500, dtype=np.int64)
    np.testing.assert_array_equal(one.pull(q, create=False), three.pull(q, create=False))


def test_threaded_pull_creates_each_new_key_once(small_slices):
    threads.set_num_threads(4)
    t = SparseTable(3, AdaGrad(), name="t")
    keys = np.arange(1000, dtype=np.int64) * 7919
    w = t.pull(keys)
    assert len(t) == 1000
    np.testing.assert_array_equal(t.pull(keys), w)  # existing now, same rows
    threads.set_num_threads(1)
    ref = SparseTable(3, AdaGrad(), name="t")
    np.testing.assert_array_equal(ref.pull(keys), w)


def test_threaded_errors_leave_the_table_unchanged(small_slices):
    threads.set_num_threads(3)
    t = SparseTable(2, SGD(0.5), name="t")
    keys = np.arange(600, dtype=np.int64)
    t.pull(keys)
    before = t.records()[1].copy()
    dup = keys.copy()
    dup[599] = 0  # the duplicate sits in another slice than its first occurrence
    with pytest.raises(TableKeyError, match="1 duplicate"):
        t.pull(dup)
    g = np.ones((600, 2), np.float32)
    ones = np.ones(600, np.float32)
    with pytest.raises(TableKeyError, match="0 unknown and 1 duplicate"):
        t.push(dup, g, ones, ones)
    unknown = keys.copy()
    unknown[450] = 10**12
    with pytest.raises(TableKeyError, match="1 unknown"):
        t.push(unknown, g, ones, ones)
    bad = g.copy()
    bad[500, 1] = np.nan
    bad[10, 0] = np.inf
    with pytest.raises(NonFiniteError, match="2 key"):
        t.push(keys, bad, ones, ones)
    np.testing.assert_array_equal(t.records()[1], before)
    assert len(t) == 600


def test_run_returns_results_in_order_and_raises_after_all_slices(small_slices):
    threads.set_num_threads(3)
    parts = threads.slices(90)
    assert parts == [(0, 30), (30, 60), (60, 90)]
    assert threads.run(parts, lambda a, b: (a, b)) == parts
    done = []

    def fn(a, b):
        done.append(a)
        if a == 30:
            raise ValueError("slice 2")
        return a

    with pytest.raises(ValueError, match="slice 2"):
        threads.run(parts, fn)
    assert sorted(done) == [0, 30, 60]


def test_slices_cover_every_size(small_slices):
    threads.set_num_threads(4)
    for n in [0, 1, 15, 16, 31, 32, 33, 64, 65, 1000, 1001]:
        parts = threads.slices(n)
        assert parts[0][0] == 0 and parts[-1][1] == n
        assert all(a < b or n == 0 for a, b in parts)
        assert all(parts[i][1] == parts[i + 1][0] for i in range(len(parts) - 1))
        assert len(parts) <= 4 and (len(parts) == 1 or min(b - a for a, b in parts) >= 8)


def test_thread_count_arguments(monkeypatch):
    with pytest.raises(ArgumentError, match="int >= 1"):
        threads.set_num_threads(0)
    with pytest.raises(ArgumentError, match="int >= 1"):
        threads.set_num_threads(True)
    monkeypatch.setenv("TNREC_TABLE_THREADS", "two")
    with pytest.raises(ArgumentError, match="TNREC_TABLE_THREADS.*'two'"):
        threads._default_threads()
    monkeypatch.setenv("TNREC_TABLE_THREADS", "3")
    assert threads._default_threads() == 3
    with pytest.raises(ArgumentError, match=r"set_local_workers\(n\): .* Received: 0"):
        threads.set_local_workers(0)


@pytest.fixture
def fresh_count(monkeypatch):
    """The thread count of a new process (never set, one worker on the machine), restored after."""
    monkeypatch.delenv("TNREC_TABLE_THREADS", raising=False)
    monkeypatch.setattr(threads, "_num_threads", None)
    monkeypatch.setattr(threads, "_explicit", False)
    monkeypatch.setattr(threads, "_local_workers", 1)
    yield
    with threads._lock:
        threads._drop_pool()  # sized for this test's count


def test_default_count_is_the_cpus_over_the_local_workers_at_most_4(fresh_count, monkeypatch):
    cpus = len(os.sched_getaffinity(0))
    assert threads.get_local_workers() == 1  # no strategy told the table otherwise
    assert threads.get_num_threads() == max(1, min(cpus, 4))
    # the launcher's environment is read by tnrec.distribute, never by the table
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert threads.get_num_threads() == max(1, min(cpus, 4))
    threads.set_local_workers(2)  # what PsStrategy does under LOCAL_WORLD_SIZE=2
    assert threads.get_num_threads() == max(1, min(cpus // 2, 4))
    threads.set_local_workers(cpus + 1)  # more workers than CPUs: one thread each
    assert threads.get_num_threads() == 1
    threads.set_local_workers(1)
    assert threads.get_num_threads() == max(1, min(cpus, 4))


@pytest.mark.parametrize(
    "choose",
    [
        pytest.param(lambda mp: threads.set_num_threads(3), id="set_num_threads"),
        pytest.param(lambda mp: mp.setenv("TNREC_TABLE_THREADS", "3"), id="TNREC_TABLE_THREADS"),
    ],
)
def test_a_chosen_count_is_kept_whatever_the_local_workers(fresh_count, monkeypatch, choose):
    choose(monkeypatch)
    threads.set_local_workers(2)
    assert threads.get_num_threads() == 3
    threads.set_local_workers(1)
    assert threads.get_num_threads() == 3


def test_a_core_beside_torch_is_one_torchs_threads_leave(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "cpus_per_worker", lambda: 4)
    try:
        for n, free in ((4, False), (6, False), (3, True), (1, True)):
            torch.set_num_threads(n)
            assert threads.core_beside_torch() is free, n
    finally:
        torch.set_num_threads(before)
