"""The one-key kernels of a concat pooling: the general kernels' values, and who takes them."""

import numpy as np
import pytest
import torch

import tnrec as tn
from tnrec.data.batch import Batch, Jagged
from tnrec.errors import ArgumentError
from tnrec.layers import pooling
from tnrec.layers.pooling import bag_scales, one_key_bags, pool


def _bags(rng, C, B, U, empty=0.2):
    """Column-major bags of zero or one virtual id (``empty`` of them empty)."""
    lengths = (rng.random(C * B) >= empty).astype(np.int64)  # [C*B]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # [C*B + 1]
    vids = rng.integers(0, U, int(offsets[-1])).astype(np.int64)  # [N], repeats included
    return vids, offsets


def _pool_both(E, vids, offsets, combiner, B, C):
    """(general, one-key) outputs and E's gradients for the same upstream gradient."""
    scales = bag_scales(np.diff(offsets), combiner)
    ids = one_key_bags(vids, offsets, B, E.shape[0])
    assert ids is not None
    g = torch.randn(B, C * E.shape[1], generator=torch.Generator().manual_seed(1))
    outs = []
    for one_key in (None, ids):
        leaf = E.clone().requires_grad_()
        out = pool(leaf, vids, offsets, scales, B, C, one_key=one_key)
        out.backward(g)
        outs.append((out.detach(), leaf.grad))
    return outs


@pytest.mark.parametrize("D", [1, 3, 16])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_one_key_pooling_gives_the_general_kernels_values(D, combiner):
    rng = np.random.default_rng(D)
    C, B, U = 5, 37, 11  # 185 bags over 11 rows: every row repeats
    vids, offsets = _bags(rng, C, B, U)
    E = torch.from_numpy(rng.standard_normal((U, D)).astype(np.float32))
    (out, grad), (out1, grad1) = _pool_both(E, vids, offsets, combiner, B, C)
    assert out1.shape == (B, C * D)
    torch.testing.assert_close(out1, out, rtol=0, atol=0)  # a one-key bag's scale is 1
    # the backward adds each row's occurrences in row order, not column order
    torch.testing.assert_close(grad1, grad, rtol=1e-6, atol=1e-6)
    assert grad1.abs().sum() > 0


def test_one_key_ids_are_in_concat_order_and_empty_bags_are_minus_one():
    # C = 2, B = 3 (column-major bags): column 0 {2} {} {0}; column 1 {} {1} {2}
    vids = np.array([2, 0, 1, 2], np.int64)
    offsets = np.array([0, 1, 1, 2, 2, 3, 4], np.int64)
    ids = one_key_bags(vids, offsets, batch_size=3, num_rows=3)
    np.testing.assert_array_equal(ids, [2, -1, -1, 1, 0, 2])
    assert ids.dtype == np.int32
    out = pool(torch.eye(3), vids, offsets, np.ones(6, np.float32), 3, 2, one_key=ids)
    expected = torch.tensor([[0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 1, 0], [1, 0, 0, 0, 0, 1]])
    torch.testing.assert_close(out, expected.float())


def test_a_bag_of_two_keys_an_empty_batch_or_too_many_rows_gives_none():
    offsets = np.array([0, 1, 3], np.int64)  # bag 1 has two keys
    assert one_key_bags(np.array([0, 1, 1]), offsets, 2, 2) is None
    assert one_key_bags(np.zeros(0, np.int64), np.zeros(1, np.int64), 0, 0) is None
    assert one_key_bags(np.array([0, 1]), np.array([0, 1, 2]), 2, 2**31) is None
    assert one_key_bags(np.array([0, 1]), np.array([0, 1, 2]), 3, 2) is None  # 2 bags, B = 3


def test_one_key_ids_of_the_wrong_length_are_refused():
    vids, offsets = np.array([0, 1]), np.array([0, 1, 2])
    ids = np.array([0, 1, 0], np.int32)
    with pytest.raises(
        ArgumentError, match="one_key has 3 ids for concat_columns=1 x batch_size=2"
    ):
        pool(torch.ones(2, 4), vids, offsets, np.ones(2, np.float32), 2, 1, one_key=ids)


def _model(columns, seed=0):
    class M(tn.Model):
        def __init__(self):
            super().__init__()
            cols = [
                tn.feature_column.embedding_column(tn.feature_column.category_column(c), 4)
                for c in columns
            ]
            opt = tn.optimizer.AdaGrad(0.1)
            self.emb = tn.layers.EmbeddingFeatures(cols, opt, output="concat", seed=seed)
            wide = [tn.feature_column.embedding_column(c.categorical, 1) for c in cols]
            self.wide = tn.layers.EmbeddingFeatures(wide, opt, output="concat", seed=seed)
            self.lin = torch.nn.Linear(4 * len(cols), 1)

        def forward_dense(self, pooled, dense):
            return (self.lin(pooled["emb"]) + pooled["wide"].sum(1, keepdim=True)).squeeze(-1)

    m = M()
    m.compile(tn.optimizer.SGD(0.05), loss="binary_crossentropy_from_logits", metrics=())
    return m


def _batch(rng, B, columns, two_keys_at=None):
    sparse = {}
    for c in columns:
        lengths = np.ones(B, np.int64)
        lengths[rng.random(B) < 0.2] = 0
        if two_keys_at is not None and c == columns[0]:
            lengths[two_keys_at] = 2
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        keys = rng.integers(1, 30, int(offsets[-1])).astype(np.int64)  # repeats in and across
        sparse[c] = Jagged(keys, offsets)
    labels = (rng.random((B, 1)) < 0.3).astype(np.float32)
    return Batch(
        sparse=sparse,
        dense=np.zeros((B, 0), np.float32),
        dense_names=(),
        labels=labels,
        label_names=("y",),
        weights=None,
        row_ids=np.arange(B, dtype=np.int64),
    )


@pytest.mark.parametrize("B", [0, 1, 64])
def test_a_model_trains_the_same_with_the_one_key_kernels(B, monkeypatch):
    """Tables after three steps with the one-key kernels and with them turned off."""
    columns = ["a", "b", "c"]
    results = []
    for use in (True, False):
        if not use:
            monkeypatch.setattr(pooling, "one_key_bags", lambda *a: None)
            monkeypatch.setattr(tn.layers.embedding, "one_key_bags", lambda *a: None)
        rng = np.random.default_rng(7)
        torch.manual_seed(0)
        m = _model(columns)
        m.train()
        for _ in range(3):
            m.train_step(_batch(rng, B, columns))
        results.append({n: _rows(t) for n, t in m.tables.items()})
    for name, (keys, rows) in results[1].items():
        assert (keys.shape[0] > 0) == (B > 0)
        np.testing.assert_array_equal(results[0][name][0], keys)
        np.testing.assert_allclose(results[0][name][1], rows, rtol=1e-6, atol=1e-7)


def _rows(table):
    keys = np.sort(table.keys())
    return keys, table.pull(keys, create=False)


def test_layers_over_the_same_bags_share_one_key_ids_and_two_keys_turn_them_off():
    rng = np.random.default_rng(3)
    m = _model(["a", "b"])
    m.train()
    m.pull(_batch(rng, 16, ["a", "b"]))
    ids_emb, ids_wide = m.emb._step.one_key, m.wide._step.one_key
    assert ids_emb is not None and ids_emb is ids_wide  # computed once for both tables
    m.pull(_batch(rng, 16, ["a", "b"], two_keys_at=5))
    assert m.emb._step.one_key is None and m.wide._step.one_key is None


def test_scales_may_be_left_out_only_where_the_one_key_kernels_pool():
    vids, offsets = np.array([0, 1]), np.array([0, 1, 2])
    ids = one_key_bags(vids, offsets, 2, 2)
    E = torch.tensor([[1.0], [2.0]])
    out = pool(E, vids, offsets, None, 2, 1, one_key=ids)
    torch.testing.assert_close(out, torch.tensor([[1.0], [2.0]]))
    with pytest.raises(ArgumentError, match="pool: bags of several keys need their scales"):
        pool(E, vids, offsets, None, 2, 1)
    with pytest.raises(ArgumentError, match="pool: the torch ops need the bags' scales"):
        pool(E, vids, offsets, None, 2, 1, one_key=ids, torch_ops=True)


def test_one_key_pooling_of_an_empty_batch_gives_no_rows():
    E = torch.ones(3, 4, requires_grad=True)
    ids = np.zeros(0, np.int32)
    out = pool(E, np.zeros(0, np.int64), np.zeros(1, np.int64), None, 0, 2, one_key=ids)
    assert out.shape == (0, 8)
    out.sum().backward()
    assert E.grad is not None and not E.grad.any()


@pytest.mark.parametrize("D", [1, 16])
def test_the_one_key_forward_on_torchs_openmp_team_gives_the_same_bits(D, monkeypatch):
    from tnrec.table import team, threads

    if team._get_team() is None:
        pytest.skip("torch's OpenMP runtime is not found here (see tnrec.table.team)")
    monkeypatch.setattr(threads, "MIN_SLICE", 16)
    monkeypatch.setattr(team, "MIN_SLICE", 16)
    monkeypatch.setattr(pooling, "TEAM_MIN_VALUES", 0)
    before = threads.get_num_threads()
    threads.set_num_threads(2)
    try:
        rng = np.random.default_rng(5)
        C, B, U = 6, 50, 11  # 300 bags in two slices over 11 rows
        vids, offsets = _bags(rng, C, B, U)
        ids = one_key_bags(vids, offsets, B, U)
        assert ids is not None and (ids < 0).any()  # empty bags too
        E = torch.from_numpy(rng.standard_normal((U, D)).astype(np.float32))
        scales = bag_scales(np.diff(offsets), "sum")
        g = torch.randn(B, C * D, generator=torch.Generator().manual_seed(2))
        got = {}
        for mode in ("1", "0"):
            monkeypatch.setenv("TNREC_TABLE_TEAM", mode)
            assert (team.slices(ids.shape[0], ids) is not None) == (mode == "1")
            leaf = E.clone().requires_grad_()
            out = pool(leaf, vids, offsets, scales, B, C, one_key=ids)
            out.backward(g)
            got[mode] = (out.detach(), leaf.grad)
        torch.testing.assert_close(got["1"][0], got["0"][0], rtol=0, atol=0)
        torch.testing.assert_close(got["1"][1], got["0"][1], rtol=0, atol=0)
        assert got["1"][1].abs().sum() > 0
    finally:
        threads.set_num_threads(before)
