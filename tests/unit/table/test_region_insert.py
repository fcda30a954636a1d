"""Big inserts and index growth go region by region on the table's threads.

A pull of at least ``REGION_INSERT_MIN`` new keys (no evicted rows to reuse)
inserts them by region, and a big index is rebuilt by region when it grows.
Either way the table must hold what the one-thread, one-key-at-a-time path
holds, and the index a run leaves must not depend on the thread count.
"""

import numpy as np
import pytest

from tnrec.errors import TableKeyError
from tnrec.table import AdaGrad, SparseTable, index, threads
from tnrec.table import table as table_mod
from tnrec.table.index import home, slot_key


def _occupied(t):
    s = t._slots
    where = np.flatnonzero(s[:, 2] >= 0)
    return np.column_stack([where, s[where]])


def _train(n_threads, region_min, monkeypatch):
    """Pulls that create (batches of new and present keys, growing the index several
    times), pushes, a delete and a pull that reuses the freed rows."""
    monkeypatch.setattr(threads, "MIN_SLICE", 16)
    monkeypatch.setattr(table_mod, "REGION_INSERT_MIN", region_min)
    threads.set_num_threads(n_threads)
    rng = np.random.default_rng(5)
    t = SparseTable(4, AdaGrad(0.1), name="t")
    for step in range(6):
        keys = np.unique(rng.integers(-(1 << 40), 1 << 40, 700 * (step + 1))).astype(np.int64)
        if step:
            keys = np.unique(np.concatenate([keys, t.keys()[::5]]))
        rng.shuffle(keys)
        t.pull(keys)
        g = rng.standard_normal((keys.shape[0], 4)).astype(np.float32)
        ones = np.ones(keys.shape[0], np.float32)
        t.push(keys, g, ones, ones)
        if step == 3:
            t.delete(t.keys()[::3])  # rows to reuse: the next pulls insert one at a time
    return t


@pytest.fixture
def restore_threads():
    before = threads.get_num_threads()
    yield
    threads.set_num_threads(before)


def test_region_inserts_hold_what_serial_inserts_hold(monkeypatch, restore_threads):
    serial = _train(1, 10**9, monkeypatch)
    one = _train(1, 32, monkeypatch)
    three = _train(3, 32, monkeypatch)
    k, r = serial.records()
    for t in (one, three):
        k2, r2 = t.records()
        np.testing.assert_array_equal(k2, k)
        np.testing.assert_array_equal(r2, r)
        # key i of an insert gets row next_row + i on both paths: the same rows
        np.testing.assert_array_equal(t.rows_for(k), serial.rows_for(k))
    # the index does not depend on the thread count
    np.testing.assert_array_equal(_occupied(one), _occupied(three))


def test_a_region_insert_of_a_repeated_key_creates_nothing(monkeypatch, restore_threads):
    monkeypatch.setattr(threads, "MIN_SLICE", 16)
    monkeypatch.setattr(table_mod, "REGION_INSERT_MIN", 32)
    threads.set_num_threads(3)
    t = SparseTable(2, AdaGrad(), name="t")
    old = np.arange(500, dtype=np.int64) * 3
    t.pull(old)
    t.reserve(5_000)
    before, weights, rows_before = _occupied(t), t.pull(old, create=False), t._store.next_row
    new = np.arange(2_000, dtype=np.int64) * 3 + 1
    with pytest.raises(TableKeyError, match=r"pull got 2 duplicate key\(s\) among 2002"):
        t.pull(np.concatenate([new, new[[0, 1_999]]]))
    assert len(t) == 500 and t._store.next_row == rows_before
    np.testing.assert_array_equal(_occupied(t), before)
    np.testing.assert_array_equal(t.pull(old, create=False), weights)
    np.testing.assert_array_equal(t.pull(new), t.initial_vectors(new))
    assert t.stats().count == 2_500 and int(t.bucket_rows().sum()) == 2_500


def _loaded_index(capacity, fill, seed):
    """An index of ``capacity`` slots holding ``fill`` random keys, rows 0.."""
    t = SparseTable(1, AdaGrad(), name="i")
    t.reserve(index.max_count(capacity))
    assert t._slots.shape[0] == capacity
    keys = np.unique(np.random.default_rng(seed).integers(-(1 << 62), 1 << 62, fill))
    t.pull_unchecked(keys.astype(np.int64))
    return t._slots


@pytest.mark.parametrize("runs", [1, 2, 16])
def test_rehash_by_region_keeps_every_entry_whatever_the_runs(runs):
    old = _loaded_index(1 << 12, 3_000, seed=2)  # 73% full: runs cross region ends
    per = old.shape[0] // index.REGIONS
    new = index.new_index(old.shape[0] * 2)
    shifts = (per.bit_length() - 1, (new.shape[0] // index.REGIONS).bit_length() - 1)
    bounds = [(j * index.REGIONS // runs, (j + 1) * index.REGIONS // runs) for j in range(runs)]
    deferred = []
    for r0, r1 in bounds:
        buf = np.empty((r1 - r0) * per, np.int32)
        m = index.rehash_regions(old, new, *shifts, r0, r1, buf)
        deferred.append(buf[:m])
    later = np.concatenate(deferred)
    assert later.shape[0] > 0  # some entries do go in afterwards
    index.rehash_deferred(old, new, later)
    ref = index.new_index(new.shape[0])
    one = np.empty(old.shape[0], np.int32)
    m = index.rehash_regions(old, ref, *shifts, 0, index.REGIONS, one)
    np.testing.assert_array_equal(later, one[:m])
    index.rehash_deferred(old, ref, one[:m])
    np.testing.assert_array_equal(new, ref)  # the same index however the regions are run
    live = np.flatnonzero(old[:, 2] >= 0)
    keys = np.array([slot_key(old, s) for s in live])
    found = np.empty(keys.shape[0], np.int32)
    assert index.lookup(new, keys, found) == 0
    np.testing.assert_array_equal(found, old[live, 2])
    mask = new.shape[0] - 1
    for s in np.flatnonzero(new[:, 2] >= 0):  # no empty slot between a key and its home
        h = home(slot_key(new, s), mask)
        assert (new[(h + np.arange((s - h) & mask)) & mask, 2] >= 0).all()


def _small_thresholds(monkeypatch, miss_rate=None):
    """Region inserts and one-pass pulls from 64 keys (16 a thread); the one-pass pull
    from ``miss_rate`` misses in the last creating pull, when given."""
    monkeypatch.setattr(threads, "MIN_SLICE", 16)
    monkeypatch.setattr(table_mod, "REGION_INSERT_MIN", 64)
    monkeypatch.setattr(table_mod, "INSERT_FIRST_MIN", 64)
    if miss_rate is not None:
        monkeypatch.setattr(table_mod, "INSERT_FIRST_MISS_RATE", miss_rate)


def _mixed_pulls(monkeypatch, miss_rate):
    """Create pulls of present and absent keys, pushes between them; ``miss_rate`` is the
    share of misses from which a big pull finds or inserts in one pass (above 1: never)."""
    _small_thresholds(monkeypatch, miss_rate)
    rng = np.random.default_rng(11)
    t = SparseTable(3, AdaGrad(0.1), name="t")
    outs = []
    for step in range(5):
        fresh = rng.integers(-(1 << 50), 1 << 50, 900)
        old = t.keys()[: 300 * step]
        keys = np.unique(np.concatenate([fresh, old])).astype(np.int64)
        rng.shuffle(keys)
        outs.append(t.pull(keys))
        g = rng.standard_normal((keys.shape[0], 3)).astype(np.float32)
        ones = np.ones(keys.shape[0], np.float32)
        t.push(keys, g, ones, ones)
    return t, outs


@pytest.mark.parametrize("n_threads", [1, 3])
def test_one_pass_find_or_insert_pulls_what_lookup_then_insert_pulls(
    monkeypatch, restore_threads, n_threads
):
    threads.set_num_threads(n_threads)
    calls = []
    real = index.find_or_insert_regions
    monkeypatch.setattr(index, "find_or_insert_regions", lambda *a: calls.append(1) or real(*a))
    two_pass, outs2 = _mixed_pulls(monkeypatch, 2.0)
    assert not calls
    one_pass, outs1 = _mixed_pulls(monkeypatch, 0.0)
    assert calls  # every pull of the second run went by find-or-insert
    for a, b in zip(outs1, outs2, strict=True):
        np.testing.assert_array_equal(a, b)  # present keys' weights and new keys' initial ones
    k, r = two_pass.records()
    k1, r1 = one_pass.records()
    np.testing.assert_array_equal(k1, k)
    np.testing.assert_array_equal(r1, r)
    np.testing.assert_array_equal(one_pass.rows_for(k), two_pass.rows_for(k))
    assert one_pass.stats().count == two_pass.stats().count == k.shape[0]
    np.testing.assert_array_equal(one_pass.bucket_rows(), two_pass.bucket_rows())
    threads.set_num_threads(1)
    one_thread, _ = _mixed_pulls(monkeypatch, 0.0)
    np.testing.assert_array_equal(_occupied(one_pass), _occupied(one_thread))  # the same index


def test_the_one_pass_pull_follows_the_last_create_pulls_misses(monkeypatch, restore_threads):
    _small_thresholds(monkeypatch, 0.6)
    calls = []
    real = index.find_or_insert_regions
    monkeypatch.setattr(index, "find_or_insert_regions", lambda *a: calls.append(1) or real(*a))
    threads.set_num_threads(1)  # one run of regions a pull
    t = SparseTable(2, AdaGrad(), name="t")
    t.pull(np.arange(1_000, dtype=np.int64))  # an empty table: all new, one pass
    assert len(calls) == 1
    t.pull(np.arange(10, dtype=np.int64))  # small: a lookup, which found every key
    t.pull(np.arange(2_000, dtype=np.int64))  # a lookup, then an insert; misses 1/2
    t.pull(np.arange(3_000, dtype=np.int64))  # misses 1/2 before it, < 0.6: a lookup
    t.pull(np.arange(2_000, 5_000, dtype=np.int64))  # 1/3 before it: a lookup; misses 2/3
    assert len(calls) == 1
    t.pull(np.arange(5_000, 6_000, dtype=np.int64))  # 2/3 before it: one pass
    assert len(calls) == 2 and len(t) == 6_000
    t.pull(np.arange(6_000, dtype=np.int64), create=False)  # reads do not count
    t.pull(np.arange(6_000, 7_000, dtype=np.int64))
    assert len(calls) == 3 and len(t) == 7_000


def test_a_one_pass_pull_of_a_repeated_present_key_changes_nothing(monkeypatch, restore_threads):
    _small_thresholds(monkeypatch, 0.0)
    threads.set_num_threads(2)
    t = SparseTable(2, AdaGrad(), name="t")
    old = np.arange(300, dtype=np.int64) * 7
    t.pull(old)
    t.reserve(2_000)  # the index does not grow (the room reserved for a pull stays)
    before, rows_before = _occupied(t), t._store.next_row
    new = np.arange(500, dtype=np.int64) * 7 + 3
    with pytest.raises(TableKeyError, match=r"pull got 1 duplicate key\(s\) among 801"):
        t.pull(np.concatenate([new, old, old[[5]]]))
    assert len(t) == 300 and t._store.next_row == rows_before
    np.testing.assert_array_equal(_occupied(t), before)
    got = t.pull(np.concatenate([new, old]))
    np.testing.assert_array_equal(got[:500], t.initial_vectors(new))
    assert len(t) == 800 and int(t.bucket_rows().sum()) == 800
