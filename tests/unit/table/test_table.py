"""SparseTable: index, pull/push contracts, initializers, statistics, eviction, errors."""

import numpy as np
import pytest

from tests.unit.keys import INT64_MAX, INT64_MIN
from tnrec.errors import ArgumentError, NonFiniteError, TableKeyError
from tnrec.table import (
    SGD,
    AdaGrad,
    Adam,
    EvictionPolicy,
    Ftrl,
    SparseTable,
    normal,
    uniform,
    zeros,
)
from tnrec.table import table as table_mod

EXTREME = np.array([0, -1, INT64_MIN, INT64_MAX, 1, INT64_MIN + 1, INT64_MAX - 1], dtype=np.int64)


def f32(*shape, value=1.0):
    return np.full(shape, value, dtype=np.float32)


def make(dim=4, opt=None, **kw):
    return SparseTable(dim, opt or SGD(learning_rate=0.5), name=kw.pop("name", "t"), **kw)


def test_extreme_keys_are_ordinary_keys():
    t = make(initializer=zeros())
    w = t.pull(EXTREME)
    assert w.shape == (7, 4) and w.dtype == np.float32 and len(t) == 7
    # one SGD step with gradient = row index: every key gets its own update
    g = np.repeat(np.arange(7, dtype=np.float32)[:, None], 4, axis=1)
    t.push(EXTREME, g, f32(7), f32(7, value=0.0))
    np.testing.assert_array_equal(t.pull(EXTREME, create=False), -0.5 * g)
    np.testing.assert_array_equal(t.keys(), np.sort(EXTREME))


def test_pull_create_false_reads_zeros_and_creates_nothing():
    t = make()
    t.pull(np.array([5], dtype=np.int64))
    before = t.rows()
    w = t.pull(np.array([5, 6, INT64_MIN], dtype=np.int64), create=False)
    np.testing.assert_array_equal(w[1:], 0.0)
    assert np.abs(w[0]).sum() > 0
    assert len(t) == 1
    after = t.rows()
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])


def test_empty_pull_and_push():
    t = make()
    empty = np.empty(0, dtype=np.int64)
    assert t.pull(empty).shape == (0, 4)
    t.push(empty, np.empty((0, 4), np.float32), np.empty(0, np.float32), np.empty(0, np.float32))
    assert len(t) == 0 and t.keys().shape == (0,)


def test_growth_across_resizes_keeps_every_key_and_vector():
    t = make(dim=3, initializer=uniform(1.0))
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(INT64_MIN, INT64_MAX, size=60_000, dtype=np.int64))
    first = t.pull(keys[:500]).copy()
    for part in np.array_split(keys[500:], 7):  # index grows from 1024 slots several times
        t.pull(part)
    assert len(t) == keys.shape[0]
    assert t.stats().capacity >= 65536
    np.testing.assert_array_equal(t.pull(keys[:500], create=False), first)
    np.testing.assert_array_equal(t.keys(), np.sort(keys))
    assert t.pull(keys, create=False).any(axis=1).all()


def test_initial_vector_is_a_function_of_seed_name_key_only():
    keys = np.array([3, 1, INT64_MAX, -7], dtype=np.int64)
    a = make(name="user", seed=11)
    a.pull(np.arange(100, dtype=np.int64))  # other keys first, other order
    b = make(name="user", seed=11)
    wa = a.pull(keys)
    wb = b.pull(keys[::-1])[::-1]
    np.testing.assert_array_equal(wa, wb)
    assert not np.allclose(wa, make(name="item", seed=11).pull(keys))
    assert not np.allclose(wa, make(name="user", seed=12).pull(keys))


@pytest.mark.parametrize(
    ("init", "dim", "mean", "std"),
    [
        pytest.param(normal(1.0), 16, 0.0, 0.25, id="normal-16"),
        pytest.param(normal(2.0), 4, 0.0, 1.0, id="normal-scale2"),
        pytest.param(uniform(0.5), 8, 0.0, 0.5 / np.sqrt(3), id="uniform"),
        pytest.param(zeros(), 8, 0.0, 0.0, id="zeros"),
    ],
)
def test_initializer_distribution(init, dim, mean, std):
    t = make(dim=dim, initializer=init)
    w = t.pull(np.arange(20_000, dtype=np.int64))
    assert abs(w.mean() - mean) < 0.01
    assert abs(w.std() - std) < 0.01 * max(std, 0.1)
    if init.kind == "uniform":
        assert np.abs(w).max() <= 0.5


def test_delete_then_reinsert_gets_a_fresh_row_and_reuses_storage():
    t = make(initializer=zeros())
    keys = np.arange(1000, dtype=np.int64)
    t.pull(keys)
    t.push(keys, f32(1000, 4), f32(1000), f32(1000))
    allocated = t.stats().rows_allocated
    assert t.delete(keys[::2]) == 500 and len(t) == 500
    assert t.delete(keys[::2]) == 0  # absent keys are ignored
    np.testing.assert_array_equal(t.pull(keys[::2], create=False), 0.0)
    np.testing.assert_array_equal(t.pull(keys[1::2], create=False), -0.5)  # neighbours intact
    w = t.pull(keys[::2])  # re-created: fresh zero rows, fresh statistics
    np.testing.assert_array_equal(w, 0.0)
    r = t.rows(keys[::2])
    np.testing.assert_array_equal(r["show"], 0.0)
    assert t.stats().rows_allocated == allocated  # freed rows were reused


def test_heavy_churn_keeps_index_consistent():
    t = make(dim=2, initializer=uniform(1.0))
    rng = np.random.default_rng(7)
    live: dict[int, np.ndarray] = {}
    for _ in range(30):
        new = np.unique(rng.integers(0, 5000, size=400, dtype=np.int64))
        w = t.pull(new)
        for k, row in zip(new.tolist(), w, strict=True):
            live.setdefault(k, row.copy())
        gone = rng.choice(np.array(sorted(live), dtype=np.int64), size=150, replace=False)
        assert t.delete(gone) == 150
        for k in gone.tolist():
            del live[k]
        keys = np.array(sorted(live), dtype=np.int64)
        np.testing.assert_array_equal(t.keys(), keys)
        np.testing.assert_array_equal(t.pull(keys, create=False), np.array([live[k] for k in keys]))


def test_push_statistics_and_marker():
    t = make(initializer=zeros())
    k = np.array([10, 20], dtype=np.int64)
    t.pull(k)
    t.generation = 7
    t.push(k, f32(2, 4), np.array([2, 3], np.float32), np.array([1, 0], np.float32))
    t.show_decay(3)
    t.push(k[:1], f32(1, 4), f32(1), f32(1))
    r = t.rows()
    np.testing.assert_allclose(r["show"], [2 * 0.98**3 + 1, 3 * 0.98**3], rtol=1e-6)
    np.testing.assert_allclose(r["click"], [1 * 0.98**3 + 1, 0], rtol=1e-6)
    np.testing.assert_array_equal(r["unseen_days"], [0, 3])
    np.testing.assert_array_equal(r["marker"], [7, 7])


def test_show_decay_zero_days_is_identity_and_rejects_negative():
    t = make()
    k = np.array([1], dtype=np.int64)
    t.pull(k)
    t.push(k, f32(1, 4), f32(1, value=5), f32(1))
    t.show_decay(0)
    assert t.rows()["show"][0] == 5.0
    with pytest.raises(ArgumentError, match="delta_days"):
        t.show_decay(-1)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(EvictionPolicy(), [], id="default-none"),
        pytest.param(EvictionPolicy(show_threshold=1.5), [1, 3], id="show"),
        pytest.param(EvictionPolicy(max_unseen_days=2), [3, 4], id="days"),
        pytest.param(
            EvictionPolicy(show_threshold=1.5, max_unseen_days=2, combine="any"),
            [1, 3, 4],
            id="any",
        ),
        pytest.param(
            EvictionPolicy(show_threshold=1.5, max_unseen_days=2, combine="all"), [3], id="all"
        ),
    ],
)
def test_evict_by_policy(policy, expected):
    # key:         1      2      3      4
    # show:        1      5      1      5
    # unseen days: 0      0      3      3
    t = make(
        policy=EvictionPolicy(
            show_decay_rate=1.0,
            **{k: v for k, v in policy.to_config().items() if k != "show_decay_rate"},
        )
    )
    keys = np.array([1, 2, 3, 4], dtype=np.int64)
    t.pull(keys)
    t.push(keys[2:], f32(2, 4), np.array([1, 5], np.float32), f32(2))
    t.show_decay(3)
    t.push(keys[:2], f32(2, 4), np.array([1, 5], np.float32), f32(2))
    assert t.evict() == len(expected)
    np.testing.assert_array_equal(t.keys(), [k for k in [1, 2, 3, 4] if k not in expected])


def test_evicted_rows_are_reused():
    t = make(policy=EvictionPolicy(max_unseen_days=0))
    t.pull(np.array([0], dtype=np.int64))
    full = t.stats().rows_allocated  # fill the first chunk exactly
    t.pull(np.arange(1, full, dtype=np.int64))
    assert t.stats().rows_allocated == full
    t.show_decay(1)
    assert t.evict() == full and len(t) == 0
    t.pull(np.arange(10 * full, 11 * full, dtype=np.int64))
    assert len(t) == full and t.stats().rows_allocated == full  # no new chunk: rows reused
    t.pull(np.array([-5], dtype=np.int64))
    assert t.stats().rows_allocated == 2 * full


@pytest.mark.parametrize(
    "opt",
    [
        pytest.param(SGD(), id="sgd"),
        pytest.param(AdaGrad(), id="adagrad"),
        pytest.param(Adam(), id="adam"),
        pytest.param(Ftrl(), id="ftrl"),
    ],
)
def test_stats_bytes_per_key(opt):
    t = make(dim=8, opt=opt)
    t.pull(np.arange(100_000, dtype=np.int64))
    s = t.stats()
    assert s.count == 100_000 and 0 < s.load_factor <= 0.75
    row_bytes = 4 * (8 + opt.state_width(8) + 4)
    assert row_bytes < s.bytes_per_key < row_bytes + 12 / 0.3 + 30  # index + last chunk slack


# ---------------------------------------------------------------- errors


def test_pull_rejects_duplicates_and_bad_dtype():
    t = make()
    with pytest.raises(TableKeyError, match=r'Table "t": pull got 2 duplicate key\(s\) among 5'):
        t.pull(np.array([1, 2, 1, 3, 1], dtype=np.int64))
    assert len(t) == 0
    with pytest.raises(ArgumentError, match=r'Table "t": `keys` must be a 1-D int64 array.*int32'):
        t.pull(np.array([1, 2], dtype=np.int32))
    with pytest.raises(ArgumentError, match="1-D int64"):
        t.pull(np.zeros((2, 2), dtype=np.int64))


def _occupied(t):
    """The index's occupied slots: (slot, key low, key high, row) of each."""
    s = t._slots
    where = np.flatnonzero(s[:, 2] >= 0)
    return np.column_stack([where, s[where]])


@pytest.mark.parametrize("by_region", [True, False], ids=["by-region", "one-thread"])
@pytest.mark.parametrize("n_old", [0, 300, 20_000])
def test_a_pull_with_repeated_new_keys_creates_nothing(n_old, by_region, monkeypatch):
    # Repeats among absent keys are found while inserting them; the keys
    # inserted before the repeat are taken out again and no old key moves.
    if not by_region:  # the insert of one key at a time (as with rows to reuse)
        monkeypatch.setattr(table_mod, "REGION_INSERT_MIN", 10**9)
    t = make(dim=8, initializer=normal(1.0))
    old = np.arange(n_old, dtype=np.int64) * 7 + 1
    if n_old:
        t.pull(old)
    t.reserve(60_000)  # the index does not grow, so every old key must keep its slot
    before = _occupied(t)
    weights = t.pull(old, create=False) if n_old else None
    new = np.arange(50_000, dtype=np.int64) * 7 + 2  # none of them present
    batch = np.concatenate([new, new[[10, 20_000, 49_999]]])  # 3 repeats, the last at the end
    with pytest.raises(TableKeyError, match=r"pull got 3 duplicate key\(s\) among 50003"):
        t.pull(batch)
    assert len(t) == n_old
    np.testing.assert_array_equal(_occupied(t), before)
    assert not t.contains(new).any()
    if n_old:
        np.testing.assert_array_equal(t.pull(old, create=False), weights)
    # the same keys, once each, are then created with their usual initial vectors
    np.testing.assert_array_equal(t.pull(new), t.initial_vectors(new))
    assert len(t) == n_old + new.shape[0]


def test_a_pull_with_repeated_new_keys_that_grows_the_index_creates_nothing():
    t = make(dim=8, initializer=normal(1.0))
    old = np.arange(3_000, dtype=np.int64) * 5
    t.pull(old)
    weights = t.pull(old, create=False)
    new = np.arange(40_000, dtype=np.int64) * 5 + 1
    with pytest.raises(TableKeyError, match=r"pull got 1 duplicate key\(s\) among 40001"):
        t.pull(np.concatenate([new, new[-1:]]))
    assert len(t) == 3_000 and not t.contains(new).any()
    np.testing.assert_array_equal(t.pull(old, create=False), weights)
    np.testing.assert_array_equal(t.pull(new), t.initial_vectors(new))


def test_a_pull_counts_repeats_of_present_and_new_keys_together():
    t = make()
    t.pull(np.array([1, 2], np.int64))
    with pytest.raises(TableKeyError, match=r"pull got 3 duplicate key\(s\) among 7"):
        t.pull(np.array([1, 5, 1, 6, 5, 2, 2], np.int64))  # 1, 2 present; 5 new
    assert len(t) == 2 and not t.contains(np.array([5, 6], np.int64)).any()


def _push_fault(t, keys, grads=None, show=None, click=None):
    n = len(keys)
    t.push(
        np.array(keys, dtype=np.int64),
        grads if grads is not None else f32(n, 4),
        show if show is not None else f32(n),
        click if click is not None else f32(n),
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param(
            {"keys": [1, 9, 8]},
            TableKeyError,
            r"2 unknown and 0 duplicate key\(s\) among 3",
            id="unknown",
        ),
        pytest.param(
            {"keys": [1, 2, 1, 1]},
            TableKeyError,
            r"0 unknown and 2 duplicate key\(s\) among 4",
            id="duplicate",
        ),
        pytest.param(
            {"keys": [1, 2], "grads": np.array([[np.nan, 0, 0, 0], [0, 0, np.inf, 0]], np.float32)},
            NonFiniteError,
            r"2 key\(s\) with a NaN or infinite gradient",
            id="nan-grad",
        ),
        pytest.param(
            {"keys": [1, 2], "show": np.array([1, np.inf], np.float32)},
            NonFiniteError,
            r"1 key\(s\)",
            id="inf-show",
        ),
        pytest.param(
            {"keys": [1, 2], "grads": f32(2, 3)},
            ArgumentError,
            r"`grads` must be a float32 array of shape \(2, 4\)",
            id="grad-shape",
        ),
        pytest.param(
            {"keys": [1, 2], "grads": np.ones((2, 4))},
            ArgumentError,
            "dtype=float64",
            id="grad-dtype",
        ),
        pytest.param(
            {"keys": [1, 2], "show": f32(3)},
            ArgumentError,
            r"`show` must be a float32 array of shape \(2,\)",
            id="show-shape",
        ),
        pytest.param(
            {"keys": [1, 2], "click": np.ones(2, np.int32)},
            ArgumentError,
            "`click`",
            id="click-dtype",
        ),
    ],
)
def test_push_errors_leave_table_unchanged(kwargs, error, match):
    t = make(opt=AdaGrad())
    t.pull(np.array([1, 2, 3], dtype=np.int64))
    before = t.rows()
    with pytest.raises(error, match=match):
        _push_fault(t, **kwargs)
    after = t.rows()
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    # the scratch bitmap is clean again: a valid push still works
    _push_fault(t, [1, 2, 3])


def test_push_unchecked_matches_push_and_reports_unknown_as_internal_error():
    a, b = make(opt=Adam()), make(opt=Adam())
    k = np.array([4, 5, 6], dtype=np.int64)
    a.pull(k), b.pull(k)
    g = np.arange(12, dtype=np.float32).reshape(3, 4)
    a.push(k, g, f32(3), f32(3))
    b.push_unchecked(k, g, f32(3), f32(3))
    for name, arr in a.rows().items():
        np.testing.assert_array_equal(arr, b.rows()[name])
    with pytest.raises(RuntimeError, match="internal error"):
        b.push_unchecked(np.array([99], dtype=np.int64), f32(1, 4), f32(1), f32(1))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        pytest.param(
            lambda: SparseTable(0, SGD(), name="u"),
            r'Table "u": `dimension`|Table "u": `dim` must be a positive int. Received: dim=0',
            id="dim",
        ),
        pytest.param(
            lambda: SparseTable(4, "adagrad", name="u"),
            "`optimizer` must be a sparse optimizer config",
            id="optimizer",
        ),
        pytest.param(lambda: SparseTable(4, SGD(), name=""), "non-empty str", id="name"),
        pytest.param(
            lambda: SparseTable(4, SGD(), name="u", seed=1.5), "`seed` must be an int", id="seed"
        ),
        pytest.param(
            lambda: SparseTable(4, SGD(), name="u", initializer="normal"),
            "`initializer`",
            id="initializer",
        ),
        pytest.param(
            lambda: SparseTable(4, SGD(), name="u", policy={}),
            "`policy` must be an EvictionPolicy",
            id="policy",
        ),
        pytest.param(
            lambda: SGD(learning_rate=0),
            r"SGD: `learning_rate` must be a positive finite number. Received: learning_rate=0",
            id="lr",
        ),
        pytest.param(lambda: AdaGrad(epsilon=-1), "AdaGrad: `epsilon`", id="eps"),
        pytest.param(lambda: Adam(beta1=1.0), r"Adam: `beta1` must be in \[0, 1\)", id="beta1"),
        pytest.param(lambda: Adam(bias_correction=1), "bias_correction", id="bias-correction"),
        pytest.param(lambda: Ftrl(l1=-0.1), "Ftrl: `l1`", id="l1"),
        pytest.param(lambda: normal(-1), "normal", id="normal"),
        pytest.param(lambda: uniform(float("nan")), "uniform", id="uniform"),
        pytest.param(lambda: EvictionPolicy(show_decay_rate=0), "show_decay_rate", id="decay"),
        pytest.param(lambda: EvictionPolicy(max_unseen_days=-1), "max_unseen_days", id="days"),
        pytest.param(
            lambda: EvictionPolicy(show_threshold=float("inf")), "show_threshold", id="threshold"
        ),
        pytest.param(lambda: EvictionPolicy(combine="either"), "combine", id="combine"),
    ],
)
def test_bad_arguments(build, match):
    with pytest.raises(ArgumentError, match=match):
        build()


def test_learning_rate_change_is_validated_at_push():
    t = make(opt=SGD())
    k = np.array([1], dtype=np.int64)
    t.pull(k)
    t.optimizer.learning_rate = -1.0
    with pytest.raises(ArgumentError, match="learning_rate"):
        t.push(k, f32(1, 4), f32(1), f32(1))
