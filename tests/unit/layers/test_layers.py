"""EmbeddingFeatures over the temporary matrix: outputs, gradients, sharing, errors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tnrec as tn
from tnrec.errors import ArgumentError
from tnrec.table import SGD, AdaGrad, SparseTable, zeros

fc = tn.feature_column


def emb_cols(names, dim=4, combiner="sum"):
    return [
        fc.embedding_column(fc.category_column(n), dimension=dim, combiner=combiner) for n in names
    ]


class OneLayer(tn.Model):
    def __init__(self, columns, output="list", opt=None, **kw):
        super().__init__()
        self.emb = tn.layers.EmbeddingFeatures(columns, opt or SGD(0.1), output=output, **kw)

    def forward_dense(self, pooled, dense):
        return pooled["emb"]


# Three rows, column "c" (multi-valued), keys drawn as bags:
#   row 0: [10, 20, 10]   (a key repeated inside one bag)
#   row 1: []             (empty bag)
#   row 2: [30]
BAGS = {"c": [[10, 20, 10], [], [30]]}


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_pooled_values_and_gradient_match_full_table_embedding_bag(make_batch, combiner):
    m = OneLayer(emb_cols(["c"], combiner=combiner), opt=SGD(0.1))
    m.build_tables()
    batch = make_batch(BAGS, [1, 0, 1])
    m.train()
    tm = m.pull(batch)["emb"]
    (out,) = m(batch)  # [B, D]
    upstream = torch.arange(12, dtype=torch.float32).view(3, 4)
    (out * upstream).sum().backward()

    # Reference: a full table holding the same rows, nn.functional.embedding_bag.
    weight = tm.E.detach().clone().requires_grad_(True)  # rows of the unique keys
    ids = torch.from_numpy(tm.inverse)  # virtual ids = row numbers of `weight`
    offsets = torch.tensor([0, 3, 3])
    mode = "mean" if combiner == "mean" else "sum"
    ref = F.embedding_bag(ids, weight, offsets, mode=mode)  # [B, D]
    if combiner == "sqrtn":
        ref = ref / torch.tensor([3.0, 1.0, 1.0]).sqrt()[:, None]
    (ref * upstream).sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(tm.E.grad, weight.grad, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[1].detach().numpy(), 0.0)  # empty bag
    np.testing.assert_array_equal(tm.keys, [10, 20, 30])


def test_outputs_list_concat_dict_and_sequence(make_batch):
    cols = emb_cols(["a", "b"], dim=3)
    batch = make_batch({"a": [[1], [2]], "b": [[3, 4], []], "s": [[5, 6, 7], [8]]}, [0, 1])
    for output, check in [
        ("list", lambda o: [t.shape for t in o] == [(2, 3), (2, 3)]),
        ("concat", lambda o: o.shape == (2, 6)),
        ("dict", lambda o: {k: v.shape for k, v in o.items()} == {"a": (2, 3), "b": (2, 3)}),
    ]:
        m = OneLayer(cols, output=output)
        m.pull(batch)
        assert check(m(batch)), output
    m = OneLayer(cols, output="concat")
    m.pull(batch)
    lst = OneLayer(cols, output="list")
    lst.pull(batch)
    torch.testing.assert_close(m(batch), torch.cat(lst(batch), dim=1))

    seq = fc.embedding_column(
        fc.sequence_category_column("s", dtype="int", max_length=2), dimension=3
    )
    m = OneLayer([*cols, seq], output="dict")
    tm = m.pull(batch)["emb"]
    grid, lengths = m(batch)["s"]
    assert grid.shape == (2, 2, 3) and lengths.tolist() == [2, 1]
    rows = {int(k): tm.E[i] for i, k in enumerate(tm.keys)}
    # row 0 keeps the last two keys (6, 7); row 1 holds 8 then padding
    torch.testing.assert_close(grid[0], torch.stack([rows[6], rows[7]]))
    torch.testing.assert_close(grid[1, 0], rows[8])
    np.testing.assert_array_equal(grid[1, 1].detach().numpy(), 0.0)
    grid.sum().backward()
    g = tm.E.grad
    assert float(g[list(tm.keys).index(5)].abs().sum()) == 0.0  # dropped key: no gradient
    assert float(g[list(tm.keys).index(7)].sum()) == 3.0


@pytest.mark.parametrize("dim", [1, 3, 16])
def test_concat_pools_in_place_and_matches_list_values_and_gradients(make_batch, dim):
    """output='concat' pools straight into [B, C*D]; it equals the list output, concatenated."""
    cols = [
        fc.embedding_column(fc.category_column(n), dimension=dim, combiner=comb)
        for n, comb in (("a", "sum"), ("b", "mean"), ("c", "sqrtn"))
    ]
    bags = {
        "a": [[1], [2, 2], [], [3]],  # a repeated key, an empty bag
        "b": [[4, 5, 6], [], [4], [7, 1]],  # key 1 also in column a
        "c": [[8], [9, 8], [8, 9, 10], []],
    }
    batch = make_batch(bags, [0, 1, 0, 1])
    upstream = torch.randn(4, 3 * dim, generator=torch.Generator().manual_seed(0))
    outs, grads = {}, {}
    for output in ("concat", "list"):
        m = OneLayer(cols, output=output, initializer=tn.table.normal(1.0))
        m.train()
        tm = m.pull(batch)["emb"]
        out = m(batch)
        out = out if output == "concat" else torch.cat(out, dim=1)
        assert out.shape == (4, 3 * dim) and out.is_contiguous()
        (out * upstream).sum().backward()
        outs[output] = out.detach()
        grads[output] = dict(zip(tm.keys.tolist(), tm.E.grad.numpy().copy(), strict=True))
    torch.testing.assert_close(outs["concat"], outs["list"], rtol=0, atol=0)
    assert grads["concat"].keys() == grads["list"].keys()
    for k, g in grads["concat"].items():
        np.testing.assert_allclose(g, grads["list"][k], rtol=1e-6, atol=1e-6)
    # reference: row 1 of column b is empty (zeros); row 2 of column c is sqrtn of 3 keys
    m = OneLayer(cols, output="concat", initializer=tn.table.normal(1.0))
    tm = m.pull(batch)["emb"]
    rows = {int(k): tm.E[i].detach() for i, k in enumerate(tm.keys)}
    out = m(batch).detach()
    np.testing.assert_array_equal(out[1, dim : 2 * dim].numpy(), 0.0)
    torch.testing.assert_close(out[2, 2 * dim :], (rows[8] + rows[9] + rows[10]) / 3**0.5)
    torch.testing.assert_close(out[0, dim : 2 * dim], (rows[4] + rows[5] + rows[6]) / 3)


def test_concat_of_an_empty_batch_keeps_its_width(make_batch):
    m = OneLayer(emb_cols(["a", "b"], dim=5), output="concat")
    batch = make_batch({"a": [], "b": []}, [])
    m.train()
    m.pull(batch)
    out = m(batch)
    assert out.shape == (0, 10)
    out.sum().backward()  # a zero-row gradient reaches the kernel


def _bad_batch(good, column, jag):
    """``good`` with column ``column`` replaced by the Jagged ``jag``."""
    from tnrec.data.batch import Batch

    return Batch(
        sparse={**good.sparse, column: jag},
        dense=good.dense,
        dense_names=good.dense_names,
        labels=good.labels,
        label_names=good.label_names,
        weights=None,
        row_ids=good.row_ids,
    )


def test_a_column_with_the_wrong_number_of_rows_is_named(make_batch):
    from tnrec.data.batch import Jagged

    m = OneLayer(emb_cols(["a", "b"]), output="concat")
    good = make_batch({"a": [[1], [2]], "b": [[3], [4]]}, [0, 1])
    bad = _bad_batch(good, "b", Jagged(np.array([3, 4, 5]), np.array([0, 1, 2, 3])))
    with pytest.raises(ArgumentError, match=r"column 'b' has offsets of shape \(4,\); .* \(3,\)"):
        m.pull(bad)


def test_bag_layout_matches_its_definition():
    from tnrec.data.batch import Jagged
    from tnrec.layers.embedding import bag_layout

    class B:
        size = 50

    rng = np.random.default_rng(4)
    sparse = {}
    for name, high in [("none", 1), ("one", 2), ("many", 5)]:
        lengths = rng.integers(0, high, 50) if name != "one" else np.ones(50, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        sparse[name] = Jagged(rng.integers(-(1 << 62), 1 << 62, int(offsets[-1])), offsets)
    # a column sliced out of a bigger batch: its offsets start past 0
    whole = Jagged(np.arange(300, dtype=np.int64), np.arange(0, 301, 3, dtype=np.int64))
    sparse["sliced"] = Jagged(whole.keys, whole.offsets[20:71])
    B.sparse = sparse
    cols = ["many", "none", "sliced", "one"]
    lay = bag_layout(B, cols, "emb")
    lengths = np.concatenate([np.diff(sparse[c].offsets) for c in cols])
    np.testing.assert_array_equal(lay.offsets, np.concatenate([[0], np.cumsum(lengths)]))
    np.testing.assert_array_equal(lay.rows, np.repeat(np.tile(np.arange(50), 4), lengths))
    want = [sparse[c].keys[sparse[c].offsets[0] : sparse[c].offsets[-1]] for c in cols]
    np.testing.assert_array_equal(lay.keys, np.concatenate(want))


def test_bad_offsets_are_named(make_batch):
    from tnrec.data.batch import Jagged

    m = OneLayer(emb_cols(["a", "b"]), output="concat")
    good = make_batch({"a": [[1], [2]], "b": [[3], [4]]}, [0, 1])
    decreasing = _bad_batch(good, "b", Jagged(np.array([3, 4]), np.array([0, 2, 1])))
    with pytest.raises(ArgumentError, match=r"column 'b' has decreasing offsets"):
        m.pull(decreasing)
    short = _bad_batch(good, "a", Jagged(np.array([1]), np.array([0, 1, 2])))
    with pytest.raises(ArgumentError, match=r"column 'a' has 1 keys but its offsets span \[0, 2\)"):
        m.pull(short)
    before = _bad_batch(good, "a", Jagged(np.array([1, 2, 3]), np.array([-2, -1, 0])))
    with pytest.raises(
        ArgumentError, match=r"column 'a' has 3 keys but its offsets span \[-2, 0\)"
    ):
        m.pull(before)


def test_two_tables_over_the_same_columns_share_one_dedup(make_batch):
    """DeepFM's embedding and linear tables read the same columns: one layout, one dedup."""

    class TwoTables(tn.Model):
        def __init__(self):
            super().__init__()
            self.emb = tn.layers.EmbeddingFeatures(emb_cols(["x", "y"], dim=2), SGD(1.0))
            self.lin = tn.layers.EmbeddingFeatures(emb_cols(["x", "y"], dim=1), SGD(1.0))

        def forward_dense(self, pooled, dense):
            return pooled["emb"][0].sum(1) + pooled["lin"][1].sum(1)

    m = TwoTables()
    m.compile(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0), loss="mse")
    batch = make_batch({"x": [[7], [8, 7]], "y": [[9], []]}, [0.0, 0.0])
    step = m.pull(batch)
    emb, lin = step["emb"], step["lin"]
    assert emb.keys is lin.keys and emb.inverse is lin.inverse  # computed once
    assert emb.keys.tolist() == [7, 8, 9] and emb.inverse.tolist() == [0, 1, 0, 2]
    assert emb.rows.tolist() == [0, 1, 1, 0]
    m(batch).sum().backward()
    assert emb.E.grad[:, 0].tolist() == [2.0, 1.0, 0.0]  # x only: key 7 twice
    assert lin.E.grad[:, 0].tolist() == [0.0, 0.0, 1.0]  # y only
    m.push()
    assert m.tables["emb"].rows()["show"].tolist() == [2, 1, 1]
    assert m.tables["lin"].rows()["show"].tolist() == [2, 1, 1]


def test_shared_table_pulls_and_pushes_each_key_once(make_batch):
    class Shared(tn.Model):
        def __init__(self):
            super().__init__()
            opt = SGD(1.0)
            init = zeros()
            self.a = tn.layers.EmbeddingFeatures(
                emb_cols(["x"]), opt, table="shared", initializer=init
            )
            self.b = tn.layers.EmbeddingFeatures(
                emb_cols(["y"]), opt, table="shared", initializer=init
            )

        def forward_dense(self, pooled, dense):
            return pooled["a"][0].sum(1) + 2 * pooled["b"][0].sum(1)

    m = Shared()
    m.compile(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0), loss="mse")
    assert list(m.tables) == ["shared"]
    # key 7 appears in both layers' columns
    batch = make_batch({"x": [[7], [8]], "y": [[7], [9]]}, [0.0, 0.0])
    tm = m.pull(batch)["shared"]
    assert sorted(tm.keys.tolist()) == [7, 8, 9]
    out = m(batch)
    out.sum().backward()
    grad = dict(zip(tm.keys.tolist(), tm.E.grad[:, 0].tolist(), strict=True))
    assert grad == {7: 3.0, 8: 1.0, 9: 2.0}  # summed over both layers
    m.push()
    rows = m.tables["shared"].rows()
    np.testing.assert_array_equal(rows["weights"][:, 0], [-3.0, -1.0, -2.0])  # one SGD step each
    np.testing.assert_array_equal(rows["show"], [2, 1, 1])  # occurrences


def test_eval_pull_creates_nothing_and_reads_unknown_as_zero(make_batch):
    m = OneLayer(emb_cols(["c"], combiner="mean"))
    m.compile(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), loss="mse")
    m.train()
    m.pull(make_batch({"c": [[1], [2]]}, [0, 0]))
    m.push()  # ends the training step that created keys 1 and 2 (no gradient: weights kept)
    table = m.tables["emb"]
    before = table.rows()
    m.eval()
    batch = make_batch({"c": [[1, 99], [98]]}, [0, 0])
    tm = m.pull(batch)["emb"]
    assert not tm.E.requires_grad
    (out,) = m(batch)
    w1 = table.pull(np.array([1], np.int64), create=False)[0]
    # unknown key 99 reads as zeros but counts in the mean's denominator
    np.testing.assert_allclose(out[0].numpy(), w1 / 2, rtol=1e-6)
    np.testing.assert_array_equal(out[1].numpy(), 0.0)
    after = table.rows()
    assert len(table) == 2
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])


def test_layer_errors(make_batch):
    with pytest.raises(ArgumentError, match=r"all columns of one layer share a table.*\[4, 8\]"):
        tn.layers.EmbeddingFeatures(emb_cols(["a"]) + emb_cols(["b"], dim=8), SGD())
    with pytest.raises(ArgumentError, match="non-empty list of embedding_column"):
        tn.layers.EmbeddingFeatures([fc.category_column("a")], SGD())
    with pytest.raises(ArgumentError, match="`sparse_optimizer` must be"):
        tn.layers.EmbeddingFeatures(emb_cols(["a"]), torch.optim.SGD)
    with pytest.raises(ArgumentError, match="`output` must be one of"):
        tn.layers.EmbeddingFeatures(emb_cols(["a"]), SGD(), output="stack")
    with pytest.raises(ArgumentError, match="a column appears twice"):
        tn.layers.EmbeddingFeatures(emb_cols(["a", "a"]), SGD())
    seq = fc.embedding_column(
        fc.sequence_category_column("s", dtype="int", max_length=2), dimension=4
    )
    with pytest.raises(ArgumentError, match="output='concat' needs pooled columns only"):
        tn.layers.EmbeddingFeatures([seq], SGD(), output="concat")
    m = OneLayer(emb_cols(["a"]))
    batch = make_batch({"a": [[1]]}, [0])
    with pytest.raises(ArgumentError, match=r"call model.pull\(batch\) before the forward pass"):
        m(batch)
    with pytest.raises(ArgumentError, match="the batch has no categorical column 'a'"):
        m.pull(make_batch({"b": [[1]]}, [0]))
    with pytest.raises(ArgumentError, match="call model.pull"):
        m.push()


def test_layers_sharing_a_table_must_agree():
    class Bad(tn.Model):
        def __init__(self):
            super().__init__()
            self.a = tn.layers.EmbeddingFeatures(emb_cols(["x"]), SGD(0.1), table="t")
            self.b = tn.layers.EmbeddingFeatures(emb_cols(["y"]), AdaGrad(0.1), table="t")

    with pytest.raises(
        ArgumentError, match='Layers "a" and "b" share table "t" but differ in `sparse_optimizer`'
    ):
        Bad().build_tables()


def test_table_is_named_after_the_layer_and_is_a_sparse_table():
    class Two(tn.Model):
        def __init__(self):
            super().__init__()
            self.user_tower = tn.layers.EmbeddingFeatures(emb_cols(["u"]), SGD())
            self.item = tn.layers.EmbeddingFeatures(emb_cols(["i"], dim=8), SGD(), name="items")

    m = Two()
    assert sorted(m.tables) == ["items", "user_tower"]
    assert isinstance(m.tables["items"], SparseTable) and m.tables["items"].dim == 8
