"""What the tnrec command line refuses, and how: ranges, NaN, empty inputs, paths that are
files, mid-day exports; strict JSON; bad-row mode, collective timeout, model-dir reuse."""

import json
import os
import shutil

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tnrec import checkpoint
from tnrec.cli import demo, export, main
from tnrec.cli.artifacts import load_model
from tnrec.cli.config import load_config
from tnrec.cli.inputs import check_inputs
from tnrec.data.synthetic import SyntheticConfig, generate
from tnrec.errors import ArgumentError, ConfigError, DistributedError

TINY = """\
seed = 1
output_dir = "out"
columns = "criteo"

[model]
name = "widedeep"
embedding_dim = 4
hidden_units = [8]

[data]
dir = "data"
train_days = ["2024-05-10"]
test = "data/test/*.parquet"

[train]
epochs = 1
batch_size = 200
log_every = 1
"""

# The smallest model with bad rows: CSV, one numeric and one categorical column.
CSV_TOML = """\
output_dir = "out"
[model]
name = "lr"
[[columns]]
type = "numeric"
key = "I1"
[[columns]]
type = "category"
key = "C1"
dtype = "str"
[data]
format = "csv"
train = "train.csv"
on_bad_row = "{mode}"
[train]
batch_size = 4
"""
GOOD_CSV = "label,I1,C1\n1,2,a\n0,3,b\n1,1,a\n0,5,c\n"


def write(root, text, name="run.toml"):
    path = root / name
    path.write_text(text)
    return str(path)


def strict_json(line):
    """Parse ``line``, refusing the NaN/Infinity tokens that Python's json accepts."""

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(line, parse_constant=refuse)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """One training day of 300 rows and 100 test rows; a 0-row and a one-label Parquet file."""
    root = tmp_path_factory.mktemp("cli-checks")
    generate(root / "data", SyntheticConfig(rows_per_day=300, num_days=1, test_rows=100, seed=2))
    test = pq.read_table(sorted((root / "data" / "test").glob("*.parquet"))[0])
    pq.write_table(test.slice(0, 0), root / "empty.parquet")
    pq.write_table(test.filter(pc.equal(test["label"], 0)), root / "one_label.parquet")
    return root


@pytest.fixture(scope="module")
def tiny_model(tiny_data):
    """The model dir of `tnrec train` on the tiny config."""
    assert main(["train", "--config", write(tiny_data, TINY)]) == 0
    return tiny_data / "out" / "model"


@pytest.fixture
def run_dir(tmp_path, tiny_data):
    """A fresh directory for a run config, with the tiny data at ``data/``."""
    os.symlink(tiny_data / "data", tmp_path / "data")
    return tmp_path


# --------------------------------------------------------------------------- config values


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        pytest.param(
            "epochs = 1", "epochs = 0", r'"train.epochs" must be >= 1. Received: 0.', id="epochs-0"
        ),
        pytest.param(
            "log_every = 1",
            "log_every = 0",
            r'"train.log_every" must be >= 1. Received: 0.',
            id="log-every-0",
        ),
        pytest.param(
            "batch_size = 200",
            "batch_size = -5",
            r'"train.batch_size" must be >= 1. Received: -5',
            id="batch-size-negative",
        ),
        pytest.param(
            "seed = 1", "seed = -1", r'"seed" must be >= 0. Received: -1.', id="seed-negative"
        ),
        pytest.param(
            "[train]",
            "[checkpoint]\nsave_every_n_steps = 0\n[train]",
            r'"checkpoint.save_every_n_steps" must be >= 1. Received: 0.',
            id="save-every-0",
        ),
        pytest.param(
            "[train]",
            "[checkpoint]\nkeep = -1\n[train]",
            r'"checkpoint.keep" must be >= 1. Rec',
            id="keep-negative",
        ),
        pytest.param(
            "[train]",
            "[eviction]\nshow_decay_rate = nan\n[train]",
            r'"eviction.show_decay_rate" must be a finite number. Received: nan.',
            id="nan-float",
        ),
        pytest.param(
            "[train]",
            '[optimizer.sparse]\ntype = "sgd"\nlearning_rate = inf\n[train]',
            r'"optimizer.sparse.learning_rate" must be a finite number. Received: inf.',
            id="inf-optimizer",
        ),
        pytest.param(
            "[train]",
            "[distributed]\ntimeout_s = 0\n[train]",
            r'"distributed.timeout_s" must be > 0. Received: 0.',
            id="timeout-0",
        ),
        pytest.param(
            "[train]",
            "[distributed]\ntimeout_s = -inf\n[train]",
            r'"distributed.timeout_s" must be a finite number. Received: -inf.',
            id="timeout-inf",
        ),
        pytest.param(
            "[train]",
            '[distributed]\ntimeout_s = "5"\n[train]',
            r'"distributed.timeout_s" must be float. Received: \'5\' \(str\).',
            id="timeout-str",
        ),
        pytest.param(
            "[train]",
            '[distributed]\nmode = "hogwild"\n[train]',
            r'"distributed.mode" must be "sync" or "async". Received: \'hogwild\'.',
            id="mode",
        ),
        pytest.param(
            "[train]",
            "[distributed]\nstaleness = -1\n[train]",
            r'"distributed.staleness" must be >= 0. Received: -1.',
            id="staleness",
        ),
        pytest.param(
            "[train]",
            "[distributed]\ntimeout = 5\n[train]",
            r'unknown key "distributed.timeout"; did you mean "distributed.timeout_s"\?',
            id="timeout-typo",
        ),
        pytest.param(
            'dir = "data"',
            'dir = "data"\non_bad_row = "ignore"',
            r'"data.on_bad_row" must be one of \(\'raise\', \'skip\'\). Received: \'ignore\'.',
            id="on-bad-row",
        ),
        pytest.param(
            'dir = "data"',
            'dir = "data"\ndelimiter = ";;"',
            r'"data.delimiter" must be one character. Received: \';;\'.',
            id="delimiter",
        ),
        pytest.param(
            'train_days = ["2024-05-10"]',
            'train_days = ["2024-05-10", "2024-05-11", "2024-05-10"]',
            r'"data.train_days" repeats day\(s\) \[\'2024-05-10\'\]; list each once.',
            id="repeated-day",
        ),
    ],
)
def test_config_values_out_of_range_name_key_and_file(tmp_path, old, new, match):
    assert old in TINY
    path = write(tmp_path, TINY.replace(old, new, 1))
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert path in str(info.value)


def test_train_with_epochs_0_fails_before_writing_anything(run_dir, capsys):
    cfg = write(run_dir, TINY.replace("epochs = 1", "epochs = 0"))
    assert main(["train", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert err == f'tnrec train: error: {cfg}: "train.epochs" must be >= 1. Received: 0.\n'
    assert not (run_dir / "out").exists()


def test_distributed_timeout_reaches_the_strategy(run_dir, tiny_model, monkeypatch, capsys):
    seen = []

    class Recorder:
        def __init__(self, timeout_s=None, mode="sync", staleness=4):
            seen.append(timeout_s)
            modes.append((mode, staleness))
            raise DistributedError("stop here")

    modes = []
    monkeypatch.setattr("tnrec.cli.common.current_strategy", lambda: None)
    monkeypatch.setattr("tnrec.cli.common.PsStrategy", Recorder)
    section = '[distributed]\ntimeout_s = 12.5\nmode = "async"\nstaleness = 2\n[train]'
    cfg = write(run_dir, TINY.replace("[train]", section))
    assert main(["train", "--config", cfg]) == 2
    assert main(["train", "--config", cfg, "--timeout-s", "3"]) == 2
    assert main(["evaluate", "--model-dir", str(tiny_model)]) == 2  # the run config's: 300
    predict = ["predict", "--model-dir", str(tiny_model), "--output", "p", "--timeout-s", "7"]
    assert main(predict) == 2
    assert seen == [12.5, 3.0, 300.0, 7.0]
    assert modes[:2] == [("async", 2), ("async", 2)]
    assert "tnrec predict: error: stop here" in capsys.readouterr().err


# --------------------------------------------------------------------------- flags


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["demo", "--epochs", "0"],
            "tnrec demo: error: argument --epochs: must be an int >= 1. ",
            id="epochs-0",
        ),
        pytest.param(
            ["demo", "--rows", "0"],
            "argument --rows: must be an int >= 1. Received: '0'.",
            id="rows-0",
        ),
        pytest.param(
            ["demo", "--rows", "1e3"],
            "argument --rows: must be an int >= 1. Received: '1e3'.",
            id="rows-float",
        ),
        pytest.param(
            ["demo", "--seed", "-1"],
            "argument --seed: must be an int >= 0. Received: '-1'.",
            id="seed-negative",
        ),
        pytest.param(
            ["export", "--model-dir", "m", "--out", "o", "--min-show", "nan"],
            "tnrec export: error: argument --min-show: must be a finite number >= 0. "
            "Received: 'nan'.",
            id="min-show-nan",
        ),
        pytest.param(
            ["export", "--model-dir", "m", "--out", "o", "--min-show", "inf"],
            "argument --min-show: must be a finite number >= 0. Received: 'inf'.",
            id="min-show-inf",
        ),
        pytest.param(
            ["export", "--model-dir", "m", "--out", "o", "--min-show", "-1"],
            "argument --min-show: must be a finite number >= 0. Received: '-1'.",
            id="min-show-negative",
        ),
        pytest.param(
            ["export", "--model-dir", "m", "--out", "o", "--min-show", "two"],
            "argument --min-show: must be a finite number >= 0. Received: 'two'.",
            id="min-show-text",
        ),
        pytest.param(
            ["evaluate", "--model-dir", "m", "--timeout-s", "0"],
            "argument --timeout-s: must be a finite number > 0. Received: '0'.",
            id="timeout-0",
        ),
        pytest.param(
            ["train", "--config", "c", "--timeout-s", "nan"],
            "argument --timeout-s: must be a finite number > 0. Received: 'nan'.",
            id="timeout-nan",
        ),
    ],
)
def test_numeric_flags_are_checked(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tnrec ") and message in err


def test_python_functions_check_their_numbers(tiny_model, tmp_path):
    with pytest.raises(ArgumentError, match=r"demo: `rows` must be an int >= 1. Received: 0."):
        demo(rows=0)
    with pytest.raises(ArgumentError, match=r"demo: `epochs` must be an int >= 1. Received: 0."):
        demo(epochs=0)
    with pytest.raises(ArgumentError, match=r"demo: `seed` must be an int >= 0. Received: -1."):
        demo(seed=-1)
    with pytest.raises(
        ArgumentError, match=r"--min-show must be a finite number >= 0. Received: nan."
    ):
        export(str(tiny_model), str(tmp_path / "e"), min_show=float("nan"))
    assert not (tmp_path / "e").exists()


# --------------------------------------------------------------------------- empty input


def test_empty_input_is_an_error_naming_it(tiny_data, tiny_model, tmp_path, capsys):
    empty = str(tiny_data / "empty.parquet")
    assert main(["evaluate", "--model-dir", str(tiny_model), "--data", empty]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"tnrec evaluate: error: --data {empty}: the input holds no rows (files: {empty}).\n"
    )
    out = tmp_path / "p.parquet"
    assert main(["predict", "--model-dir", str(tiny_model), "--data", empty, "--output", str(out)])
    assert "tnrec predict: error: --data" in capsys.readouterr().err
    assert not out.exists()


def test_empty_test_data_or_missing_test_pattern_fail_before_training(run_dir, tiny_data, capsys):
    os.symlink(tiny_data / "empty.parquet", run_dir / "empty.parquet")
    cfg = write(run_dir, TINY.replace("data/test/*.parquet", "empty.parquet"))
    assert main(["train", "--config", cfg]) == 2
    want = f'{cfg}: "data.test": the input holds no rows (files: {run_dir}/empty.parquet).'
    assert want in capsys.readouterr().err
    cfg = write(run_dir, TINY.replace("data/test/*.parquet", "nowhere/*.parquet"))
    assert main(["train", "--config", cfg]) == 2
    want = f'{cfg}: "data.test": pattern "{run_dir}/nowhere/*.parquet" matches no file.'
    assert want in capsys.readouterr().err
    assert not (run_dir / "out").exists()  # nothing trained, nothing written


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("label,I1,C1\n", id="header-only"),
        pytest.param("", id="zero-bytes"),
    ],
)
def test_csv_without_data_lines_holds_no_rows(tmp_path, text):
    (tmp_path / "train.csv").write_text(text)
    cfg = load_config(write(tmp_path, CSV_TOML.format(mode="raise")))
    with pytest.raises(
        ConfigError, match=r'"data.train": the input holds no rows \(files: .*train'
    ):
        check_inputs(cfg)


# --------------------------------------------------------------------------- strict JSON


def test_json_output_is_strict_nan_becomes_null(run_dir, tiny_data, tiny_model, capsys):
    one = str(tiny_data / "one_label.parquet")
    capsys.readouterr()
    assert main(["evaluate", "--model-dir", str(tiny_model), "--data", one]) == 0
    logs = strict_json(capsys.readouterr().out.strip().splitlines()[-1])
    assert logs["auc"] is None and logs["auc_exact"] is None and logs["loss"] > 0
    cfg = write(run_dir, TINY.replace("data/test/*.parquet", one))
    assert main(["train", "--config", cfg]) == 0
    printed = strict_json(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["val_auc"] is None and printed["rows"] == 300
    text = (run_dir / "out" / "runlog.jsonl").read_text()
    records = [strict_json(line) for line in text.splitlines()]
    assert [r["val_auc"] for r in records if r["event"] == "train"] == [None]
    config = strict_json((run_dir / "out" / "config.json").read_text())
    assert (
        config["distributed"]
        == {"timeout_s": 300.0, "memory_limit_bytes": None, "mode": "sync", "staleness": 4}
        and config["data"]["on_bad_row"] == "raise"
    )


# --------------------------------------------------------------------------- bad rows, reruns


def test_on_bad_row_reaches_every_reader_and_a_failed_first_run_can_be_rerun(tmp_path, capsys):
    (tmp_path / "train.csv").write_text(GOOD_CSV + "1,2\n")  # line 6: 2 fields, not 3
    raising = write(tmp_path, CSV_TOML.format(mode="raise"), "raise.toml")
    assert main(["train", "--config", raising]) == 2
    err = capsys.readouterr().err
    assert "tnrec train: error:" in err and "train.csv" in err and "expected 3" in err
    model_dir = tmp_path / "out" / "model"
    assert (model_dir / "model.json").is_file() and checkpoint.latest(str(model_dir)) is None
    # the corrected rerun is another model (seed 7), into the same model dir: accepted
    skipping = write(tmp_path, "seed = 7\n" + CSV_TOML.format(mode="skip"), "skip.toml")
    assert main(["train", "--config", skipping]) == 0
    assert strict_json(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 4
    assert json.loads((model_dir / "model.json").read_text())["params"]["seed"] == 7
    # evaluate and predict read with the run's bad-row mode; only bad rows: an error
    bad = tmp_path / "bad.csv"
    bad.write_text("label,I1,C1\n1,2\n0\n")
    assert main(["evaluate", "--model-dir", str(model_dir), "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tnrec evaluate: error: --data {bad}: ")
    assert "holds no rows" in err and err.endswith("(2 bad rows skipped by this worker)\n")
    out = tmp_path / "p.csv"
    assert main(
        ["predict", "--model-dir", str(model_dir), "--data", str(bad), "--output", str(out)]
    )
    assert capsys.readouterr().err == (
        f"tnrec predict: error: --data {bad}: the input holds no rows that can be read "
        '(2 bad rows skipped (data.on_bad_row = "skip")).\n'
    )
    assert not out.exists()
    # once the model dir holds a checkpoint, another model is refused
    other = write(tmp_path, "seed = 8\n" + CSV_TOML.format(mode="skip"), "other.toml")
    assert main(["train", "--config", other]) == 2
    assert "the model dir holds another model (params" in capsys.readouterr().err


# --------------------------------------------------------------------------- paths


def test_output_dir_or_model_dir_that_is_a_file(run_dir, capsys):
    (run_dir / "out").write_text("")
    cfg = write(run_dir, TINY)
    assert main(["train", "--config", cfg]) == 2
    want = f'tnrec train: error: {cfg}: "output_dir": {run_dir}/out is an existing file, not a'
    assert capsys.readouterr().err.startswith(want)
    (run_dir / "f").write_text("")
    cfg = write(run_dir, TINY.replace("[train]", '[checkpoint]\ndir = "f/model"\n[train]'))
    assert main(["train", "--config", cfg, "--output-dir", str(run_dir / "run")]) == 2
    want = (
        f'{cfg}: "checkpoint.dir": {run_dir}/f/model cannot be created: {run_dir}/f is a file, '
        "not a directory."
    )
    assert want in capsys.readouterr().err
    assert not (run_dir / "run").exists()


def test_output_paths_of_predict_export_demo(tiny_model, tmp_path, capsys):
    md = str(tiny_model)
    f = tmp_path / "f"
    f.write_text("")
    assert main(["predict", "--model-dir", md, "--output", str(f / "p.parquet")]) == 2
    err = capsys.readouterr().err
    assert f"--output {f}/p.parquet: {f} is an existing file, not a directory." in err
    assert main(["predict", "--model-dir", md, "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path} is a directory; give a file name." in capsys.readouterr().err
    assert main(["export", "--model-dir", md, "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} already exists; choose a new directory." in capsys.readouterr().err
    assert main(["export", "--model-dir", md, "--out", str(f / "e")]) == 2
    want = f"--out {f}/e cannot be created: {f} is a file, not a directory."
    assert want in capsys.readouterr().err
    assert main(["demo", "--rows", "10", "--output-dir", str(f)]) == 2
    want = f"tnrec demo: error: --output-dir {f} is an existing file, not a directory.\n"
    assert capsys.readouterr().err == want


def test_an_os_error_is_one_line_naming_the_path(monkeypatch, capsys):
    def fail(args):
        raise PermissionError(13, "Permission denied", "/srv/runs/x")

    monkeypatch.setattr("tnrec.cli.entry._run", fail)
    assert main(["inspect", "x"]) == 1
    assert capsys.readouterr().err == "tnrec inspect: error: Permission denied: /srv/runs/x\n"


# --------------------------------------------------------------------------- mid-day export


def test_export_refuses_a_day_whose_last_checkpoint_is_mid_day(tiny_model, tmp_path, capsys):
    root = tmp_path / "model"
    shutil.copytree(tiny_model, root)
    model, _ = load_model(str(root))
    model.save_weights(str(root), "2024-05-11", resume={"dt": "2024-05-11", "day_complete": False})
    ckpt = root / "2024-05-11" / "2"
    assert checkpoint.latest(str(root), "2024-05-11") == str(ckpt)
    refused = (
        f"tnrec export: error: {ckpt}: day '2024-05-11' is incomplete: its last checkpoint "
        "(generation 2) was saved mid-day (the day's training was interrupted or is still "
        "running). Pass --allow-incomplete to export it anyway.\n"
    )
    for args in (
        ["--dt", "2024-05-11"],
        [],  # the published checkpoint is the mid-day one
        ["--delta", "--since", "2024-05-10", "--to", "2024-05-11"],
    ):
        assert main(["export", "--model-dir", str(root), "--out", str(tmp_path / "e"), *args]) == 2
        assert capsys.readouterr().err == refused
        assert not (tmp_path / "e").exists()
    with pytest.raises(ArgumentError, match=r"day '2024-05-11' is incomplete: .*\(generation 2\)"):
        export(str(root), str(tmp_path / "e"), dt="2024-05-11")
    base = ["export", "--model-dir", str(root)]
    assert main([*base, "--out", str(tmp_path / "e1"), "--dt", "2024-05-10"]) == 0  # complete
    assert (
        main([*base, "--out", str(tmp_path / "e2"), "--dt", "2024-05-11", "--allow-incomplete"])
        == 0
    )
    manifest = json.loads((tmp_path / "e2" / "manifest.json").read_text())
    assert manifest["provenance"] == {
        "model_dir": str(root),
        "dt": "2024-05-11",
        "generation": 2,
        "global_step": 2,  # 300 rows in batches of 200
        "complete": False,
    }
    manifest = json.loads((tmp_path / "e1" / "manifest.json").read_text())
    assert manifest["provenance"]["complete"] is True
    assert manifest["provenance"]["generation"] == 1
