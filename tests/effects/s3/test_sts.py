"""kind = "aws_sts": one AssumeRole per call, narrowed by an inline session policy.

Stand-in: moto in server mode (the session's server, on 127.0.0.1). What moto cannot
show: it does not intersect a session policy with the role's (an assumed role's
credentials may do anything there, with or without its IAM enforcement), and it keeps
neither SourceIdentity nor session tags; so the policy is read back from moto's STS
backend, the identity and tags from the AssumeRole call as botocore sends it, and what
the policy allows on AWS is asserted by its text, not by a refusal.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from broker.credentials.aws_sts import AssumeRole
from broker.errors import CredentialRefused
from broker.grants import Grants, Scope
from broker.settings import Settings
from broker.testing import make_context
from tests.effects.conftest import S3_VERSIONED
from tests.effects.s3.support import PUT, put, read

ROLE = "arn:aws:iam::123456789012:role/broker-s3"
OBJECT = "arn:aws:s3:::reports/2026/q4.csv"
REF = "box/req-7 0123456789ab"


@pytest.fixture
def sts_settings(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """[credentials.s3-writer] for moto; the broker's own identity in the environment."""
    monkeypatch.setenv("TEST_BROKER_STS_KEY", "broker-key-id")
    monkeypatch.setenv("TEST_BROKER_STS_SECRET", "broker-secret")
    table = {
        "kind": "aws_sts",
        "role_arn": ROLE,
        "region": "us-east-1",
        "endpoint_url": s3_endpoint,
        "access_key_id_env": "TEST_BROKER_STS_KEY",
        "secret_access_key_env": "TEST_BROKER_STS_SECRET",
    }
    return Settings(table, "credentials.s3-writer")


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The AssumeRole parameters as botocore sends them."""
    calls: list[dict[str, Any]] = []
    made = AssumeRole._sts

    def recording(self: AssumeRole) -> Any:
        client = made(self)
        client.meta.events.register(
            "provide-client-params.sts.AssumeRole", lambda params, **_: calls.append(params)
        )
        return client

    monkeypatch.setattr(AssumeRole, "_sts", recording)
    yield calls


def test_the_session_policy_names_the_object_and_the_actions_only(
    sts_settings: Settings, sent: list[dict[str, Any]]
) -> None:
    """moto: the recorded policy allows s3:PutObject on one ARN; a copy's source read-only."""
    from moto.sts.models import sts_backends

    scope = Scope("aws", (OBJECT,), ("s3:PutObject",), read=("arn:aws:s3:::raw/in.csv",))
    grant = AssumeRole(sts_settings).mint(scope, REF)
    (call,) = sent
    assert call["DurationSeconds"] == 900
    assert call["SourceIdentity"] == "broker-box-req-7"
    assert {"Key": "broker-sha256", "Value": "0123456789ab"} in call["Tags"]
    recorded = next(
        r
        for backend in sts_backends.values()
        for partition in backend.values()
        for r in partition.assumed_roles
        if r.access_key_id == grant.values["access_key_id"]
    )
    assert json.loads(recorded.policy) == {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:PutObject"], "Resource": [OBJECT]},
            {
                "Effect": "Allow",
                "Action": [
                    "s3:GetBucketVersioning",
                    "s3:GetObject",
                    "s3:GetObjectVersion",
                    "s3:ListBucketVersions",
                ],
                "Resource": ["arn:aws:s3:::raw/in.csv"],
            },
        ],
    }
    assert grant.id.endswith(":assumed-role/broker-s3/box-req-7-0123456789ab")
    assert grant.summary(None)["scope"] == (
        f"aws: {OBJECT} only; s3:PutObject; read-only arn:aws:s3:::raw/in.csv"
    )


def test_the_minted_session_reaches_s3(sts_settings: Settings, s3_endpoint: str) -> None:
    """moto: the session's credentials are accepted by moto's S3 (which does not narrow them)."""
    grant = AssumeRole(sts_settings).mint(Scope("aws", (OBJECT,), ("s3:PutObject",)), REF)
    s3 = boto3.session.Session(
        aws_access_key_id=grant.values["access_key_id"],
        aws_secret_access_key=grant.values["secret_access_key"],
        aws_session_token=grant.values["session_token"],
        region_name="us-east-1",
    ).client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="sts-narrowed")
    s3.put_object(Bucket="sts-narrowed", Key="k", Body=b"x")


def test_an_unreachable_sts_fails_closed(sts_settings: Settings) -> None:
    """No server: a closed loopback port; the call fails, saying nothing was applied."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    table = {**sts_settings, "endpoint_url": f"http://127.0.0.1:{port}"}
    grants = Grants(lambda: AssumeRole(Settings(table, "credentials.s3-writer")), REF)
    with pytest.raises(CredentialRefused, match="nothing was applied"):
        grants.credential(Scope("aws", (OBJECT,), ("s3:PutObject",)))
    assert grants.close() == []


def test_a_silent_sts_hits_the_deadline(sts_settings: Settings) -> None:
    """A loopback listener that never answers: timeout = 1 ends the call."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        table = {**sts_settings, "endpoint_url": f"http://127.0.0.1:{port}", "timeout": 1}
        provider = AssumeRole(Settings(table, "credentials.s3-writer"))
        with pytest.raises(CredentialRefused, match="did not answer in time"):
            provider.mint(Scope("aws", (OBJECT,), ("s3:PutObject",)), REF)


def test_a_put_applies_with_a_session_for_its_object_only(
    tmp_path: Any, sts_settings: Settings, s3_settings: dict[str, Any], s3_client: Any
) -> None:
    """moto: s3.put_object with credential = "s3-writer": one AssumeRole for the apply,
    its policy naming the object (and its bucket's versions), the write applied."""
    from moto.sts.models import sts_backends

    table = {k: v for k, v in s3_settings.items() if not k.endswith("_env")}
    ctx = make_context(
        {**table, "credential": "s3-writer"},
        integration="s3",
        state_dir=tmp_path,
        credentials={"s3-writer": dict(sts_settings)},
    )
    PUT.apply(put(S3_VERSIONED, "minted.txt", "hello"), ctx)
    assert ctx.grants is not None
    (used,) = ctx.grants.close()
    assert read(s3_client, S3_VERSIONED, "minted.txt") == b"hello"
    assert used["scope"].startswith(f"aws: arn:aws:s3:::{S3_VERSIONED}/minted.txt, ")
    assert "s3:PutObject" in used["scope"] and "s3:DeleteObject" not in used["scope"]
    session = used["id"].rsplit("/", 1)[1]
    (role,) = [
        r
        for backend in sts_backends.values()
        for partition in backend.values()
        for r in partition.assumed_roles
        if r.session_name == session
    ]
    statement = json.loads(role.policy)["Statement"][0]
    assert statement["Resource"] == [
        f"arn:aws:s3:::{S3_VERSIONED}/minted.txt",
        f"arn:aws:s3:::{S3_VERSIONED}",
    ]
