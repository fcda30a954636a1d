"""Streaming metrics: checked against scikit-learn and NumPy, streamed, summed, AUC error."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import accuracy_score, log_loss, mean_squared_error, roc_auc_score

from tnrec import metrics
from tnrec.errors import ArgumentError

NAMES = ["auc", "logloss", "ctr", "pctr", "copc", "accuracy", "mse"]
WEIGHTED = [pytest.param(False, id="unweighted"), pytest.param(True, id="weighted")]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def make_data(n, base_logit, seed, signal=1.5, noise=0.5):
    """Return (y, p, w): labels from a hidden logit, predictions from a noisy estimate of it.

    The hidden logit is ``base_logit + signal * z``; the "model" sees ``z`` with
    noise, as a trained model would, and its predictions are float32 like a
    torch output.
    """
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n)
    y = (rng.random(n) < _sigmoid(base_logit + signal * z)).astype(np.float64)
    p = _sigmoid(base_logit + signal * z + noise * rng.standard_normal(n)).astype(np.float32)
    w = rng.uniform(0.1, 3.0, n)
    return y, p.astype(np.float64), w


@pytest.fixture(scope="module")
def balanced():
    return make_data(20_000, 0.0, seed=1)


@pytest.fixture(scope="module")
def low_ctr():
    # base rate ~2%: hidden logit -5 + 1.5 z
    return make_data(200_000, -5.0, seed=2)


def reference(name, y, p, w):
    """The metric by scikit-learn or a NumPy formula."""
    if name == "auc":
        return roc_auc_score(y, p, sample_weight=w)
    if name == "logloss":
        return log_loss(y, p, sample_weight=w)
    if name == "accuracy":
        return accuracy_score(y >= 0.5, p >= 0.5, sample_weight=w)
    if name == "mse":
        return mean_squared_error(y, p, sample_weight=w)
    w1 = np.ones_like(y) if w is None else w
    if name == "ctr":
        return np.sum(w1 * y) / np.sum(w1)
    if name == "pctr":
        return np.sum(w1 * p) / np.sum(w1)
    if name == "copc":
        return np.sum(w1 * y) / np.sum(w1 * p)
    raise AssertionError(name)


def run(name, y, p, w=None, chunks=1):
    m = metrics.get(name)
    parts = np.array_split(np.arange(len(y)), chunks)
    for idx in parts:
        m.update(y[idx], p[idx], None if w is None else w[idx])
    return m


# --- values ------------------------------------------------------------------------------


@pytest.mark.parametrize("weighted", WEIGHTED)
@pytest.mark.parametrize("name", NAMES)
def test_matches_reference(name, weighted, balanced):
    y, p, w = balanced
    w = w if weighted else None
    got = run(name, y, p, w).result()
    want = reference(name, y, p, w)
    # the histogram AUC is approximate; everything else is the same sum
    tol = 1e-4 if name == "auc" else 1e-12
    assert got == pytest.approx(want, rel=tol, abs=tol)


@pytest.mark.parametrize("weighted", WEIGHTED)
def test_mse_on_regression_values(weighted):
    rng = np.random.default_rng(3)
    y = rng.normal(5.0, 10.0, 1000)
    p = y + rng.normal(0.0, 2.0, 1000)
    w = rng.uniform(0.0, 2.0, 1000) if weighted else None
    got = run("mse", y, p, w).result()
    assert got == pytest.approx(mean_squared_error(y, p, sample_weight=w), rel=1e-12)


def test_small_literal_values():
    #   y  = [0,   1,   0,   1  ]
    #   p  = [0.1, 0.1, 0.2, 0.3]
    #   w  = [1,   2,   1,   1  ]
    y = np.array([0.0, 1.0, 0.0, 1.0])
    p = np.array([0.1, 0.1, 0.2, 0.3])
    w = np.array([1.0, 2.0, 1.0, 1.0])
    res = {n: run(n, y, p, w).result() for n in NAMES}
    assert res["ctr"] == pytest.approx(3 / 5)
    assert res["pctr"] == pytest.approx((0.1 + 0.2 + 0.2 + 0.3) / 5)
    assert res["copc"] == pytest.approx(3 / 0.8)
    assert res["accuracy"] == pytest.approx(2 / 5)  # rows 0 and 2 are right
    assert res["mse"] == pytest.approx((0.01 + 2 * 0.81 + 0.04 + 0.49) / 5)
    loss = -(np.log(0.9) + 2 * np.log(0.1) + np.log(0.8) + np.log(0.3)) / 5
    assert res["logloss"] == pytest.approx(loss)
    # pairs (pos, neg) weighted: pos 0.1 (w2) vs neg 0.1 tie -> 2*0.5, vs 0.2 -> 0;
    # pos 0.3 (w1) beats both -> 2. AUC = 3 / (3 pos * 2 neg)
    assert res["auc"] == pytest.approx(3 / 6, abs=1e-15)
    assert metrics.exact_auc(y, p, w) == pytest.approx(3 / 6, abs=1e-15)


def test_logloss_clips_predictions():
    m = metrics.get("logloss")
    m.update([1.0, 0.0], [0.0, 1.0])  # two certain mistakes
    assert m.result() == pytest.approx(-np.log(1e-7), rel=1e-9)


def test_accuracy_threshold_is_inclusive():
    m = metrics.get("accuracy")
    m.update([1.0, 0.0, 1.0], [0.5, 0.4999, 0.9])  # p == 0.5 predicts a click
    assert m.result() == 1.0


# --- streaming and summed states -------------------------------------------------------------


@pytest.mark.parametrize("weighted", WEIGHTED)
@pytest.mark.parametrize("name", NAMES)
def test_streaming_equals_one_call(name, weighted, balanced):
    y, p, w = balanced
    w = w if weighted else None
    whole = run(name, y, p, w)
    streamed = run(name, y, p, w, chunks=7)
    np.testing.assert_allclose(streamed.state(), whole.state(), rtol=1e-12, atol=1e-9)
    assert streamed.result() == pytest.approx(whole.result(), rel=1e-12)


@pytest.mark.parametrize("weighted", WEIGHTED)
@pytest.mark.parametrize("name", NAMES)
def test_summed_states_equal_whole(name, weighted, balanced):
    # what the distributed layer does: all-reduce(sum) the states, then set_state
    y, p, w = balanced
    w = w if weighted else None
    cut = len(y) // 3
    a = run(name, y[:cut], p[:cut], None if w is None else w[:cut])
    b = run(name, y[cut:], p[cut:], None if w is None else w[cut:])
    whole = run(name, y, p, w)
    merged = metrics.get(name)
    merged.set_state(a.state() + b.state())
    np.testing.assert_allclose(merged.state(), whole.state(), rtol=1e-12, atol=1e-9)
    assert merged.result() == pytest.approx(whole.result(), rel=1e-12)
    assert a.result() != pytest.approx(whole.result(), rel=1e-9)  # the halves really differ


@pytest.mark.parametrize("name", NAMES)
def test_state_is_fixed_size_float64_copy(name, balanced):
    y, p, _ = balanced
    m = metrics.get(name)
    size = m.state().shape
    m.update(y[:10], p[:10])
    s = m.state()
    assert s.dtype == np.float64 and s.shape == size
    before = m.result()
    s[:] = 0.0  # a copy: mutating it leaves the metric alone
    assert m.result() == before
    m.update(y, p)
    assert m.state().shape == size


@pytest.mark.parametrize("name", NAMES)
def test_reset(name, balanced):
    y, p, _ = balanced
    m = run(name, y, p)
    m.reset()
    assert not m.state().any()
    m.update(y[:100], p[:100])
    assert m.result() == pytest.approx(run(name, y[:100], p[:100]).result(), rel=1e-12)


# --- streaming AUC accuracy ------------------------------------------------------------------


def _auc_errors(y, p, w):
    m = run("auc", y, p, w, chunks=4)
    exact = metrics.exact_auc(y, p, w)
    return m.result(), exact, roc_auc_score(y, p, sample_weight=w)


def _auc_error_bound(y, p, w):
    """Worst-case streaming AUC error: half the share of (pos, neg) pairs sharing a bucket.

    The observed error is far smaller (within-bucket orders cancel); the bound
    shows the margin does not rest on that luck.
    """
    s = run("auc", y, p, w).state()
    neg, pos = np.split(s, 2)
    return 0.5 * (pos @ neg) / (pos.sum() * neg.sum())


@pytest.mark.parametrize("weighted", WEIGHTED)
def test_streaming_auc_low_ctr(weighted, low_ctr):
    y, p, w = low_ctr
    w = w if weighted else None
    assert 0.01 <= y.mean() <= 0.03
    stream, exact, skl = _auc_errors(y, p, w)
    assert 0.7 < exact < 0.95  # a realistic model, not a trivial one
    assert exact == pytest.approx(skl, abs=1e-12)
    err = abs(stream - exact)
    print(
        f"low-CTR ({y.mean():.4f}) {'weighted' if weighted else 'unweighted'}: "
        f"stream={stream:.8f} exact={exact:.8f} |err|={err:.2e}"
    )
    assert err < 1e-4
    assert abs(stream - skl) < 1e-4
    assert _auc_error_bound(y, p, w) < 3e-5  # 2^17 buckets: ~1.4e-5


@pytest.mark.parametrize("weighted", WEIGHTED)
def test_streaming_auc_balanced(weighted):
    y, p, w = make_data(200_000, 0.0, seed=4)
    w = w if weighted else None
    stream, exact, skl = _auc_errors(y, p, w)
    assert exact == pytest.approx(skl, abs=1e-12)
    print(f"balanced: |err|={abs(stream - exact):.2e}")
    assert abs(stream - exact) < 1e-4
    assert _auc_error_bound(y, p, w) < 3e-5  # 2^17 buckets: ~1.8e-5


def test_streaming_auc_resolution_is_in_logit():
    # Low-CTR predictions 5e-6 apart: 2^17 bins over p (width 7.6e-6) would tie
    # neighbours; over the logit they are ~2 bins apart, so the order is kept.
    p = 0.01 + 5e-6 * np.arange(6)
    y = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    m = metrics.get("auc")
    m.update(y, p)
    assert m.result() == 1.0


def test_auc_extreme_predictions_share_end_buckets():
    # p beyond the clip range is tied with the clip value, as in logloss
    m = metrics.get("auc")
    m.update([0.0, 1.0, 0.0, 1.0], [0.0, 1e-9, 1.0, 1.0 - 1e-12])
    assert m.result() == 0.5


def test_auc_num_buckets_changes_state_size():
    m = metrics.AUC(num_buckets=2**16)
    assert m.state().shape == (2**17,)
    m.update([0.0, 1.0], [0.3, 0.6])
    assert m.result() == 1.0


# --- exact AUC ---------------------------------------------------------------------------


@pytest.mark.parametrize("weighted", WEIGHTED)
def test_exact_auc_with_ties_matches_sklearn(weighted):
    rng = np.random.default_rng(5)
    y = (rng.random(5000) < 0.3).astype(np.float64)
    p = np.round(rng.random(5000) * 0.5 + 0.3 * y, 2)  # ~80 distinct values: heavy ties
    assert len(np.unique(p)) < 100
    w = rng.uniform(0.0, 2.0, 5000) if weighted else None
    assert metrics.exact_auc(y, p, w) == pytest.approx(
        roc_auc_score(y, p, sample_weight=w), abs=1e-12
    )


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 1.0]), st.integers(-3, 3), st.integers(0, 3)),
        min_size=2,
        max_size=40,
    )
)
def test_exact_auc_property_vs_sklearn(rows):
    y = np.array([r[0] for r in rows])
    p = np.array([r[1] for r in rows], dtype=np.float64)  # small integer scores: many ties
    w = np.array([r[2] for r in rows], dtype=np.float64)
    pos, neg = (w * y).sum(), (w * (1 - y)).sum()
    got = metrics.exact_auc(y, p, w)
    if pos == 0 or neg == 0:
        assert np.isnan(got)
    else:
        assert got == pytest.approx(roc_auc_score(y, p, sample_weight=w), abs=1e-12)


def test_exact_auc_any_real_scores():
    y = np.array([0.0, 1.0, 0.0, 1.0])
    assert metrics.exact_auc(y, np.array([-5.0, 3.0, 2.0, 100.0])) == 1.0


# --- edge cases --------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_no_rows_is_nan_and_empty_update_is_noop(name, balanced):
    m = metrics.get(name)
    assert np.isnan(m.result())
    m.update(np.zeros(0), np.zeros(0), np.zeros(0))
    assert np.isnan(m.result())
    assert not m.state().any()
    y, p, _ = balanced
    m.update(y[:50], p[:50])
    before = m.state()
    m.update([], [])
    np.testing.assert_array_equal(m.state(), before)


@pytest.mark.parametrize(
    "label",
    [
        pytest.param(0.0, id="all_negative"),
        pytest.param(1.0, id="all_positive"),
    ],
)
def test_auc_one_class_is_nan(label):
    y = np.full(10, label)
    p = np.linspace(0.1, 0.9, 10)
    assert np.isnan(run("auc", y, p).result())
    assert np.isnan(metrics.exact_auc(y, p))
    # the other metrics stay defined
    assert run("ctr", y, p).result() == label


def test_exact_auc_empty_is_nan():
    assert np.isnan(metrics.exact_auc([], []))


def test_copc_without_predicted_clicks_is_nan():
    assert np.isnan(run("copc", np.array([1.0, 0.0]), np.array([0.0, 0.0])).result())


@pytest.mark.parametrize("name", NAMES)
def test_zero_weight_rows_are_ignored(name, balanced):
    y, p, w = balanced
    y, p, w = y[:500], p[:500], w[:500]
    rng = np.random.default_rng(6)
    y_junk = (rng.random(200) < 0.5).astype(np.float64)
    p_junk = rng.random(200)
    m = metrics.get(name)
    m.update(np.r_[y, y_junk], np.r_[p, p_junk], np.r_[w, np.zeros(200)])
    clean = run(name, y, p, w)
    np.testing.assert_allclose(m.state(), clean.state(), rtol=1e-12, atol=1e-12)
    assert m.result() == pytest.approx(clean.result(), rel=1e-12)
    # exact AUC too
    assert metrics.exact_auc(
        np.r_[y, y_junk], np.r_[p, p_junk], np.r_[w, np.zeros(200)]
    ) == pytest.approx(metrics.exact_auc(y, p, w), abs=1e-12)


def test_all_zero_weight_is_nan():
    assert np.isnan(run("logloss", np.array([1.0]), np.array([0.5]), np.array([0.0])).result())


def test_column_vectors_and_lists_are_accepted():
    m = metrics.get("mse")
    m.update(np.array([[1.0], [2.0]]), np.array([[1.5], [2.0]]), [1.0, 3.0])
    assert m.result() == pytest.approx(0.25 / 4)


# --- get ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_get_by_name(name):
    a, b = metrics.get(name), metrics.get(name)
    assert a.name == name
    assert a is not b  # fresh state each time
    assert isinstance(a, metrics.Metric)


def test_get_passes_instances_through():
    m = metrics.AUC()
    assert metrics.get(m) is m


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("AUC-PR", id="unknown"),
        pytest.param("Auc", id="case"),
        pytest.param("", id="empty"),
    ],
)
def test_get_unknown_name_lists_valid_names(bad):
    with pytest.raises(ArgumentError, match=r"one of \['accuracy', 'auc', 'copc', 'ctr'.*'mse'"):
        metrics.get(bad)


def test_get_wrong_type():
    with pytest.raises(ArgumentError, match=r"`metric` must be a Metric.*Received: metric=3"):
        metrics.get(3)  # type: ignore[arg-type]


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_y_pred_shape_mismatch(name):
    m = metrics.get(name)
    with pytest.raises(ArgumentError, match=r"`y_pred` must have the shape of `y_true` \(3,\)"):
        m.update([0.0, 1.0, 0.0], [0.5, 0.5])


def test_weight_shape_mismatch():
    with pytest.raises(ArgumentError, match=r"`weight` must have the shape.*shape=\(2,\)"):
        metrics.get("auc").update([0.0, 1.0, 0.0], [0.5, 0.5, 0.5], [1.0, 1.0])
    with pytest.raises(ArgumentError, match=r"`weight` must have the shape"):
        metrics.exact_auc([0.0, 1.0], [0.5, 0.5], [1.0])


def test_two_dimensional_input():
    with pytest.raises(ArgumentError, match=r"`y_true` must be a 1-D array.*shape=\(2, 2\)"):
        metrics.get("ctr").update(np.zeros((2, 2)), np.zeros((2, 2)))


@pytest.mark.parametrize(
    ("name", "y", "p", "pattern"),
    [
        pytest.param("auc", [0.0, 1.0], [0.5, np.nan], r"`y_pred` must be finite", id="nan_pred"),
        pytest.param("mse", [np.inf, 1.0], [0.5, 0.5], r"`y_true` must be finite", id="inf_label"),
        pytest.param(
            "logloss",
            [0.0, 1.0],
            [0.5, 1.5],
            r"`y_pred` must lie in \[0, 1\].*1\.5",
            id="prob_above_1",
        ),
        pytest.param(
            "auc", [0.0, 1.0], [-2.0, 3.0], r"`y_pred` must lie in \[0, 1\]", id="logits_to_auc"
        ),
        pytest.param(
            "ctr", [0.0, 2.0], [0.5, 0.5], r"`y_true` must lie in \[0, 1\]", id="label_above_1"
        ),
    ],
)
def test_bad_values(name, y, p, pattern):
    with pytest.raises(ArgumentError, match=pattern):
        metrics.get(name).update(y, p)


def test_mse_accepts_values_outside_unit_interval():
    m = metrics.get("mse")
    m.update([-3.0, 7.0], [-1.0, 7.0])
    assert m.result() == 2.0


@pytest.mark.parametrize(
    "w",
    [
        pytest.param([1.0, -1.0], id="negative"),
        pytest.param([1.0, np.nan], id="nan"),
    ],
)
def test_bad_weight(w):
    with pytest.raises(ArgumentError, match=r"`weight` must be finite and non-negative"):
        metrics.get("logloss").update([0.0, 1.0], [0.5, 0.5], w)
    with pytest.raises(ArgumentError, match=r"`weight` must be finite and non-negative"):
        metrics.exact_auc([0.0, 1.0], [0.5, 0.5], w)


def test_exact_auc_bad_labels():
    with pytest.raises(ArgumentError, match=r"`y_true` must lie in \[0, 1\]"):
        metrics.exact_auc([0.0, 2.0], [0.1, 0.2])


@pytest.mark.parametrize(("name", "size"), [("auc", 2**18), ("ctr", 2), ("mse", 2)])
def test_set_state_wrong_size(name, size):
    m = metrics.get(name)
    with pytest.raises(ArgumentError, match=rf"'{name}': `state` must have shape \({size},\)"):
        m.set_state(np.zeros(size + 1))
    with pytest.raises(ArgumentError, match=r"Received: shape=\(1, 2\)"):
        m.set_state(np.zeros((1, 2)))


@pytest.mark.parametrize(
    "n",
    [
        pytest.param(2**16 - 1, id="too_few"),
        pytest.param(1000.0, id="float"),
        pytest.param(True, id="bool"),
    ],
)
def test_auc_bad_num_buckets(n):
    with pytest.raises(ArgumentError, match=r"`num_buckets` must be an int >= 65536"):
        metrics.AUC(num_buckets=n)


@pytest.mark.parametrize(
    ("y", "pattern"),
    [
        pytest.param(
            [0.0, 2.0, 1.0],
            r"Metric 'auc': `y_true` must lie in \[0, 1\] for this metric\. "
            r"Received: \[2\] in 1 of 3 rows, the first at index 1\.",
            id="two",
        ),
        pytest.param(
            [-1.0, 0.0, -1.0],
            r"Metric 'auc': `y_true` must lie in \[0, 1\].*\[-1\] in 2 of 3 rows",
            id="minus_one",
        ),
        pytest.param(
            [0.0, 1.0, np.nan],
            r"Metric 'auc': `y_true` must be finite\. Received: \[nan\] in 1 of",
            id="nan",
        ),
    ],
)
def test_auc_rejects_labels_outside_0_1_with_a_tnrec_error(y, pattern):
    with pytest.raises(ArgumentError, match=pattern):
        metrics.get("auc").update(y, [0.2, 0.5, 0.7])
    with pytest.raises(ArgumentError, match=r"exact_auc: `y_true` must"):
        metrics.exact_auc(y, [0.2, 0.5, 0.7])


def test_non_numeric_input_is_a_tnrec_error():
    with pytest.raises(ArgumentError, match=r"Metric 'ctr': `y_true` must be an array of numbers"):
        metrics.get("ctr").update(["a", "b"], [0.1, 0.2])
