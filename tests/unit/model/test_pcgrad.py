"""compile(pcgrad=True): the heads' dense gradients combined by PCGrad, the tables' untouched
(W workers: tests/multiprocess/test_dense_parity.py)."""

import numpy as np
import pyarrow as pa
import pytest
import torch

import tnrec as tn
from tests.unit.export.export_common import TINY_INPUTS, tiny_rows
from tnrec.data import to_batch
from tnrec.errors import ArgumentError
from tnrec.optimizer import pcgrad

fc = tn.feature_column


def test_pcgrad_of_two_conflicting_tasks_by_hand():
    # g_a . g_b = -1 < 0: g_a - (-1)/2 g_b = [0.5, 0.5]; g_b - (-1)/1 g_a = [0, 1]
    out = pcgrad(torch.tensor([[1.0, 0.0], [-1.0, 1.0]]))
    np.testing.assert_allclose(out.numpy(), [0.5, 1.5], rtol=1e-7)


def test_pcgrad_projects_against_the_original_gradients_in_index_order():
    g = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [0.0, -1.0, 1.0]], dtype=torch.float64)
    # g0: vs g1 (dot -1) -> [0.5, 0.5, 0]; vs g2 (dot -0.5) -> [0.5, 0.25, 0.25]
    # g1: vs g0 (dot -1) -> [0, 1, 0];     vs g2 (dot -1)   -> [0, 0.5, 0.5]
    # g2: vs g0 (dot 0) no change;         vs g1 (dot -1)   -> [-0.5, -0.5, 1]
    want = np.array([0.5, 0.25, 0.25]) + [0, 0.5, 0.5] + [-0.5, -0.5, 1.0]
    np.testing.assert_allclose(pcgrad(g).numpy(), want, rtol=1e-12)


@pytest.mark.parametrize(
    "grads",
    [[[1.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 0.0]], [[2.0, -3.0]]],
    ids=["agreeing", "a-zero-gradient", "one-task"],
)
def test_pcgrad_without_conflict_is_the_plain_sum(grads):
    g = torch.tensor(grads)
    assert torch.equal(pcgrad(g), g.sum(0))


def test_pcgrad_refuses_a_flat_gradient():
    with pytest.raises(ArgumentError, match=r"must be \[T, P\].*Received: shape \(3,\)"):
        pcgrad(torch.zeros(3))


# ---------------------------------------------------------------- in a model


class TwoHeads(tn.Model):
    """Head a = w0 + e(u), head b = s * w0 + w1: dense gradients [1, 0] and [s, 1]."""

    def __init__(self, s):
        super().__init__()
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(TINY_INPUTS[0], 1)], tn.optimizer.SGD(0.5), output="concat"
        )
        self.w = torch.nn.Parameter(torch.tensor([0.3, -0.2]))
        self.s = s

    def forward_dense(self, pooled, dense):
        e = pooled["emb"][:, 0]  # [B]
        return {"a": self.w[0] + e, "b": self.s * self.w[0] + self.w[1] + 0 * e}


def identity(out, y):
    return out  # the loss is the output: its mean's gradient is the output's


def train_two_heads(s, use_pcgrad):
    torch.manual_seed(0)
    m = TwoHeads(s)
    m.compile(
        tn.optimizer.SGD(1.0),
        loss={"a": identity, "b": identity},
        label={"a": "y", "b": "y"},
        pcgrad=use_pcgrad,
    )
    batch = to_batch(pa.Table.from_pylist(tiny_rows(10, 1)), TINY_INPUTS, label="y")
    m.train_step(batch)
    return m.w.detach().numpy(), m.tables["emb"].rows()


def test_conflicting_heads_step_along_the_projected_sum_and_the_table_along_the_total():
    w, rows = train_two_heads(-1.0, True)  # g_a = [1, 0], g_b = [-1, 1]
    np.testing.assert_allclose(w, [0.3 - 0.5, -0.2 - 1.5], rtol=1e-6)
    w_plain, rows_plain = train_two_heads(-1.0, False)
    np.testing.assert_allclose(w_plain, [0.3 - 0.0, -0.2 - 1.0], rtol=1e-6)
    assert sorted(rows) == sorted(rows_plain)
    for k, v in rows_plain.items():  # the pushed gradient is the plain total's
        np.testing.assert_array_equal(rows[k], v, err_msg=k)


def test_agreeing_heads_step_as_without_pcgrad():
    w, rows = train_two_heads(1.0, True)  # g_a = [1, 0], g_b = [1, 1]: no conflict
    w_plain, rows_plain = train_two_heads(1.0, False)
    np.testing.assert_allclose(w, [0.3 - 2.0, -0.2 - 1.0], rtol=1e-6)
    np.testing.assert_array_equal(w, w_plain)
    for k, v in rows_plain.items():
        np.testing.assert_array_equal(rows[k], v, err_msg=k)


def test_pcgrad_must_be_a_bool():
    with pytest.raises(ArgumentError, match=r"`pcgrad` must be True or False\. Received: "):
        TwoHeads(1.0).compile(tn.optimizer.SGD(1.0), loss={"a": identity}, pcgrad="yes")
