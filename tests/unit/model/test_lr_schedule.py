"""LearningRateScheduler: dense and sparse rates per global step, a float64 reference,
exact resume from mid-day checkpoints, bad arguments."""

import numpy as np
import pytest
import torch

import tnrec as tn
from tnrec.callbacks import Callback, LearningRateScheduler
from tnrec.daily import train_days
from tnrec.errors import ArgumentError
from tnrec.schedules import CosineDecay, ExponentialDecay, WarmUp
from tnrec.table import AdaGrad, Ftrl, SparseTable, zeros

fc = tn.feature_column
SPARSE_LR, DENSE_LR, G2, EPS = 0.1, 0.05, 0.1, 1e-8


class Linear(tn.Model):
    """``out = sum(w[k]) + b`` over one key per row: gradients are easy to write down."""

    def __init__(self) -> None:
        super().__init__()
        col = fc.embedding_column(fc.category_column("k"), 2)
        self.emb = tn.layers.EmbeddingFeatures(
            [col], AdaGrad(SPARSE_LR, initial_g2sum=G2), output="concat", initializer=zeros()
        )
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def forward_dense(self, pooled, dense):
        return pooled["emb"].sum(1) + self.bias


def _linear() -> Linear:
    m = Linear()
    m.compile(tn.optimizer.SGD(DENSE_LR), loss="mse")
    return m


# Five steps of four rows; key 7 appears twice in step 0, key 9 first in step 2.
KEYS = [[7, 8, 7, 5], [5, 8, 8, 8], [9, 7, 5, 9], [8, 8, 7, 9], [5, 9, 9, 7]]
LABELS = [[1.0, 0.0, 0.5, 2.0], [0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.5]] + [
    [0.5, 0.0, 1.0, 1.5],
    [2.0, 0.0, 1.0, 0.0],
]


def _batches(make_batch):
    return [make_batch({"k": [[k] for k in ks]}, y) for ks, y in zip(KEYS, LABELS, strict=True)]


def _reference(factors):
    """float64 AdaGrad rows and SGD bias for ``KEYS``/``LABELS`` at rates ``base * factors[t]``."""
    w, g2, b = {}, {}, 0.0
    for t, (ks, ys) in enumerate(zip(KEYS, LABELS, strict=True)):
        for k in ks:
            w.setdefault(k, np.zeros(2))
            g2.setdefault(k, G2)
        out = np.array([w[k].sum() for k in ks]) + b  # [B]
        r = 2.0 * (out - np.array(ys)) / len(ks)  # d loss / d out, loss = mean((out - y)^2)
        for k in sorted(set(ks)):
            g = np.full(2, sum(ri for ri, kk in zip(r, ks, strict=True) if kk == k))  # [D]
            g2[k] += float(g @ g) / 2
            w[k] = w[k] - SPARSE_LR * factors[t] * g / (EPS + np.sqrt(g2[k]))
        b -= DENSE_LR * factors[t] * r.sum()
    return w, b


class Rates(Callback):
    """Records the dense and sparse rates each step ran with."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, float]] = []

    def on_train_batch_end(self, step, logs=None):
        lr = self.model.optimizer.param_groups[0]["lr"]
        self.seen.append((lr, self.model.tables["emb"].learning_rate))


def test_a_schedule_sets_both_rates_and_matches_a_float64_reference(make_batch):
    schedule = WarmUp(2, start_factor=0.5, then=ExponentialDecay(1, 0.5))
    factors = [0.5, 0.75, 1.0, 0.5, 0.25]  # by hand: warm-up 0.5, 0.75; then 0.5 ** (t - 2)
    model, rates = _linear(), Rates()
    history = model.fit(
        _batches(make_batch), callbacks=[LearningRateScheduler(schedule), rates], verbose=0
    )
    assert rates.seen == [(DENSE_LR * f, SPARSE_LR * f) for f in factors]
    assert history.history["learning_rate"] == [DENSE_LR * 0.25]
    w, b = _reference(factors)
    rows = model.tables["emb"].rows()
    got = dict(zip(rows["keys"].tolist(), rows["weights"], strict=True))
    assert sorted(got) == sorted(w)
    for k in w:
        np.testing.assert_allclose(got[k], w[k], rtol=2e-6, err_msg=f"key {k}")
    np.testing.assert_allclose(float(model.bias.detach()), b, rtol=2e-6)
    # the same steps at the constant rates end elsewhere: the schedule is what matched
    w1, _ = _reference([1.0] * 5)
    assert not np.allclose(got[7], w1[7], rtol=1e-3)


def test_a_keras_function_gets_each_optimizer_current_rate_and_the_global_step(make_batch):
    calls = []

    def halve(step, lr):
        calls.append((step, lr))
        return lr * 0.5

    model, rates = _linear(), Rates()
    cb = LearningRateScheduler(halve, dense=False)
    model.fit(_batches(make_batch)[:2], callbacks=[cb, rates], verbose=0)
    model.fit(_batches(make_batch)[2:3], callbacks=[cb, rates], verbose=0)
    assert calls == [(0, SPARSE_LR), (1, SPARSE_LR / 2), (2, SPARSE_LR / 4)]
    assert rates.seen == [(DENSE_LR, SPARSE_LR / 2), (DENSE_LR, SPARSE_LR / 4)] + [
        (DENSE_LR, SPARSE_LR / 8)
    ]


def test_tables_empty_schedules_the_dense_rate_only(make_batch):
    model, rates = _linear(), Rates()
    cb = LearningRateScheduler(lambda step, lr: 0.01 * (step + 1), tables=())
    model.fit(_batches(make_batch)[:2], callbacks=[cb, rates], verbose=0)
    assert rates.seen == [(0.01, SPARSE_LR), (0.02, SPARSE_LR)]
    assert model.tables["emb"].scheduled_learning_rate is None


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: LearningRateScheduler(0.1),
            r"LearningRateScheduler: `schedule` must be a tnrec schedule or a function "
            r"\(step, lr\) -> lr\. Received: 0.1",
        ),
        (
            lambda: LearningRateScheduler(WarmUp(2), tables="emb"),
            r"`tables` must be a list of table names or None\. Received: 'emb'",
        ),
    ],
    ids=["not-callable", "tables-str"],
)
def test_bad_constructor_arguments_are_refused(make, match):
    with pytest.raises(ArgumentError, match=match):
        make()


@pytest.mark.parametrize(
    ("cb", "match"),
    [
        (
            LearningRateScheduler(WarmUp(2), tables=["emb", "nope"]),
            r"`tables` names \['nope'\], which the model lacks; its tables are \['emb'\]",
        ),
        (
            LearningRateScheduler(lambda step, lr: float("nan")),
            r"the schedule returned nan for the dense optimizer at step 0; a learning rate must "
            r"be a finite number >= 0",
        ),
        (
            LearningRateScheduler(lambda step, lr: -1.0, dense=False),
            r'the schedule returned -1.0 for table "emb" at step 0',
        ),
    ],
    ids=["unknown-table", "nan", "negative"],
)
def test_bad_schedules_fail_when_fit_starts(make_batch, cb, match):
    model = _linear()
    with pytest.raises(ArgumentError, match=match):
        model.fit(_batches(make_batch), callbacks=[cb], verbose=0)


def test_table_learning_rate_is_checked_and_ftrl_refuses_zero():
    t = SparseTable(2, AdaGrad(0.1), name="t")
    t.set_learning_rate(0.0)
    assert t.learning_rate == 0.0 and t.scheduled_learning_rate == 0.0
    t.set_learning_rate(None)
    assert t.learning_rate == 0.1 and t.scheduled_learning_rate is None
    with pytest.raises(ArgumentError, match=r'Table "t": the learning rate must be a finite '):
        t.set_learning_rate(float("inf"))
    f = SparseTable(2, Ftrl(0.1), name="f")
    with pytest.raises(ArgumentError, match=r"> 0 \(Ftrl divides by it\)\. Received: 0.0"):
        f.set_learning_rate(0.0)


class Stop(Callback):
    """Raises after global step ``at`` (a crash in the middle of a day)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, step, logs=None):
        if self.model.global_step == self.at:
            raise RuntimeError(f"stopped at step {self.at}")


@pytest.mark.parametrize(
    "schedule",
    [WarmUp(7, 0.2, then=CosineDecay(20, 0.1)), lambda step, lr: lr * 0.97],
    ids=["warmup-cosine", "keras-function"],
)
def test_a_run_stopped_mid_schedule_resumes_bit_identically(common, tmp_path, schedule):
    # 240 rows a day in batches of 16: 15 steps a day; saves every 4 steps; the stop at
    # step 22 (day 1) leaves the checkpoint of step 20, whose rates are mid-schedule.
    days = [
        (f"d{d}", lambda d=d: common.reader(common.write_day(str(tmp_path), d))) for d in (0, 1)
    ]

    def run(model_dir, extra=()):
        model = common.build()
        cbs = [LearningRateScheduler(schedule), *extra]
        train_days(model, days, str(model_dir), save_every_n_steps=4, callbacks=cbs)
        return model

    whole = run(tmp_path / "whole")
    with pytest.raises(RuntimeError, match="stopped at step 22"):
        run(tmp_path / "stopped", [Stop(22)])
    resumed = run(tmp_path / "stopped")
    assert resumed.global_step == whole.global_step == 30
    common.assert_same(common.snapshot(resumed), common.snapshot(whole), skip=())
    for name, table in whole.tables.items():
        assert resumed.tables[name].learning_rate == table.learning_rate
        assert table.learning_rate != table.optimizer.learning_rate  # the schedule moved it
    assert resumed.optimizer.param_groups[0]["lr"] == whole.optimizer.param_groups[0]["lr"]
