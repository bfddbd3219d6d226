"""The edge: botocore's exceptions and S3's error codes become EffectFailed, in words
an agent can act on; `Op` says what the handler was doing.

botocore is imported when a call is made or its exception translated, not with this
module: listing effects, loading a policy or starting a broker never pays for it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from broker.errors import EffectFailed

if TYPE_CHECKING:
    from botocore.exceptions import BotoCoreError, ClientError


@dataclass(frozen=True)
class Op:
    """What the handler was doing when S3 or botocore failed: the words of the reason."""

    doing: str
    bucket: str
    key: str = ""
    write: bool = False
    conflict: str | None = None  # the reason for a 412 on a conditional request
    endpoint: str = "the AWS S3 endpoint"

    @property
    def target(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"bucket {self.bucket}"


_UNAVAILABLE = (
    "failed: S3 is unavailable or busy ({code}) while {doing}; send the request again later"
)
_CREDENTIALS = (
    "failed: S3 refused the host's credentials ({code}) while {doing}; "
    "ask the operator to check [integrations.s3]"
)
_DENIED = (
    "failed: the host's S3 credentials may not do this ({doing}); write somewhere else, "
    "or ask the operator to grant it"
)
# S3 error code → reason; `{conflict}` is the sentence the condition's owner wrote.
REASONS: dict[str, str] = {
    "PreconditionFailed": "{conflict}",
    "ConditionalRequestConflict": (
        "failed: another write to {target} happened at the same moment; send the request again"
    ),
    "NoSuchBucket": "failed: bucket {bucket} does not exist on the host's S3; check its name",
    "NoSuchKey": "failed: {target} does not exist",
    "NoSuchVersion": "failed: that version of {target} no longer exists",
    "AccessDenied": _DENIED,
    "AllAccessDisabled": _DENIED,
    "InvalidAccessKeyId": _CREDENTIALS,
    "SignatureDoesNotMatch": _CREDENTIALS,
    "ExpiredToken": _CREDENTIALS,
    "InvalidToken": _CREDENTIALS,
    "EntityTooLarge": "failed: the object is too large for one upload to {target}",
    "InvalidObjectState": "failed: {target} is archived; it cannot be used until it is restored",
    "MethodNotAllowed": (
        "failed: S3 does not allow this on {target} ({message}); an object lock may be in the way"
    ),
    "SlowDown": _UNAVAILABLE,
    "ServiceUnavailable": _UNAVAILABLE,
    "InternalError": _UNAVAILABLE,
    "RequestTimeout": _UNAVAILABLE,
}
# HEAD answers carry no body: their code is the bare HTTP status.
_STATUS_CODES = {
    "412": "PreconditionFailed",
    "404": "NoSuchKey",
    "403": "AccessDenied",
    "500": "InternalError",
    "503": "ServiceUnavailable",
}
_MAYBE = (
    "failed: S3 did not answer while {doing}; the change may or may not have been made: "
    "check before sending the request again"
)


@cache
def botocore_reasons() -> tuple[tuple[type[BotoCoreError], str], ...]:
    """botocore's exceptions the handlers meet, most specific first, with their reasons."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import (
        HTTPClientError,
        NoCredentialsError,
        ParamValidationError,
        PartialCredentialsError,
        ReadTimeoutError,
    )

    return (
        (
            NoCredentialsError,
            "failed: the host has no S3 credentials; ask the operator to set "
            "[integrations.s3] access_key_id_env and secret_access_key_env",
        ),
        (
            PartialCredentialsError,
            "failed: the host's S3 credentials are incomplete; ask the operator to check "
            "[integrations.s3]",
        ),
        (
            ReadTimeoutError,
            "failed: S3 did not answer in time while {doing}; send the request again",
        ),
        (
            HTTPClientError,
            "failed: the connection to S3 broke while {doing}; send the request again",
        ),
        (
            BotoConnectionError,
            "failed: cannot reach S3 at {endpoint} while {doing} ({name}); try again later",
        ),
        (ParamValidationError, "failed: the S3 client refused the parameters while {doing}"),
    )


def error_code(exc: ClientError) -> str:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return _STATUS_CODES.get(code, code)


def translate(exc: ClientError | BotoCoreError, op: Op) -> EffectFailed:
    """An EffectFailed whose reason says what happened in words an agent can act on."""
    from botocore.exceptions import ClientError, HTTPClientError

    words = {
        "doing": op.doing,
        "target": op.target,
        "bucket": op.bucket,
        "endpoint": op.endpoint,
        "conflict": op.conflict
        or f"failed: {op.target} no longer meets the request's condition (HTTP 412)",
    }
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == "NoSuchKey" and op.conflict:
            code = "PreconditionFailed"  # If-Match on a key that is gone
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        message = str(exc.response.get("Error", {}).get("Message", ""))[:200]
        template = REASONS.get(
            code, "failed: S3 answered {code} (HTTP {status}) while {doing}: {message}"
        )
        return EffectFailed(template.format(code=code, status=status, message=message, **words))
    if op.write and isinstance(exc, HTTPClientError):  # the request may have been served
        return EffectFailed(_MAYBE.format(**words))
    for kind, template in botocore_reasons():
        if isinstance(exc, kind):
            return EffectFailed(template.format(name=type(exc).__name__, **words))
    return EffectFailed(
        f"failed: the S3 client failed while {op.doing} ({type(exc).__name__}); "
        "send the request again later, or ask the operator"
    )


@contextmanager
def edge(op: Op) -> Iterator[None]:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, op) from exc
