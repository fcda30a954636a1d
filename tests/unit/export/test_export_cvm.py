"""Exports of cvm=True layers: the dictionaries carry the CVM inputs, the Predictor uses them."""

import numpy as np
import pytest
import torch

import tnrec as tn
from tests.unit.export.export_common import S, U, X, tiny_batches, tiny_rows
from tnrec.errors import ArgumentError
from tnrec.export import export_delta, load_dictionary
from tnrec.layers.embedding import cvm_inputs
from tnrec.serving import Predictor
from tnrec.table import Adam

fc = tn.feature_column


class TinyCvm(tn.Model):
    """A cvm layer (two pooled columns, concat) beside a plain one reading the same columns."""

    def __init__(self):
        super().__init__()
        self.feature_columns = [X]
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(U, 4), fc.embedding_column(S, 4, combiner="mean")],
            Adam(0.05),
            output="concat",
            cvm=True,
        )
        self.lin = tn.layers.EmbeddingFeatures([fc.embedding_column(U, 1)], Adam(0.05))
        self.mlp = torch.nn.Linear(2 * 6 + 1 + 1, 1)

    def forward_dense(self, pooled, dense):
        return self.mlp(torch.cat([pooled["emb"], pooled["lin"][0], dense], 1))


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    m = TinyCvm()
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    m.fit(tiny_batches(tiny_rows(64, 0)), verbose=0)
    m.tables["emb"].show_decay(1)  # decayed statistics are what the dictionary carries
    return m


def test_the_dictionary_holds_weights_then_the_cvm_inputs(trained, tmp_path):
    path = trained.export(str(tmp_path / "exp"))
    keys, rows = load_dictionary(path, "emb")
    assert rows.shape == (len(trained.tables["emb"]), 6)
    table = trained.tables["emb"].rows(np.asarray(keys))
    np.testing.assert_array_equal(rows[:, :4], table["weights"])
    np.testing.assert_array_equal(rows[:, 4:], cvm_inputs(table["show"], table["click"]))
    assert (table["show"] > 0).all()
    assert load_dictionary(path, "lin")[1].shape[1] == 1


def test_predictor_reproduces_model_predict_with_cvm_inputs(trained, tmp_path):
    path = trained.export(str(tmp_path / "exp"))
    rows = tiny_rows(40, 7)  # seen and unseen keys, missing values
    want = trained.predict(tiny_batches(rows))["prediction"]
    got = Predictor(path).predict(rows)  # [B]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_delta_of_a_cvm_model_and_an_export_of_given_rows_raise(trained, tmp_path):
    with pytest.raises(ArgumentError, match=r"export_delta: layers \['emb'\] have cvm=True"):
        export_delta(str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "d"), model=trained)
    from tnrec.export import export

    rows = {n: t.rows() for n, t in trained.tables.items()}
    with pytest.raises(ArgumentError, match=r'export\(tables=...\): layer "emb" has cvm=True'):
        export(trained, str(tmp_path / "e"), tables=rows)
