"""boto3 clients for the host's settings and credentials (from `ctx.secret`): a reader
that retries, and a writer that never does."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from broker.errors import ConfigError, EffectFailed
from effects.base import Context
from effects.s3.settings import SECRETS

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@lru_cache(maxsize=8)
def _make_clients(
    endpoint: str | None,
    region: str | None,
    style: str,
    key_id: str | None,
    secret: str | None,
    token: str | None,
) -> tuple[S3Client, S3Client]:
    import boto3  # here, not at import: a start that serves no S3 request never loads it
    from botocore.config import Config as BotoConfig

    session = boto3.session.Session(
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=token,
        region_name=region,
    )

    def make(attempts: int) -> S3Client:
        s3_options: Any = {"addressing_style": style}
        config = BotoConfig(
            connect_timeout=5,
            read_timeout=60,
            retries={"mode": "standard", "total_max_attempts": attempts},
            s3=s3_options,
        )
        return session.client("s3", endpoint_url=endpoint, config=config)

    # Writes are never retried by botocore: a retried conditional write that had in
    # fact succeeded would come back as a 412 and be reported as a conflict.
    return make(3), make(1)


def clients(ctx: Context) -> tuple[S3Client, S3Client]:
    """(reader, writer) for this host's settings; the writer never retries."""
    settings = ctx.settings
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
