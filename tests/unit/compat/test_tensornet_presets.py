"""tnrec.compat.tensornet: TensorNet's constructors give the tnrec objects that update as it does.

Each update is checked against TensorNet's rule written out in float64 from the
reference's description (its ``*_kernel.cc`` arithmetic), not against tnrec's own.
"""

import numpy as np
import pytest

import tnrec.compat.tensornet as tnc
from tests.unit.table.table_common import ATOL, RTOL
from tnrec.errors import ArgumentError
from tnrec.table import EvictionPolicy, SparseTable, normal

KEYS = np.array([3, -7, 2**62], dtype=np.int64)
ONES = np.ones(3, np.float32)


def _grads(step: int) -> np.ndarray:
    rng = np.random.default_rng(step)
    return rng.normal(size=(3, 4)).astype(np.float32)


def _table(settings: tnc.SparseSettings) -> SparseTable:
    return SparseTable(
        4,
        settings.optimizer,
        name="t",
        initializer=settings.initializer,
        policy=settings.policy,
    )


def test_adagrad_defaults_are_tensornets():
    s = tnc.AdaGrad()
    assert s.optimizer.learning_rate == 0.01
    assert s.optimizer.initial_g2sum == 0.0 and s.optimizer.epsilon == 1e-8
    assert s.initializer == normal(1.0)
    # threshold 0 deletes nothing (no show is negative); 1000 unseen days, OR
    assert s.policy == EvictionPolicy(
        show_decay_rate=0.98, show_threshold=None, max_unseen_days=1000, combine="any"
    )


def test_adagrad_eviction_arguments_map_to_the_policy():
    s = tnc.AdaGrad(show_threshold=2.5, no_show_days=7, elimination_logic=1, show_decay_rate=0.9)
    assert s.policy == EvictionPolicy(
        show_decay_rate=0.9, show_threshold=2.5, max_unseen_days=7, combine="all"
    )


def test_adagrad_updates_as_tensornets_rule():
    s = tnc.AdaGrad(learning_rate=0.05, initial_g2sum=0.1, initial_scale=0.1)
    t = _table(s)
    w = t.pull(KEYS)[:, :4].astype(np.float64)
    g2 = np.full(3, 0.1)
    for step in range(5):
        g = _grads(step)
        t.pull(KEYS)
        t.push(KEYS, g, ONES, ONES)
        g2 += (g.astype(np.float64) ** 2).sum(1) / 4  # one scalar per sign: the mean of g^2
        w -= 0.05 * g / (1e-8 + np.sqrt(g2))[:, None]
    np.testing.assert_allclose(t.pull(KEYS)[:, :4], w, rtol=RTOL, atol=ATOL)


def test_adam_has_no_bias_correction():
    s = tnc.Adam(learning_rate=0.01)
    assert s.optimizer.bias_correction is False
    assert not s.policy.evicts
    t = _table(s)
    w = t.pull(KEYS)[:, :4].astype(np.float64)
    m = np.zeros((3, 4))
    v = np.zeros((3, 4))
    for step in range(4):
        g = _grads(step).astype(np.float64)
        t.pull(KEYS)
        t.push(KEYS, g.astype(np.float32), ONES, ONES)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        w -= 0.01 * m / (1e-8 + np.sqrt(v))
    np.testing.assert_allclose(t.pull(KEYS)[:, :4], w, rtol=1e-5, atol=1e-6)


def test_ftrl_learning_rate_is_the_inverse_of_alpha():
    s = tnc.Ftrl(learning_rate=0.5, beta=1.0, lambda1=0.01, lambda2=0.1, initial_scale=0.0)
    assert s.optimizer.learning_rate == 2.0
    t = _table(s)
    lr, beta, l1, l2 = 0.5, 1.0, 0.01, 0.1
    z = np.zeros((3, 4))
    n = np.zeros((3, 4))
    w = np.zeros((3, 4))
    t.pull(KEYS)
    for step in range(4):
        g = _grads(step).astype(np.float64)
        t.pull(KEYS)
        t.push(KEYS, g.astype(np.float32), ONES, ONES)
        # TensorNet's ftrl_kernel: lr multiplies where McMahan's alpha divides
        sigma = lr * (np.sqrt(n + g * g) - np.sqrt(n)) * w
        z += g - sigma
        n += g * g
        w = np.where(np.abs(z) <= l1, 0.0, -(z - np.sign(z) * l1) / ((beta + np.sqrt(n)) * lr + l2))
    np.testing.assert_allclose(t.pull(KEYS)[:, :4], w, rtol=1e-5, atol=1e-6)


def test_embedding_column_defaults_to_mean():
    col = tnc.embedding_column(tnc.category_column("slot_1"), dimension=8)
    assert col.combiner == "mean" and col.dimension == 8


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: tnc.AdaGrad(mom_decay_rate=0.5), "mom_decay_rate.*no effect"),
        (lambda: tnc.AdaGrad(grad_decay_rate=0.9), "grad_decay_rate.*no effect"),
        (lambda: tnc.AdaGrad(elimination_logic=2), "elimination_logic"),
        (lambda: tnc.AdaGrad(initial_scale="big"), "initial_scale"),
        (lambda: tnc.Ftrl(learning_rate=0), "learning_rate.*positive"),
        (lambda: tnc.category_column("s", bucket_size=0), "bucket_size"),
        (lambda: tnc.EmbeddingFeatures([], object()), "sparse_opt"),
        (lambda: tnc.AdaGrad(learning_rate=-1.0), "learning_rate"),
    ],
    ids=["mom", "grad", "logic", "scale", "ftrl-lr", "bucket", "opt", "neg-lr"],
)
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ArgumentError, match=match):
        call()


def test_batch_norms_take_tensornets_defaults():
    import torch

    from tnrec.layers import BatchNormalization, PCTRBatchNormalization

    bn = tnc.TNBatchNormalization(3)
    assert type(bn) is BatchNormalization
    assert (bn.synchronized, bn.sync_freq, bn.max_count, bn.momentum) == (False, 1, 100_000, 0.99)
    pctr = tnc.PCTRDNNBatchNormalization(3, synchronized=True, sync_freq=4)
    assert type(pctr) is PCTRBatchNormalization
    assert (pctr.synchronized, pctr.sync_freq) == (True, 4)
    # the same statistics as the tnrec layer built with the same arguments
    x = torch.tensor([[1.0, 2.0, 3.0], [3.0, -2.0, 0.5]])
    ref = BatchNormalization(3, synchronized=False)
    bn.train()
    ref.train()
    torch.testing.assert_close(bn(x), ref(x), rtol=0, atol=0)
