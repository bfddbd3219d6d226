"""Fixtures for handler tests against real local servers; the S3 ones are named s3_*."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

S3_KEY_ID_ENV = "TEST_BROKER_S3_KEY_ID"
S3_SECRET_ENV = "TEST_BROKER_S3_SECRET"
S3_VERSIONED = "versioned-scratch"
S3_PLAIN = "plain-scratch"
S3_REPORTS = "reports"
S3_OUTSIDE = "not-allowed"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1, on a free port, for the whole session."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_settings(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """[integrations.s3] for the moto server; fake credentials only in the environment."""
    monkeypatch.setenv(S3_KEY_ID_ENV, "testing-key-id")
    monkeypatch.setenv(S3_SECRET_ENV, "testing-secret-key")
    return {
        "endpoint_url": s3_endpoint,
        "region": "us-east-1",
        "access_key_id_env": S3_KEY_ID_ENV,
        "secret_access_key_env": S3_SECRET_ENV,
        "allow": [f"{S3_VERSIONED}/*", f"{S3_PLAIN}/*", f"{S3_REPORTS}/out/*"],
    }


@pytest.fixture(scope="session")
def s3_session_client(s3_endpoint: str) -> S3Client:
    """One boto3 client for the session's setup and checks (building one is slow)."""
    return boto3.session.Session(
        aws_access_key_id="testing-key-id",
        aws_secret_access_key="testing-secret-key",
        region_name="us-east-1",
    ).client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
def s3_client(
    s3_endpoint: str, s3_session_client: S3Client, s3_settings: dict[str, Any]
) -> S3Client:
    """A fresh server for the test: a versioned bucket and three plain ones."""
    reset = urllib.request.Request(f"{s3_endpoint}/moto-api/reset", method="POST")
    with urllib.request.urlopen(reset, timeout=10):
        pass
    for bucket in (S3_VERSIONED, S3_PLAIN, S3_REPORTS, S3_OUTSIDE):
        s3_session_client.create_bucket(Bucket=bucket)
    s3_session_client.put_bucket_versioning(
        Bucket=S3_VERSIONED, VersioningConfiguration={"Status": "Enabled"}
    )
    return s3_session_client
