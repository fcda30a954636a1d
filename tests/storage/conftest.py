"""Fixtures for tests that run against a real S3 server on 127.0.0.1 (see ``s3_server.py``).

``s3_server`` starts moto's standalone server and the fault-injecting proxy once per
session; ``s3`` gives each test its own bucket, no fault rules, fresh proxy counters
and the environment an S3 client reads, all pointing at the proxy.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.storage.s3_server import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    FaultProxy,
    S3Server,
    boto3_s3,
    pyarrow_s3,
    unique_bucket_name,
)


@dataclasses.dataclass
class S3Bucket:
    """One test's bucket on the S3 server: where it is, and how to look inside it."""

    bucket: str
    endpoint: str  # the proxy: ``http://127.0.0.1:PORT``
    proxy: FaultProxy
    client: Any  # boto3 S3 client straight to moto: inspects what is stored, never faulted

    def uri(self, path: str = "") -> str:
        """``s3://<bucket>/<path>``."""
        return f"s3://{self.bucket}/{path.lstrip('/')}"

    def fs(self, max_attempts: int = 3, **kwargs: Any) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` through the proxy (paths are ``<bucket>/<key>``)."""
        return pyarrow_s3(self.endpoint, max_attempts=max_attempts, **kwargs)

    def proxied_client(self, max_attempts: int = 1) -> Any:
        """A boto3 S3 client through the proxy; by default it never retries."""
        return boto3_s3(self.endpoint, max_attempts=max_attempts)

    def keys(self, prefix: str = "") -> list[str]:
        """Every key stored under ``prefix``, sorted."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def get_bytes(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server and the fault proxy on 127.0.0.1, for the whole session."""
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Bucket]:
    """A fresh bucket, no fault rules, and an S3 environment that points at the proxy."""
    assert s3_server.proxy is not None
    endpoint = s3_server.endpoint
    environment = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "TNREC_S3_ENDPOINT": endpoint,
        # Never reach for the EC2 metadata service or a developer's ~/.aws: only
        # 127.0.0.1 is there to talk to.
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    name = unique_bucket_name()
    s3_server.create_bucket(name)
    s3_server.proxy.clear()
    yield S3Bucket(name, endpoint, s3_server.proxy, s3_server.client())
    s3_server.proxy.clear()
    s3_server.delete_bucket(name)
