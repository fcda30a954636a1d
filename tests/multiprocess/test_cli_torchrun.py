"""`torchrun -m tnrec.cli`: train on 2 workers, evaluate in one process, merged predictions."""

import json
import os
import subprocess

import pyarrow.parquet as pq

from tnrec.cli import main
from tnrec.data.synthetic import SyntheticConfig, generate

TOML = """\
seed = 3
output_dir = "out"
[model]
name = "widedeep"
embedding_dim = 4
hidden_units = [8]
[data]
dir = "data"
train_days = ["2024-05-10", "2024-05-11"]
test = "data/test/*.parquet"
shuffle = false
[train]
batch_size = 200
"""


def _torchrun(launch, args: list[str], cwd: str) -> subprocess.CompletedProcess:
    res = launch(2, args, timeout_s=300.0, target=["-m", "tnrec.cli"], cwd=cwd)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def test_train_on_two_workers_evaluate_in_one_predict_merged(launch, tmp_path, capsys):
    generate(tmp_path / "data", SyntheticConfig(rows_per_day=600, num_days=2, test_rows=301))
    (tmp_path / "run.toml").write_text(TOML)
    res = _torchrun(launch, ["train", "--config", "run.toml"], str(tmp_path))
    day_lines = [line for line in res.stdout.splitlines() if line.startswith("day ")]
    assert len(day_lines) == 2  # rank 0 prints, rank 1 does not
    assert day_lines[0].startswith("day 2024-05-10: rows 600 - keys created")
    model_dir = tmp_path / "out" / "model"
    manifest = json.loads((model_dir / "2024-05-11" / "2" / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    # evaluate in one process: the checkpoint written by 2 workers loads on 1
    capsys.readouterr()
    assert main(["evaluate", "--model-dir", str(model_dir)]) == 0
    logs = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 < logs["auc_exact"] < 1
    out = tmp_path / "preds.parquet"
    res = _torchrun(
        launch,
        ["predict", "--model-dir", str(model_dir), "--output", str(out), "--merge"],
        str(tmp_path),
    )
    assert f"wrote 301 predictions to {out}" in res.stdout
    assert sorted(os.listdir(tmp_path)) == ["data", "out", "preds.parquet", "run.toml"]
    ids = pq.read_table(out)["row_id"].to_pylist()
    single = tmp_path / "one.parquet"
    assert main(["predict", "--model-dir", str(model_dir), "--output", str(single)]) == 0
    want = pq.read_table(single)
    assert len(ids) == 301 and len(set(ids)) == 301
    assert ids == want["row_id"].to_pylist()  # every row once, in the files' order
    got = pq.read_table(out)["prediction"].to_numpy()
    assert abs(got - want["prediction"].to_numpy()).max() < 1e-6


# Each worker picks its own arguments by RANK: a launcher that starts workers with
# different configs or output dirs (the same argv reaches every worker otherwise).
PER_RANK = """\
import os, sys
from tnrec.cli import main
rank = os.environ["RANK"]
sys.exit(main(["train", "--config", f"run{rank}.toml", *sys.argv[1:]]
              + (["--output-dir", f"out{rank}"] if os.environ.get("PER_RANK_OUT") else [])))
"""


def test_workers_with_different_configs_or_output_dirs_fail_fast(launch, tmp_path, monkeypatch):
    generate(tmp_path / "data", SyntheticConfig(rows_per_day=200, num_days=1, test_rows=50))
    (tmp_path / "run0.toml").write_text(TOML)
    (tmp_path / "run1.toml").write_text(TOML.replace("embedding_dim = 4", "embedding_dim = 8"))
    (tmp_path / "per_rank.py").write_text(PER_RANK)
    res = launch(2, [], timeout_s=120.0, target=["per_rank.py"], cwd=str(tmp_path))
    assert res.returncode != 0
    for rank in (0, 1):  # every worker fails with the same message, naming the key
        want = (
            f"tnrec train: error: run{rank}.toml: the workers were started with "
            "different run configs or model dirs: rank 1 differs from rank 0 in "
            "model.embedding_dim. Start every worker with the same config and --output-dir."
        )
        assert want in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()  # nothing built or written
    (tmp_path / "run1.toml").write_text(TOML)
    monkeypatch.setenv("PER_RANK_OUT", "1")
    res = launch(2, [], timeout_s=120.0, target=["per_rank.py"], cwd=str(tmp_path))
    assert res.returncode != 0
    assert res.stderr.count("rank 1 differs from rank 0 in output_dir, model_dir.") == 2
    assert not (tmp_path / "out0").exists() and not (tmp_path / "out1").exists()


def test_train_on_two_workers_async_and_balanced(launch, tmp_path):
    """`[distributed] mode = "async"` and `[train] balance = true` each train every row once."""
    generate(tmp_path / "data", SyntheticConfig(rows_per_day=600, num_days=2, test_rows=50))
    modes = {
        "async": TOML.replace("[train]", '[distributed]\nmode = "async"\nstaleness = 2\n[train]'),
        "balanced": TOML.replace("[train]", "[train]\nbalance = true"),
    }
    for name, toml in modes.items():
        (tmp_path / f"{name}.toml").write_text(toml)
        args = ["train", "--config", f"{name}.toml", "--output-dir", f"out-{name}"]
        res = _torchrun(launch, args, str(tmp_path))
        day_lines = [line for line in res.stdout.splitlines() if line.startswith("day ")]
        assert [line.split(" - ")[0] for line in day_lines] == [
            "day 2024-05-10: rows 600",
            "day 2024-05-11: rows 600",
        ], res.stdout
        assert (tmp_path / f"out-{name}" / "model" / "2024-05-11").is_dir()
