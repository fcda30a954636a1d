"""The index is laid out by bucket: a key's home slot lies in its bucket's 1/1024th."""

import numpy as np
import pytest

from tnrec._hashing import NUM_BUCKETS, bucket_of, mix64
from tnrec.table import SGD, SparseTable, index
from tnrec.table.index import home, slot_key


@pytest.mark.parametrize("capacity", [1 << 10, 1 << 11, 1 << 16, 1 << 22])
def test_home_is_in_the_buckets_region(capacity):
    keys = np.random.default_rng(capacity).integers(-(1 << 62), 1 << 62, 5000).astype(np.int64)
    keys = np.concatenate([keys, np.array([0, -1, 2**63 - 1, -(2**63)], np.int64)])
    homes = np.array([home(k, capacity - 1) for k in keys])
    per = capacity // NUM_BUCKETS
    assert ((homes >= 0) & (homes < capacity)).all()
    assert np.array_equal(homes // per, bucket_of(keys))
    # within the region the hash's bits above the bucket's choose the slot
    h = mix64(keys).view(np.uint64)
    assert np.array_equal(homes % per, ((h >> np.uint64(10)) % np.uint64(per)).astype(np.int64))


@pytest.mark.parametrize("capacity", [16, 256, 512])
def test_small_hash_sets_use_the_low_bits(capacity):
    keys = np.arange(-500, 500, dtype=np.int64)
    homes = np.array([home(k, capacity - 1) for k in keys])
    h = mix64(keys).view(np.uint64)
    assert np.array_equal(homes, (h % np.uint64(capacity)).astype(np.int64))


def test_every_slot_sits_at_or_after_its_home_in_a_full_table():
    t = SparseTable(1, SGD(0.1), name="layout")
    rng = np.random.default_rng(3)
    for _ in range(5):  # grow across resizes, delete some, insert more
        t.pull_unchecked(np.unique(rng.integers(0, 1 << 40, 30_000)).astype(np.int64), True)
        t.delete(t.keys()[::7])
    slots = t._slots
    mask = slots.shape[0] - 1
    live = np.flatnonzero(slots[:, 2] >= 0)
    keys = np.array([slot_key(slots, s) for s in live])
    homes = np.array([home(k, mask) for k in keys])
    run = (live - homes) & mask  # how far linear probing carried each key past its home
    assert run.max() < 200
    for s, d in zip(live, run, strict=True):  # no empty slot between a key and its home
        assert (slots[(s - np.arange(d + 1)) & mask, 2] >= 0).all()


def test_homes_and_buckets_gives_each_key_its_home_and_counts_the_buckets():
    rng = np.random.default_rng(11)
    capacity = 1 << 14
    keys = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 5000)
    keys[:3] = [0, -1, 7]
    keys[3] = keys[4]  # a repeat counts twice
    want_homes = np.array([home(k, capacity - 1) for k in keys])
    homes = np.empty(keys.shape[0], np.int64)
    counts = index.homes_and_buckets(keys, capacity - 1, homes)
    np.testing.assert_array_equal(homes, want_homes)
    np.testing.assert_array_equal(counts, np.bincount(bucket_of(keys), minlength=NUM_BUCKETS))
    # region r of the index holds buckets [64 r, 64 r + 64)
    shift = (capacity // index.REGIONS).bit_length() - 1
    np.testing.assert_array_equal(
        counts.reshape(index.REGIONS, -1).sum(axis=1),
        np.bincount(want_homes >> shift, minlength=index.REGIONS),
    )
