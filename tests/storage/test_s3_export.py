"""A Predictor serving an export stored on S3 (moto's server on 127.0.0.1) predicts what the
same export on a local disk predicts; damaged or missing objects are refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec as tn
from tests.storage.test_s3_inputs import TOML
from tnrec.cli import main
from tnrec.cli.run import export as cli_export
from tnrec.data.synthetic import SyntheticConfig, generate
from tnrec.errors import ArgumentError, CheckpointError, ChecksumError, WriteError
from tnrec.serving import Predictor


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A model trained here and exported locally, and its raw test rows."""
    work = tmp_path_factory.mktemp("s3export")
    generate(work / "data", SyntheticConfig(rows_per_day=400, num_days=2, test_rows=150))
    cfg = work / "run.toml"
    test = work / "data" / "test" / "*.parquet"
    cfg.write_text(TOML.format(out=work / "out", data=work / "data", test=test))
    assert main(["train", "--config", str(cfg)]) == 0
    out = work / "export"
    cli_export(str(work / "out" / "model"), str(out))
    files = sorted((work / "data" / "test").glob("*.parquet"))
    raw = pa.concat_tables(pq.read_table(f) for f in files)
    return out, raw


def _upload_dir(s3, local: Path, prefix: str) -> str:
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        s3.put_bytes(f"{prefix}/{f.relative_to(local)}", f.read_bytes())
    return s3.uri(prefix)


def test_a_predictor_from_s3_predicts_what_the_local_export_predicts(s3, exported):
    local, raw = exported
    uri = _upload_dir(s3, local, "exports/ctr")
    want = Predictor(str(local)).predict(raw)
    remote = Predictor(uri)
    np.testing.assert_array_equal(remote.predict(raw), want)
    assert remote.path == uri
    for table in tn.export.read_manifest(str(local))["tables"]:
        k1, w1 = tn.export.load_dictionary(str(local), table)
        k2, w2 = tn.export.load_dictionary(uri, table)
        np.testing.assert_array_equal(k2, k1)
        np.testing.assert_array_equal(w2, w1)


def test_throttled_reads_of_an_export_are_retried(s3, exported):
    local, raw = exported
    uri = _upload_dir(s3, local, "exports/ctr")
    s3.proxy.fail_next("503", 3, method="GET")
    s3.proxy.fail_next("drop", 1, method="GET")
    np.testing.assert_array_equal(Predictor(uri).predict(raw), Predictor(str(local)).predict(raw))
    assert s3.proxy.injected == 4


def test_a_damaged_or_missing_object_is_refused_by_name(s3, exported):
    local, _ = exported
    uri = _upload_dir(s3, local, "exports/ctr")
    keys = s3.keys("exports/ctr/embeddings/")
    victim = next(k for k in keys if k.endswith("weights.npy"))
    data = bytearray(s3.get_bytes(victim))
    data[-1] ^= 0x01
    s3.put_bytes(victim, bytes(data))
    with pytest.raises(ChecksumError, match=rf"s3://{s3.bucket}/{victim} is corrupt"):
        Predictor(uri)
    s3.client.delete_object(Bucket=s3.bucket, Key=victim)
    with pytest.raises(CheckpointError, match=rf"s3://{s3.bucket}/{victim} is missing"):
        Predictor(uri)
    with pytest.raises(CheckpointError, match=r"No export at s3://.*/nothing: no such directory"):
        Predictor(s3.uri("nothing"))


def test_an_export_written_to_s3_predicts_what_the_local_export_predicts(s3, exported):
    local, raw = exported
    model_dir = str(local.parent / "out" / "model")
    uri = s3.uri("exports/ctr")
    assert cli_export(model_dir, uri) == uri
    keys = s3.keys("exports/ctr/")
    assert "exports/ctr/manifest.json" in keys and not [k for k in keys if ".tmp" in k]
    np.testing.assert_array_equal(Predictor(uri).predict(raw), Predictor(str(local)).predict(raw))
    with pytest.raises(ArgumentError, match="already exists"):
        cli_export(model_dir, uri)


def test_a_failed_export_to_s3_leaves_nothing_and_a_killed_ones_remains_are_replaced(
    s3, exported, monkeypatch
):
    local, raw = exported
    model_dir = str(local.parent / "out" / "model")
    uri = s3.uri("exports/ctr")
    monkeypatch.setenv("TNREC_IO_ATTEMPTS", "2")
    s3.proxy.fail_always("503", method="PUT", path_contains="weights.npy")
    with pytest.raises(WriteError, match=rf"s3://{s3.bucket}/exports/ctr/embeddings/.*2 attempts"):
        cli_export(model_dir, uri)
    s3.proxy.clear()
    # nothing published, nothing left (pyarrow keeps the parent prefix as an empty marker)
    assert [k for k in s3.keys("exports/") if not k.endswith("/")] == []
    # what a killed export leaves: shard objects, no manifest; the next export replaces it
    s3.put_bytes("exports/ctr/embeddings/stale/keys.npy", b"stale")
    cli_export(model_dir, uri)
    assert not [k for k in s3.keys("exports/ctr/") if "stale" in k]
    np.testing.assert_array_equal(Predictor(uri).predict(raw), Predictor(str(local)).predict(raw))
    # a prefix holding anything else is never deleted
    s3.put_bytes("exports/other/notes.txt", b"mine")
    with pytest.raises(ArgumentError, match="already exists"):
        cli_export(model_dir, s3.uri("exports/other"))
    assert s3.keys("exports/other/") == ["exports/other/notes.txt"]
