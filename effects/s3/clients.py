"""boto3 clients for the host's settings and credentials (from `ctx.secret`): a reader
that retries, and a writer that never does."""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from broker.errors import ConfigError, EffectFailed
from effects.base import Context, Scope
from effects.s3.settings import SECRETS

READS = ("s3:GetBucketVersioning", "s3:GetObject", "s3:GetObjectVersion", "s3:ListBucketVersions")
"""What observing an object takes (read_state): its bucket's versioning, head, versions."""
PUT = ("s3:PutObject",)
DELETE = ("s3:DeleteObject", "s3:DeleteObjectVersion")

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


_shared_lock = threading.Lock()
_shared: list[Any] = []  # one boto3 session: its loader keeps the service models


@lru_cache(maxsize=8)
def _make_clients(
    endpoint: str | None,
    region: str | None,
    style: str,
    key_id: str | None,
    secret: str | None,
    token: str | None,
) -> tuple[S3Client, S3Client]:
    """The standing keys' clients, kept: made once per settings."""
    return _fresh_clients(endpoint, region, style, key_id, secret, token)


def _fresh_clients(
    endpoint: str | None,
    region: str | None,
    style: str,
    key_id: str | None,
    secret: str | None,
    token: str | None,
) -> tuple[S3Client, S3Client]:
    """Clients for these keys, made from the shared session: a few milliseconds, where
    a session of their own costs ~100 ms (it loads the service models again). A minted
    session's are made per call and kept by nobody once it ends."""
    import boto3  # here, not at import: a start that serves no S3 request never loads it
    from botocore.config import Config as BotoConfig

    def make(attempts: int) -> S3Client:
        s3_options: Any = {"addressing_style": style}
        config = BotoConfig(
            connect_timeout=5,
            read_timeout=60,
            retries={"mode": "standard", "total_max_attempts": attempts},
            s3=s3_options,
        )
        made: S3Client = _shared[0].client(
            "s3",
            endpoint_url=endpoint,
            config=config,
            region_name=region,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            aws_session_token=token,
        )
        return made

    with _shared_lock:  # a boto3 session is not safe to share between threads unlocked
        if not _shared:
            _shared.append(boto3.session.Session())
        # Writes are never retried by botocore: a retried conditional write that had in
        # fact succeeded would come back as a 412 and be reported as a conflict.
        return make(3), make(1)


def object_scope(
    bucket: str, key: str, writes: tuple[str, ...] = (), source: tuple[str, str] | None = None
) -> Scope:
    """One object (and its bucket, for versioning and versions), read or written; a
    copy's source read only."""
    arns = (f"arn:aws:s3:::{bucket}/{key}", f"arn:aws:s3:::{bucket}")
    read = (f"arn:aws:s3:::{source[0]}/{source[1]}", f"arn:aws:s3:::{source[0]}") if source else ()
    return Scope("aws", arns, tuple(sorted({*READS, *writes})), read=read)


def clients(ctx: Context, scope: Scope) -> tuple[S3Client, S3Client]:
    """(reader, writer) for this host's settings, with a session minted for `scope` when
    the integration names a provider (STS), else the host's standing keys; the writer
    never retries."""
    settings = ctx.settings
    grant = ctx.credential(scope)
    if grant is not None:  # never cached: the session's secrets end with the call
        return _fresh_clients(
            settings.get("endpoint_url"),
            settings.get("region"),
            settings.get("addressing_style", "auto"),
            *(grant.values[key] for key in SECRETS),
        )
    try:
        creds = [ctx.secret(key) for key in SECRETS]
    except ConfigError as exc:
        raise EffectFailed(
            f"failed: the host's S3 credentials are not available ({exc}); ask the operator"
        ) from exc
    return _make_clients(
        settings.get("endpoint_url"),
        settings.get("region"),
        settings.get("addressing_style", "auto"),
        *creds,
    )


def endpoint(ctx: Context) -> str:
    return str(ctx.settings.get("endpoint_url") or "the AWS S3 endpoint")
