"""Sparse optimizer rules of tnrec.table: SGD, row-wise AdaGrad, Adam, FTRL-proximal.

Three kinds of checks, per rule (formulas from issue 2, arithmetic from
docs/table_api.md: hyper-parameters and per-row math in float64, rows stored as
float32 after every push):

* hand-computed values for 2-3 pushes, written out literally;
* a plain-NumPy reference over many random pushes on a random subset of keys,
  so keys recur across pushes with different step counts (1e-6 relative);
* cross-checks against torch.optim (SGD, Adam, and Adagrad where row-wise and
  element-wise coincide: D = 1).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
import torch

from tests.unit.keys import INT64_MAX, INT64_MIN
from tests.unit.table.table_common import ATOL, RTOL
from tnrec.table import SGD, AdaGrad, Adam, EvictionPolicy, Ftrl, SparseTable, normal, zeros


def _keys(*values: int) -> npt.NDArray[np.int64]:
    return np.array(values, dtype=np.int64)


def _f32(rows: list[list[float]]) -> npt.NDArray[np.float32]:
    return np.array(rows, dtype=np.float32)


def _push(
    table: SparseTable,
    keys: npt.NDArray[np.int64],
    grads: list[list[float]] | npt.NDArray[np.float32],
    show: float = 1.0,
    click: float = 0.0,
) -> None:
    n = len(keys)
    table.push(
        keys,
        np.asarray(grads, dtype=np.float32),
        np.full(n, show, dtype=np.float32),
        np.full(n, click, dtype=np.float32),
    )


def _weights(table: SparseTable, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
    return table.pull(keys, create=False)


# ---------------------------------------------------------------------------
# Hand-computed values (zeros() initializer, dim 2, key 7 unless said)
# ---------------------------------------------------------------------------


def test_sgd_hand_computed() -> None:
    t = SparseTable(2, SGD(learning_rate=0.5), name="sgd", initializer=zeros(), seed=0)
    k = _keys(7)
    np.testing.assert_array_equal(t.pull(k), _f32([[0.0, 0.0]]))
    # step 1: w = 0 - 0.5 * [1, -2] = [-0.5, 1.0]
    _push(t, k, [[1.0, -2.0]])
    np.testing.assert_array_equal(_weights(t, k), _f32([[-0.5, 1.0]]))
    # step 2: w = [-0.5, 1.0] - 0.5 * [0.5, 4.0] = [-0.75, -1.0]
    _push(t, k, [[0.5, 4.0]])
    np.testing.assert_array_equal(_weights(t, k), _f32([[-0.75, -1.0]]))
    # step 3: w = [-0.75, -1.0] - 0.5 * [-0.25, 0.0] = [-0.625, -1.0]
    _push(t, k, [[-0.25, 0.0]])
    np.testing.assert_array_equal(_weights(t, k), _f32([[-0.625, -1.0]]))
    assert set(t.rows()) == {"keys", "weights", "show", "click", "unseen_days", "marker"}


def test_adagrad_hand_computed() -> None:
    opt = AdaGrad(learning_rate=0.1, initial_g2sum=0.0, epsilon=1e-8)
    t = SparseTable(2, opt, name="ada", initializer=zeros(), seed=0)
    k = _keys(7)
    t.pull(k)
    np.testing.assert_array_equal(t.rows(k)["g2sum"], np.array([0.0], np.float32))
    # step 1: g = [1, 7]: g2sum = 0 + (1 + 49) / 2 = 25, sqrt = 5
    #         w = 0 - 0.1 * [1, 7] / 5 = [-0.02, -0.14]
    _push(t, k, [[1.0, 7.0]])
    np.testing.assert_allclose(t.rows(k)["g2sum"], [25.0], rtol=0)
    np.testing.assert_allclose(_weights(t, k), [[-0.02, -0.14]], rtol=RTOL)
    # step 2: g = [7, 1]: g2sum = 25 + 25 = 50, sqrt = 7.0710678
    #         w = [-0.02 - 0.7 / 7.0710678, -0.14 - 0.1 / 7.0710678]
    #           = [-0.02 - 0.0989949, -0.14 - 0.0141421] = [-0.1189949, -0.1541421]
    _push(t, k, [[7.0, 1.0]])
    np.testing.assert_allclose(t.rows(k)["g2sum"], [50.0], rtol=0)
    np.testing.assert_allclose(_weights(t, k), [[-0.1189949, -0.1541421]], rtol=RTOL)
    # step 3: g = [-5, -5]: g2sum = 50 + 25 = 75, sqrt = 8.6602540
    #         w += 0.5 / 8.6602540 = 0.0577350 -> [-0.06125993, -0.09640712]
    _push(t, k, [[-5.0, -5.0]])
    np.testing.assert_allclose(t.rows(k)["g2sum"], [75.0], rtol=0)
    np.testing.assert_allclose(_weights(t, k), [[-0.06125993, -0.09640712]], rtol=RTOL)


def test_adagrad_initial_g2sum_hand_computed() -> None:
    opt = AdaGrad(learning_rate=0.1, initial_g2sum=11.0, epsilon=1e-8)
    t = SparseTable(2, opt, name="ada", initializer=zeros(), seed=0)
    k = _keys(-1)
    t.pull(k)
    np.testing.assert_array_equal(t.rows(k)["g2sum"], np.array([11.0], np.float32))
    # g = [3, 3]: g2sum = 11 + (9 + 9) / 2 = 20; w = -0.1 * 3 / sqrt(20) = -0.06708204
    _push(t, k, [[3.0, 3.0]])
    np.testing.assert_allclose(t.rows(k)["g2sum"], [20.0], rtol=0)
    np.testing.assert_allclose(_weights(t, k), [[-0.06708204, -0.06708204]], rtol=RTOL)


def test_adam_bias_corrected_hand_computed() -> None:
    opt = Adam(learning_rate=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8, bias_correction=True)
    t = SparseTable(2, opt, name="adam", initializer=zeros(), seed=0)
    k = _keys(7)
    t.pull(k)
    np.testing.assert_array_equal(t.rows(k)["step"], np.array([0], np.int32))
    # step 1 (t=1): g = [1, -2]; m = 0.1 g = [0.1, -0.2]; v = 0.001 g^2 = [0.001, 0.004]
    #   m/(1-0.9) = g, v/(1-0.999) = g^2 -> w = -0.1 * g / |g| = [-0.1, 0.1]
    _push(t, k, [[1.0, -2.0]])
    r = t.rows(k)
    np.testing.assert_array_equal(r["step"], np.array([1], np.int32))
    np.testing.assert_allclose(r["m"], [[0.1, -0.2]], rtol=RTOL)
    np.testing.assert_allclose(r["v"], [[0.001, 0.004]], rtol=RTOL)
    np.testing.assert_allclose(_weights(t, k), [[-0.1, 0.1]], rtol=RTOL)
    # step 2 (t=2): g = [0.5, 0.5]
    #   m = 0.9 [0.1, -0.2] + 0.05 = [0.14, -0.13]
    #   v = 0.999 [0.001, 0.004] + 0.001 * 0.25 = [0.001249, 0.004246]
    #   mhat = m / 0.19 = [0.7368421, -0.6842105]; vhat = v / 0.001999 = [0.6248124, 2.1240620]
    #   step = 0.1 * mhat / sqrt(vhat) = 0.1 * [0.7368421/0.7904508, -0.6842105/1.4574162]
    #        = [0.0932180, -0.0469468] -> w = [-0.1932180, 0.1469468]
    _push(t, k, [[0.5, 0.5]])
    r = t.rows(k)
    np.testing.assert_array_equal(r["step"], np.array([2], np.int32))
    np.testing.assert_allclose(r["m"], [[0.14, -0.13]], rtol=RTOL)
    np.testing.assert_allclose(r["v"], [[0.001249, 0.004246]], rtol=RTOL)
    np.testing.assert_allclose(_weights(t, k), [[-0.1932180, 0.1469468]], rtol=RTOL)
    # step 3 (t=3): g = [-1, 0]
    #   m = 0.9 [0.14, -0.13] + 0.1 [-1, 0] = [0.026, -0.117]
    #   v = 0.999 [0.001249, 0.004246] + 0.001 [1, 0] = [0.002247751, 0.004241754]
    #   mhat = m / 0.271 = [0.0959410, -0.4317343]; vhat = v / 0.002997001 = [0.7500001, 1.4153329]
    #   step = 0.1 * [0.0959410/0.8660254, -0.4317343/1.1896776] = [0.0110783, -0.0362900]
    #   w = [-0.2042963, 0.1832368]
    _push(t, k, [[-1.0, 0.0]])
    r = t.rows(k)
    np.testing.assert_array_equal(r["step"], np.array([3], np.int32))
    np.testing.assert_allclose(r["m"], [[0.026, -0.117]], rtol=RTOL)
    np.testing.assert_allclose(r["v"], [[0.002247751, 0.004241754]], rtol=RTOL)
    np.testing.assert_allclose(_weights(t, k), [[-0.2042963, 0.1832368]], rtol=RTOL)


def test_adam_without_bias_correction_hand_computed() -> None:
    opt = Adam(learning_rate=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8, bias_correction=False)
    t = SparseTable(2, opt, name="adam", initializer=zeros(), seed=0)
    k = _keys(7)
    t.pull(k)
    # TensorNet's rule: w -= lr * m / (sqrt(v) + eps), same m, v as the bias-corrected test.
    # step 1: m = [0.1, -0.2], sqrt(v) = [0.0316228, 0.0632456]
    #         w = -0.1 * [3.1622777, -3.1622777] = [-0.3162278, 0.3162278]
    _push(t, k, [[1.0, -2.0]])
    np.testing.assert_allclose(_weights(t, k), [[-0.3162278, 0.3162278]], rtol=RTOL)
    # step 2: m = [0.14, -0.13], sqrt(v) = [0.0353412, 0.0651613]
    #         w -= 0.1 * [3.9613828, -1.9950480] -> [-0.7123659, 0.5157325]
    _push(t, k, [[0.5, 0.5]])
    np.testing.assert_allclose(_weights(t, k), [[-0.7123659, 0.5157325]], rtol=RTOL)
    # step 3: m = [0.026, -0.117], sqrt(v) = [0.0474105, 0.0651288]
    #         w -= 0.1 * [0.5484023, -1.7964417] -> [-0.7672061, 0.6953767]
    _push(t, k, [[-1.0, 0.0]])
    np.testing.assert_allclose(_weights(t, k), [[-0.7672061, 0.6953767]], rtol=RTOL)
    np.testing.assert_array_equal(t.rows(k)["step"], np.array([3], np.int32))


def test_ftrl_hand_computed() -> None:
    opt = Ftrl(learning_rate=0.5, beta=1.0, l1=0.1, l2=1.0)
    t = SparseTable(2, opt, name="ftrl", initializer=zeros(), seed=0)
    k = _keys(7)
    np.testing.assert_array_equal(t.pull(k), _f32([[0.0, 0.0]]))
    r = t.rows(k)
    np.testing.assert_array_equal(r["z"], _f32([[0.0, 0.0]]))
    np.testing.assert_array_equal(r["n"], _f32([[0.0, 0.0]]))
    # step 1: g = [1, -0.05], n = 0, w = 0: sigma = |g| / 0.5 = [2, 0.1]; z = g; n = g^2
    #   coord 0: |z| = 1 > 0.1: w = -(1 - 0.1) / ((1 + 1) / 0.5 + 1) = -0.9 / 5 = -0.18
    #   coord 1: |z| = 0.05 <= l1 -> w = 0 exactly
    _push(t, k, [[1.0, -0.05]])
    r = t.rows(k)
    np.testing.assert_allclose(r["z"], [[1.0, -0.05]], rtol=RTOL)
    np.testing.assert_allclose(r["n"], [[1.0, 0.0025]], rtol=RTOL)
    np.testing.assert_allclose(r["weights"], [[-0.18, 0.0]], rtol=RTOL, atol=0)
    # step 2: g = [0.5, -0.2]
    #   coord 0: sigma = (sqrt(1.25) - 1) / 0.5 = 0.2360680; z = 1 + 0.5 + 0.2360680 * 0.18
    #            = 1.5424922; n = 1.25; w = -1.4424922 / ((1 + 1.1180340) / 0.5 + 1) = -0.2754915
    #   coord 1: sigma = (sqrt(0.0425) - 0.05) / 0.5 = 0.3123106; z = -0.05 - 0.2 - 0 = -0.25
    #            n = 0.0425; w = 0.15 / ((1 + 0.2061553) / 0.5 + 1) = 0.04395849
    _push(t, k, [[0.5, -0.2]])
    r = t.rows(k)
    np.testing.assert_allclose(r["z"], [[1.5424922, -0.25]], rtol=RTOL)
    np.testing.assert_allclose(r["n"], [[1.25, 0.0425]], rtol=RTOL)
    np.testing.assert_allclose(r["weights"], [[-0.2754915, 0.04395849]], rtol=RTOL)
    # step 3: g = [-2, 0.1]
    #   coord 0: sigma = (sqrt(5.25) - sqrt(1.25)) / 0.5 = 2.3465077
    #            z = 1.5424922 - 2 + 2.3465077 * 0.2754915 = 0.1889352; n = 5.25
    #            w = -(0.1889352 - 0.1) / ((1 + 2.2912878) / 0.5 + 1) = -0.01172889
    #   coord 1: sigma = (sqrt(0.0525) - sqrt(0.0425)) / 0.5 = 0.0459470
    #            z = -0.25 + 0.1 - 0.0459470 * 0.04395849 = -0.1520198; n = 0.0525
    #            w = 0.0520198 / ((1 + 0.2291288) / 0.5 + 1) = 0.01504219
    _push(t, k, [[-2.0, 0.1]])
    r = t.rows(k)
    np.testing.assert_allclose(r["z"], [[0.1889352, -0.1520198]], rtol=RTOL)
    np.testing.assert_allclose(r["n"], [[5.25, 0.0525]], rtol=RTOL)
    np.testing.assert_allclose(r["weights"], [[-0.01172889, 0.01504219]], rtol=RTOL)


def test_ftrl_large_l1_gives_exact_zeros() -> None:
    opt = Ftrl(learning_rate=0.5, beta=1.0, l1=1.5, l2=1.0)
    t = SparseTable(2, opt, name="ftrl", initializer=zeros(), seed=0)
    k = _keys(INT64_MIN, INT64_MAX)
    t.pull(k)
    # key INT64_MIN, g = [1, 2]: z = g, n = g^2
    #   coord 0: |z| = 1 <= 1.5 -> exactly 0
    #   coord 1: w = -(2 - 1.5) / ((1 + 2) / 0.5 + 1) = -0.5 / 7 = -0.07142857
    # key INT64_MAX, g = [-1.5, 0.25]: both |z| <= 1.5 -> exactly 0 (1.5 is on the boundary)
    _push(t, k, [[1.0, 2.0], [-1.5, 0.25]])
    w = _weights(t, k)
    assert w[0, 0] == 0.0
    np.testing.assert_allclose(w[0, 1], -0.07142857, rtol=RTOL)
    np.testing.assert_array_equal(w[1], _f32([[0.0, 0.0]])[0])
    np.testing.assert_allclose(t.rows(k)["z"], [[1.0, 2.0], [-1.5, 0.25]], rtol=0)


@pytest.fixture
def ftrl_and_sgd_tables() -> tuple[SparseTable, SparseTable]:
    """Two tables with the same (seed, name, initializer): the same initial vectors."""
    opt = Ftrl(learning_rate=0.05, beta=1.0, l1=0.1, l2=1.0)
    ftrl = SparseTable(8, opt, name="item", initializer=normal(2.0), seed=11)
    sgd = SparseTable(8, SGD(), name="item", initializer=normal(2.0), seed=11)
    return ftrl, sgd


def test_ftrl_new_row_reads_back_initial_vector(
    ftrl_and_sgd_tables: tuple[SparseTable, SparseTable],
) -> None:
    ftrl, sgd = ftrl_and_sgd_tables
    k = _keys(0, -1, INT64_MIN, INT64_MAX, 123456789)
    w_ftrl = ftrl.pull(k)
    w_sgd = sgd.pull(k)
    assert np.all(w_sgd != 0.0)
    np.testing.assert_allclose(w_ftrl, w_sgd, rtol=RTOL)
    np.testing.assert_allclose(_weights(ftrl, k), w_sgd, rtol=RTOL)
    # z such that w(z, n = 0) = -(z - sign(z) l1) / (beta / alpha + l2) = w0
    r = ftrl.rows(k)
    np.testing.assert_array_equal(r["n"], np.zeros((5, 8), np.float32))
    z = r["z"].astype(np.float64)
    w_from_z = np.where(np.abs(z) <= 0.1, 0.0, -(z - np.sign(z) * 0.1) / (1.0 / 0.05 + 1.0))
    np.testing.assert_allclose(w_from_z, w_sgd, rtol=RTOL)
    # a zero gradient leaves z and n, hence w, where they were
    _push(ftrl, k, np.zeros((5, 8), np.float32))
    np.testing.assert_allclose(_weights(ftrl, k), w_sgd, rtol=RTOL)


# ---------------------------------------------------------------------------
# Plain-NumPy reference: float64 math, float32 storage after each push
# ---------------------------------------------------------------------------

State = dict[str, np.ndarray]
Rule = Callable[[State, np.ndarray, np.ndarray, float], None]


def _ref_sgd(s: State, i: np.ndarray, g32: np.ndarray, lr: float) -> None:
    w = s["weights"][i].astype(np.float64)
    s["weights"][i] = (w - lr * g32.astype(np.float64)).astype(np.float32)


def _ref_adagrad(eps: float) -> Rule:
    def rule(s: State, i: np.ndarray, g32: np.ndarray, lr: float) -> None:
        g = g32.astype(np.float64)  # [U, D]
        g2sum = s["g2sum"][i].astype(np.float64) + (g * g).sum(axis=1) / g.shape[1]  # [U]
        w = s["weights"][i].astype(np.float64) - lr * g / (eps + np.sqrt(g2sum))[:, None]
        s["g2sum"][i] = g2sum.astype(np.float32)
        s["weights"][i] = w.astype(np.float32)

    return rule


def _ref_adam(b1: float, b2: float, eps: float, bias_correction: bool) -> Rule:
    def rule(s: State, i: np.ndarray, g32: np.ndarray, lr: float) -> None:
        g = g32.astype(np.float64)
        t = s["step"][i].astype(np.int64) + 1  # [U]
        m = b1 * s["m"][i].astype(np.float64) + (1 - b1) * g
        v = b2 * s["v"][i].astype(np.float64) + (1 - b2) * g * g
        if bias_correction:
            mhat = m / (1 - b1 ** t.astype(np.float64))[:, None]
            vhat = v / (1 - b2 ** t.astype(np.float64))[:, None]
            step = lr * mhat / (np.sqrt(vhat) + eps)
        else:
            step = lr * m / (np.sqrt(v) + eps)
        s["weights"][i] = (s["weights"][i].astype(np.float64) - step).astype(np.float32)
        s["m"][i] = m.astype(np.float32)
        s["v"][i] = v.astype(np.float32)
        s["step"][i] = t.astype(np.int32)

    return rule


def _ref_ftrl(beta: float, l1: float, l2: float) -> Rule:
    def rule(s: State, i: np.ndarray, g32: np.ndarray, alpha: float) -> None:
        g = g32.astype(np.float64)
        w = s["weights"][i].astype(np.float64)
        z = s["z"][i].astype(np.float64)
        n = s["n"][i].astype(np.float64)
        sigma = (np.sqrt(n + g * g) - np.sqrt(n)) / alpha
        z = z + g - sigma * w
        n = n + g * g
        w = np.where(
            np.abs(z) <= l1, 0.0, -(z - np.sign(z) * l1) / ((beta + np.sqrt(n)) / alpha + l2)
        )
        s["weights"][i] = w.astype(np.float32)
        s["z"][i] = z.astype(np.float32)
        s["n"][i] = n.astype(np.float32)

    return rule


# (optimizer factory, reference rule), one per rule
OPTIMIZER_CASES = [
    pytest.param(lambda: SGD(learning_rate=0.05), _ref_sgd, id="sgd"),
    pytest.param(
        lambda: AdaGrad(learning_rate=0.05, initial_g2sum=0.1, epsilon=1e-8),
        _ref_adagrad(1e-8),
        id="adagrad",
    ),
    pytest.param(
        lambda: Adam(learning_rate=0.01, beta1=0.8, beta2=0.99, epsilon=1e-7),
        _ref_adam(0.8, 0.99, 1e-7, True),
        id="adam-bias-corrected",
    ),
    pytest.param(
        lambda: Adam(learning_rate=0.01, beta1=0.9, beta2=0.999, bias_correction=False),
        _ref_adam(0.9, 0.999, 1e-8, False),
        id="adam-tensornet",
    ),
    pytest.param(
        lambda: Ftrl(learning_rate=0.1, beta=1.0, l1=0.05, l2=0.5),
        _ref_ftrl(1.0, 0.05, 0.5),
        id="ftrl",
    ),
]

NUM_KEYS = 200
NUM_STEPS = 30
DIM = 5


@pytest.fixture
def random_keys() -> npt.NDArray[np.int64]:
    rng = np.random.default_rng(1234)
    keys = rng.integers(INT64_MIN, INT64_MAX, size=NUM_KEYS - 4, dtype=np.int64)
    keys = np.concatenate([keys, _keys(0, -1, INT64_MIN, INT64_MAX)])
    assert len(np.unique(keys)) == NUM_KEYS
    return keys


def _assert_table_matches(table: SparseTable, keys: np.ndarray, ref: State, step: int) -> None:
    rows = table.rows(keys)
    assert set(rows) == set(ref) | {"keys"}, step
    np.testing.assert_array_equal(rows["keys"], keys)
    for name, expected in ref.items():
        got = rows[name]
        assert got.dtype == expected.dtype, (name, step)
        if expected.dtype == np.int32:
            np.testing.assert_array_equal(got, expected, err_msg=f"{name} after step {step}")
        else:
            np.testing.assert_allclose(
                got, expected, rtol=RTOL, atol=ATOL, err_msg=f"{name} after step {step}"
            )


@pytest.mark.parametrize(("make_optimizer", "rule"), OPTIMIZER_CASES)
def test_matches_numpy_reference_over_random_pushes(
    make_optimizer: Callable[[], object], rule: Rule, random_keys: npt.NDArray[np.int64]
) -> None:
    rng = np.random.default_rng(99)
    opt = make_optimizer()
    decay_rate = 0.9
    table = SparseTable(
        DIM,
        opt,
        name="ref",
        initializer=normal(0.5),
        seed=7,
        policy=EvictionPolicy(show_decay_rate=decay_rate),
    )
    table.generation = 1
    table.pull(random_keys)
    # The starting state (initial vectors, FTRL's z) is the table's own: read it once.
    ref = {k: v.copy() for k, v in table.rows(random_keys).items() if k != "keys"}
    assert np.all(ref["marker"] == 1)
    assert np.all(ref["unseen_days"] == 0)
    assert np.all(ref["show"] == 0) and np.all(ref["click"] == 0)
    base_lr = opt.learning_rate
    for step in range(1, NUM_STEPS + 1):
        # a new learning rate every 10 steps, as a schedule would set it
        lr = base_lr * (1.0, 0.5, 2.0)[(step - 1) // 10]
        table.optimizer.learning_rate = lr
        table.generation = step + 1
        idx = rng.choice(NUM_KEYS, size=int(rng.integers(20, 120)), replace=False)
        grads = rng.normal(0.0, 1.0, size=(len(idx), DIM)).astype(np.float32)
        grads[rng.random(grads.shape) < 0.1] = 0.0
        show = rng.integers(0, 4, size=len(idx)).astype(np.float32)
        click = (rng.random(len(idx)) < 0.3).astype(np.float32)
        table.push(random_keys[idx], grads, show, click)

        rule(ref, idx, grads, lr)
        ref["show"][idx] = (ref["show"][idx].astype(np.float64) + show).astype(np.float32)
        ref["click"][idx] = (ref["click"][idx].astype(np.float64) + click).astype(np.float32)
        ref["unseen_days"][idx] = 0
        ref["marker"][idx] = step + 1
        if step % 7 == 0:
            days = step % 3 + 1
            table.show_decay(days)
            factor = decay_rate**days
            for name in ("show", "click"):
                ref[name] = (ref[name].astype(np.float64) * factor).astype(np.float32)
            ref["unseen_days"] += days
        _assert_table_matches(table, random_keys, ref, step)
    # keys were pushed a different number of times each
    if "step" in ref:
        assert len(np.unique(ref["step"])) > 5


# ---------------------------------------------------------------------------
# Cross-checks against torch.optim
# ---------------------------------------------------------------------------

# torch does float32 arithmetic where the table does float64: allow a few
# float32 ulps accumulated over the steps.
TORCH_RTOL = 1e-5
TORCH_ATOL = 1e-6


def _torch_step(
    param: torch.nn.Parameter, opt: torch.optim.Optimizer, grads: npt.NDArray[np.float32]
) -> None:
    opt.zero_grad(set_to_none=False)
    param.grad = torch.from_numpy(grads.copy())
    opt.step()


def test_sgd_matches_torch_sgd(random_keys: npt.NDArray[np.int64]) -> None:
    rng = np.random.default_rng(5)
    t = SparseTable(DIM, SGD(learning_rate=0.1), name="sgd", initializer=normal(), seed=1)
    w0 = t.pull(random_keys)
    param = torch.nn.Parameter(torch.from_numpy(w0.copy()))  # [U, D]
    opt = torch.optim.SGD([param], lr=0.1)
    ones = np.ones(NUM_KEYS, np.float32)
    for _ in range(NUM_STEPS):
        # only some rows are pushed; in torch the others get a zero gradient
        idx = np.sort(rng.choice(NUM_KEYS, size=80, replace=False))
        dense = np.zeros((NUM_KEYS, DIM), np.float32)
        dense[idx] = rng.normal(size=(len(idx), DIM)).astype(np.float32)
        t.push(random_keys[idx], dense[idx], ones[idx], ones[idx])
        _torch_step(param, opt, dense)
    np.testing.assert_allclose(
        _weights(t, random_keys), param.detach().numpy(), rtol=TORCH_RTOL, atol=TORCH_ATOL
    )
    assert not np.allclose(_weights(t, random_keys), w0, atol=1e-3)


def test_adam_matches_torch_adam(random_keys: npt.NDArray[np.int64]) -> None:
    rng = np.random.default_rng(6)
    opt = Adam(learning_rate=0.01, beta1=0.85, beta2=0.995, epsilon=1e-6)
    t = SparseTable(DIM, opt, name="adam", initializer=normal(), seed=1)
    w0 = t.pull(random_keys)
    param = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    topt = torch.optim.Adam([param], lr=0.01, betas=(0.85, 0.995), eps=1e-6)
    n = NUM_KEYS
    for _ in range(NUM_STEPS):
        # every row is pushed every step, so the table's per-row step count equals torch's
        grads = rng.normal(size=(n, DIM)).astype(np.float32)
        t.push(random_keys, grads, np.ones(n, np.float32), np.zeros(n, np.float32))
        _torch_step(param, topt, grads)
    np.testing.assert_allclose(
        _weights(t, random_keys), param.detach().numpy(), rtol=TORCH_RTOL, atol=TORCH_ATOL
    )
    rows = t.rows(random_keys)
    state = topt.state[param]
    np.testing.assert_allclose(rows["m"], state["exp_avg"].numpy(), rtol=TORCH_RTOL, atol=1e-7)
    np.testing.assert_allclose(rows["v"], state["exp_avg_sq"].numpy(), rtol=TORCH_RTOL, atol=1e-9)
    np.testing.assert_array_equal(rows["step"], np.full(n, NUM_STEPS, np.int32))


def test_adagrad_with_dim_1_matches_torch_adagrad(random_keys: npt.NDArray[np.int64]) -> None:
    # With D = 1 the row-wise accumulator sum(g*g)/D is torch's per-element one.
    rng = np.random.default_rng(8)
    opt = AdaGrad(learning_rate=0.1, initial_g2sum=0.5, epsilon=1e-8)
    t = SparseTable(1, opt, name="ada", initializer=normal(), seed=1)
    w0 = t.pull(random_keys)
    param = torch.nn.Parameter(torch.from_numpy(w0.copy()))  # [U, 1]
    topt = torch.optim.Adagrad([param], lr=0.1, initial_accumulator_value=0.5, eps=1e-8)
    ones = np.ones(NUM_KEYS, np.float32)
    for _ in range(NUM_STEPS):
        idx = np.sort(rng.choice(NUM_KEYS, size=100, replace=False))
        dense = np.zeros((NUM_KEYS, 1), np.float32)
        dense[idx] = rng.normal(size=(len(idx), 1)).astype(np.float32)
        t.push(random_keys[idx], dense[idx], ones[idx], ones[idx])
        _torch_step(param, topt, dense)
    np.testing.assert_allclose(
        _weights(t, random_keys), param.detach().numpy(), rtol=TORCH_RTOL, atol=TORCH_ATOL
    )
    np.testing.assert_allclose(
        t.rows(random_keys)["g2sum"], topt.state[param]["sum"].numpy()[:, 0], rtol=TORCH_RTOL
    )


def test_adagrad_is_row_wise_not_element_wise() -> None:
    # Written-out row-wise rule on one row, D = 4, g = [2, 0, 0, 0]:
    #   g2sum = (4 + 0 + 0 + 0) / 4 = 1  ->  w = -0.1 * g / (1e-8 + 1) = [-0.2, 0, 0, 0]
    # (torch.optim.Adagrad would give -0.1 * 2 / 2 = -0.1 for the first coordinate.)
    t = SparseTable(4, AdaGrad(learning_rate=0.1), name="ada", initializer=zeros(), seed=0)
    k = _keys(1)
    t.pull(k)
    _push(t, k, [[2.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(_weights(t, k), [[-0.2, 0.0, 0.0, 0.0]], rtol=RTOL)
    np.testing.assert_allclose(t.rows(k)["g2sum"], [1.0], rtol=RTOL)
    # g = [0, 0, 0, 4]: g2sum = 1 + 16 / 4 = 5 -> every coordinate of the row shares sqrt(5):
    #   w[3] = -0.1 * 4 / sqrt(5) = -0.1788854
    _push(t, k, [[0.0, 0.0, 0.0, 4.0]])
    np.testing.assert_allclose(_weights(t, k), [[-0.2, 0.0, 0.0, -0.1788854]], rtol=RTOL)
    np.testing.assert_allclose(t.rows(k)["g2sum"], [5.0], rtol=RTOL)


# ---------------------------------------------------------------------------
# Learning rate read at each push
# ---------------------------------------------------------------------------


def test_sgd_learning_rate_changed_between_pushes_is_used() -> None:
    t = SparseTable(2, SGD(learning_rate=0.5), name="sgd", initializer=zeros(), seed=0)
    k = _keys(7)
    t.pull(k)
    _push(t, k, [[1.0, 1.0]])  # w = -0.5 * 1 = -0.5
    t.optimizer.learning_rate = 0.25
    _push(t, k, [[1.0, -2.0]])  # w = [-0.5 - 0.25, -0.5 + 0.5] = [-0.75, 0.0]
    np.testing.assert_array_equal(_weights(t, k), _f32([[-0.75, 0.0]]))
    t.optimizer.learning_rate = 2.0
    _push(t, k, [[0.125, -0.5]])  # w = [-0.75 - 0.25, 0.0 + 1.0] = [-1.0, 1.0]
    np.testing.assert_array_equal(_weights(t, k), _f32([[-1.0, 1.0]]))


@pytest.mark.parametrize(
    ("make_optimizer", "g1", "lr2", "g2", "expected"),
    [
        # AdaGrad: push 1, g = [1, 7], lr 0.1: w = [-0.02, -0.14] (g2sum 25)
        #          push 2, g = [7, 1], lr 0.4: w -= 0.4 * [7, 1] / sqrt(50)
        #          = [-0.02 - 0.3959798, -0.14 - 0.0565685] = [-0.4159798, -0.1965685]
        pytest.param(
            lambda: AdaGrad(learning_rate=0.1),
            [[1.0, 7.0]],
            0.4,
            [[7.0, 1.0]],
            [[-0.4159798, -0.1965685]],
            id="adagrad",
        ),
        # Adam (bias-corrected): push 1, g = [1, -2], lr 0.1: w = -0.1 * sign(g) = [-0.1, 0.1]
        #          push 2, g = [0.5, 0.5], lr 0.4: w -= 0.4 * [0.9321796, -0.4694682]
        #          = [-0.1 - 0.3728719, 0.1 + 0.1877873] = [-0.4728719, 0.2877873]
        pytest.param(
            lambda: Adam(learning_rate=0.1),
            [[1.0, -2.0]],
            0.4,
            [[0.5, 0.5]],
            [[-0.4728719, 0.2877873]],
            id="adam",
        ),
        # FTRL (l1 0.1, l2 1): push 1, g = [1, -0.05], alpha 0.5: w = [-0.18, 0], z = [1, -0.05]
        #          push 2, g = [0.5, -0.2], alpha 0.25:
        #   coord 0: sigma = (sqrt(1.25) - 1) / 0.25 = 0.4721360; z = 1.5 + 0.4721360 * 0.18
        #            = 1.5849845; w = -1.4849845 / ((1 + 1.1180340) / 0.25 + 1) = -0.1567740
        #   coord 1: z = -0.25; w = 0.15 / ((1 + 0.2061553) / 0.25 + 1) = 0.02575275
        pytest.param(
            lambda: Ftrl(learning_rate=0.5, beta=1.0, l1=0.1, l2=1.0),
            [[1.0, -0.05]],
            0.25,
            [[0.5, -0.2]],
            [[-0.1567740, 0.02575275]],
            id="ftrl",
        ),
    ],
)
def test_learning_rate_changed_between_pushes_is_used(
    make_optimizer: Callable[[], object],
    g1: list[list[float]],
    lr2: float,
    g2: list[list[float]],
    expected: list[list[float]],
) -> None:
    t = SparseTable(2, make_optimizer(), name="lr", initializer=zeros(), seed=0)
    k = _keys(7)
    t.pull(k)
    _push(t, k, g1)
    t.optimizer.learning_rate = lr2
    _push(t, k, g2)
    np.testing.assert_allclose(_weights(t, k), expected, rtol=RTOL)


# ---------------------------------------------------------------------------
# Statistics written by push
# ---------------------------------------------------------------------------


def test_push_accumulates_show_click_resets_unseen_days_and_sets_marker() -> None:
    t = SparseTable(2, SGD(learning_rate=0.5), name="stats", initializer=zeros(), seed=0)
    t.generation = 1
    k = _keys(10, 20)
    t.pull(k)
    r = t.rows(k)
    np.testing.assert_array_equal(r["show"], _f32([[0.0, 0.0]])[0])
    np.testing.assert_array_equal(r["click"], _f32([[0.0, 0.0]])[0])
    np.testing.assert_array_equal(r["unseen_days"], np.array([0, 0], np.int32))
    np.testing.assert_array_equal(r["marker"], np.array([1, 1], np.int32))

    t.show_decay(3)  # show, click stay 0; unseen_days 0 -> 3
    t.generation = 5
    g = np.zeros((1, 2), np.float32)
    t.push(k[:1], g, np.array([2.0], np.float32), np.array([1.0], np.float32))
    t.push(k[:1], g, np.array([3.5], np.float32), np.array([0.0], np.float32))
    r = t.rows(k)
    np.testing.assert_array_equal(r["show"], np.array([5.5, 0.0], np.float32))  # 2 + 3.5
    np.testing.assert_array_equal(r["click"], np.array([1.0, 0.0], np.float32))  # 1 + 0
    np.testing.assert_array_equal(r["unseen_days"], np.array([0, 3], np.int32))
    np.testing.assert_array_equal(r["marker"], np.array([5, 1], np.int32))

    # pulling an existing row neither creates it again nor marks it
    t.generation = 6
    t.pull(k)
    np.testing.assert_array_equal(t.rows(k)["marker"], np.array([5, 1], np.int32))
    # show_decay(2) with the default rate 0.98: 5.5 * 0.98^2 = 5.2822; 1 * 0.9604
    t.show_decay(2)
    r = t.rows(k)
    np.testing.assert_allclose(r["show"], [5.2822, 0.0], rtol=RTOL)
    np.testing.assert_allclose(r["click"], [0.9604, 0.0], rtol=RTOL)
    np.testing.assert_array_equal(r["unseen_days"], np.array([2, 5], np.int32))
    t.push(k, np.zeros((2, 2), np.float32), np.ones(2, np.float32), np.zeros(2, np.float32))
    r = t.rows(k)
    np.testing.assert_allclose(r["show"], [6.2822, 1.0], rtol=RTOL)
    np.testing.assert_array_equal(r["unseen_days"], np.array([0, 0], np.int32))
    np.testing.assert_array_equal(r["marker"], np.array([6, 6], np.int32))
