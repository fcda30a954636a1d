"""A synchronous step's push beside its dense optimizer step (steps.PUSH_BESIDE_DENSE_STEP).

The push (temporary matrices' gradients -> tables) and the dense step (the dense
parameters) share no state: side by side they must train the same model, bit for
bit, as one after the other. The default pushes beside a big dense step where a
core is left over (torch's threads plus the table kernels' fit in this worker's CPUs).
"""

import numpy as np
import pytest
import torch

import tnrec as tn
import tnrec.steps as steps
from tnrec.models import DeepFM
from tnrec.table import threads as table_threads

fc = tn.feature_column


def deepfm():
    cols = [fc.category_column(k) for k in ("user", "item", "tags")]
    cols += [fc.numeric_column(k) for k in ("d0", "d1")]
    return DeepFM(cols, embedding_dim=4, hidden_units=[16, 8])


def frozen_and_trained():
    """Two tables, one with a frozen layer beside a trained one, and a sequence layer."""

    class M(tn.Model):
        def __init__(self):
            super().__init__()
            cat = {k: fc.category_column(k) for k in ("user", "item", "tags")}
            self.emb = tn.layers.EmbeddingFeatures(
                [fc.embedding_column(cat["user"], 4), fc.embedding_column(cat["item"], 4)],
                tn.table.AdaGrad(0.05),
                output="concat",
            )
            self.frozen = tn.layers.EmbeddingFeatures(
                [fc.embedding_column(cat["tags"], 4, combiner="mean")],
                tn.table.AdaGrad(0.05),
                output="concat",
                trainable=False,
            )
            self.out = torch.nn.Linear(14, 1)

        def forward_dense(self, pooled, dense):
            x = torch.cat([pooled["emb"], pooled["frozen"], dense], 1)  # [B, 14]
            return self.out(x).squeeze(-1)

    return M()


def train(make, batches, beside, monkeypatch):
    monkeypatch.setattr(steps, "PUSH_BESIDE_DENSE_STEP", beside)
    torch.manual_seed(0)
    m = make()
    m.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    losses = [m.train_step(b).get("loss") for b in batches]
    rows = {}
    for name, table in sorted(m.tables.items()):
        keys = np.sort(table.keys())
        rows[name] = (keys, table.pull(keys, create=False))
    params = {n: p.detach().clone() for n, p in m.named_parameters()}
    return losses, rows, params


@pytest.mark.parametrize("make", [deepfm, frozen_and_trained], ids=["deepfm", "frozen"])
def test_pushing_beside_the_dense_step_trains_the_same_model_bit_for_bit(
    batches, monkeypatch, make
):
    data = batches(12, 64, seed=1)
    data.insert(5, data[0].slice(0, 0))  # an empty batch: nothing pulled, nothing pushed
    a = train(make, data, False, monkeypatch)
    b = train(make, data, True, monkeypatch)
    assert a[0] == b[0] and a[0][5] is None  # the losses; the empty batch has none
    assert a[1].keys() == b[1].keys() and a[1]
    for name in a[1]:
        np.testing.assert_array_equal(a[1][name][0], b[1][name][0])
        np.testing.assert_array_equal(a[1][name][1], b[1][name][1])
    assert a[2].keys() == b[2].keys()
    for n in a[2]:
        assert torch.equal(a[2][n], b[2][n]), n


def test_a_failed_push_is_raised_after_the_dense_step(batches, monkeypatch):
    monkeypatch.setattr(steps, "PUSH_BESIDE_DENSE_STEP", True)
    m = deepfm()
    m.compile(tn.optimizer.Adam(0.01))
    data = batches(2, 32, seed=1)
    m.train_step(data[0])
    before = [p.detach().clone() for p in m.parameters()]

    def broken_push(*args, **kwargs):
        raise OSError("the parameter server went away")

    monkeypatch.setattr(m.ps, "push", broken_push)
    with pytest.raises(OSError, match="went away"):
        m.train_step(data[1])
    assert any(not torch.equal(a, p) for a, p in zip(before, m.parameters(), strict=True))


BIG = steps.BESIDE_MIN_DENSE


@pytest.mark.parametrize(
    ("torch_threads", "table", "cpus", "values", "want"),
    [
        (1, 1, 2, BIG, True),
        (1, 1, 1, BIG, False),
        (2, 2, 2, BIG, False),
        (1, 2, 4, 10 * BIG, True),
        (2, 1, 2, BIG, False),
        (1, 1, 2, BIG - 1, False),  # a small dense step: the hand-off would cost more
        (1, 1, 8, 33, False),
    ],
)
def test_the_default_pushes_beside_only_a_big_dense_step_where_a_core_is_left(
    monkeypatch, torch_threads, table, cpus, values, want
):
    monkeypatch.setattr(steps, "PUSH_BESIDE_DENSE_STEP", None)
    monkeypatch.setattr(torch, "get_num_threads", lambda: torch_threads)
    monkeypatch.setattr(table_threads, "get_num_threads", lambda: table)
    monkeypatch.setattr(table_threads, "cpus_per_worker", lambda: cpus)
    params = [torch.empty(values - values // 3), torch.empty(values // 3)]  # `values` in all
    assert steps.push_beside_dense_step(params) is want
    for forced in (True, False):
        monkeypatch.setattr(steps, "PUSH_BESIDE_DENSE_STEP", forced)
        assert steps.push_beside_dense_step(params) is forced


def test_cpus_per_worker_divides_the_cpus_among_the_local_workers(monkeypatch):
    monkeypatch.setattr(table_threads.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(table_threads, "_local_workers", 3)
    assert table_threads.cpus_per_worker() == 2
    monkeypatch.setattr(table_threads, "_local_workers", 16)
    assert table_threads.cpus_per_worker() == 1
