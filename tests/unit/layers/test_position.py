"""PositionBias: training reads each row's position, inference and the export one position."""

import numpy as np
import pyarrow as pa
import pytest
import torch

import tnrec as tn
from tests.unit.export.export_common import TINY_INPUTS, X, tiny_rows
from tnrec.data import to_batch
from tnrec.errors import ArgumentError, DataError
from tnrec.serving import Predictor

fc = tn.feature_column
POS = fc.category_column("pos", dtype="int")


class TinyPos(tn.Model):
    def __init__(self, **kwargs):
        super().__init__()
        self.feature_columns = [X]
        u, s = TINY_INPUTS[0], TINY_INPUTS[1]
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(u, 4), fc.embedding_column(s, 4, combiner="mean")],
            tn.optimizer.AdaGrad(0.1),
            output="concat",
        )
        self.mlp = torch.nn.Linear(9, 1)
        self.position = tn.layers.PositionBias(POS, [1, 2, 3], **kwargs)

    def forward_dense(self, pooled, dense):
        logit = self.mlp(torch.cat([pooled["emb"], dense], 1)).squeeze(-1)  # [B]
        return logit + self.position(logit)  # [B]


def rows_with_positions(n, seed):
    rng = np.random.default_rng(seed)
    return [{**r, "pos": int(rng.integers(1, 4))} for r in tiny_rows(n, seed)]


def batches(rows, size=16):
    table = pa.Table.from_pylist(rows)
    cols = [*TINY_INPUTS, POS]
    return [to_batch(table.slice(i, size), cols, label="y") for i in range(0, len(rows), size)]


def outputs(model, batch, training):
    model.train(training)
    with torch.no_grad():
        model.pull(batch)
        out = model(batch)
    model._release()
    return out.numpy()


@pytest.fixture
def model():
    torch.manual_seed(0)
    m = TinyPos()
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    with torch.no_grad():  # the bias of positions 1, 2, 3
        m.position.tower[-1].weight.copy_(torch.tensor([[0.5, -1.0, 2.0]]))
    return m


def test_training_adds_each_rows_position_bias_and_inference_the_first(model):
    (batch,) = batches([{**r, "pos": p} for r, p in zip(tiny_rows(3, 1), [1, 3, 2], strict=True)])
    train = outputs(model, batch, True)  # creates the rows the eval pull then reads
    infer = outputs(model, batch, False)
    np.testing.assert_allclose(train - infer, [0.0, 1.5, -1.5], rtol=1e-6, atol=1e-6)
    assert model.position.inference_position == 1


def test_the_configured_inference_position_is_served():
    torch.manual_seed(0)
    m = TinyPos(inference_position=3)
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    with torch.no_grad():
        m.position.tower[-1].weight.copy_(torch.tensor([[0.5, -1.0, 2.0]]))
    (batch,) = batches([{**r, "pos": 1} for r in tiny_rows(4, 2)])
    train = outputs(m, batch, True)  # creates the rows the eval pull then reads
    np.testing.assert_allclose(outputs(m, batch, False) - train, [1.5] * 4, rtol=1e-6, atol=1e-6)


def test_training_learns_a_bias_per_seen_position_and_the_export_serves_the_first(tmp_path):
    torch.manual_seed(0)
    m = TinyPos(hidden_units=[3])
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    rows = [{**r, "pos": 1 + i % 2} for i, r in enumerate(tiny_rows(64, 0))]  # never 3
    before = m.position.tower[0].weight.detach().numpy().copy()  # [3, P]
    m.fit(batches(rows), verbose=0)
    after = m.position.tower[0].weight.detach().numpy()
    assert np.any(after[:, :2] != before[:, :2])  # the positions trained on moved
    np.testing.assert_array_equal(after[:, 2], before[:, 2])  # position 3 never had an input
    path = m.export(str(tmp_path / "exp"))
    assert "pos" not in str(Predictor(path).manifest["feature_spec"])
    test = tiny_rows(30, 9)  # no position column at all
    want = m.predict(batches([{**r, "pos": 2} for r in test]))["prediction"]
    got = Predictor(path).predict([{k: v for k, v in r.items() if k != "y"} for r in test])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "rows, match",
    [
        (
            [{"pos": 1}, {"pos": 7}],
            r'column "pos" must hold one of positions=\[1, 2, 3\]\. '
            r"Received: another value at row_id=1",
        ),
        ([{"pos": 1}, {"pos": None}], r'exactly one "pos"\. Received: 0 values at row_id=1'),
    ],
    ids=["unknown-position", "missing-position"],
)
def test_a_training_row_without_a_known_position_is_refused(model, rows, match):
    data = [{**r, **p} for r, p in zip(tiny_rows(2, 3), rows, strict=True)]
    (batch,) = batches(data)
    with pytest.raises(DataError, match=match):
        model.train_step(batch)


def test_a_training_batch_without_the_column_is_refused(model):
    table = pa.Table.from_pylist(tiny_rows(4, 3))
    batch = to_batch(table, TINY_INPUTS, label="y")
    with pytest.raises(DataError, match=r'has no column "pos" \(the position\)\. Add it'):
        model.train_step(batch)


def test_training_forward_without_the_batch_is_refused():
    layer = tn.layers.PositionBias(POS, [1, 2]).train()
    with pytest.raises(ArgumentError, match=r"Received: positions of None rows for 4 rows"):
        layer(torch.zeros(4, 1))


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((POS, []), {}, r"`positions` must be a non-empty list of distinct values\. Received: "),
        ((POS, [1, 1]), {}, r"distinct values\. Received: positions=\[1, 1\]"),
        ((POS, [1, 2]), {"inference_position": 5}, r"Received: inference_position=5"),
        ((POS, [1, 2]), {"hidden_units": [0]}, r"Received: hidden_units=\[0\]"),
        ((fc.embedding_column(POS, 2), [1]), {}, r"Received: EmbeddingColumn"),
    ],
    ids=["empty", "duplicate", "inference", "hidden", "column"],
)
def test_bad_arguments(args, kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        tn.layers.PositionBias(*args, **kwargs)
