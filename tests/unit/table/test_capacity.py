"""Row caps (per bucket, never the pushed batch) and the memory limit (an error before OOM)."""

import numpy as np
import pytest

from tnrec.errors import ArgumentError, MemoryLimitError
from tnrec.table import (
    SGD,
    AdaGrad,
    EvictionPolicy,
    MemoryBudget,
    SparseTable,
    bucket_of,
)
from tnrec.table.capacity import bucket_caps


def push_all(t, keys, show=None):
    t.pull_unchecked(keys)
    n = keys.shape[0]
    s = np.ones(n, np.float32) if show is None else show
    t.push_unchecked(keys, np.ones((n, t.dim), np.float32), s, s)


def test_bucket_shares_sum_to_the_cap():
    caps = bucket_caps(5000)
    assert caps.sum() == 5000 and caps.max() - caps.min() == 1
    with pytest.raises(ArgumentError, match="max_rows"):
        EvictionPolicy(max_rows=1000)
    with pytest.raises(ArgumentError, match="low_water"):
        EvictionPolicy(max_rows=2048, low_water=0.0)


def test_the_cap_is_never_exceeded_and_the_batch_is_never_evicted():
    cap = 4096
    t = SparseTable(2, SGD(0.1), name="c", policy=EvictionPolicy(max_rows=cap, low_water=0.9))
    rng = np.random.default_rng(0)
    caps = bucket_caps(cap)
    for _ in range(30):
        keys = np.unique(rng.integers(-(1 << 50), 1 << 50, 700)).astype(np.int64)
        push_all(t, keys)
        assert np.isin(keys, t.keys()).all()  # the pushed batch keeps its rows
        over = t.bucket_rows() - caps
        batch_per_bucket = np.bincount(bucket_of(keys), minlength=1024)
        assert (over <= batch_per_bucket).all()  # only the batch's own keys above a share
        assert len(t) <= cap + keys.shape[0]
        assert np.array_equal(t.bucket_rows(), np.bincount(bucket_of(t.keys()), minlength=1024))
    assert t.counters["keys_evicted_cap"] > 0


def test_eviction_order_is_lowest_show_then_longest_unseen_then_key():
    t = SparseTable(1, SGD(0.1), name="o", policy=EvictionPolicy(max_rows=1024, low_water=1.0))
    keys = np.arange(200_000, dtype=np.int64)
    b = bucket_of(keys)
    k = keys[b == 7][:5]  # five keys of one bucket, whose share is one row
    show = np.array([3, 1, 1, 2, 5], np.float32)
    for i in range(5):  # one at a time: each push evicts down to one row, never the pushed key
        push_all(t, k[i : i + 1], show[i : i + 1])
    assert np.isin(k[4], t.keys())  # the last pushed key survives, then whoever ranks first
    t2 = SparseTable(1, SGD(0.1), name="o", policy=EvictionPolicy(max_rows=1024, low_water=1.0))
    # all four pushed together, then one more key: eviction keeps the highest show
    no_cap = SparseTable(1, SGD(0.1), name="o")
    for tab in (t2, no_cap):
        push_all(tab, k[:4], show[:4])
        tab.show_decay(0)
    assert len(t2) == 4  # a batch is never evicted, even above the share
    other = keys[b == 7][5:6]
    push_all(t2, other, np.array([0.5], np.float32))
    assert t2.keys().tolist() == [int(other[0])]  # everything else evicted: the batch survives
    # ties on show: the longer unseen goes first, then the smaller key
    t3 = SparseTable(1, SGD(0.1), name="o", policy=EvictionPolicy(max_rows=2048, low_water=1.0))
    a, c, d = keys[b == 9][:3]
    push_all(t3, np.array([a, c], np.int64))
    t3.show_decay(1)  # a and c unseen for a day; then d is pushed with the same show
    push_all(t3, np.array([d], np.int64))
    assert sorted(t3.keys().tolist()) == sorted([max(a, c), d])


def test_memory_limit_raises_before_allocating_and_changes_nothing():
    budget = MemoryBudget(8 << 20)
    t = SparseTable(8, AdaGrad(), name="big")
    budget.attach(t)
    t.pull(np.arange(1000, dtype=np.int64))
    before = (len(t), t.stats().bytes_held)
    with pytest.raises(MemoryLimitError, match=r'Table "big": adding 200000 keys needs .* MiB'):
        t.pull(np.arange(1000, 201000, dtype=np.int64))
    assert (len(t), t.stats().bytes_held) == before
    assert t.pull(np.arange(1000, dtype=np.int64), create=False).any()
    with pytest.raises(ArgumentError, match="memory_limit_bytes"):
        MemoryBudget(0)


def test_memory_limit_covers_every_table_of_the_worker_and_loads(tmp_path):
    a, b = SparseTable(4, SGD(), name="a"), SparseTable(4, SGD(), name="b")
    a.pull(np.arange(100_000, dtype=np.int64))
    a.save(tmp_path / "a", order="bucket")
    budget = MemoryBudget(a.stats().bytes_held + (1 << 20))
    budget.attach(a)
    budget.attach(b)
    with pytest.raises(MemoryLimitError, match='Table "b"'):
        b.pull(np.arange(100_000, dtype=np.int64))
    with pytest.raises(MemoryLimitError, match="memory limit"):
        SparseTable.load(tmp_path / "a", memory_budget=budget)


def test_strategy_memory_limit_reaches_the_tables():
    import tnrec as tn

    s = tn.distribute.PsStrategy(memory_limit_bytes=1 << 20)
    try:
        with s.scope():
            ps = s.make_ps({"u": SparseTable(16, AdaGrad(), name="u")})
        with pytest.raises(MemoryLimitError, match="memory_limit_bytes"):
            ps.pull({"u": np.arange(50_000, dtype=np.int64)}, True)
    finally:
        s.shutdown()


def test_the_bucket_walk_finds_exactly_the_rows_of_the_buckets_over_their_share():
    from tnrec.table import capacity

    t = SparseTable(1, SGD(0.1), name="w")
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(-(1 << 62), 1 << 62, 60_000)).astype(np.int64)
    t.pull(keys)
    t.delete(keys[::5])  # backward shifts: runs that were moved
    live = t.keys()
    b = bucket_of(live)
    over = np.zeros(1024, bool)
    over[[0, 3, 511, 1023]] = True
    excess = np.where(over, 10**9, 0)  # take every candidate
    got = capacity.select_cap_victims(
        t._slots, t._store, t.stats_offset, t.bucket_rows(), over, excess
    )
    np.testing.assert_array_equal(np.sort(got), live[over[b]])
