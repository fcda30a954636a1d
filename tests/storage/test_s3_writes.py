"""The durable-IO module's writes to S3 (moto's server on 127.0.0.1): whole objects, retried,
and a clear error naming the object when the store keeps failing."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tnrec import _fileio
from tnrec.errors import WriteError


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def test_files_written_to_s3_are_read_back_as_written(s3):
    _fileio.write_bytes(s3.uri("a/b/x.bin"), b"hello")
    assert s3.get_bytes("a/b/x.bin") == b"hello"
    arr = np.arange(300_000, dtype=np.int64)  # 2.4 MB, streamed in pieces
    f = _fileio.StreamFile(s3.uri("a/b/y.npy"))
    data = _npy(arr)
    for i in range(0, len(data), 100_000):
        f.write(data[i : i + 100_000])
    digest = f.close()
    np.testing.assert_array_equal(_fileio.load_npy(s3.uri("a/b/y.npy")), arr)
    assert digest == _fileio.sha256_file(s3.uri("a/b/y.npy"))
    _fileio.write_json(s3.uri("a/doc.json"), {"format": "t", "format_version": 1, "x": 1})
    assert _fileio.read_versioned_json(s3.uri("a/doc.json"), "t", 1)["x"] == 1
    _fileio.write_atomic(s3.uri("a/doc.json"), lambda f: f.write(b"{}"))
    assert s3.get_bytes("a/doc.json") == b"{}"
    assert s3.keys("a/") == ["a/b/x.bin", "a/b/y.npy", "a/doc.json"]  # no temporary objects


def test_a_log_on_s3_is_appended_to_and_trees_are_removed(s3):
    _fileio.append_text(s3.uri("logs/run.jsonl"), "1\n")
    _fileio.append_text(s3.uri("logs/run.jsonl"), "2\n")
    assert s3.get_bytes("logs/run.jsonl") == b"1\n2\n"
    _fileio.makedirs(s3.uri("logs/empty"))  # a prefix needs no creating: no object
    assert s3.keys("logs/") == ["logs/run.jsonl"]
    assert _fileio.file_sizes(s3.uri("logs")) == {"run.jsonl": 4}
    _fileio.write_bytes(s3.uri("t/x/1"), b"1")
    _fileio.write_bytes(s3.uri("t/x/y/2"), b"2")
    _fileio.remove_tree(s3.uri("t/x"))
    _fileio.remove_tree(s3.uri("t/nothing"))  # nothing there: nothing happens
    _fileio.remove_file(s3.uri("logs/run.jsonl"))
    _fileio.remove_file(s3.uri("logs/none"))
    assert [k for k in s3.keys() if not k.endswith("/")] == []


def test_throttled_and_dropped_writes_are_retried_whole(s3):
    s3.proxy.fail_next("503", 1, method="PUT")
    s3.proxy.fail_next("drop", 1, method="PUT")
    _fileio.write_bytes(s3.uri("x.bin"), b"again")
    assert s3.get_bytes("x.bin") == b"again"
    assert s3.proxy.injected == 2


def test_a_store_that_keeps_failing_a_write_gives_an_error_naming_the_object(s3, monkeypatch):
    monkeypatch.setenv("TNREC_IO_ATTEMPTS", "3")
    s3.proxy.fail_always("503", method="PUT")
    with pytest.raises(WriteError, match=rf"Cannot write s3://{s3.bucket}/x.bin: .*3 attempts"):
        _fileio.write_bytes(s3.uri("x.bin"), b"x")
    f = _fileio.StreamFile(s3.uri("y.bin"))
    f.write(b"y")
    with pytest.raises(WriteError, match=rf"Cannot write s3://{s3.bucket}/y.bin"):
        f.close()
    assert s3.proxy.requests["PUT"] == 6  # 3 attempts each, no more
    s3.proxy.clear()
    assert s3.keys() == []  # nothing half-written
