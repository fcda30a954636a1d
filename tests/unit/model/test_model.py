"""tn.Model: compile/fit/evaluate/predict, overrides, weights, heads, logs and errors."""

import io

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

import tnrec as tn
from tnrec.callbacks import Callback, ProgressBar
from tnrec.errors import ArgumentError, DataError, EmptyInputError, NonFiniteError
from tnrec.table import SGD, AdaGrad, zeros

fc = tn.feature_column


class Small(tn.Model):
    def __init__(self, heads=None):
        super().__init__()
        cols = [fc.embedding_column(fc.category_column(k), 4) for k in ("user", "item")]
        cols.append(fc.embedding_column(fc.category_column("tags"), 4, combiner="mean"))
        self.emb = tn.layers.EmbeddingFeatures(cols, AdaGrad(0.05), output="concat")
        self.head_names = heads  # not `heads`: Model.heads is the compiled heads
        self.out = torch.nn.Linear(14, len(heads) if heads else 1)

    def forward_dense(self, pooled, dense):
        z = self.out(torch.cat([pooled["emb"], dense], 1))
        if self.head_names:
            return {h: torch.sigmoid(z[:, i]) for i, h in enumerate(self.head_names)}
        return torch.sigmoid(z)


def compiled(**kw):
    torch.manual_seed(0)
    m = Small(kw.pop("heads", None))
    m.compile(tn.optimizer.Adam(learning_rate=0.02), **{"metrics": ["auc", "logloss"], **kw})
    return m


def test_fit_learns_and_history_has_every_epoch(batches):
    train, val = batches(30, 128, seed=1), batches(5, 128, seed=2)
    m = compiled(metrics=["auc", "logloss", "ctr", "pctr", "copc", "accuracy"])
    h = m.fit(train, epochs=3, validation_data=val, verbose=0)
    assert h.epoch == [0, 1, 2]
    for k in ("loss", "auc", "logloss", "ctr", "pctr", "copc", "accuracy", "val_loss", "val_auc"):
        assert len(h.history[k]) == 3, k
    assert h.history["loss"][2] < h.history["loss"][0]
    assert h.history["val_auc"][2] > 0.7
    assert len(m.tables["emb"]) > 50  # rows created by training, not by validation
    labels = np.concatenate([b.labels[:, 0] for b in train]).astype(np.float64)
    np.testing.assert_allclose(h.history["ctr"][0], labels.mean(), rtol=1e-9)


def test_evaluate_matches_sklearn_on_predict_output(batches):
    train, test = batches(20, 128, seed=1), batches(6, 100, seed=9)
    m = compiled()
    m.fit(train, epochs=2, verbose=0)
    size = len(m.tables["emb"])
    logs = m.evaluate(test, verbose=0, exact_auc=True)
    out = m.predict(test)
    assert len(m.tables["emb"]) == size  # evaluation and prediction create no key
    assert set(out) == {"row_id", "label", "prediction"}
    np.testing.assert_array_equal(out["row_id"], np.concatenate([b.row_ids for b in test]))
    np.testing.assert_array_equal(out["label"], np.concatenate([b.labels[:, 0] for b in test]))
    exact = roc_auc_score(out["label"], out["prediction"])
    assert abs(logs["auc_exact"] - exact) < 1e-9
    assert abs(logs["auc"] - exact) < 1e-3
    assert abs(logs["logloss"] - log_loss(out["label"], out["prediction"])) < 1e-5
    assert abs(logs["loss"] - logs["logloss"]) < 1e-5


def test_train_step_override_runs_under_fit(batches):
    class Counting(Small):
        seen = 0

        def train_step(self, batch):
            self.seen += batch.size
            return super().train_step(batch)

    torch.manual_seed(0)
    m = Counting()
    m.compile(torch.optim.SGD(m.parameters(), lr=0.1))
    m.fit(batches(7, 16), epochs=2, steps_per_epoch=5, verbose=0)
    assert m.seen == 2 * 5 * 16


def test_train_step_trains_on_an_overridden_compute_loss(batches):
    class Flipped(Small):
        calls = 0

        def compute_loss(self, batch, outputs, norm=None):
            self.calls += 1
            loss, preds = super().compute_loss(batch, outputs, norm)
            return 2.0 * loss, {k: 1 - p for k, p in preds.items()}

    data = batches(6, 32, seed=3)
    models = []
    for cls, lr in ((Small, 0.2), (Flipped, 0.1)):  # twice the loss at half the rate
        torch.manual_seed(0)
        m = cls()
        m.compile(torch.optim.SGD(m.parameters(), lr=lr), metrics=["auc"])
        models.append((m, m.fit(data, verbose=0).history))
    (plain, hp), (flipped, hf) = models
    assert flipped.calls == 6  # train_step called the override, and trained on its loss ...
    for a, b in zip(plain.out.parameters(), flipped.out.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # ... and its metrics read the override's predictions
    assert hf["auc"][0] == pytest.approx(1 - hp["auc"][0], abs=1e-3)


def test_callbacks_progress_lines_and_stop_training(batches):
    events = []

    class Recorder(Callback):
        def on_epoch_end(self, epoch, logs=None):
            events.append((epoch, round(logs["loss"], 6)))
            self.model.stop_training = epoch == 1

        def on_train_batch_end(self, step, logs=None):
            events.append(step)

    m = compiled()
    m.fit(batches(3, 8), epochs=5, callbacks=[Recorder()], verbose=0)
    assert [e for e in events if isinstance(e, int)] == [1, 2, 3, 1, 2, 3]
    assert [e[0] for e in events if isinstance(e, tuple)] == [0, 1]

    stream = io.StringIO()  # not a terminal: plain lines every `log_every` steps
    bar = ProgressBar(None, stream=stream, log_every=2)
    for step in range(1, 6):
        if bar.due(step):
            bar.update(step, step * 10, {"loss": 0.5})
    bar.close(0, {"loss": 0.25, "auc": 0.75})
    lines = stream.getvalue().splitlines()
    assert [ln.split(" - ")[0] for ln in lines] == ["step 2", "step 4", "epoch 1"]
    assert lines[-1].endswith("loss: 0.25 - auc: 0.75") and "samples/s" in lines[0]


def test_sample_weights_scale_the_gradient_as_the_formula_says(make_batch):
    # loss = sum_i w_i * (p_i - y_i)^2 / sum_i w_i, p_i = pooled embedding of row i
    class Identity(tn.Model):
        def __init__(self):
            super().__init__()
            col = fc.embedding_column(fc.category_column("k"), 1)
            self.emb = tn.layers.EmbeddingFeatures([col], SGD(1.0), initializer=zeros())

        def forward_dense(self, pooled, dense):
            return pooled["emb"][0][:, 0]

    m = Identity()
    m.compile(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0), loss="mse")
    batch = make_batch({"k": [[1], [2], [1]]}, [1.0, 2.0, 3.0], weights=[1.0, 2.0, 5.0])
    m.train_step(batch)
    # d loss / d e_1 = 2 * (0 - 1) * 1/8 + 2 * (0 - 3) * 5/8 = -4; e_2: 2 * (0 - 2) * 2/8 = -1
    rows = m.tables["emb"].rows()
    np.testing.assert_allclose(rows["weights"][:, 0], [4.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(rows["show"], [6.0, 2.0])  # sample-weighted occurrences
    np.testing.assert_allclose(rows["click"], [1 * 1 + 5 * 3, 2 * 2])  # label-weighted


def test_empty_batch_is_a_no_op(make_batch, batches):
    m = compiled()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    empty = make_batch({"user": [], "item": [], "tags": []}, np.zeros(0), dense=np.zeros((0, 2)))
    assert m.train_step(empty) == {}
    assert len(m.tables["emb"]) == 0
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, before[k])
    with pytest.raises(EmptyInputError, match=r"Small.evaluate: the input holds no rows; there"):
        m.evaluate([empty], verbose=0)
    assert m.predict([empty])["prediction"].shape == (0,)
    h = m.fit([empty, *batches(2, 8)], verbose=0)
    assert len(h.history["loss"]) == 1


def test_two_heads_with_their_own_labels_and_metrics(batches):
    data = batches(10, 32, seed=4)
    two = [
        type(b)(
            sparse=b.sparse,
            dense=b.dense,
            dense_names=b.dense_names,
            labels=np.stack([b.labels[:, 0], 1 - b.labels[:, 0]], 1),
            label_names=("click", "skip"),
            weights=None,
            row_ids=b.row_ids,
        )
        for b in data
    ]
    m = compiled(
        heads=["click", "skip"],
        loss={"click": "binary_crossentropy", "skip": "binary_crossentropy"},
        metrics={"click": ["auc"], "skip": ["ctr"]},
        loss_weights={"skip": 0.5},
    )
    h = m.fit(two, epochs=2, verbose=0)
    assert {"loss", "click_auc", "skip_ctr"} <= set(h.history)
    out = m.predict(two[:2])
    assert set(out) == {"row_id", "click", "skip", "prediction_click", "prediction_skip"}
    ys = np.concatenate([b.labels[:, 1] for b in two]).astype(np.float64)
    np.testing.assert_allclose(h.history["skip_ctr"][0], ys.mean(), rtol=1e-9)
    # clicks in the tables follow the first head's label ("click")
    rows = m.tables["emb"].rows()
    assert rows["click"].sum() > 0


def test_compile_and_model_errors(batches, make_batch):
    m = Small()
    with pytest.raises(ArgumentError, match="call model.compile"):
        m.fit(batches(1, 4), verbose=0)
    with pytest.raises(ArgumentError, match=r"`loss` must be one of \['binary_crossentropy'"):
        m.compile(tn.optimizer.Adam(), loss="hinge")
    with pytest.raises(ArgumentError, match="Ftrl is a sparse rule"):
        m.compile(tn.optimizer.Ftrl())
    with pytest.raises(ArgumentError, match="`clip_norm` must be a positive number"):
        m.compile(tn.optimizer.Adam(), clip_norm=0)
    with pytest.raises(ArgumentError, match=r"`metric` must be a Metric or one of.*metric=.f1."):
        m.compile(tn.optimizer.Adam(), metrics=["f1"])
    m.compile(tn.optimizer.Adam())
    with pytest.raises(ArgumentError, match=r"`epochs` must be an int >= 0"):
        m.fit(batches(1, 4), epochs=-1, verbose=0)
    two_labels = make_batch(
        {"user": [[1]], "item": [[2]], "tags": [[]]},
        [[0, 1]],
        dense=[[0, 0]],
        label_names=("a", "b"),
    )
    with pytest.raises(ArgumentError, match=r"name the one to train on with compile\(label=...\)"):
        m.train_step(two_labels)

    class NoDense(tn.Model):
        def __init__(self):
            super().__init__()
            self.emb = tn.layers.EmbeddingFeatures(
                [fc.embedding_column(fc.category_column("user"), 4)], SGD()
            )

    nd = NoDense()
    nd.compile(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    with pytest.raises(
        ArgumentError, match=r"NoDense must override forward_dense\(pooled, dense\)"
    ):
        nd.train_step(batches(1, 4)[0])


def test_gradient_clipping_bounds_the_dense_update(batches):
    data = batches(1, 64)
    deltas = []
    for clip in (None, 1e-3):
        torch.manual_seed(0)
        m = Small()
        m.compile(torch.optim.SGD(m.parameters(), lr=1.0), clip_norm=clip)
        before = m.out.weight.detach().clone()
        m.train_step(data[0])
        deltas.append(float((m.out.weight.detach() - before).norm()))
    assert deltas[1] <= 1e-3 + 1e-7 < deltas[0]


def test_custom_loop_with_public_pull_and_push(batches):
    m = Small()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    m.compile(opt)
    m.train()
    b = batches(1, 32)[0]
    step = m.pull(b)
    loss = torch.nn.functional.binary_cross_entropy(
        m(b).squeeze(1), torch.from_numpy(b.labels[:, 0])
    )
    loss.backward()
    grads = step["emb"].E.grad.clone()
    w0 = m.tables["emb"].pull(step["emb"].keys, create=False)
    m.push()
    opt.step()
    w1 = m.tables["emb"].pull(step["emb"].keys, create=False)
    moved = np.abs(w1 - w0).sum(1) > 0
    np.testing.assert_array_equal(moved, grads.abs().sum(1).numpy() > 0)


def test_compile_uses_the_models_default_dense_optimizer(batches):
    m = Small()
    with pytest.raises(ArgumentError, match="Small.compile: `dense_optimizer` is required"):
        m.compile()
    m.default_dense_optimizer = tn.optimizer.SGD(learning_rate=0.5)
    m.compile()
    assert isinstance(m.optimizer, torch.optim.SGD) and m.optimizer.param_groups[0]["lr"] == 0.5


# --- labels and sample weights outside the loss's domain ----------------------------------


def _with(batch, labels=None, weights=None, row_ids=None):
    """``batch`` with other labels ``[B]``, sample weights or row ids."""
    return type(batch)(
        sparse=batch.sparse,
        dense=batch.dense,
        dense_names=batch.dense_names,
        labels=batch.labels if labels is None else np.asarray(labels, np.float32)[:, None],
        label_names=batch.label_names,
        weights=None if weights is None else np.asarray(weights, np.float32),
        row_ids=batch.row_ids if row_ids is None else np.asarray(row_ids, np.int64),
    )


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        pytest.param(2.0, "2", id="two"),
        pytest.param(-1.0, "-1", id="minus_one"),
        pytest.param(np.nan, "nan", id="nan"),
    ],
)
def test_labels_outside_the_loss_range_raise_before_any_update(batches, bad, shown):
    b = batches(1, 8)[0]
    labels = b.labels[:, 0].copy()
    labels[3] = bad
    # row 3 of file #2: row ids encode file_index << 40 | row in file
    bad_batch = _with(b, labels, row_ids=(2 << 40) + np.arange(8))
    m = compiled()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    want = (
        r'Small.train_step \(step 1\): Label "label" of the model\'s output must be finite and '
        r'in \[0, 1\] \(for its loss "binary_crossentropy", metric "auc", metric "logloss"\)\. '
        rf"Received: \[{shown}\] in 1 of the batch's 8 rows, the first at "
        r"row_id=2199023255555 \(file #2, row 3\)\. Nothing was updated\."
    )
    with pytest.raises(DataError, match=want):
        m.fit([bad_batch], verbose=0)
    assert len(m.tables["emb"]) == 0  # not even pulled
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, before[k])
    with pytest.raises(DataError, match=r"Small.test_step: Label \"label\" of the model's output"):
        m.evaluate([bad_batch], verbose=0)


def test_label_range_follows_the_loss_and_the_metrics(batches):
    b = batches(1, 8)[0]
    labels = b.labels[:, 0].copy()
    labels[[1, 5]] = [3.5, -2.0]
    m = compiled(loss="mse", metrics=["mse"])
    assert m.train_step(_with(b, labels))["loss"] > 0  # mse takes any finite label
    labels[5] = np.inf
    with pytest.raises(DataError, match=r"must be finite \(for its loss \"mse\", metric \"mse\"\)"):
        m.train_step(_with(b, labels))

    def nan_is_missing(out, y):  # a callable loss may use NaN as "no label": not checked
        known = ~torch.isnan(y)
        return known * (out - torch.nan_to_num(y)) ** 2

    labels[5] = np.nan
    m = compiled(loss=nan_is_missing, metrics=[])
    assert np.isfinite(m.train_step(_with(b, labels))["loss"])
    m = compiled(loss=nan_is_missing, metrics=["auc"])  # ... but its metrics need labels in [0, 1]
    with pytest.raises(DataError, match=r"in \[0, 1\] \(for its metric \"auc\"\)\. Received: \["):
        m.train_step(_with(b, labels))


def test_two_heads_name_the_head_with_bad_labels(batches):
    b = batches(1, 4)[0]
    two = type(b)(
        sparse=b.sparse,
        dense=b.dense,
        dense_names=b.dense_names,
        labels=np.array([[0, 0], [1, 1], [0, 7], [1, 0]], np.float32),
        label_names=("click", "skip"),
        weights=None,
        row_ids=b.row_ids,
    )
    bce = "binary_crossentropy"
    m = compiled(heads=["click", "skip"], loss={"click": bce, "skip": bce}, metrics={})
    with pytest.raises(DataError, match=r'Label "skip" of head "skip" must be finite and in'):
        m.train_step(two)


@pytest.mark.parametrize(
    ("w", "shown"),
    [
        pytest.param([1, -0.5, 1, 1], "-0.5", id="neg"),
        pytest.param([1, 1, np.nan, 1], "nan", id="nan"),
    ],
)
def test_bad_sample_weights_raise_naming_the_row(batches, w, shown):
    b = _with(batches(1, 4)[0], weights=w)
    m = compiled()
    with pytest.raises(
        DataError, match=rf"Sample weights must be finite and >= 0\. Received: \[{shown}\] in 1 of"
    ):
        m.train_step(b)


def test_every_worker_raises_when_another_worker_has_bad_labels(batches, monkeypatch):
    m = compiled()
    reduce = m.ps.all_reduce_sum
    # what the all-reduce returns when one other worker flagged its batch
    monkeypatch.setattr(m.ps, "all_reduce_sum", lambda v: reduce(v) + np.r_[0, 0, 1.0][: len(v)])
    with pytest.raises(DataError, match=r"1 other worker\(s\) got a batch with invalid labels"):
        m.train_step(batches(1, 4)[0])


# --- non-finite gradients -----------------------------------------------------------------


class TwoTables(tn.Model):
    """``out = sigmoid(a + where(False, b * nan, 0))``: finite, but b's gradient is NaN."""

    def __init__(self):
        super().__init__()
        self.a = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(fc.category_column("user"), 2)], SGD(0.1)
        )
        self.b = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(fc.category_column("item"), 2)], SGD(0.1)
        )
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward_dense(self, pooled, dense):
        a = pooled["a"][0].sum(1) * self.scale
        b = pooled["b"][0].sum(1)
        never = torch.zeros_like(b, dtype=torch.bool)
        return torch.sigmoid(a + torch.where(never, b * float("nan"), torch.zeros_like(b)))


def test_non_finite_gradients_name_the_tables(batches):
    m = TwoTables()
    m.compile(tn.optimizer.Adam())
    with pytest.raises(
        NonFiniteError,
        match=r'TwoTables.train_step \(step 1\): the gradients of table\(s\) "b" are NaN or '
        r"infinite, so nothing was updated\. Lower the learning rates",
    ):
        m.train_step(batches(1, 8)[0])
    assert float(m.scale.detach()) == 1.0  # the dense step did not run


def test_a_nan_input_names_the_loss_the_tables_and_the_dense_parameters(batches):
    b = batches(1, 8)[0]
    dense = b.dense.copy()
    dense[2, 0] = np.nan
    m = compiled()
    nan_batch = type(b)(**{**b.__dict__, "dense": dense})
    with pytest.raises(
        NonFiniteError,
        match=r'the loss; the gradients of table\(s\) "emb"; the gradients of dense '
        r'parameter\(s\) "out.weight", "out.bias" are NaN or infinite.*check the inputs',
    ):
        m.train_step(nan_batch)


def test_the_step_clears_the_optimizers_gradients_or_calls_its_own_zero_grad(batches):
    # torch's own zero_grad: every parameter the optimizer holds has its gradient cleared
    # at each step, including one the model's forward does not use
    b = batches(1, 8)[0]
    m = compiled()
    spare = torch.nn.Parameter(torch.ones(2))
    spare.grad = torch.full((2,), 3.0)
    m.compile(torch.optim.SGD([*m.parameters(), spare], lr=0.1))
    m.train_step(b)
    assert spare.grad is None
    # an optimizer with a zero_grad of its own has it called, with set_to_none=True
    calls = []

    class Counting(torch.optim.SGD):
        def zero_grad(self, set_to_none: bool = True) -> None:
            calls.append(set_to_none)
            super().zero_grad(set_to_none)

    m.compile(Counting(m.parameters(), lr=0.1))
    m.train_step(b)
    m.train_step(b)
    assert calls == [True, True]


def test_a_manual_push_checks_the_gradients_train_steps_push_does_not_check_again(
    batches, monkeypatch
):
    b = batches(1, 8)[0]
    m = compiled()
    flags = []
    push = m.ps.push

    def spy(*args, **kw):
        flags.append(kw.get("checked", False))
        return push(*args, **kw)

    monkeypatch.setattr(m.ps, "push", spy)
    m.train_step(b)
    assert flags == [True]  # train_step found every gradient finite before its push
    before = m.tables["emb"].rows()["weights"].copy()
    step = m.pull(b)
    loss, _ = m.compute_loss(b, m(b), norm=float(b.size))
    loss.backward()
    step["emb"].E.grad[0, 0] = float("nan")  # a custom step's gradient nobody checked
    with pytest.raises(NonFiniteError, match=r'Table "emb": the step produced a NaN'):
        m.push()
    assert flags == [True, False]
    np.testing.assert_array_equal(m.tables["emb"].rows()["weights"][: before.shape[0]], before)


# --- evaluate / predict / test_step ---------------------------------------------------------


def test_evaluate_raises_when_every_row_has_weight_zero(batches):
    m = compiled()
    b = _with(batches(1, 4)[0], weights=[0, 0, 0, 0])
    with pytest.raises(EmptyInputError, match=r"all 4 rows of the input have sample weight 0;"):
        m.evaluate([b], verbose=0)
    with pytest.raises(EmptyInputError, match=r"the input holds no rows"):
        m.evaluate(batches(2, 4), steps=0, verbose=0)


def test_exact_auc_uses_the_predictions_test_step_returns(batches):
    train, test = batches(10, 64, seed=1), batches(3, 64, seed=2)

    class Flipped(Small):
        def test_step(self, batch):
            logs = super().test_step(batch)
            if logs:
                logs["predictions"] = {h: 1 - p for h, p in logs["predictions"].items()}
            return logs

    torch.manual_seed(0)
    m = Flipped()
    m.compile(tn.optimizer.Adam(learning_rate=0.02), metrics=["auc"])
    m.fit(train, verbose=0)
    logs = m.evaluate(test, verbose=0, exact_auc=True)
    labels = np.concatenate([b.labels[:, 0] for b in test])
    flipped = 1 - m.predict(test)["prediction"]
    assert logs["auc_exact"] == pytest.approx(roc_auc_score(labels, flipped), abs=1e-9)
    assert logs["auc_exact"] == pytest.approx(1 - logs["auc"], abs=1e-3)  # metrics: unflipped

    class LossOnly(Small):
        def test_step(self, batch):
            return {"loss": super().test_step(batch).get("loss", 0.0)}

    m = LossOnly()
    m.compile(tn.optimizer.Adam())
    assert set(m.evaluate(test, verbose=0)) == {"loss"}  # without exact_auc, no predictions needed
    with pytest.raises(
        ArgumentError,
        match=r"LossOnly.evaluate\(exact_auc=True\) gathers the predictions that test_step "
        r"returns.*Received: \['loss'\]",
    ):
        m.evaluate(test, verbose=0, exact_auc=True)


def test_test_step_returns_loss_and_predictions(batches):
    m = compiled()
    b = batches(1, 8)[0]
    m.eval()
    logs = m.test_step(b)
    assert set(logs) == {"loss", "predictions"}
    np.testing.assert_array_equal(logs["predictions"][""], m.predict([b])["prediction"])


def test_predict_verbose_prints_one_line(batches, capsys):
    m = compiled()
    m.predict(batches(2, 8), verbose=0)
    m.predict(batches(2, 8))
    assert capsys.readouterr().out == ""
    out = m.predict(batches(2, 8), verbose=1)
    line = capsys.readouterr().out
    assert out["prediction"].shape == (16,)
    assert line.startswith("predict - 16 rows - ") and line.endswith(" samples/s\n")


def test_binary_crossentropy_on_a_logit_output_is_an_argument_error(batches):
    class Logit(Small):
        def forward_dense(self, pooled, dense):
            return self.out(torch.cat([pooled["emb"], dense], 1)) * 100.0  # not a probability

    torch.manual_seed(0)
    m = Logit()
    m.compile(tn.optimizer.Adam())
    with pytest.raises(
        ArgumentError,
        match=r'Loss "binary_crossentropy" takes probabilities in \[0, 1\]\. Received: model '
        r'outputs in \[.*\]\. For an output that is a logit, compile with loss="binary_cross',
    ):
        m.train_step(batches(1, 16)[0])
