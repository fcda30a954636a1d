"""The tnrec command line: train (daily cycle, checkpoints) / evaluate / predict / export /
inspect / demo on tiny data, and config errors."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from tnrec import checkpoint
from tnrec.cli import export, main
from tnrec.cli.artifacts import load_model
from tnrec.cli.config import load_config
from tnrec.cli.inputs import make_reader
from tnrec.cli.inspection import inspect_row
from tnrec.data.synthetic import SyntheticConfig, generate
from tnrec.errors import ArgumentError, CheckpointError, ConfigError, TableKeyError
from tnrec.export import apply_delta, load_dictionary
from tnrec.runlog import read_runlog
from tnrec.serving import Predictor

TOML = """\
seed = 1
output_dir = "out"
columns = "criteo"

[model]
name = "deepfm"
embedding_dim = 4
hidden_units = [16]

[data]
dir = "data"
train_days = ["2024-05-10", "2024-05-11"]
test = "data/test/*.parquet"

[optimizer.sparse]
type = "adagrad"
learning_rate = 0.05

[train]
epochs = 2
batch_size = 500
log_every = 2
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Three days of 1,000 rows and 600 test rows of synthetic Criteo-schema Parquet."""
    root = tmp_path_factory.mktemp("cli")
    generate(root / "data", SyntheticConfig(rows_per_day=1000, num_days=3, test_rows=600, seed=5))
    return root


def write_config(root, text=TOML, name="run.toml"):
    path = root / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def trained(data_dir):
    """The output dir of `tnrec train` on the tiny config, and the JSON it printed."""
    assert main(["train", "--config", write_config(data_dir)]) == 0
    return data_dir / "out"


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_train_writes_checkpoints_model_json_and_run_log(trained):
    assert sorted(os.listdir(trained)) == ["config.json", "model", "runlog.jsonl"]
    model = sorted(n for n in os.listdir(trained / "model") if not n.startswith("."))
    assert model == ["2024-05-10", "2024-05-11", "_checkpoint", "model.json"]
    assert checkpoint.generations(str(trained / "model")) == [("2024-05-10", 1), ("2024-05-11", 2)]
    doc = json.loads((trained / "model" / "model.json").read_text())
    assert doc["model"] == "deepfm" and doc["params"]["embedding_dim"] == 4
    assert doc["tables"] == ["emb", "wide"] and doc["config"]["model"]["name"] == "deepfm"
    records = read_runlog(trained)
    days = [r for r in records if r["event"] == "day"]
    assert [(r["dt"], r["rows"], r["skipped"]) for r in days] == [
        ("2024-05-10", 2000, False),  # 2 epochs of 1,000 rows
        ("2024-05-11", 2000, False),
    ]
    assert days[1]["table_sizes"]["emb"] > days[0]["table_sizes"]["emb"] > 0
    final = [r for r in records if r["event"] == "train"][-1]
    assert final["rows"] == 4000 and 0 < final["val_auc"] < 1
    epochs = [r for r in records if r["event"] == "epoch"]  # per-epoch records of every day
    assert len(epochs) == 4 and sum(r["rows"] for r in epochs) == 4000
    assert all(r["samples_per_s"] > 0 and r["input_wait_s"] >= 0 for r in epochs)
    cfg = json.loads((trained / "config.json").read_text())
    assert os.path.isabs(cfg["data"]["dir"]) and cfg["model"]["name"] == "deepfm"


def test_a_later_run_skips_complete_days_and_trains_the_new_one(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    cfg2 = write_config(tmp_path, TOML.replace("epochs = 2", "epochs = 1"), "two.toml")
    three = TOML.replace("epochs = 2", "epochs = 1").replace(
        '"2024-05-11"]', '"2024-05-11", "2024-05-12"]'
    )
    cfg3 = write_config(tmp_path, three, "three.toml")
    os.symlink(data_dir / "data", tmp_path / "data")
    assert main(["train", "--config", cfg2, "--output-dir", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", "--config", cfg3, "--output-dir", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "day 2024-05-10: already complete, skipped" in lines
    assert "day 2024-05-11: already complete, skipped" in lines
    assert any(line.startswith("day 2024-05-12: rows 1000 - keys created") for line in lines)
    gens = checkpoint.generations(str(out / "model"))
    assert gens == [("2024-05-10", 1), ("2024-05-11", 2), ("2024-05-12", 3)]
    assert main(["train", "--config", cfg3, "--output-dir", str(out)]) == 0
    assert last_json(capsys)["rows"] == 0  # nothing left to train
    assert len(checkpoint.generations(str(out / "model"))) == 3
    # another model into the same checkpoint dir is refused
    other = write_config(
        tmp_path, three.replace("embedding_dim = 4", "embedding_dim = 8"), "o.toml"
    )
    assert main(["train", "--config", other, "--output-dir", str(out)]) == 2
    assert "the model dir holds another model (params" in capsys.readouterr().err


def test_eval_next_day_reports_auc_before_training_each_later_day(data_dir, tmp_path, capsys):
    text = TOML.replace("epochs = 2", "epochs = 1").replace(
        'output_dir = "out"', 'output_dir = "nd"'
    )
    cfg = write_config(data_dir, text, "nd.toml")
    assert main(["train", "--config", cfg, "--eval-next-day"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(line for line in lines if line.startswith("day 2024-05-10:"))
    second = next(line for line in lines if line.startswith("day 2024-05-11:"))
    assert "next-day AUC" not in first  # no model before the first day
    assert second.startswith("day 2024-05-11: next-day AUC 0.")
    days = [r for r in read_runlog(data_dir / "nd") if r["event"] == "day"]
    assert days[0]["next_day_auc"] is None and 0 < days[1]["next_day_auc"] < 1
    # the same AUC as evaluating the day-1 checkpoint on day 2
    day2 = str(data_dir / "data" / "2024-05-11" / "*.parquet")

    model, _ = load_model(str(data_dir / "nd" / "model"), "2024-05-10")
    cfg_ = load_config(cfg)
    auc = model.evaluate(make_reader(cfg_, "test", paths=[day2]), verbose=0)["auc"]
    assert days[1]["next_day_auc"] == pytest.approx(auc, abs=1e-12)


def test_evaluate_reproduces_the_validation_of_training(trained, capsys):
    val_auc = [r for r in read_runlog(trained) if r["event"] == "train"][-1]["val_auc"]
    capsys.readouterr()
    assert main(["evaluate", "--model-dir", str(trained / "model")]) == 0
    logs = last_json(capsys)
    assert logs["auc"] == pytest.approx(val_auc, abs=1e-12)
    assert 0 < logs["auc_exact"] < 1 and logs["logloss"] > 0
    assert main(["evaluate", "--model-dir", str(trained)]) == 0  # the output dir works too
    assert last_json(capsys)["auc"] == logs["auc"]


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_predict_writes_row_ids_labels_and_predictions(trained, tmp_path, ext):
    out = tmp_path / f"p.{ext}"
    assert main(["predict", "--model-dir", str(trained), "--output", str(out)]) == 0
    table = pq.read_table(out) if ext == "parquet" else pa_csv.read_csv(out)
    assert table.column_names == ["row_id", "label", "prediction"]
    assert table.num_rows == 600
    p = table["prediction"].to_numpy()
    assert ((p > 0) & (p < 1)).all()
    assert len(set(table["row_id"].to_pylist())) == 600


def test_evaluate_and_predict_on_other_data(trained, data_dir, tmp_path, capsys):
    day = str(data_dir / "data" / "2024-05-10" / "*.parquet")
    assert main(["evaluate", "--model-dir", str(trained), "--data", day]) == 0
    out = tmp_path / "p.parquet"
    assert main(["predict", "--model-dir", str(trained), "--data", day, "--output", str(out)]) == 0
    assert pq.read_table(out).num_rows == 1000
    assert main(["evaluate", "--model-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "model.json not found: not a model directory written by `tnrec train`" in err


def test_train_csv_with_custom_columns_and_lr(data_dir, tmp_path, capsys):
    pq_file = data_dir / "data" / "2024-05-10" / "part-00000.parquet"
    table = pq.read_table(pq_file, columns=["label", "I1", "C1", "C2"])
    pa_csv.write_csv(table, tmp_path / "train.csv")
    text = """\
output_dir = "run"
[model]
name = "lr"
[[columns]]
type = "numeric"
key = "I1"
transforms = ["log1p"]
[[columns]]
type = "category"
key = "C1"
dtype = "str"
[[columns]]
type = "bucketized"
key = "C2_len"
boundaries = [1.0, 2.0]
[data]
format = "csv"
train = "train.csv"
[train]
batch_size = 250
"""
    cfg = write_config(tmp_path, text.replace('[[columns]]\ntype = "bucketized"', "[[x]]"))
    with pytest.raises(ConfigError, match=r'unknown key "x"'):
        load_config(cfg)
    text = text.replace('key = "C2_len"\nboundaries = [1.0, 2.0]', 'key = "I1"\nboundaries = [1.0]')
    text = text.replace('type = "bucketized"\nkey = "I1"', 'type = "bucketized"\nkey = "I2"')
    table = pq.read_table(pq_file, columns=["label", "I1", "I2", "C1"])
    pa_csv.write_csv(table, tmp_path / "train.csv")
    assert main(["train", "--config", write_config(tmp_path, text)]) == 0
    assert last_json(capsys)["rows"] == table.num_rows
    spec = json.loads((tmp_path / "run" / "model" / "model.json").read_text())["feature_spec"]
    assert [c["type"] for c in spec["columns"]] == ["numeric", "category", "bucketized"]
    assert checkpoint.generations(str(tmp_path / "run" / "model")) == [("train", 1)]


def test_demo_prints_test_and_optimal_auc(tmp_path, capsys):
    assert main(["demo", "--rows", "2000", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "test AUC 0." in out and "optimal AUC 0." in out and "samples/s" in out
    assert (tmp_path / "run.toml").exists() and (tmp_path / "run" / "model" / "model.json").exists()
    load_config(tmp_path / "run.toml")  # the config it wrote is valid


def test_python_m_tnrec_cli_help():
    env = {**os.environ, "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", "")}
    res = subprocess.run(
        [sys.executable, "-m", "tnrec.cli", "--help"], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0 and "demo" in res.stdout and "predict" in res.stdout


# --------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        pytest.param(
            "epochs = 2",
            "epoch = 2",
            r'unknown key "train.epoch"; did you mean "train.epochs"\?',
            id="typo-in-section",
        ),
        pytest.param(
            "seed = 1",
            "epochs = 1",
            r'unknown key "epochs"; did you mean "train.epochs"\?',
            id="key-in-wrong-section",
        ),
        pytest.param(
            "[data]", "[dta]", r'unknown key "dta"; did you mean "data"\?', id="section-typo"
        ),
        pytest.param(
            "train_days",
            "trian_days",
            r'key "data.trian_days"; did you mean "data.train_days"',
            id="days-typo",
        ),
        pytest.param(
            "learning_rate = 0.05",
            "learning_rat = 0.05",
            r'unknown key "optimizer.sparse.learning_rat"; did you mean '
            r'"optimizer.sparse.learning_rate"\?',
            id="optimizer-hparam",
        ),
        pytest.param(
            "epochs = 2",
            'epochs = "2"',
            r'"train.epochs" must be int. Received: \'2\' \(str\)',
            id="str-for-int",
        ),
        pytest.param(
            "hidden_units = [16]",
            "hidden_units = 16",
            r'"model.hidden_units" must be list of ints',
            id="int-for-list",
        ),
        pytest.param(
            "epochs = 2",
            "epochs = true",
            r'"train.epochs" must be int. Received: True \(bool\)',
            id="bool-for-int",
        ),
        pytest.param(
            "batch_size = 500",
            "batch_size = 0",
            r'"train.batch_size" must be >= 1. Received: 0',
            id="range",
        ),
        pytest.param(
            'name = "deepfm"',
            'name = "deepfn"',
            r'"model.name" must be one of .* mean "deepfm"',
            id="model-name",
        ),
        pytest.param(
            'type = "adagrad"',
            'type = "rmsprop"',
            r'"optimizer.sparse.type" must be one of',
            id="optimizer-type",
        ),
        pytest.param(
            "learning_rate = 0.05",
            "learning_rate = -1.0",
            r"optimizer.sparse: .*learning_rate",
            id="optimizer-value",
        ),
        pytest.param(
            'columns = "criteo"',
            'columns = "avazu"',
            r'"columns" must be "criteo" or a list',
            id="columns-preset",
        ),
        pytest.param('dir = "data"', "", r'no training data: set "data.train"', id="no-train-data"),
        pytest.param("epochs = 2", "epochs = = 2", r"not valid TOML/JSON", id="bad-toml"),
        pytest.param(
            "[train]",
            "[train]\nx = 1",
            r'unknown key "train.x". Valid keys here: balance, batch_size, device, ep',
            id="no-suggestion",
        ),
        pytest.param(
            "[train]",
            "[checkpoint]\nkep = 2\n[train]",
            r'"checkpoint.kep"; did you mean "checkp',
            id="checkpoint-typo",
        ),
        pytest.param(
            "[train]",
            "[checkpoint]\nkeep = 0\n[train]",
            r'"checkpoint.keep" must be >= 1. Rec',
            id="checkpoint-keep-range",
        ),
        pytest.param(
            "[train]",
            '[checkpoint]\nsave_every_n_steps = "10"\n[train]',
            r'"checkpoint.save_every_n_steps" must be int. Received: \'10\'',
            id="checkpoint-every-type",
        ),
        pytest.param(
            "[train]",
            "[checkpoint]\ndir = 3\n[train]",
            r'"checkpoint.dir" must be str. Received: 3',
            id="checkpoint-dir-type",
        ),
        pytest.param(
            "[train]",
            "[eviction]\nshow_decay_rate = 1.5\n[train]",
            r"eviction: EvictionPolicy: `show_decay_rate` must be in \(0, 1\]",
            id="eviction-rate",
        ),
        pytest.param(
            "[train]",
            '[eviction]\ncombine = "both"\n[train]',
            r"eviction: .*`combine` must be",
            id="eviction-combine",
        ),
    ],
)
def test_config_errors_name_the_key(tmp_path, old, new, match):
    assert old in TOML
    path = write_config(tmp_path, TOML.replace(old, new, 1))
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert path in str(info.value)  # every error names the file


def test_missing_data_names_the_pattern(data_dir, tmp_path, capsys):
    text = TOML.replace(
        'dir = "data"\ntrain_days = ["2024-05-10", "2024-05-11"]', 'train = "nowhere/*.parquet"'
    )
    cfg = load_config(write_config(tmp_path, text))
    want = rf'"data.train": pattern "{tmp_path}/nowhere/\*.parquet" matches no file'
    with pytest.raises(ConfigError, match=want):
        make_reader(cfg, "train")
    text = TOML.replace('"2024-05-11"', '"2024-05-13"')
    cfg = load_config(write_config(data_dir, text, "missing.toml"))
    want = r'"data.train_days": Day .2024-05-13. not found: no directory .*/2024-05-13 \(pattern'
    with pytest.raises(ConfigError, match=want):
        make_reader(cfg, "train")
    assert main(["train", "--config", str(data_dir / "missing.toml")]) == 2
    assert "tnrec train: error:" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "absent.toml")]) == 2
    assert "cannot read the run config" in capsys.readouterr().err


def test_column_errors(tmp_path):
    base = TOML.replace('columns = "criteo"\n', "")
    cases = [
        ('[[columns]]\ntype = "categry"\nkey = "C1"\n', r'"columns\[0\].type" must be one of'),
        (
            '[[columns]]\ntype = "category"\nkey = "C1"\ndtyp = "str"\n',
            r'unknown key "columns\[0\].dtyp"; did you mean "columns\[0\].dtype"\?',
        ),
        ('[[columns]]\ntype = "category"\nkey = "C1"\ndtype = "float"\n', r"`dtype` must be one"),
    ]
    for cols, match in cases:
        with pytest.raises(ConfigError, match=match):
            load_config(write_config(tmp_path, base + cols))


# --------------------------------------------------------------------------- export, inspect

ZOO = {
    "lr": "",
    "widedeep": "embedding_dim = 4\nhidden_units = [8]",
    "deepfm": "embedding_dim = 4\nhidden_units = [8]",
    "dcn": "embedding_dim = 4\nhidden_units = [8]\ncross_layers = 2",
}


@pytest.mark.parametrize("name", list(ZOO))
def test_export_then_predictor_on_raw_rows_equals_tnrec_predict(data_dir, tmp_path, name):
    text = TOML.replace('name = "deepfm"\nembedding_dim = 4\nhidden_units = [16]', "")
    text = text.replace("[model]", f'[model]\nname = "{name}"\n{ZOO[name]}')
    text = text.replace("epochs = 2", "epochs = 1").replace(', "2024-05-11"]', "]")
    cfg = write_config(data_dir, text.replace('output_dir = "out"', f'output_dir = "z-{name}"'))
    assert main(["train", "--config", cfg]) == 0
    model_dir = str(data_dir / f"z-{name}" / "model")
    preds = tmp_path / "p.parquet"
    assert main(["predict", "--model-dir", model_dir, "--output", str(preds)]) == 0
    assert main(["export", "--model-dir", model_dir, "--out", str(tmp_path / "e"), "--onnx"]) == 0
    assert (tmp_path / "e" / "dense.onnx").is_file()
    raw = pa.concat_tables(
        pq.read_table(f) for f in sorted(glob.glob(str(data_dir / "data/test/*.parquet")))
    )
    got = Predictor(str(tmp_path / "e")).predict(raw)
    want = pq.read_table(preds)
    assert np.all(np.diff(want["row_id"].to_numpy()) > 0)  # predict keeps the files' row order
    np.testing.assert_allclose(got, want["prediction"].to_numpy(), rtol=0, atol=1e-5)


def test_delta_export_applied_to_the_first_day_gives_the_second(data_dir, tmp_path, capsys):
    # max_unseen_days = 1: keys not seen on a day are evicted at its save -> deleted keys
    text = TOML.replace("epochs = 2", "epochs = 1").replace(
        'output_dir = "out"', 'output_dir = "dl"'
    )
    text += "[eviction]\nmax_unseen_days = 1\n"
    assert main(["train", "--config", write_config(data_dir, text, "dl.toml")]) == 0
    md = str(data_dir / "dl" / "model")
    e1, e2, delta = (str(tmp_path / n) for n in ("e1", "e2", "delta"))
    assert main(["export", "--model-dir", md, "--dt", "2024-05-10", "--out", e1]) == 0
    assert main(["export", "--model-dir", md, "--out", e2]) == 0
    args = ["export", "--model-dir", md, "--delta", "--since", "2024-05-10", "--to", "2024-05-11"]
    assert main([*args, "--out", delta]) == 0
    assert f"wrote the delta to {delta}" in capsys.readouterr().out
    doc = json.loads(open(os.path.join(delta, "manifest.json")).read())
    assert doc["tables"]["emb"]["deleted"] > 0 and doc["tables"]["emb"]["updated"] > 0
    for table in ("emb", "wide"):
        k1, w1 = load_dictionary(e1, table)
        k2, w2 = load_dictionary(e2, table)
        k, w = apply_delta(k1, w1, delta, table)
        np.testing.assert_array_equal(k, k2)
        np.testing.assert_array_equal(w, w2)
    assert not np.array_equal(k1, k2)


def test_export_errors(trained, tmp_path):
    md = str(trained / "model")
    out = str(tmp_path / "x")
    with pytest.raises(CheckpointError, match=r"holds no complete checkpoint of day '2024-05-09' "):
        export(md, out, dt="2024-05-09")
    with pytest.raises(
        CheckpointError, match=r"no complete checkpoint of day '2024-01-01' \(days: "
    ):
        export(md, out, delta=True, since="2024-01-01", to="2024-05-11")
    with pytest.raises(ArgumentError, match=r"--delta needs --since DT1 and --to DT2"):
        export(md, out, delta=True, since="2024-05-10")
    with pytest.raises(ArgumentError, match=r"--since and --to go with --delta"):
        export(md, out, since="2024-05-10")
    with pytest.raises(ArgumentError, match=r"--delta takes --since DT1 and --to DT2, not --dt"):
        export(md, out, dt="2024-05-10", delta=True, since="a", to="b")
    assert not os.path.exists(out)


def test_export_format_tsv_writes_text_dictionaries_equal_to_the_npy(trained, tmp_path):
    md, out = str(trained / "model"), str(tmp_path / "x")
    assert main(["export", "--model-dir", md, "--out", out, "--format", "tsv"]) == 0
    tables = sorted(os.listdir(os.path.join(out, "embeddings")))
    assert sorted(os.listdir(os.path.join(out, "tsv"))) == tables
    for t in tables:
        d = os.path.join(out, "embeddings", t, "shard-00000-of-00001")
        keys, weights = (
            np.load(os.path.join(d, "keys.npy")),
            np.load(os.path.join(d, "weights.npy")),
        )
        lines = open(os.path.join(out, "tsv", t, "shard-00000-of-00001.tsv")).read().splitlines()
        cells = [ln.split("\t") for ln in lines]
        got_keys = np.array([int(c[0]) for c in cells], np.uint64).view(np.int64)
        got = np.array([[float(x) for x in c[1:]] for c in cells]).astype(np.float32)
        np.testing.assert_array_equal(got_keys, keys)
        assert (got.view(np.uint32) == weights.view(np.uint32)).all()
    assert main(["export", "--model-dir", md, "--out", str(tmp_path / "d"), "--format", "tsv",
                 "--delta", "--since", "2024-05-10", "--to", "2024-05-11"]) == 2  # fmt: skip


def test_inspect_prints_days_tables_and_quantiles(trained, capsys):
    md = str(trained / "model")
    assert main(["inspect", md]) == 0
    text = capsys.readouterr().out
    assert "model       deepfm (embedding_dim=4, hidden_units=[16], seed=1)" in text
    assert "published   2024-05-11/2" in text
    assert "  2024-05-10  1            yes       4            1" in text
    assert "tables of 2024-05-11/2 (generation 2, 1 worker(s)" in text
    assert "show quantiles" in text and "click quantiles" in text
    assert main(["inspect", md, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    sizes = [r for r in read_runlog(trained) if r["event"] == "day"][-1]["table_sizes"]
    assert {n: t["keys"] for n, t in doc["tables"].items()} == sizes
    assert doc["tables"]["emb"]["dim"] == 4 and doc["tables"]["wide"]["dim"] == 1
    assert doc["tables"]["emb"]["optimizer"]["type"] == "AdaGrad"
    show = doc["tables"]["emb"]["show"]
    assert 0 < show["min"] <= show["p50"] <= show["p90"] <= show["p99"] <= show["max"]
    assert list(doc["days"]) == ["2024-05-10", "2024-05-11"]
    # one day: its last generation
    assert main(["inspect", os.path.join(md, "2024-05-10"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"]["dir"] == "2024-05-10/1"


def test_inspect_one_row_and_its_errors(trained, capsys):
    md = str(trained / "model")
    part = trained / "model" / "2024-05-11" / "2" / "sparse" / "emb" / "part-00000-of-00001"
    keys = np.load(part / "keys.npy")
    k = int(keys[7])
    assert main(["inspect", md, "--table", "emb", "--key", str(k)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["table", "emb"] and lines[1].split() == ["key", str(k)]
    assert [line.split()[0] for line in lines[3:]] == [
        "weights",
        "g2sum",
        "show",
        "click",
        "unseen_days",
        "marker",
    ]
    row = inspect_row(md, "emb", str(k))
    np.testing.assert_array_equal(np.float32(row["weights"]), np.load(part / "weights.npy")[7])
    assert row["show"] == pytest.approx(float(np.load(part / "show.npy")[7]))
    missing = 5
    while missing in set(keys.tolist()):
        missing += 1
    with pytest.raises(
        TableKeyError, match=rf'key {missing} is not in table "emb" of .*2024-05-11/2'
    ):
        inspect_row(md, "emb", str(missing))
    assert main(["inspect", md, "--table", "emb", "--key", str(missing)]) == 2
    assert f'tnrec inspect: error: key {missing} is not in table "emb"' in capsys.readouterr().err
    with pytest.raises(
        ArgumentError, match=r'--table: no table "deep" in .*; tables: \[.emb., .wide.\]'
    ):
        inspect_row(md, "deep", str(k))
    with pytest.raises(
        ArgumentError, match=r"--key must be an int \(a hashed key\). Received: 'abc'"
    ):
        inspect_row(md, "emb", "abc")
    assert main(["inspect", md, "--table", "emb"]) == 2
    assert "--table and --key go together" in capsys.readouterr().err
    assert main(["inspect", str(trained / "nowhere")]) == 2
    assert "is not a model dir (no _checkpoint or model.json)" in capsys.readouterr().err


def test_steps_per_epoch_is_refused_by_the_daily_cycle(data_dir, tmp_path, capsys):
    text = TOML.replace("[train]", "[train]\nsteps_per_epoch = 2")
    assert main(["train", "--config", write_config(data_dir, text, "spe.toml")]) == 2
    assert '"train.steps_per_epoch" is not supported by the daily cycle' in capsys.readouterr().err
