"""The model zoo: each model learns, its formulas, its errors; saved models; run logs."""

import json
import math
import os

import numpy as np
import pytest
import torch

import tnrec as tn
from tnrec import _fileio
from tnrec.cli.artifacts import load_model, save_model
from tnrec.data.batch import Batch, Jagged
from tnrec.data.synthetic import SyntheticConfig, generate
from tnrec.errors import (
    ArgumentError,
    CheckpointError,
    ChecksumError,
    DataError,
    FormatVersionError,
)
from tnrec.models import DCN, LR, MODELS, CrossLayer, DeepFM, WideDeep, build
from tnrec.models.base import MAX_INITIAL_BIAS, initial_bias
from tnrec.runlog import RunLog, TimedData, read_runlog

fc = tn.feature_column

SMALL = {"embedding_dim": 4, "hidden_units": [16, 8]}
ZOO = [
    pytest.param("lr", {}, id="lr"),
    pytest.param("widedeep", SMALL, id="widedeep"),
    pytest.param("deepfm", SMALL, id="deepfm"),
    pytest.param("dcn", {**SMALL, "cross_layers": 2}, id="dcn"),
]


@pytest.fixture(scope="module")
def criteo_data(tmp_path_factory):
    """3,000 training and 1,000 test rows of synthetic Criteo-schema data (Parquet)."""
    out = tmp_path_factory.mktemp("syn")
    gen = generate(out, SyntheticConfig(rows_per_day=3000, num_days=1, test_rows=1000, seed=3))
    cols = tn.data.criteo_columns()
    files = [str(p) for p in gen.train_files[gen.days[0]]]
    train = tn.data.read_parquet(files, cols, batch_size=500)
    test = tn.data.read_parquet([str(p) for p in gen.test_files], cols, batch_size=500)
    return cols, train, test


@pytest.mark.parametrize(("name", "params"), ZOO)
def test_zoo_model_trains_and_its_loss_falls(criteo_data, name, params):
    cols, train, test = criteo_data
    torch.manual_seed(0)
    model = build(name, cols, **params)
    model.compile()
    history = model.fit(train, epochs=4, verbose=0)
    loss, auc = history.history["loss"], history.history["auc"]
    assert all(a > b for a, b in zip(loss, loss[1:], strict=False)), loss  # falls every epoch
    # A bias alone would lower the loss too; the training AUC shows the keys' rows learn.
    assert auc[-1] > 0.9, auc
    out = model.predict(test)
    assert out["prediction"].shape == (1000,)
    assert ((out["prediction"] > 0) & (out["prediction"] < 1)).all()  # sigmoid of the logit


@pytest.mark.parametrize(("name", "params"), ZOO)
def test_zoo_model_outputs_a_logit_and_compiles_with_defaults(name, params):
    cols = tn.data.criteo_columns()
    model = build(name, cols, **params)
    model.compile()
    assert isinstance(model.optimizer, torch.optim.Adam)
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert model.heads[0].prediction == "sigmoid"  # loss is ..._from_logits
    assert [m.name for m in model.heads[0].metrics] == ["auc", "logloss"]
    B, C, D = 5, 26, params.get("embedding_dim", 1)
    pooled = {"emb": torch.randn(B, C * D), "wide": torch.randn(B, C)}
    logit = model.forward_dense(pooled, torch.randn(B, 13))
    assert logit.shape == (B,)


def test_deepfm_fm_term_is_the_sum_of_pairwise_dot_products():
    cols = [fc.category_column(f"c{i}") for i in range(4)] + [fc.numeric_column("x")]
    model = DeepFM(cols, embedding_dim=3, hidden_units=[5])
    with torch.no_grad():  # silence the linear and deep parts: only the FM term is left
        model.deep[-1].weight.zero_()
        model.deep[-1].bias.zero_()
        model.wide_dense.weight.zero_()
        model.bias.zero_()
    v = torch.randn(2, 4, 3)  # [B, C, D]
    pooled = {"emb": v.reshape(2, 12), "wide": torch.zeros(2, 4)}
    got = model.forward_dense(pooled, torch.randn(2, 1))
    want = sum((v[:, i] * v[:, j]).sum(1) for i in range(4) for j in range(i + 1, 4))
    torch.testing.assert_close(got, want)


def test_lr_and_widedeep_linear_part_sums_key_weights_and_dense():
    cols = [fc.category_column("a"), fc.category_column("b"), fc.numeric_column("x")]
    model = LR(cols)
    with torch.no_grad():
        model.wide_dense.weight.fill_(2.0)
        model.bias.fill_(0.5)
    got = model.forward_dense({"wide": torch.tensor([[1.0, -3.0]])}, torch.tensor([[4.0]]))
    torch.testing.assert_close(got, torch.tensor([1.0 - 3.0 + 8.0 + 0.5]))
    wd = WideDeep(cols, embedding_dim=2, hidden_units=[3])
    assert [layer.dim for layer in wd.embedding_layers()] == [2, 1]
    assert wd.wide.initializer == tn.table.zeros()  # linear weights start at 0


def test_dcn_cross_layer_formula():
    layer = CrossLayer(3)
    x0, x = torch.randn(4, 3), torch.randn(4, 3)
    want = x0 * (x @ layer.linear.weight.T + layer.linear.bias) + x
    torch.testing.assert_close(layer(x0, x), want)
    model = DCN([fc.category_column("a"), fc.numeric_column("x")], 2, [4], cross_layers=3)
    assert len(model.cross) == 3 and not hasattr(model, "wide")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param(
            {"embedding_dim": 0}, r"`embedding_dim` must be a positive int. Received: 0", id="dim0"
        ),
        pytest.param(
            {"hidden_units": [8, -1]},
            r"`hidden_units` must be a list of positive ints",
            id="hidden-negative",
        ),
        pytest.param(
            {"hidden_units": 8}, r"`hidden_units` must be a list of positive ints", id="hidden-int"
        ),
        pytest.param(
            {"columns": [fc.numeric_column("x")]},
            r"at least one categorical column",
            id="no-categorical",
        ),
        pytest.param(
            {"columns": [fc.sequence_category_column("s", "int", 5)]},
            r"takes category, bucketized, embedding \(pooled\) and numeric",
            id="sequence",
        ),
        pytest.param(
            {"columns": [fc.embedding_column(fc.category_column("a"), 8)]},
            r'column "a" has dimension 8, but .* embedding_dim=4',
            id="other-dim",
        ),
    ],
)
def test_constructor_errors_name_the_argument(kwargs, match):
    args = {"columns": [fc.category_column("a")], "embedding_dim": 4, "hidden_units": [8]}
    args.update(kwargs)
    with pytest.raises(ArgumentError, match=match):
        DeepFM(**args)


def test_dcn_and_build_errors():
    with pytest.raises(ArgumentError, match=r"`cross_layers` must be an int >= 0. Received: .*-1"):
        DCN([fc.category_column("a")], cross_layers=-1)
    with pytest.raises(ArgumentError, match=r"Unknown model 'deepfn'; expected one of"):
        build("deepfn", [fc.category_column("a")])
    assert sorted(MODELS) == ["dcn", "deepfm", "lr", "widedeep"]


@pytest.mark.parametrize(("name", "params"), ZOO)
def test_saved_model_predicts_the_same(tmp_path, criteo_data, name, params):
    cols, train, test = criteo_data
    torch.manual_seed(0)
    model = build(name, cols, **params)
    model.compile()
    model.fit(train, epochs=1, verbose=0)
    save_model(model, tmp_path / "m", params)
    save_model(model, tmp_path / "m", params)  # replaces the earlier one
    assert sorted(os.listdir(tmp_path)) == ["m"]  # no temporary directory left
    loaded, doc = load_model(tmp_path / "m")
    assert type(loaded) is type(model) and doc["model"] == name
    want = model.predict(test)["prediction"]
    np.testing.assert_array_equal(loaded.predict(test)["prediction"], want)


def test_load_model_errors_name_the_file(tmp_path, criteo_data):
    with pytest.raises(CheckpointError, match=r"model.json not found: not a model directory"):
        load_model(tmp_path)
    model = LR(criteo_data[0])
    model.compile()
    save_model(model, tmp_path / "m", {})
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    (tmp_path / "m" / "model.json").write_bytes(
        _fileio.dumps_checked({**doc, "format_version": 99})
    )
    with pytest.raises(FormatVersionError, match=r"model.json: format_version 99 is not supported"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "model.json").write_text(json.dumps({**doc, "model": "deepfm"}))
    with pytest.raises(ChecksumError, match=r"model file .*model.json is corrupt"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "model.json").write_text(json.dumps(doc))
    (tmp_path / "m" / "model" / "1" / "dense.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"model/1/dense.pt is corrupt: its sha256"):
        load_model(tmp_path / "m")
    with pytest.raises(CheckpointError, match=r"holds no complete checkpoint of day '2024'"):
        load_model(tmp_path / "m", "2024")


def test_run_log_writes_step_and_epoch_records(tmp_path, criteo_data):
    cols, train, _ = criteo_data
    model = LR(cols)
    model.compile()
    log = RunLog(tmp_path / "run", every=2)
    model.fit(log.wrap(train), epochs=2, callbacks=[log], verbose=0)
    records = read_runlog(tmp_path / "run")
    steps = [r for r in records if r["event"] == "step"]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [(r["epoch"], r["step"]) for r in steps] == [(e, s) for e in (0, 1) for s in (2, 4, 6)]
    assert [r["global_step"] for r in steps] == [2, 4, 6, 8, 10, 12]
    assert [r["rows"] for r in epochs] == [3000, 3000]
    assert [r["rows"] for r in steps[:3]] == [1000, 2000, 3000]
    for r in epochs:
        assert r["steps"] == 6 and r["samples_per_s"] > 0 and 0 <= r["input_wait_share"] <= 1
        assert {"loss", "auc", "logloss"} <= set(r)
    assert all(r["input_wait_s"] >= 0 and "loss" in r for r in steps)


def test_run_log_without_wrapped_data_and_errors(tmp_path):
    log = RunLog(tmp_path, every=0, tensorboard=True)  # tensorboard absent or present: no crash
    log.on_train_begin()
    log.on_epoch_begin(0)
    log.on_train_batch_end(1, {"loss": float("nan")})
    log.on_epoch_end(0, {"loss": float("inf")})
    log.on_train_end()
    (rec,) = read_runlog(tmp_path / "runlog.jsonl")
    assert rec["event"] == "epoch" and rec["loss"] is None and "samples_per_s" not in rec
    with pytest.raises(ArgumentError, match=r"`every` must be an int >= 0. Received: every=-1"):
        RunLog(tmp_path, every=-1)
    timed = TimedData([1, 2])
    assert list(timed) == [1, 2] and timed.batches == 2 and timed.wait_s >= 0


@pytest.mark.slow
def test_deepfm_on_1m_synthetic_rows_vs_lr_and_optimal(tmp_path):
    """Slow (~2.5 min, ``pytest -m slow``): default generator settings, 1M training rows.

    The issue's targets: DeepFM's test AUC within 0.01 of the optimal AUC and
    at least 0.01 above LR on the same columns, with the settings of
    ``bench/synthetic_quality.py`` (one epoch, batch 1024, Ftrl on the
    tables). Measured: optimal 0.8198, DeepFM 0.8124, LR 0.7700
    (docs/models_cli.md).
    """
    torch.set_num_threads(1)
    cfg = SyntheticConfig(rows_per_day=333_334)
    gen = generate(tmp_path, cfg)
    bounds = [-0.5] + [0.25 * i for i in range(1, 61)]  # log1p scale; missing (-1) apart
    cols = [
        fc.numeric_column(f"I{j}", -1.0, [fc.log1p(), fc.bucketize(bounds)]) for j in range(1, 14)
    ]
    cols += [fc.category_column(f"C{j}", dtype="str") for j in range(1, 27)]
    files = tn.data.list_files(tmp_path, days=list(cfg.days))
    test = tn.data.read_parquet([str(p) for p in gen.test_files], cols, batch_size=8192)
    aucs = {}
    for name, params, sparse, dlr in [
        ("lr", {}, tn.optimizer.Ftrl(0.1, beta=5e-3, l1=0.0, l2=0.0), 0.01),
        (
            "deepfm",
            {"embedding_dim": 16, "hidden_units": [256, 128]},
            tn.optimizer.Ftrl(0.05, beta=4e-3, l1=0.0, l2=4e-2),
            0.001,
        ),
    ]:
        torch.manual_seed(0)
        model = build(
            name, cols, sparse_optimizer=sparse, dense_optimizer=tn.optimizer.Adam(dlr), **params
        )
        model.compile()
        train = tn.data.read_parquet(files, cols, batch_size=1024, shuffle=True, seed=0)
        model.fit(train, epochs=1, verbose=0)
        aucs[name] = model.evaluate(test, verbose=0, exact_auc=True)["auc_exact"]
    print(aucs, gen.optimal_auc)
    assert aucs["deepfm"] >= gen.optimal_auc - 0.01  # measured: optimal - 0.0075
    assert aucs["deepfm"] >= aucs["lr"] + 0.01  # measured: LR + 0.042


# --- the initial bias -----------------------------------------------------------------------

TINY_COLS = [fc.category_column("user"), fc.category_column("item"), fc.numeric_column("d0")]


def tiny_batch(labels, weights=None, seed=0):
    """B rows: one ``user`` and one ``item`` key each, one dense feature, the given labels."""
    labels = np.asarray(labels, np.float32)
    B = labels.shape[0]
    rng = np.random.default_rng(seed)
    offsets = np.arange(B + 1, dtype=np.int64)
    return Batch(
        sparse={
            k: Jagged(rng.integers(0, 50, B).astype(np.int64), offsets) for k in ("user", "item")
        },
        dense=rng.normal(size=(B, 1)).astype(np.float32),
        dense_names=("d0",),
        labels=labels[:, None],
        label_names=("label",),
        weights=None if weights is None else np.asarray(weights, np.float32),
        row_ids=np.arange(B, dtype=np.int64),
    )


def first_step_bias(name, params, batch):
    torch.manual_seed(0)
    model = build(name, TINY_COLS, **params)
    # lr 0: the step itself leaves the bias where the prior put it
    model.compile(torch.optim.SGD(model.parameters(), lr=0.0))
    model.train_step(batch)
    return float(model.output_bias().detach()[0])


@pytest.mark.parametrize(
    ("clicks", "weight", "weight_sq", "want"),
    [
        pytest.param(0.0, 7.0, 7.0, -math.log(15.0), id="seven_zeros"),  # p = 0.5 / 8
        pytest.param(7.0, 7.0, 7.0, math.log(15.0), id="seven_ones"),
        pytest.param(0.0, 1000.0, 1000.0, -5.0, id="many_zeros"),  # bounded
        pytest.param(1000.0, 1000.0, 1000.0, 5.0, id="many_ones"),
        # a realistic batch keeps its rate, and so do the same rows with weights 0.01
        pytest.param(31.0, 1024.0, 1024.0, math.log(31.5 / 993.5), id="ctr_3pct"),
        pytest.param(0.31, 10.24, 0.1024, math.log(31.5 / 993.5), id="scaled"),
        # w [1, 1, 2], y [1, 0, 1]: n = 16/6, p = 7.5/11
        pytest.param(3.0, 4.0, 6.0, math.log(15 / 7), id="kish"),
    ],
)
def test_initial_bias_is_shrunk_and_bounded(clicks, weight, weight_sq, want):
    assert initial_bias(clicks, weight, weight_sq) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("name", "params"), ZOO)
@pytest.mark.parametrize(
    ("labels", "want"),
    [
        pytest.param([0] * 7, -math.log(15.0), id="all_zero"),
        pytest.param([1] * 7, math.log(15.0), id="all_one"),
        pytest.param([0] * 600, -5.0, id="many_zero"),
        pytest.param([1] * 20 + [0] * 480, math.log(20.5 / 480.5), id="realistic"),
    ],
)
def test_first_step_sets_a_bounded_bias(name, params, labels, want):
    got = first_step_bias(name, params, tiny_batch(labels))
    assert got == pytest.approx(want, abs=1e-6)
    assert abs(got) <= MAX_INITIAL_BIAS


def test_initial_bias_waits_for_a_batch_with_weight_and_spares_a_loaded_one():
    model = build("lr", TINY_COLS)
    model.compile(torch.optim.SGD(model.parameters(), lr=0.0))
    model.train_step(tiny_batch([1, 0, 0], weights=[0, 0, 0]))  # nothing to estimate from
    assert float(model.bias.detach()[0]) == 0.0
    model.train_step(tiny_batch([1, 0, 0]))
    assert float(model.bias.detach()[0]) == pytest.approx(math.log(1.5 / 2.5))

    model = build("lr", TINY_COLS)
    model.compile(torch.optim.SGD(model.parameters(), lr=0.0))
    with torch.no_grad():
        model.bias.fill_(0.25)  # as loaded weights would set it
    model.train_step(tiny_batch([0] * 7))
    assert float(model.bias.detach()[0]) == 0.25


def test_initial_bias_checks_the_labels_first():
    model = build("lr", TINY_COLS)
    model.compile()
    with pytest.raises(
        DataError, match=r'LR.train_step \(step 1\): Label "label" .* Received: \[2\]'
    ):
        model.train_step(tiny_batch([0, 2, 1]))
