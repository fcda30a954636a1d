"""BatchNormalization: TensorNet's summed statistics, the count cap, the exchange points,
checkpoints and the export (W workers: tests/multiprocess/test_dense_parity.py)."""

import numpy as np
import pytest
import torch

import tnrec as tn
from tests.unit.export.export_common import TINY_INPUTS, X, tiny_batches, tiny_rows
from tnrec.errors import ArgumentError
from tnrec.layers.normalization import COUNT, SQ, SUM, append_statistics
from tnrec.serving import Predictor

fc = tn.feature_column
EPS = 1e-5


def ref_norm(x, mean, var):
    return (x - np.asarray(mean)) / np.sqrt(np.asarray(var) + EPS)


def test_training_adds_the_batch_first_then_normalises_with_the_totals():
    bn = BatchNormalization_(2).train()
    x1 = np.array([[1.0, 2.0], [3.0, 6.0]])
    x2 = np.array([[5.0, -2.0], [7.0, 0.0], [0.0, 1.0]])
    out1 = bn(torch.tensor(x1, dtype=torch.float32)).detach().numpy()
    # after batch 1: mean [2, 4], var [(1+9)/2 - 4, (4+36)/2 - 16] = [1, 4]
    np.testing.assert_allclose(out1, ref_norm(x1, [2.0, 4.0], [1.0, 4.0]), rtol=1e-6)
    out2 = bn(torch.tensor(x2, dtype=torch.float32)).detach().numpy()
    both = np.concatenate([x1, x2])  # below the cap the totals are those of every row seen
    mean, var = both.mean(0), both.var(0)
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.numpy(), var, rtol=1e-6)
    np.testing.assert_allclose(out2, ref_norm(x2, mean, var), rtol=1e-5, atol=1e-6)
    assert bn.local[COUNT].tolist() == [5.0, 5.0]
    np.testing.assert_array_equal(bn.totals.numpy(), bn.local.numpy())  # sync_freq=1


def BatchNormalization_(*args, **kwargs):
    return tn.layers.BatchNormalization(*args, **kwargs)


def test_eval_uses_the_moving_statistics_and_changes_nothing():
    bn = BatchNormalization_(1).eval()
    x = torch.tensor([[3.0], [5.0]])
    np.testing.assert_allclose(bn(x).detach().numpy(), x.numpy() / np.sqrt(1 + EPS), rtol=1e-6)
    assert bn.local.abs().sum() == 0 and bn.moving_variance.tolist() == [1.0]
    bn.train()(x)
    bn.eval()
    before = bn.state_dict()
    out = bn(torch.tensor([[100.0]])).detach().numpy()
    np.testing.assert_allclose(out, ref_norm(np.array([[100.0]]), 4.0, 1.0), rtol=1e-6)
    for k, v in bn.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_no_gradient_flows_through_the_statistics():
    bn = BatchNormalization_(2).train()
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0]], requires_grad=True)
    with torch.no_grad():
        bn.gamma.copy_(torch.tensor([2.0, -1.0]))
    bn(x).sum().backward()
    inv = 1 / np.sqrt(np.array([1.0, 4.0]) + EPS)
    np.testing.assert_allclose(x.grad.numpy(), np.tile(np.array([2.0, -1.0]) * inv, (2, 1)), 1e-6)
    np.testing.assert_allclose(bn.beta.grad.numpy(), [2.0, 2.0])
    np.testing.assert_allclose(bn.gamma.grad.numpy(), [0.0, 0.0], atol=1e-6)  # sum of x-hat


def test_past_max_count_the_count_freezes_and_the_sums_decay_as_in_tensornet():
    bn = BatchNormalization_(1, momentum=0.9, max_count=3).train()
    for batch in ([1.0, 3.0], [5.0, 7.0], [2.0, 2.0]):
        bn(torch.tensor(batch)[:, None])
    # batches 1-2 add up (count 4 > 3), batch 3 decays: r = 2 / 4, a = (1 - 0.9f) * r
    a = float(np.float32(1) - np.float32(0.9)) * 0.5
    s, q = 16 * (1 - a) + a * 4, 84 * (1 - a) + a * 8
    assert bn.local[COUNT].tolist() == [4.0]
    np.testing.assert_allclose(bn.local[SUM].numpy(), [s], rtol=1e-15)
    np.testing.assert_allclose(bn.local[SQ].numpy(), [q], rtol=1e-15)
    np.testing.assert_allclose(bn.moving_mean.numpy(), [s / 4], rtol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.numpy(), [q / 4 - (s / 4) ** 2], rtol=1e-5)


def test_append_statistics_without_a_cap_keeps_adding():
    t = torch.zeros(5, 1, dtype=torch.float64)
    for _ in range(3):
        append_statistics(t, torch.tensor([[1.0], [1.0], [10.0]], dtype=torch.float64), 0.9, 0)
    assert t[[SUM, SQ, COUNT], 0].tolist() == [3.0, 3.0, 30.0]


def test_kahan_summation_keeps_small_increments():
    t = torch.zeros(5, 1, dtype=torch.float64)
    append_statistics(t, torch.tensor([[1e16], [0.0], [1.0]], dtype=torch.float64), 0.9, 0)
    for _ in range(10):
        append_statistics(t, torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64), 0.9, 0)
    assert float(t[SUM, 0]) - 1e16 == 10.0  # plain float64 addition would lose every 1.0


@pytest.mark.parametrize(
    "kwargs, totals_after",
    [({"sync_freq": 2}, [0, 9, 9, 30]), ({"synchronized": False}, [0, 0, 0, 0])],
    ids=["every-2-steps", "unsynchronized"],
)
def test_totals_change_only_at_an_exchange(kwargs, totals_after):
    bn = BatchNormalization_(1, **kwargs).train()
    seen = 0.0
    for step in range(1, 5):  # batch sums 3, 6, 9, 12
        bn(torch.tensor([[float(step)], [float(2 * step)]]))
        seen += 3 * step
        assert float(bn.totals[SUM, 0]) == totals_after[step - 1]
        assert float(bn.local[SUM, 0]) == seen  # the worker's own view counts every batch
    bn.sync_statistics()  # before a save: nothing pending afterwards, totals == local
    assert float(bn.totals[SUM, 0]) == float(bn.local[SUM, 0]) == 30.0
    assert bn.increments.abs().sum() == 0 and int(bn.batch_counter) == 0


def test_an_empty_batch_adds_nothing_and_keeps_the_initial_statistics():
    bn = BatchNormalization_(3).train()
    assert bn(torch.zeros(0, 3)).shape == (0, 3)
    assert bn.moving_mean.tolist() == [0.0] * 3 and bn.moving_variance.tolist() == [1.0] * 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_features": 0}, r"`num_features` must be a positive int\. Received: num_features=0"),
        ({"epsilon": 0.0}, r"`epsilon` must be a positive number\. Received: epsilon=0\.0"),
        ({"momentum": 1.5}, r"`momentum` must be a number in \[0, 1\]\. Received: momentum=1\.5"),
        ({"sync_freq": 0}, r"`sync_freq` must be a positive int .*Received: sync_freq=0"),
        ({"max_count": -1}, r"`max_count` must be an int >= 0 .*Received: max_count=-1"),
    ],
    ids=["features", "epsilon", "momentum", "sync_freq", "max_count"],
)
def test_bad_arguments(kwargs, match):
    args = {"num_features": 2, **kwargs}
    with pytest.raises(ArgumentError, match=match):
        BatchNormalization_(args.pop("num_features"), **args)


def test_an_input_of_another_width_is_refused():
    with pytest.raises(ArgumentError, match=r"num_features=2 channels\. Received: shape \(4, 3\)"):
        BatchNormalization_(2)(torch.zeros(4, 3))


# ---------------------------------------------------------------- in a model


class TinyBN(tn.Model):
    def __init__(self):
        super().__init__()
        self.feature_columns = [X]
        u, s = TINY_INPUTS[0], TINY_INPUTS[1]
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(u, 4), fc.embedding_column(s, 4, combiner="mean")],
            tn.optimizer.AdaGrad(0.1),
            output="concat",
        )
        self.bn = tn.layers.BatchNormalization(9, sync_freq=3, max_count=40)
        self.mlp = torch.nn.Linear(9, 1)

    def forward_dense(self, pooled, dense):
        return self.mlp(self.bn(torch.cat([pooled["emb"], dense], 1)))


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    m = TinyBN()
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    m.fit(tiny_batches(tiny_rows(80, 0)), verbose=0)  # 5 steps: 1 left pending, cap passed
    return m


def test_save_exchanges_what_is_pending_and_a_load_restores_it_exactly(trained, tmp_path):
    assert int(trained.bn.batch_counter) == 2 and trained.bn.increments.abs().sum() > 0
    trained.save_weights(str(tmp_path), "d1")
    bn = trained.bn
    assert int(bn.batch_counter) == 0 and bn.increments.abs().sum() == 0
    # steps 1-3 exchanged 48 rows (> max_count 40): steps 4-5 decay the sums, the count stays
    assert torch.equal(bn.totals, bn.local) and float(bn.totals[COUNT].max()) == 48.0
    fresh = TinyBN()
    fresh.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    fresh.load_weights(str(tmp_path))
    for name, buf in trained.bn.named_buffers():
        assert torch.equal(getattr(fresh.bn, name), buf), name
    rows = tiny_batches(tiny_rows(20, 5))
    np.testing.assert_array_equal(
        fresh.predict(rows)["prediction"], trained.predict(rows)["prediction"]
    )


def test_the_export_holds_the_moving_statistics(trained, tmp_path):
    path = trained.export(str(tmp_path / "exp"))
    rows = tiny_rows(30, 7)
    want = trained.predict(tiny_batches(rows))["prediction"]
    got = Predictor(path).predict([{k: v for k, v in r.items() if k != "y"} for r in rows])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert trained.bn.moving_variance.min() > 0  # trained statistics, not the initial ones


# ---------------------------------------------------------------- the PCTR-DNN variant


def test_pctr_normalises_with_the_statistics_before_the_batch_and_the_raw_squares():
    bn = tn.layers.PCTRBatchNormalization(1).train()
    x1, x2 = np.array([[1.0], [3.0]]), np.array([[5.0], [7.0]])
    out1 = bn(torch.tensor(x1, dtype=torch.float32)).detach().numpy()
    np.testing.assert_allclose(out1, x1 / np.sqrt(EPS), rtol=1e-6)  # nothing seen: 0 and 0
    out2 = bn(torch.tensor(x2, dtype=torch.float32)).detach().numpy()
    # before batch 2: mean 4 / 2, "variance" = squares around 0 = 1 + 9
    np.testing.assert_allclose(out2, (x2 - 2.0) / np.sqrt(10.0 + EPS), rtol=1e-6)
    # batch 2 adds sum 12 and squares around 2: 9 + 25
    assert bn.local[[SUM, SQ, COUNT], 0].tolist() == [16.0, 44.0, 4.0]
    out = bn.eval()(torch.tensor([[10.0]])).detach().numpy()
    np.testing.assert_allclose(out, [[(10.0 - 4.0) / np.sqrt(44.0 + EPS)]], rtol=1e-6)
    assert bn.moving_mean.tolist() == [4.0] and bn.moving_variance.tolist() == [44.0]


class TinyPCTR(TinyBN):
    def __init__(self):
        super().__init__()
        self.bn = tn.layers.PCTRBatchNormalization(9, sync_freq=2, max_count=40)


def test_pctr_round_trips_through_a_checkpoint_and_the_export(tmp_path):
    torch.manual_seed(0)
    m = TinyPCTR()
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    m.fit(tiny_batches(tiny_rows(48, 0)), verbose=0)
    m.save_weights(str(tmp_path / "ckpt"), "d1")
    fresh = TinyPCTR()
    fresh.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    fresh.load_weights(str(tmp_path / "ckpt"))
    for name, buf in m.bn.named_buffers():
        assert torch.equal(getattr(fresh.bn, name), buf), name
    rows = tiny_rows(30, 7)
    want = m.predict(tiny_batches(rows))["prediction"]
    got = Predictor(m.export(str(tmp_path / "exp"))).predict(
        [{k: v for k, v in r.items() if k != "y"} for r in rows]
    )
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
