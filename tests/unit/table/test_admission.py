"""Admission: a row only at the first training pull after a key's show reaches min_show."""

import numpy as np
import pytest

from tests.unit.keys import INT64_MAX, INT64_MIN
from tnrec.errors import ArgumentError, MismatchError, TableKeyError
from tnrec.table import AdaGrad, AdmissionPolicy, EvictionPolicy, SparseTable, bucket_of, files
from tnrec.table.admission import CountMinSketch, admission_passes

SMALL = 1024 * 2 * 4 * 8  # 8 counters per bucket and hash row: collisions happen


def table(min_show=2.0, probability=None, sketch_bytes=SMALL, read="zeros", decay=1.0):
    adm = AdmissionPolicy(
        min_show=min_show, probability=probability, sketch_bytes=sketch_bytes, read_unadmitted=read
    )
    return SparseTable(
        3, AdaGrad(0.1), name="t", seed=4, admission=adm, policy=EvictionPolicy(decay)
    )


def step(t, keys, show=None):
    keys = np.asarray(keys, np.int64)
    out = t.pull(keys)
    s = np.ones(len(keys), np.float32) if show is None else np.asarray(show, np.float32)
    t.push(keys, np.ones((len(keys), 3), np.float32), s, s)
    return out


def test_a_key_gets_its_row_at_the_first_pull_after_its_show_reaches_min_show():
    t = table(min_show=3.0)
    k = [5, INT64_MIN, INT64_MAX]
    for i in range(3):  # shows 0, 1, 2 before each pull: refused
        out = step(t, k)
        assert len(t) == 0 and not out.any(), i
    reference = SparseTable(3, AdaGrad(0.1), name="t", seed=4)
    want = reference.pull(np.array(k, np.int64))
    out = t.pull(np.array(k, np.int64))  # show 3: admitted with the key-determined vector
    np.testing.assert_array_equal(out, want)
    assert len(t) == 3
    assert t.counters == {"keys_admitted": 3, "keys_refused": 9, "keys_evicted_cap": 0}
    rows = t.rows()
    assert (rows["show"] == 0).all()  # the sketch's shows are not moved into the row


def test_refused_keys_drop_their_gradient_and_create_nothing():
    t = table(min_show=5.0)
    step(t, [1, 2, 3])
    assert len(t) == 0 and t.keys().shape == (0,)
    assert t.pull(np.array([1], np.int64), create=False).tolist() == [[0, 0, 0]]


def test_read_unadmitted_init_returns_the_initial_vector_without_a_row():
    t = table(min_show=2.0, read="init")
    keys = np.array([11, 12], np.int64)
    out = t.pull(keys)
    assert len(t) == 0
    np.testing.assert_array_equal(out, t.initial_vectors(keys))
    np.testing.assert_array_equal(out, SparseTable(3, AdaGrad(0.1), name="t", seed=4).pull(keys))


def test_sketch_never_under_counts_even_with_collisions():
    rng = np.random.default_rng(0)
    sketch = CountMinSketch(8, np.uint64(7))
    true = {}
    for _ in range(40):
        keys = np.unique(rng.integers(0, 3000, 200)).astype(np.int64)
        show = rng.uniform(0, 3, keys.shape[0]).astype(np.float32)
        sketch.add(keys, show)
        for k, s in zip(keys.tolist(), show.tolist(), strict=True):
            true[k] = true.get(k, 0.0) + s
    keys = np.array(sorted(true), np.int64)
    est = sketch.estimate(keys)
    want = np.array([true[k] for k in keys.tolist()], np.float32)
    assert (est >= want * (1 - 1e-5)).all()
    assert (est > want * 1.01).any()  # 8 counters per bucket: the test sees collisions


def test_sketch_updates_do_not_depend_on_the_order_of_a_push():
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(0, 5000, 1500)).astype(np.int64)
    show = rng.uniform(0, 2, keys.shape[0]).astype(np.float32)
    a, b = CountMinSketch(4, np.uint64(3)), CountMinSketch(4, np.uint64(3))
    a.add(keys, show)
    perm = rng.permutation(keys.shape[0])
    b.add(keys[perm], show[perm])
    np.testing.assert_array_equal(a.counters, b.counters)


def test_sketch_decays_with_the_rows_show():
    t = table(min_show=2.0, sketch_bytes=1 << 20, decay=0.5)
    step(t, [9], [1.5])
    t.show_decay(1)  # 1.5 -> 0.75
    step(t, [9], [1.0])  # 1.75 < 2: still refused
    assert len(t) == 0
    step(t, [9], [0.25])  # 2.0: admitted at the next pull
    t.pull(np.array([9], np.int64))
    assert len(t) == 1


def test_probability_is_a_pure_function_of_seed_table_and_key():
    keys = np.arange(-20000, 20000, dtype=np.int64)
    t1 = table(min_show=None, probability=0.3)
    t1.pull(keys)
    admitted = t1.keys()
    assert 0.27 < admitted.shape[0] / keys.shape[0] < 0.33
    t2 = table(min_show=None, probability=0.3)
    for part in np.array_split(keys[::-1], 7):  # other batches, other order
        t2.pull(np.ascontiguousarray(part))
    np.testing.assert_array_equal(t2.keys(), admitted)
    other = SparseTable(3, AdaGrad(), name="other", admission=AdmissionPolicy(probability=0.3))
    other.pull(keys)
    assert not np.array_equal(other.keys(), admitted)  # the table name is part of it
    assert admission_passes(keys, 0.3, t1._table_seed).sum() == admitted.shape[0]


def test_both_tests_must_pass():
    t = table(min_show=1.0, probability=0.5, sketch_bytes=1 << 20)
    keys = np.arange(4000, dtype=np.int64)
    step(t, keys)
    t.pull(keys)
    want = keys[admission_passes(keys, 0.5, t._table_seed)]
    np.testing.assert_array_equal(t.keys(), np.sort(want))


def test_duplicate_unadmitted_keys_in_a_push_are_refused():
    t = table()
    t.pull(np.array([1, 2], np.int64))
    with pytest.raises(TableKeyError, match="duplicate"):
        t.push(
            np.array([1, 1], np.int64),
            np.zeros((2, 3), np.float32),
            np.ones(2, np.float32),
            np.ones(2, np.float32),
        )


def test_empty_batches_change_nothing():
    t = table()
    empty = np.zeros(0, np.int64)
    assert t.pull(empty).shape == (0, 3)
    t.push(empty, np.zeros((0, 3), np.float32), np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert len(t) == 0 and t.counters["keys_refused"] == 0


def test_sketch_survives_save_and_load_and_resharding(tmp_path):
    t = table(min_show=3.0, sketch_bytes=1 << 20)
    keys = np.arange(3000, dtype=np.int64)
    step(t, keys)
    step(t, keys[:1500])  # keys < 1500 have show 2, the rest 1
    t.save(tmp_path / "whole", order="bucket")
    loaded = SparseTable.load(tmp_path / "whole")
    np.testing.assert_array_equal(loaded.sketch.counters, t.sketch.counters)
    assert loaded.admission == t.admission
    # two "workers", each reading its buckets of the same save, then merged counters
    b = bucket_of(keys)
    parts = []
    for rank in range(2):
        mine = np.arange(1024) % 2 == rank
        half = table(min_show=3.0, sketch_bytes=1 << 20)
        files.load_into(half, str(tmp_path / "whole"), buckets=mine)
        touched = half.sketch.touched_buckets()
        assert mine[touched].all()
        parts.append(half)
    for k in (keys[:5], keys[1500:1505]):
        est = np.where(b[k] % 2 == 0, parts[0].sketch.estimate(k), parts[1].sketch.estimate(k))
        np.testing.assert_array_equal(est, t.sketch.estimate(k))
    # the resumed table admits exactly as the original would
    step(t, keys[:1500])
    step(loaded, keys[:1500])
    t.pull(keys)
    loaded.pull(keys)
    np.testing.assert_array_equal(loaded.keys(), t.keys())
    assert loaded.keys().shape == (1500,)


def test_a_changed_sketch_size_is_refused_on_load(tmp_path):
    t = table(min_show=2.0, sketch_bytes=1 << 20)
    step(t, [1, 2, 3])
    t.save(tmp_path / "t", order="bucket")
    other = table(min_show=2.0, sketch_bytes=1 << 21)
    with pytest.raises(MismatchError, match="sketch_bytes changed"):
        other.load_rows(tmp_path / "t")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "set `min_show`, `probability` or both"),
        ({"min_show": 0}, "min_show"),
        ({"min_show": float("nan")}, "min_show"),
        ({"probability": 1.5}, "probability"),
        ({"probability": 0.0}, "probability"),
        ({"min_show": 1, "sketch_bytes": 100}, "sketch_bytes"),
        ({"min_show": 1, "read_unadmitted": "random"}, "read_unadmitted"),
    ],
)
def test_bad_policies_are_refused(kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        AdmissionPolicy(**kwargs)


def test_admission_must_be_a_policy():
    with pytest.raises(ArgumentError, match="AdmissionPolicy"):
        SparseTable(2, AdaGrad(), admission={"min_show": 2})
