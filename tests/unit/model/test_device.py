"""The dense part's device and precision: on the CPU, and on CUDA where there is one.

The meta device stands in for a GPU where shapes are enough: a forward pass
there fails on any host tensor left in the dense part's way. Where
``torch.cuda.is_available()``, the training and precision tests also run the
dense part on CUDA against the CPU.
"""

import numpy as np
import pytest
import torch

import tnrec as tn
from tnrec.errors import ArgumentError
from tnrec.layers import pooling
from tnrec.layers.device import CPU, autocast, host_float32, module_device, to_device, to_host
from tnrec.models import DeepFM
from tnrec.table import AdaGrad

fc = tn.feature_column
#: Where the dense part runs off the numba kernels: torch ops on the CPU, and CUDA where there is.
OFF_NUMBA = ["torch-cpu", *(["cuda"] if torch.cuda.is_available() else [])]


class Small(tn.Model):
    """The model tests' small model (three columns, one Linear) with a dtype probe."""

    def __init__(self):
        super().__init__()
        cols = [fc.embedding_column(fc.category_column(k), 4) for k in ("user", "item")]
        cols.append(fc.embedding_column(fc.category_column("tags"), 4, combiner="mean"))
        self.emb = tn.layers.EmbeddingFeatures(cols, AdaGrad(0.05), output="concat")
        self.out = torch.nn.Linear(14, 1)
        self.seen: list[torch.dtype] = []  # the Linear's output dtype, per forward

    def forward_dense(self, pooled, dense):
        z = self.out(torch.cat([pooled["emb"], dense], 1))  # [B, 1]
        self.seen.append(z.dtype)
        return torch.sigmoid(z)


class Mixed(tn.Model):
    """Every kind of pooled output: concat, list with cvm, sequences (a frozen-free mix)."""

    def __init__(self):
        super().__init__()
        cat = {k: fc.category_column(k) for k in ("user", "item", "tags")}
        self.emb = tn.layers.EmbeddingFeatures(
            [
                fc.embedding_column(cat["user"], 4),
                fc.embedding_column(cat["item"], 4),
                fc.embedding_column(cat["tags"], 4, combiner="mean"),
            ],
            AdaGrad(0.05),
            output="concat",
        )
        self.lin = tn.layers.EmbeddingFeatures(
            [
                fc.embedding_column(cat["user"], 1),
                fc.embedding_column(cat["tags"], 1, combiner="sqrtn"),
            ],
            AdaGrad(0.05),
            cvm=True,
        )
        seq = fc.sequence_category_column("tags", dtype="int", max_length=3)
        self.seq = tn.layers.EmbeddingFeatures([fc.embedding_column(seq, 2)], AdaGrad(0.05))
        self.out = torch.nn.Linear(12 + 2 * 3 + 2 + 2, 1)

    def forward_dense(self, pooled, dense):
        grid, lengths = pooled["seq"][0]  # [B, T, 2], [B]
        seq = grid.sum(1) / lengths.clamp(min=1).unsqueeze(1)  # [B, 2]
        x = torch.cat([pooled["emb"], *pooled["lin"], seq, dense], 1)  # [B, 22]
        return self.out(x).squeeze(-1)  # [B] logit


def small_deepfm():
    cols = [fc.category_column(k) for k in ("user", "item", "tags")]
    cols += [fc.numeric_column(k) for k in ("d0", "d1")]
    return DeepFM(cols, embedding_dim=4, hidden_units=[16, 8])


def table_rows(model):
    """Every table's keys (sorted) and rows."""
    out = {}
    for name, table in sorted(model.tables.items()):
        keys = np.sort(table.keys())
        out[name] = (keys, table.pull(keys, create=False))
    return out


# ------------------------------------------------------------------ the edge helpers


def test_moves_to_the_cpu_return_their_input():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = to_device(a, CPU)
    assert t.data_ptr() == a.ctypes.data  # no copy
    assert to_device(t, CPU) is t and to_host(t) is t
    assert host_float32(t).ctypes.data == a.ctypes.data
    assert host_float32(t.double()).dtype == np.float32
    assert to_device(t, torch.device("meta")).device.type == "meta"


def test_module_device_follows_the_parameters_then_the_buffers():
    assert module_device(torch.nn.ReLU()) == CPU  # nothing to follow
    bn = torch.nn.BatchNorm1d(2, affine=False).to("meta")  # buffers only
    assert module_device(bn).type == "meta"


def test_autocast_fp32_changes_nothing_and_bf16_runs_linear_layers_in_bf16():
    lin = torch.nn.Linear(2, 1)
    with autocast(CPU, "fp32"):
        assert lin(torch.ones(1, 2)).dtype == torch.float32
    with autocast(CPU, "bf16"):
        assert lin(torch.ones(1, 2)).dtype == torch.bfloat16


# ------------------------------------------------------------------ Model.device


def test_model_device_is_the_dense_parameters_and_follows_to():
    m = small_deepfm()
    assert m.device == CPU
    assert m.to("cpu") is m and m.device == CPU
    m.to("meta")
    assert m.device.type == "meta"
    m.to_empty(device="cpu")
    assert m.device == CPU


@pytest.mark.parametrize("make", [Small, Mixed, small_deepfm], ids=["small", "mixed", "deepfm"])
def test_pull_and_forward_run_on_the_model_device(batches, make):
    m = make()
    m.build_tables()
    m.to("meta")
    batch = batches(1, 16)[0]
    for training in (True, False):
        m.train(training)
        step = m.pull(batch)
        assert {tm.E.device.type for tm in step.values()} == {"meta"}
        assert all(tm.E.requires_grad == training for tm in step.values())
        out = m(batch)
        assert out.device.type == "meta" and out.shape[0] == 16


# ------------------------------------------------------------------ torch pooling on the CPU


@pytest.mark.parametrize("where", OFF_NUMBA)
@pytest.mark.parametrize("make", [Mixed, small_deepfm], ids=["mixed", "deepfm"])
def test_torch_pooling_trains_as_the_numba_kernels(batches, monkeypatch, make, where):
    """Torch-ops pooling on the CPU, or the whole dense part on CUDA, against the CPU's numba."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # float32 on both
    train = batches(20, 64, seed=1)
    runs = []
    for off in (False, True):
        monkeypatch.setattr(pooling, "TORCH_ON_CPU", off and where == "torch-cpu")
        torch.manual_seed(0)
        m = make()
        m.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
        if off and where == "cuda":
            m.to("cuda")
            assert m.device.type == "cuda"
        losses = [m.train_step(b)["loss"] for b in train]
        runs.append((losses, table_rows(m)))
    (loss_a, rows_a), (loss_b, rows_b) = runs
    # CUDA sums in other orders (GEMM splits, atomic adds), ~1e-7 a step that Adam carries on
    rtol, atol = (1e-5, 1e-6) if where == "torch-cpu" else (1e-4, 1e-5)
    np.testing.assert_allclose(loss_b, loss_a, rtol=rtol, atol=atol)
    assert rows_a.keys() == rows_b.keys()
    for name in rows_a:
        np.testing.assert_array_equal(rows_b[name][0], rows_a[name][0])
        np.testing.assert_allclose(rows_b[name][1], rows_a[name][1], rtol=rtol, atol=atol)


# ------------------------------------------------------------------ precision


def compiled_small(device="cpu", **kw):
    torch.manual_seed(0)
    m = Small()
    m.compile(tn.optimizer.Adam(learning_rate=0.02), **kw)
    return m.to(device)


@pytest.mark.parametrize("device", ["cpu", *OFF_NUMBA[1:]])
def test_bf16_trains_with_float32_tables_and_gradients(batches, monkeypatch, device):
    m = compiled_small(device, precision="bf16")
    pushed = []
    push = m.ps.push

    def recording_push(keys, grads, *args, **kw):
        pushed.extend(g.dtype for g in grads.values())
        return push(keys, grads, *args, **kw)

    monkeypatch.setattr(m.ps, "push", recording_push)
    losses = [m.train_step(b)["loss"] for b in batches(30, 128, seed=1)]
    assert set(m.seen) == {torch.bfloat16}  # the dense part ran under autocast
    assert set(pushed) == {np.dtype(np.float32)}
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.02, losses
    assert m.tables["emb"].rows()["weights"].dtype == np.float32
    out = m.predict(batches(2, 50, seed=2))["prediction"]
    assert out.dtype == np.float32 and out.shape == (100,)


@pytest.mark.parametrize("device", ["cpu", *OFF_NUMBA[1:]])
def test_bf16_loss_is_float32(batches, device):
    m = compiled_small(device, precision="bf16")
    batch = batches(1, 32)[0]
    m.pull(batch)
    loss, preds = m.compute_loss(batch, m(batch), norm=32.0)
    assert loss.dtype == torch.float32 and preds[""].dtype == torch.float32
    assert loss.device.type == device and preds[""].device.type == "cpu"  # for the metrics


def test_fp32_is_the_default_and_unchanged(batches):
    train = batches(10, 64, seed=1)
    default, explicit = compiled_small(), compiled_small(precision="fp32")
    assert default.precision == "fp32"
    a = [default.train_step(b)["loss"] for b in train]
    b = [explicit.train_step(b)["loss"] for b in train]
    assert a == b and set(default.seen) == {torch.float32}


@pytest.mark.parametrize("bad", ["fp16", "BF16", None, 16], ids=["fp16", "BF16", "None", "16"])
def test_a_bad_precision_names_the_argument_and_the_choices(bad):
    with pytest.raises(
        ArgumentError, match=rf"`precision` must be one of \['fp32', 'bf16'\]\. .*={bad!r}"
    ):
        Small().compile(tn.optimizer.Adam(0.01), precision=bad)
