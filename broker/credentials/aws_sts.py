"""kind = "aws_sts": per call, `AssumeRole` on the configured role with an inline
session policy naming exactly the request's actions and object ARNs, for the shortest
duration STS allows, with `SourceIdentity` and session tags naming the request.

    [credentials.s3-writer]
    kind = "aws_sts"
    role_arn = "arn:aws:iam::123456789012:role/broker-s3"
    region = "eu-west-1"
    endpoint_url = "https://sts.eu-west-1.amazonaws.com"   # optional
    access_key_id_env = "BROKER_AWS_KEY_ID"                # the broker's own identity,
    secret_access_key_env = "BROKER_AWS_SECRET"            # allowed only sts:AssumeRole
    duration = 900                                         # seconds, 900 (the least) to 3600
    timeout = 10                                           # the call's deadline

STS session credentials cannot be revoked one by one: `revoke` does nothing, and the
credential lives `duration` seconds (docs/credentials.md says what that allows).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from broker.errors import ConfigError, CredentialRefused
from broker.grants import Grant, Scope
from broker.settings import Settings

SECRETS = ("access_key_id", "secret_access_key", "session_token")
KEYS = frozenset(
    {"kind", "role_arn", "region", "endpoint_url", "duration", "timeout"}
    | {f"{s}_{how}" for s in SECRETS for how in ("env", "file")}
)
READ_ACTIONS = (
    "s3:GetBucketVersioning",
    "s3:GetObject",
    "s3:GetObjectVersion",
    "s3:ListBucketVersions",
)
_UNSAFE = re.compile(r"[^\w+=,.@-]")
_lock = threading.Lock()
_session: list[Any] = []  # one boto3 session: a client from it costs ms, a new one ~100 ms


class AssumeRole:
    """Role sessions narrowed by an inline policy to one request's objects and actions."""

    kind = "aws_sts"

    def __init__(self, settings: Settings) -> None:
        where = settings.where
        settings.only(KEYS)
        role = settings.get("role_arn")
        if not isinstance(role, str) or not role.startswith("arn:"):
            raise ConfigError(f"{where}.role_arn: the role's ARN (arn:aws:iam::…:role/…)")
        duration = settings.get("duration", 900)
        if (
            not isinstance(duration, int)
            or isinstance(duration, bool)
            or not 900 <= duration <= 43200
        ):
            raise ConfigError(f"{where}.duration: whole seconds, 900 (STS's least) or more")
        self.settings = settings
        self.role = role
        self.duration = duration
        self.timeout = float(settings.get("timeout", 10))
        self.name = f"aws_sts:{where.removeprefix('credentials.')}"

    def policy(self, scope: Scope) -> dict[str, Any]:
        """The inline session policy: the scope's actions on its resources, reads on `read`."""
        statements = [
            {"Effect": "Allow", "Action": list(scope.actions), "Resource": list(scope.resources)}
        ]
        if scope.read:
            statements.append(
                {"Effect": "Allow", "Action": list(READ_ACTIONS), "Resource": list(scope.read)}
            )
        return {"Version": "2012-10-17", "Statement": statements}

    def mint(self, scope: Scope, ref: str) -> Grant:
        if scope.service != "aws" or not scope.resources or not scope.actions:
            raise CredentialRefused("failed: an STS session is minted for named AWS resources only")
        where, digest = ref.rsplit(" ", 1) if " " in ref else (ref, "")
        identity = _UNSAFE.sub("-", f"broker-{where}")[:64]
        tags = [
            {"Key": "broker-request", "Value": where[:256]},
            {"Key": "broker-sha256", "Value": digest or "-"},
        ]
        try:
            answer = self._sts().assume_role(
                RoleArn=self.role,
                RoleSessionName=_UNSAFE.sub("-", f"{where}-{digest}")[:64],
                Policy=json.dumps(self.policy(scope), separators=(",", ":")),
                DurationSeconds=self.duration,
                SourceIdentity=identity,
                Tags=tags,
            )
        except Exception as exc:  # botocore's ClientError, its connection and read timeouts
            raise CredentialRefused(_refusal(exc, self.role)) from exc
        creds = answer["Credentials"]
        values = {
            "access_key_id": creds["AccessKeyId"],
            "secret_access_key": creds["SecretAccessKey"],
            "session_token": creds["SessionToken"],
        }
        session = answer["AssumedRoleUser"]["Arn"]
        return Grant(scope, self.name, session, creds["Expiration"].isoformat(), values)

    def revoke(self, grant: Grant) -> None:
        """STS cannot end one session early; it expires at `expires_at`."""

    def _sts(self) -> Any:
        import boto3
        from botocore.config import Config as BotoConfig

        try:
            key_id, secret, token = (self.settings.secret(s) for s in SECRETS)
        except ConfigError as exc:
            raise CredentialRefused(
                f"failed: the broker's AWS identity is unavailable ({exc}); ask the operator"
            ) from exc
        config = BotoConfig(
            connect_timeout=self.timeout,
            read_timeout=self.timeout,
            retries={"total_max_attempts": 1},
        )
        with _lock:  # a boto3 session is not safe to share between threads unlocked
            if not _session:
                _session.append(boto3.session.Session())
            return _session[0].client(
                "sts",
                endpoint_url=self.settings.get("endpoint_url"),
                config=config,
                region_name=self.settings.get("region"),
                aws_access_key_id=key_id,
                aws_secret_access_key=secret,
                aws_session_token=token,
            )


def _refusal(exc: Exception, role: str) -> str:
    from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

    if isinstance(exc, ReadTimeoutError | ConnectTimeoutError):
        return (
            f"failed: STS did not answer in time for {role}; nothing was applied; try again later"
        )
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "?")
        return (
            f"failed: STS refused to assume {role} for this request ({code}); ask the operator; "
            "nothing was applied"
        )
    name = type(exc).__name__
    return f"failed: STS could not be reached ({name}); nothing was applied; try again later"
