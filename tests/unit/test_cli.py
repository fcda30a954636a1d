"""The tnrec command line: train / evaluate / predict / demo on tiny data, and config errors."""

import json
import os
import subprocess
import sys

import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from tnrec.cli import main
from tnrec.data.synthetic import SyntheticConfig, generate
from tnrec.models.config import ConfigError, load_config, make_reader
from tnrec.runlog import read_runlog

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
    """Two days of 1,000 rows and 600 test rows of synthetic Criteo-schema Parquet."""
    root = tmp_path_factory.mktemp("cli")
    generate(root / "data", SyntheticConfig(rows_per_day=1000, num_days=2, test_rows=600, seed=5))
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


def test_train_writes_model_config_and_run_log(trained, capsys):
    assert sorted(os.listdir(trained)) == ["config.json", "model", "runlog.jsonl"]
    model = sorted(os.listdir(trained / "model"))
    assert model == ["dense.pt", "feature_spec.json", "model.json", "tables"]
    assert sorted(os.listdir(trained / "model" / "tables")) == ["emb", "wide"]
    records = read_runlog(trained)
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["rows"] for r in epochs] == [2000, 2000]
    assert all("val_auc" in r and r["samples_per_s"] > 0 for r in epochs)
    assert sum(r["event"] == "step" for r in records) == 4  # 4 steps an epoch, every 2
    cfg = json.loads((trained / "config.json").read_text())
    assert os.path.isabs(cfg["data"]["dir"]) and cfg["model"]["name"] == "deepfm"


def test_evaluate_reproduces_the_validation_of_training(trained, capsys):
    val_auc = [r for r in read_runlog(trained) if r["event"] == "epoch"][-1]["val_auc"]
    capsys.readouterr()
    assert main(["evaluate", "--model-dir", str(trained)]) == 0
    logs = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert logs["auc"] == pytest.approx(val_auc, abs=1e-12)
    assert 0 < logs["auc_exact"] < 1 and logs["logloss"] > 0


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
    assert "config.json: No such file" in capsys.readouterr().err


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
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["loss"] > 0
    spec = json.loads((tmp_path / "run" / "model" / "feature_spec.json").read_text())
    assert [c["type"] for c in spec["columns"]] == ["numeric", "category", "bucketized"]


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
        ("epochs = 2", "epoch = 2", r'unknown key "train.epoch"; did you mean "train.epochs"\?'),
        ("seed = 1", "epochs = 1", r'unknown key "epochs"; did you mean "train.epochs"\?'),
        ("[data]", "[dta]", r'unknown key "dta"; did you mean "data"\?'),
        ("train_days", "trian_days", r'key "data.trian_days"; did you mean "data.train_days"'),
        (
            "learning_rate = 0.05",
            "learning_rat = 0.05",
            r'unknown key "optimizer.sparse.learning_rat"; did you mean '
            r'"optimizer.sparse.learning_rate"\?',
        ),
        ("epochs = 2", 'epochs = "2"', r'"train.epochs" must be int. Received: \'2\' \(str\)'),
        ("hidden_units = [16]", "hidden_units = 16", r'"model.hidden_units" must be list of ints'),
        ("epochs = 2", "epochs = true", r'"train.epochs" must be int. Received: True \(bool\)'),
        ("batch_size = 500", "batch_size = 0", r'"train.batch_size" must be >= 1. Received: 0'),
        ('name = "deepfm"', 'name = "deepfn"', r'"model.name" must be one of .* mean "deepfm"'),
        ('type = "adagrad"', 'type = "rmsprop"', r'"optimizer.sparse.type" must be one of'),
        (
            "learning_rate = 0.05",
            "learning_rate = -1.0",
            r"optimizer.sparse: .*learning_rate",
        ),
        ('columns = "criteo"', 'columns = "avazu"', r'"columns" must be "criteo" or a list'),
        ('dir = "data"', "", r'no training data: set "data.train"'),
        ("epochs = 2", "epochs = = 2", r"not valid TOML/JSON"),
        ("[train]", "[train]\nx = 1", r'unknown key "train.x". Valid keys here: batch_size, ep'),
    ],
    ids=[
        "typo-in-section",
        "key-in-wrong-section",
        "section-typo",
        "days-typo",
        "optimizer-hparam",
        "str-for-int",
        "int-for-list",
        "bool-for-int",
        "range",
        "model-name",
        "optimizer-type",
        "optimizer-value",
        "columns-preset",
        "no-train-data",
        "bad-toml",
        "no-suggestion",
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
    text = TOML.replace('"2024-05-11"', '"2024-05-12"')
    cfg = load_config(write_config(data_dir, text, "missing.toml"))
    want = r'"data.train_days": Day .2024-05-12. not found: no directory .*/2024-05-12 \(pattern'
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
