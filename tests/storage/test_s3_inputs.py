"""Input files read from a real S3 server (moto, on 127.0.0.1): the same rows as from local files.

Every test goes through the fault-injecting proxy in front of the server, so
the retries it shows are the client's and tnrec's, against real HTTP.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec as tn
import tnrec.data as td
from tests.unit.data.criteo_rows import make_rows, write_csv, write_parquet
from tests.unit.data.data_common import read_all
from tnrec import _fileio, checkpoint
from tnrec.cli import main
from tnrec.errors import DataError
from tnrec.runlog import read_runlog
from tnrec.serving import Predictor

DAYS = ["2024-05-10", "2024-05-11"]


def _upload(s3, local: Path, key: str) -> str:
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=local.read_bytes())
    return s3.uri(key)


def _same(a: td.Batch, b: td.Batch) -> None:
    assert a.size == b.size
    for k in td.CRITEO_CATEGORICAL:
        np.testing.assert_array_equal(a.keys(k), b.keys(k))
        np.testing.assert_array_equal(a.offsets(k), b.offsets(k))
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.labels, b.labels)


@pytest.fixture
def days(s3, tmp_path):
    """Two days of Parquet and CSV files, locally and under s3://bucket/data/<day>/."""
    local = tmp_path / "data"
    for i, day in enumerate(DAYS):
        (local / day).mkdir(parents=True)
        for part in range(2):
            rows = make_rows(23 + part, seed=10 * i + part)
            for kind, write in (("parquet", write_parquet), ("csv", write_csv)):
                f = write(local / day / f"part-{part}.{kind}", rows)
                _upload(s3, Path(f), f"data/{day}/part-{part}.{kind}")
    return local


def test_list_files_and_globs_name_the_objects(s3, days):
    got = td.list_files(s3.uri("data"), DAYS, "*.parquet")
    assert got == [s3.uri(f"data/{d}/part-{p}.parquet") for d in DAYS for p in range(2)]
    assert td.list_files(s3.uri("data"), pattern="*.csv") == [
        s3.uri(f"data/{d}/part-{p}.csv") for d in DAYS for p in range(2)
    ]
    assert td.expand_paths(s3.uri("data/*/part-1.*")) == [
        s3.uri(f"data/{d}/part-1.{k}") for d in DAYS for k in ("csv", "parquet")
    ]
    assert _fileio.is_dir(s3.uri("data")) and not _fileio.is_file(s3.uri("data"))
    with pytest.raises(DataError, match=r"No files matched pattern: s3://.*/data/\*/\*\.tsv"):
        td.expand_paths(s3.uri("data/*/*.tsv"))
    with pytest.raises(DataError, match=r"Day '2024-05-12' not found.*s3://"):
        td.list_files(s3.uri("data"), ["2024-05-12"])
    with pytest.raises(DataError, match=r"Input file not found: s3://.*/nothing.parquet"):
        td.expand_paths(s3.uri("nothing.parquet"))


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_s3_files_read_the_same_rows_as_local_ones(s3, days, kind):
    cols = td.criteo_columns()
    read = td.read_parquet if kind == "parquet" else td.read_csv
    remote = read(td.list_files(s3.uri("data"), DAYS, f"*.{kind}"), cols, batch_size=9)
    here = read(td.list_files(str(days), DAYS, f"*.{kind}"), cols, batch_size=9)
    _same(read_all(remote), read_all(here))
    # two workers split the objects (Parquet row groups, CSV byte ranges) as they split files
    for rank in range(2):
        _same(read_all(remote.split(rank, 2)), read_all(here.split(rank, 2)))


def test_a_csv_read_in_byte_ranges_fetches_ranges_not_the_object(s3, tmp_path):
    rows = make_rows(400, seed=5)
    uri = _upload(s3, Path(write_csv(tmp_path / "big.csv", rows)), "big.csv")
    cols = td.criteo_columns()
    parts = [read_all(td.read_csv(uri, cols, batch_size=50).split(r, 4)) for r in range(4)]
    whole = read_all(td.read_csv(str(tmp_path / "big.csv"), cols, batch_size=50))
    _same(td.Batch.concat([p for p in parts if p.size]), whole)
    with _fileio.open_input(uri) as f:
        f.seek(100)
        assert f.read(20) == (tmp_path / "big.csv").read_bytes()[100:120]
        f.seek(-10, 2)
        assert f.read() == (tmp_path / "big.csv").read_bytes()[-10:]


def test_throttling_and_dropped_connections_are_retried(s3, days, monkeypatch):
    cols = td.criteo_columns()
    want = read_all(td.read_parquet(td.list_files(str(days), DAYS), cols, batch_size=9))
    s3.proxy.fail_next("503", 2, method="GET")
    s3.proxy.fail_next("drop", 1, method="GET")
    got = read_all(td.read_parquet(td.list_files(s3.uri("data"), DAYS), cols, batch_size=9))
    _same(got, want)
    assert s3.proxy.injected >= 3


def test_a_store_that_keeps_failing_gives_an_error_naming_the_uri(s3, days, monkeypatch):
    monkeypatch.setenv("TNREC_IO_ATTEMPTS", "2")
    s3.proxy.fail_always("503")
    with pytest.raises(DataError, match=r"s3://.* after 2 attempts"):
        td.list_files(s3.uri("data"), DAYS)
    assert s3.proxy.injected == 2  # tnrec's attempts, not multiplied by the client's own
    s3.proxy.clear()
    files = td.list_files(s3.uri("data"), DAYS)
    s3.proxy.fail_always("503", method="GET")
    with pytest.raises(DataError, match=r"s3://.*part-0\.parquet"):
        read_all(td.read_parquet(files, td.criteo_columns()))


TOML = """\
seed = 3
output_dir = "{out}"
[model]
name = "widedeep"
embedding_dim = 4
hidden_units = [8]
[data]
dir = "{data}"
train_days = ["2024-05-10", "2024-05-11"]
test = "{test}"
shuffle = false
[train]
batch_size = 200
"""


def _assert_same_model(a, b) -> None:
    for (n1, p1), (n2, p2) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert n1 == n2
        np.testing.assert_array_equal(p1.detach().numpy(), p2.detach().numpy(), err_msg=n1)
    for name, table in a.tables.items():
        ra, rb = table.rows(), b.tables[name].rows()
        order_a, order_b = np.argsort(ra["keys"]), np.argsort(rb["keys"])
        for k in ra:
            np.testing.assert_array_equal(ra[k][order_a], rb[k][order_b], err_msg=f"{name} {k}")


def test_tnrec_train_reads_its_days_from_s3_and_trains_as_from_local_files(s3, tmp_path, capsys):
    from tnrec.data.synthetic import SyntheticConfig, generate

    local = tmp_path / "data"
    generate(local, SyntheticConfig(rows_per_day=500, num_days=2, test_rows=200))
    for f in sorted(local.rglob("*.parquet")):
        _upload(s3, f, "days/" + str(f.relative_to(local)))
    runs = {}
    for name, data, test, out in (
        ("local", str(local), str(local / "test" / "*.parquet"), str(tmp_path / "out-local")),
        ("s3", s3.uri("days"), s3.uri("days/test/*.parquet"), str(tmp_path / "out-s3")),
        ("all-s3", s3.uri("days"), s3.uri("days/test/*.parquet"), s3.uri("runs/ctr")),
    ):
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(TOML.format(out=out, data=data, test=test))
        assert main(["train", "--config", str(cfg)]) == 0
        runs[name] = out
    from tnrec.cli.artifacts import load_model

    a, _ = load_model(f"{runs['local']}/model")
    for other in ("s3", "all-s3"):  # inputs on S3; inputs, checkpoints and run log on S3
        b, _ = load_model(f"{runs[other]}/model")
        _assert_same_model(a, b)
    keys = s3.keys("runs/ctr/")
    assert {"runs/ctr/config.json", "runs/ctr/runlog.jsonl", "runs/ctr/model/_checkpoint"} <= set(
        keys
    )
    days = [r["dt"] for r in read_runlog(s3.uri("runs/ctr")) if r["event"] == "day"]
    assert days == ["2024-05-10", "2024-05-11"]
    # run again: both days are complete in the checkpoint on S3, so nothing is trained
    assert main(["train", "--config", str(tmp_path / "all-s3.toml")]) == 0
    assert [r["skipped"] for r in read_runlog(s3.uri("runs/ctr")) if r["event"] == "day"][2:] == [
        True,
        True,
    ]
    bad = tmp_path / "missing-day.toml"
    text = TOML.format(out=tmp_path / "out-bad", data=s3.uri("days"), test=s3.uri("days/test/*"))
    bad.write_text(text.replace('"2024-05-11"]', '"2024-05-12"]'))
    assert main(["train", "--config", str(bad)]) == 2
    assert "2024-05-12" in capsys.readouterr().err


def test_a_run_config_read_from_s3_resolves_its_inputs_next_to_it(s3, tmp_path, capsys):
    from tnrec.cli.config import load_config
    from tnrec.data.synthetic import SyntheticConfig, generate

    local = tmp_path / "data"
    generate(local, SyntheticConfig(rows_per_day=300, num_days=2, test_rows=100))
    for f in sorted(local.rglob("*.parquet")):
        _upload(s3, f, "job/days/" + str(f.relative_to(local)))
    text = TOML.format(out="runs/x", data="days", test="days/test/*.parquet")
    s3.put_bytes("job/ctr.toml", text.encode())
    out = tmp_path / "out"
    cfg = load_config(s3.uri("job/ctr.toml"), output_dir=str(out))
    assert cfg.data.dir == s3.uri("job/days") and cfg.data.test == [
        s3.uri("job/days/test/*.parquet")
    ]
    assert main(["train", "--config", s3.uri("job/ctr.toml"), "--output-dir", str(out)]) == 0
    assert (out / "model").is_dir()
    # a relative output_dir is next to the config: on S3 too
    assert main(["train", "--config", s3.uri("job/ctr.toml")]) == 0
    assert "job/runs/x/model/_checkpoint" in s3.keys("job/runs/x/")
    assert main(["train", "--config", s3.uri("job/none.toml")]) == 2
    assert "cannot read the run config s3://" in capsys.readouterr().err


def test_two_workers_under_torchrun_train_from_s3_as_one_process_does(s3, tmp_path):
    from tests.multiprocess.conftest import torchrun
    from tnrec.cli.artifacts import load_model
    from tnrec.data.synthetic import SyntheticConfig, generate

    local = tmp_path / "data"
    generate(local, SyntheticConfig(rows_per_day=400, num_days=2, test_rows=100))
    for f in sorted(local.rglob("*.parquet")):
        _upload(s3, f, "days/" + str(f.relative_to(local)))
    cfg = tmp_path / "run.toml"
    data, test = s3.uri("days"), s3.uri("days/test/*.parquet")
    cfg.write_text(TOML.format(out=tmp_path / "out-1", data=data, test=test))
    assert main(["train", "--config", str(cfg)]) == 0
    two_dir = s3.uri("runs/two")  # the two workers' checkpoints go to S3 too
    res = torchrun(
        2,
        ["train", "--config", str(cfg), "--output-dir", two_dir],
        timeout_s=300.0,
        target=["-m", "tnrec.cli"],
    )  # the workers inherit the AWS_* environment that points at the server
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = checkpoint.read_manifest(checkpoint.latest(f"{two_dir}/model"))
    assert manifest["world_size"] == 2
    one, _ = load_model(tmp_path / "out-1" / "model")
    two, _ = load_model(f"{two_dir}/model")  # written by 2 workers to S3, loaded by 1
    for (n1, p1), (_, p2) in zip(one.named_parameters(), two.named_parameters(), strict=True):
        want = p1.detach().numpy()
        np.testing.assert_allclose(p2.detach().numpy(), want, rtol=1e-5, atol=1e-6, err_msg=n1)
    for name, table in one.tables.items():
        ra, rb = table.rows(), two.tables[name].rows()
        assert len(ra["keys"]) > 0
        oa, ob = np.argsort(ra["keys"]), np.argsort(rb["keys"])
        np.testing.assert_array_equal(ra["keys"][oa], rb["keys"][ob])
        np.testing.assert_allclose(rb["weights"][ob], ra["weights"][oa], rtol=1e-5, atol=1e-6)
    # the two workers export their shards to S3; the Predictor serves it from there
    export_uri = s3.uri("exports/two")
    res = torchrun(
        2,
        ["export", "--model-dir", two_dir, "--out", export_uri],
        timeout_s=300.0,
        target=["-m", "tnrec.cli"],
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert tn.export.read_manifest(export_uri)["routing"]["num_shards"] == 2
    local_export = str(tmp_path / "x")
    assert main(["export", "--model-dir", str(tmp_path / "out-1"), "--out", local_export]) == 0
    files = sorted((local / "test").glob("*.parquet"))
    raw = pa.concat_tables(pq.read_table(f) for f in files)
    np.testing.assert_allclose(
        Predictor(export_uri).predict(raw),
        Predictor(local_export).predict(raw),
        rtol=1e-5,
        atol=1e-6,
    )
