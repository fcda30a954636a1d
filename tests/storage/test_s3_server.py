"""The S3 test server itself: moto behind the fault proxy, driven by pyarrow and boto3.

These pin down what the storage tests rely on: objects round-trip through the proxy
(multipart uploads with chunked bodies and ``Expect: 100-continue`` included), each
fault reaches the client as S3 would send it, the counters see every attempt — and
which faults pyarrow's own retry strategy absorbs, so a tnrec test can tell pyarrow's
retries from tnrec's.
"""

from __future__ import annotations

import os
import time

import boto3
import pytest
from botocore.exceptions import ClientError
from pyarrow import fs as pafs

from tests.storage.s3_server import DROP, SLOW, SLOWDOWN, FaultProxy

MB = 1 << 20


def _write(fs: pafs.S3FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as f:
        f.write(data)


def _read(fs: pafs.S3FileSystem, path: str) -> bytes:
    with fs.open_input_file(path) as f:
        return f.read()


@pytest.mark.parametrize(
    "size_bytes, puts", [(12 * MB, 2), (5, 1)], ids=["12MB-multipart", "5-bytes"]
)
def test_pyarrow_writes_and_reads_back_through_the_proxy(s3, size_bytes, puts):
    data = os.urandom(size_bytes)
    fs = s3.fs()
    _write(fs, f"{s3.bucket}/dir/obj.bin", data)
    # pyarrow 26 always uploads in parts: create, one PUT per part (10 MB parts), complete
    assert s3.proxy.requests == {"POST": 2, "PUT": puts}
    assert s3.keys() == ["dir/obj.bin"]
    assert s3.get_bytes("dir/obj.bin") == data  # what moto stores, read around the proxy
    assert _read(fs, f"{s3.bucket}/dir/obj.bin") == data
    assert s3.proxy.injected == 0


def test_the_fixture_points_a_default_client_and_from_uri_at_the_proxy(s3):
    assert os.environ["TNREC_S3_ENDPOINT"] == s3.endpoint == os.environ["AWS_ENDPOINT_URL_S3"]
    assert s3.uri("/a/b.parquet") == f"s3://{s3.bucket}/a/b.parquet"
    boto3.client("s3").put_object(Bucket=s3.bucket, Key="k", Body=b"abc")  # env only
    fs, path = pafs.FileSystem.from_uri(s3.uri("k"))  # reads AWS_ENDPOINT_URL_S3
    assert path == f"{s3.bucket}/k"
    assert _read(fs, path) == b"abc"
    assert s3.proxy.requests == {"PUT": 1, "HEAD": 1, "GET": 1}


def test_rules_match_method_and_path_and_a_503_to_head_keeps_the_connection(s3):
    s3.put_bytes("a/x", b"x")
    client = s3.proxied_client()  # no retries: every fault reaches the test
    s3.proxy.fail_next(SLOWDOWN, 2, method="HEAD", path_contains="a/x")
    with pytest.raises(ClientError, match=r"\(503\).*HeadObject"):
        client.head_object(Bucket=s3.bucket, Key="a/x")
    assert client.get_object(Bucket=s3.bucket, Key="a/x")["Body"].read() == b"x"  # not HEAD
    with pytest.raises(ClientError, match=r"\(503\)"):
        client.head_object(Bucket=s3.bucket, Key="a/x")
    assert s3.proxy.pending == 0  # both used up
    assert client.head_object(Bucket=s3.bucket, Key="a/x")["ContentLength"] == 1
    s3.proxy.fail_next(SLOWDOWN, method="GET")
    with pytest.raises(ClientError, match=r"\(SlowDown\).*Please reduce your request rate"):
        client.get_object(Bucket=s3.bucket, Key="a/x")
    assert s3.proxy.requests == {"HEAD": 3, "GET": 2}
    assert s3.proxy.injected_by_kind == {SLOWDOWN: 3}
    # a 503 to a HEAD carries no body, so keep-alive framing holds: one connection for all
    assert s3.proxy.connections == 1
    assert [seen.fault for seen in s3.proxy.log] == [SLOWDOWN, None, SLOWDOWN, None, SLOWDOWN]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: p.fail_next("reset"), r"`kind` must be one of .*Received: kind='reset'"),
        (lambda p: p.fail_always("404"), r"`kind` must be one of .*Received: kind='404'"),
        (lambda p: p.fail_next(DROP, 0), r"`count` must be a positive int. Received: count=0"),
    ],
    ids=["unknown-kind", "unknown-kind-always", "zero-count"],
)
def test_a_bad_rule_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call(FaultProxy(("127.0.0.1", 9)))


@pytest.mark.parametrize(
    "max_attempts, gets", [(3, 2), (1, 1)], ids=["3-attempts-retried", "1-attempt-fails"]
)
def test_pyarrow_retries_a_503_on_get_by_itself(s3, max_attempts, gets):
    data = os.urandom(64 * 1024)
    s3.put_bytes("obj", data)
    s3.proxy.fail_next(SLOWDOWN, 1, method="GET")
    fs = s3.fs(max_attempts=max_attempts)
    if max_attempts == 1:
        # The AWS SDK names the 503 by the error body's code when it has read it
        # (SLOW_DOWN) and by the HTTP status otherwise (SERVICE_UNAVAILABLE): both occur.
        with pytest.raises(OSError, match="(SERVICE_UNAVAILABLE|SLOW_DOWN) during GetObject"):
            _read(fs, f"{s3.bucket}/obj")
    else:
        assert _read(fs, f"{s3.bucket}/obj") == data
    assert s3.proxy.injected == 1
    assert s3.proxy.requests == {"HEAD": 1, "GET": gets}


def test_pyarrow_gives_up_on_a_503_whose_body_outgrows_the_read(s3):
    # A canary for tnrec's own retries: pyarrow reads a range into a buffer of the
    # range's size; S3's error body (~250 bytes) does not fit in a 5-byte read, the SDK
    # reports INTERNAL_FAILURE instead of SlowDown, and that is not retried.
    s3.put_bytes("tiny", b"hello")
    s3.proxy.fail_next(SLOWDOWN, 1, method="GET")
    with pytest.raises(OSError, match="INTERNAL_FAILURE.*Failed to flush response stream"):
        _read(s3.fs(max_attempts=3), f"{s3.bucket}/tiny")
    assert s3.proxy.requests == {"HEAD": 1, "GET": 1}


def test_a_fault_that_persists_fails_naming_the_key_then_clears(s3):
    s3.put_bytes("day/part-0.parquet", b"p" * 1000)
    s3.proxy.fail_always(SLOWDOWN, path_contains="part-0")
    fs = s3.fs(max_attempts=3)
    with pytest.raises(OSError, match=rf"key 'day/part-0.parquet' in bucket '{s3.bucket}'"):
        _read(fs, f"{s3.bucket}/day/part-0.parquet")
    assert s3.proxy.injected == 3  # max_attempts counts the first try
    assert s3.proxy.pending == 1
    s3.proxy.clear()
    assert _read(fs, f"{s3.bucket}/day/part-0.parquet") == b"p" * 1000


@pytest.mark.parametrize(
    "max_attempts", [3, 1], ids=["3-attempts-retried", "1-attempt-fails-nothing-stored"]
)
def test_pyarrow_retries_a_put_whose_connection_drops(s3, max_attempts):
    s3.proxy.fail_next(DROP, 1, method="PUT")
    fs = s3.fs(max_attempts=max_attempts)
    if max_attempts == 1:
        with pytest.raises(OSError, match=r"key 'out.bin'.*Empty reply from server"):
            _write(fs, f"{s3.bucket}/out.bin", b"payload")
        assert s3.keys() == []
    else:
        _write(fs, f"{s3.bucket}/out.bin", b"payload")
        assert s3.get_bytes("out.bin") == b"payload"
        assert s3.proxy.requests["PUT"] == 2  # the part, twice
    assert s3.proxy.injected_by_kind == {DROP: 1}


def test_a_slow_response_arrives_late_and_intact(s3):
    s3.put_bytes("obj", b"s" * 1000)
    s3.proxy.fail_next(SLOW, 1, method="GET", delay_ms=300)
    started = time.monotonic()
    assert _read(s3.fs(), f"{s3.bucket}/obj") == b"s" * 1000
    # a lower bound the proxy itself guarantees, not a speed expectation
    assert time.monotonic() - started >= 0.3
    assert s3.proxy.injected_by_kind == {SLOW: 1}
    assert s3.proxy.requests == {"HEAD": 1, "GET": 1}


@pytest.mark.parametrize("max_attempts", [2, 1], ids=["2-attempts-retried", "1-attempt-times-out"])
def test_a_response_slower_than_the_request_timeout_is_retried(s3, max_attempts):
    # On Linux the SDK's request_timeout is curl's low-speed limit (under 1 byte/s for
    # that long): a response that waits longer is abandoned and, if attempts are left,
    # retried like a dropped connection.
    s3.put_bytes("obj", b"t" * 1000)
    s3.proxy.fail_next(SLOW, 1, method="GET", delay_ms=1500)
    fs = s3.fs(max_attempts=max_attempts, request_timeout=0.5)
    if max_attempts == 1:
        with pytest.raises(OSError, match="Timeout was reached"):
            _read(fs, f"{s3.bucket}/obj")
    else:
        assert _read(fs, f"{s3.bucket}/obj") == b"t" * 1000
    assert s3.proxy.requests == {"HEAD": 1, "GET": max_attempts}
