"""EmbeddingFeatures(cvm=True) show/click inputs and trainable=False tables."""

import math

import numpy as np
import pytest
import torch

import tnrec as tn
from tnrec.errors import ArgumentError
from tnrec.layers.embedding import cvm_inputs
from tnrec.table import SGD, AdaGrad, Adam, Ftrl, zeros

fc = tn.feature_column

OPTIMIZERS = {
    "adagrad": lambda: AdaGrad(0.1, initial_g2sum=0.1),
    "adam": lambda: Adam(0.01),
    "ftrl": lambda: Ftrl(0.1, l1=0.0, l2=0.1),
    "sgd": lambda: SGD(0.1),
}


def cols(names, dim=2, combiner="sum"):
    return [fc.embedding_column(fc.category_column(n), dim, combiner=combiner) for n in names]


class Layers(tn.Model):
    """Layers given as keyword arguments; the output sums every pooled output."""

    def __init__(self, detach=False, **layers):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.detach = detach
        for name, layer in layers.items():
            setattr(self, name, layer)

    def forward_dense(self, pooled, dense):
        outs = [o if torch.is_tensor(o) else torch.cat(list(o), 1) for o in pooled.values()]
        out = torch.cat(outs, 1).sum(1, keepdim=True)
        return (out.detach() if self.detach else out) + self.bias


def step(model, batch, upstream=None):
    """One manual training step: pull, forward, backward of sum(out * upstream), push."""
    model.train()
    model.pull(batch)
    out = {
        k: o if torch.is_tensor(o) else torch.cat(list(o), 1) for k, o in model.embed(batch).items()
    }
    loss = sum((o * (upstream if upstream is not None else 1.0)).sum() for o in out.values())
    if loss.requires_grad:
        loss.backward()
    model.push()
    return out


# ---------------------------------------------------------------- CVM


def test_cvm_inputs_are_show_and_log_ctr_in_float64():
    got = cvm_inputs(np.float32([0, 4, 2.5]), np.float32([0, 1, 2.5]))
    want = [[0, 0], [4, math.log(2) - math.log(5)], [2.5, 0]]
    np.testing.assert_array_equal(got, np.float32(want))


# Two rows, columns "u" (one key each) and "t" (bags):
#   row 0: u=[1]  t=[5, 6]       label 1, weight 1
#   row 1: u=[2]  t=[5]          label 0, weight 2
BATCH = {"u": [[1], [2]], "t": [[5, 6], [5]]}


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS), ids=sorted(OPTIMIZERS))
def test_cvm_reads_the_statistics_before_the_batch_push_and_pools_them(make_batch, opt):
    layer = tn.layers.EmbeddingFeatures(
        cols(["u", "t"], combiner="mean"),
        OPTIMIZERS[opt](),
        name="e",
        output="concat",
        initializer=zeros(),
        cvm=True,
    )
    m = Layers(e=layer)
    m.compile(tn.optimizer.SGD(0.1), loss="mse")
    batch = make_batch(BATCH, [1, 0], weights=[1, 2])
    first = step(m, batch)["e"]  # [B, 2 * (2 + 2)]
    # first pull: every key is new, so show = 0 and log-CTR = 0
    np.testing.assert_array_equal(first.detach().numpy()[:, [2, 3, 6, 7]], 0.0)
    second = step(m, batch)["e"].detach().numpy()
    # after one push: show(1)=1 click(1)=1, show(2)=2 click(2)=0,
    # show(5)=1+2=3 click(5)=1, show(6)=1 click(6)=1
    ctr = {1: math.log(2) - math.log(2), 2: -math.log(3), 5: math.log(2) - math.log(4), 6: 0.0}
    show = {1: 1.0, 2: 2.0, 5: 3.0, 6: 1.0}
    want_u = [[show[1], ctr[1]], [show[2], ctr[2]]]
    want_t = [
        [(show[5] + show[6]) / 2, (ctr[5] + ctr[6]) / 2],  # mean over the bag [5, 6]
        [show[5], ctr[5]],
    ]
    np.testing.assert_allclose(second[:, 2:4], want_u, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(second[:, 6:8], want_t, rtol=1e-6, atol=1e-7)
    third = step(m, batch)["e"].detach().numpy()  # shows doubled: they count every push
    np.testing.assert_allclose(third[1, 2], 4.0, rtol=1e-6)


def test_cvm_gets_no_gradient_and_unknown_keys_read_zero(make_batch):
    layer = tn.layers.EmbeddingFeatures(cols(["u"]), SGD(0.5), name="e", cvm=True)
    m = Layers(e=layer)
    m.compile(tn.optimizer.SGD(0.1), loss="mse")
    batch = make_batch({"u": [[1], [2]]}, [1, 1])
    step(m, batch)
    m.train()
    tm = m.pull(batch)["e"]
    (out,) = m.embed(batch)["e"]  # [B, D + 2]
    assert out.shape == (2, 4)
    (out * torch.tensor([[1.0, 2.0, 100.0, 100.0]])).sum().backward()
    assert tm.E.grad.shape == (2, 2)  # the two CVM inputs are not part of the matrix
    np.testing.assert_array_equal(tm.E.grad.numpy(), [[1, 2], [1, 2]])
    m._release()
    m.eval()
    unseen = make_batch({"u": [[99], [1]]}, [0, 0])
    with torch.no_grad():
        m.pull(unseen)
        (ev,) = m.embed(unseen)["e"]
    np.testing.assert_array_equal(ev[0].numpy(), 0.0)
    np.testing.assert_allclose(ev[1, 2:].numpy(), [1.0, math.log(2) - math.log(2)])


def test_cvm_bad_arguments_name_the_layer():
    seq = fc.embedding_column(fc.sequence_category_column("h", max_length=3), 2)
    with pytest.raises(ArgumentError, match=r'"e": cvm=True .* sequence columns \[\'h\'\]'):
        tn.layers.EmbeddingFeatures([seq], SGD(0.1), name="e", cvm=True)
    with pytest.raises(ArgumentError, match=r"`cvm` must be a bool. Received: cvm=1"):
        tn.layers.EmbeddingFeatures(cols(["u"]), SGD(0.1), name="e", cvm=1)
    with pytest.raises(ArgumentError, match=r"`trainable` must be a bool. Received: trainable=0"):
        tn.layers.EmbeddingFeatures(cols(["u"]), SGD(0.1), name="e", trainable=0)
    a = tn.layers.EmbeddingFeatures(cols(["u"]), SGD(0.1), name="a", table="s", cvm=True)
    b = tn.layers.EmbeddingFeatures(cols(["t"]), SGD(0.1), name="b", table="s")
    with pytest.raises(ArgumentError, match=r'share table "s" but differ in `cvm`: True vs False'):
        Layers(a=a, b=b).build_tables()


# ---------------------------------------------------------------- frozen tables


def _frozen_model(opt, trainable_b=False):
    a = tn.layers.EmbeddingFeatures(cols(["u"]), OPTIMIZERS[opt](), name="a")
    b = tn.layers.EmbeddingFeatures(cols(["t"]), OPTIMIZERS[opt](), name="b", trainable=trainable_b)
    m = Layers(a=a, b=b)
    m.compile(tn.optimizer.SGD(0.1), loss="mse")
    return m


def _batches(n):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        B = 5
        u = [[int(k)] for k in rng.integers(0, 6, B)]
        t = [[int(k) for k in rng.integers(0, 4, rng.integers(0, 3))] for _ in range(B)]
        out.append((u, t, rng.integers(0, 2, B).astype(np.float32), i))
    return out


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS), ids=sorted(OPTIMIZERS))
def test_a_frozen_table_is_bit_identical_after_training(make_batch, opt):
    m = _frozen_model(opt)
    every = make_batch({"u": [[0]], "t": [[0, 1, 2, 3]]}, [0])
    m.train()
    m.pull(every)  # the frozen layer's pull creates its keys' rows
    m._release()
    before = {k: v.copy() for k, v in m.tables["b"].rows().items()}
    a_before = m.tables["a"].rows()["weights"].copy()
    for u, t, y, i in _batches(8):
        m.train_step(make_batch({"u": u, "t": t}, y, start=i * 10))
    after = m.tables["b"].rows()
    for k in before:  # weights, optimizer state, show, click, unseen days, marker
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert not np.array_equal(m.tables["a"].rows()["weights"][: len(a_before)], a_before)


def test_a_frozen_layer_sharing_a_table_updates_it_only_through_the_trainable_layer(make_batch):
    a = tn.layers.EmbeddingFeatures(cols(["u"]), SGD(0.5), name="a", table="s")
    f = tn.layers.EmbeddingFeatures(cols(["t"]), SGD(0.5), name="f", table="s", trainable=False)
    m = Layers(a=a, f=f)
    m.compile(tn.optimizer.SGD(0.1), loss="mse")
    # u: row 0 [1], row 1 [1]; t: row 0 [1, 7], row 1 [7]   (key 7 only in the frozen layer)
    batch = make_batch({"u": [[1], [1]], "t": [[1, 7], [7]]}, [1, 0])
    m.train()
    start = m.pull(batch)["s"].E.detach().numpy().copy()  # rows of [1, 7]
    m._release()
    step(m, batch)  # loss = sum of both layers' outputs: d/de_1 through "a" is 2 per dim
    rows = m.tables["s"].rows(np.array([1, 7], np.int64))
    np.testing.assert_allclose(rows["weights"][0], start[0] - 0.5 * 2, rtol=1e-6)
    np.testing.assert_array_equal(rows["weights"][1], start[1])
    np.testing.assert_array_equal(rows["show"], [2.0, 0.0])  # only the trainable occurrences
    np.testing.assert_array_equal(rows["click"], [1.0, 0.0])
    np.testing.assert_array_equal(rows["marker"], [1, 1])  # 7: created by the pull, not pushed


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS), ids=sorted(OPTIMIZERS))
def test_detached_outputs_push_nothing(make_batch, opt):
    layer = tn.layers.EmbeddingFeatures(cols(["u"]), OPTIMIZERS[opt](), name="e")
    m = Layers(detach=True, e=layer)
    m.compile(tn.optimizer.SGD(0.1), loss="mse")
    batch = make_batch({"u": [[1], [2]]}, [1, 0])
    m.train()
    m.pull(batch)
    m._release()
    before = m.tables["e"].rows()
    for _ in range(3):
        m.train_step(batch)
    after = m.tables["e"].rows()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert float(m.bias.detach()) != 0.0  # the step ran: the dense part trained


def test_a_zero_gradient_of_a_key_in_the_batch_is_an_adam_update(make_batch):
    layer = tn.layers.EmbeddingFeatures(cols(["u"]), Adam(0.1), name="e")
    m = Layers(e=layer)
    m.compile(tn.optimizer.SGD(0.1), loss="mse")
    batch = make_batch({"u": [[1]]}, [1])
    step(m, batch)  # a first, non-zero gradient gives Adam a momentum
    w1 = m.tables["e"].rows()["weights"].copy()
    step(m, batch, upstream=0.0)  # pushed with a zero gradient: the momentum still moves it
    rows = m.tables["e"].rows()
    assert not np.array_equal(rows["weights"], w1)
    np.testing.assert_array_equal(rows["show"], [2.0])
