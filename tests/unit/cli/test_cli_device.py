"""``tnrec train --device`` and ``[train] device``: where the dense part trains.

This machine has no GPU: ``cpu`` must train, ``cuda`` must fail before
anything is built or written (where CUDA is available it must train instead).
"""

import json

import pytest
import torch

from tnrec.cli import main
from tnrec.cli.config import config_from_dict, load_config
from tnrec.cli.train import train_device
from tnrec.data.synthetic import SyntheticConfig, generate
from tnrec.errors import ConfigError

TOML = """\
seed = 1
output_dir = "out"

[model]
name = "deepfm"
embedding_dim = 4
hidden_units = [8]

[data]
dir = "data"
train_days = ["2024-05-10"]

[train]
batch_size = 200
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One day of 400 rows of synthetic Criteo-schema Parquet."""
    root = tmp_path_factory.mktemp("cli_device")
    generate(root / "data", SyntheticConfig(rows_per_day=400, num_days=1, test_rows=100, seed=5))
    return root


def write_config(root, name, extra=""):
    path = root / name
    path.write_text(TOML.replace("[train]", f"[train]\n{extra}"))
    return str(path)


def test_the_default_device_is_the_cpu(data_dir):
    assert load_config(write_config(data_dir, "default.toml")).train.device == "cpu"


@pytest.mark.parametrize(
    ("extra", "flags"),
    [("", ["--device", "cpu"]), ('device = "cpu"', [])],
    ids=["flag", "config"],
)
def test_train_on_the_cpu_runs(data_dir, capsys, extra, flags):
    cfg = write_config(data_dir, f"cpu-{bool(flags)}.toml", extra)
    out = f"out-cpu-{bool(flags)}"
    assert main(["train", "--config", cfg, "--output-dir", str(data_dir / out), *flags]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 400
    written = json.loads((data_dir / out / "config.json").read_text())
    assert written["train"]["device"] == "cpu"


@pytest.mark.parametrize(
    ("extra", "flags"),
    [("", ["--device", "cuda"]), ('device = "cuda"', [])],
    ids=["flag", "config"],
)
def test_train_on_cuda_fails_clearly_without_cuda_and_runs_with_it(data_dir, capsys, extra, flags):
    cfg = write_config(data_dir, f"cuda-{bool(flags)}.toml", extra)
    out = data_dir / f"out-cuda-{bool(flags)}"
    rc = main(["train", "--config", cfg, "--output-dir", str(out), *flags])
    if torch.cuda.is_available():  # a CUDA machine: not run here
        assert (
            rc == 0 and json.loads((out / "config.json").read_text())["train"]["device"] == "cuda"
        )
        return
    err = capsys.readouterr().err
    assert rc == 2, err
    assert (
        "tnrec train: error: " in err
        and "\"train.device\": `device` is 'cuda' but CUDA is not available" in err
    ), err
    assert not out.exists()  # failed before anything was written


@pytest.mark.parametrize(
    ("extra", "flags"),
    [("", ["--device", "gpu"]), ('device = "gpu"', [])],
    ids=["flag", "config"],
)
def test_a_bad_device_names_the_key_and_the_choices(data_dir, capsys, extra, flags):
    cfg = write_config(data_dir, f"bad-{bool(flags)}.toml", extra)
    assert main(["train", "--config", cfg, *flags]) == 2
    assert (
        '"train.device": `device` must be "cpu", "cuda" or "cuda:N". Received: device=\'gpu\''
        in capsys.readouterr().err
    )


def test_cuda_with_several_workers_is_each_workers_own_gpu_in_sync_mode_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the rule, without a GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = config_from_dict(
        {"data": {"train": "x/*.parquet"}, "train": {"device": "cuda"}}, "/r.toml"
    )
    assert train_device(cfg, 1) == torch.device("cuda")
    assert [train_device(cfg, 4, r) for r in range(4)] == [
        torch.device("cuda", i) for i in (0, 1, 0, 1)
    ]
    cfg.train.device = "cuda:1"
    assert train_device(cfg, 4, 0) == torch.device("cuda", 1)  # a chosen GPU stays chosen
    cfg.distributed.mode = "async"
    with pytest.raises(
        ConfigError, match=r"\"train.device\" is 'cuda:1' with 2 workers in async mode"
    ):
        train_device(cfg, 2)
    assert train_device(cfg, 1) == torch.device("cuda", 1)
    cfg.train.device = "cpu"
    assert train_device(cfg, 2) == torch.device("cpu")
