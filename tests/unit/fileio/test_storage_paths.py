"""The storage interface's path rules, without a server: URIs vs local paths, joins, globs,
which failures are retried, and the retry bound."""

from __future__ import annotations

import pytest

from tnrec._fileio import storage
from tnrec.errors import WriteError


def test_uris_and_local_paths_are_told_apart():
    assert storage.is_remote("s3://b/k") and storage.is_remote("HDFS://nn:8020/x")
    assert not storage.is_remote("/data/x") and not storage.is_remote("file:///data/x")
    assert not storage.is_remote("relative/s3:/x")
    assert storage.local("file:///data/x") == "/data/x"
    with pytest.raises(ValueError, match="not a local path"):
        storage.local("s3://b/k")


def test_join_and_parent_follow_the_path_kind(tmp_path):
    assert (
        storage.join("s3://b/data/", "2024-05-10", "*.parquet")
        == "s3://b/data/2024-05-10/*.parquet"
    )
    assert storage.join(str(tmp_path), "a") == str(tmp_path / "a")
    assert storage.parent("s3://b/data/x.csv") == "s3://b/data"


def test_local_globs_and_queries(tmp_path):
    for name in ("a.csv", "b.csv", "c.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "d.csv").mkdir()  # a directory is never a match
    assert storage.glob(str(tmp_path / "*.csv")) == [
        str(tmp_path / "a.csv"),
        str(tmp_path / "b.csv"),
    ]
    assert storage.size(str(tmp_path / "a.csv")) == 1
    assert storage.is_dir(f"file://{tmp_path}") and not storage.exists(str(tmp_path / "zz"))
    assert ("d.csv", True) in storage.list_dir(str(tmp_path))
    with storage.open_input(str(tmp_path / "a.csv")) as f:
        assert f.read() == b"x"


@pytest.mark.parametrize(
    "error, retried",
    [
        (OSError("AWS Error SLOW_DOWN during GetObject operation: 503"), True),
        (OSError("curlCode: 7, Couldn't connect to server"), True),
        (OSError("Connection reset by peer"), True),
        (OSError("AWS Error NETWORK_CONNECTION during HeadObject"), True),
        (FileNotFoundError("Path does not exist 'b/k'"), False),
        (PermissionError("AWS Error ACCESS_DENIED"), False),
        (OSError("AWS Error NO_SUCH_BUCKET during ListObjectsV2"), False),
    ],
)
def test_only_transient_failures_are_retried(error, retried):
    assert storage.transient(error) is retried


def test_retries_are_bounded_and_the_error_names_the_uri(monkeypatch):
    monkeypatch.setenv("TNREC_IO_ATTEMPTS", "3")
    monkeypatch.setattr(storage.time, "sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("503 SlowDown")
        return "ok"

    assert storage.retry("read", "s3://b/k", flaky) == "ok" and len(calls) == 3

    def broken():
        calls.append(1)
        raise OSError("503 SlowDown")

    calls.clear()
    with pytest.raises(OSError, match=r"cannot read s3://b/k after 3 attempts: 503 SlowDown"):
        storage.retry("read", "s3://b/k", broken)
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(FileNotFoundError, match="s3://b/k does not exist"):
        storage.retry("open", "s3://b/k", lambda: calls.append(1) or open("/nonexistent/x"))
    assert len(calls) == 1  # a missing file is not tried again


@pytest.mark.parametrize("value", ["0", "many"])
def test_a_bad_attempt_count_is_named(monkeypatch, value):
    monkeypatch.setenv("TNREC_IO_ATTEMPTS", value)
    with pytest.raises(ValueError, match="TNREC_IO_ATTEMPTS"):
        storage.retry("read", "s3://b/k", lambda: None)


def test_a_directory_is_staged_beside_its_final_path_except_on_an_object_store(tmp_path):
    from tnrec import _fileio

    assert _fileio.staging_dir(str(tmp_path / "out"), "ab") == str(tmp_path / ".out.tmp-ab")
    assert _fileio.staging_dir("hdfs://nn:8020/m/out", "ab") == "hdfs://nn:8020/m/.out.tmp-ab"
    for uri in ("s3://b/m/out", "gs://b/m/out", "abfs://c/m/out"):
        assert _fileio.staging_dir(uri, "ab") == uri  # no rename: written under the final keys
    with pytest.raises(WriteError, match="s3://b/m/x: an object store has no rename"):
        _fileio.publish("s3://b/m/.x.tmp", "s3://b/m/x")
    # a lock on an object store locks nothing (and writes no lock object)
    with _fileio.DirLock("s3://b/m"):
        pass


def test_file_uris_in_a_run_config_stay_as_given(tmp_path):
    from tnrec.cli.config import config_from_dict

    doc = {"data": {"train": [f"file://{tmp_path}/d/*.parquet"], "test": "t/*.parquet"}}
    cfg = config_from_dict(doc, str(tmp_path / "cfg" / "run.toml"))
    assert cfg.data.train == [f"file://{tmp_path}/d/*.parquet"]
    assert cfg.data.test == [str(tmp_path / "cfg" / "t" / "*.parquet")]
