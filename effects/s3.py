"""s3.put_object, s3.copy_object, s3.delete_object: objects in allow-listed buckets, undoable.

Settings, `[integrations.s3]`:

    allow = ["agent-scratch/*", "reports/out/*"]    # bucket/prefix*, or bucket/exact-key
    endpoint_url = "http://127.0.0.1:9000"          # optional: an S3-compatible server
    region = "eu-west-1"                            # optional
    access_key_id_env = "BROKER_S3_KEY_ID"          # optional, with secret_access_key_env
    secret_access_key_env = "BROKER_S3_SECRET"      # (or *_file); else boto3's own chain
    session_token_env = "BROKER_S3_TOKEN"           # optional
    addressing_style = "path"                       # optional: auto | path | virtual

Nothing outside `allow` is read or written, whatever a request says. Every write is
conditional: what the broker saw of the target when it classified the request
(`reversible_for`) and, for a request that waits for a person, when it computed the
preview, is kept under <state_dir>/s3/seen/ until the request is applied. `apply`
sends that state to S3 as If-Match (its ETag) or If-None-Match: * (it did not exist),
so S3 refuses a write to an object that changed since the approver saw it (412 →
`failed`). Without such a record the agent's `if_match`/`if_none_match`, else the
state read just before the write, is the condition, so `previous` in the output is
exact. moto ignores the destination conditions of CopyObject, so a copy also compares
before it sends them (AWS enforces them).

Undo (`revert_preview`, `revert`) is one delete: of the version a put or copy created
(the previous version is current again), of a new key in an unversioned bucket, or of
the delete marker a delete left. Anything else cannot be undone and says why.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import hashlib
import json
import logging
import os
import re
import time
import unicodedata
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from broker.config import resolve_secret
from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context, Handler

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CopySourceTypeDef

log = logging.getLogger(__name__)

SHOW_MAX = 256 * 1024  # larger objects are described, not shown or diffed
SEEN_MAX_AGE_S = 30 * 86400
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SECRETS = ("access_key_id", "secret_access_key", "session_token")
_STYLES = ("auto", "path", "virtual")
CONFIG_KEYS = frozenset(
    {"allow", "endpoint_url", "region", "addressing_style"}
    | {f"{s}_{how}" for s in _SECRETS for how in ("env", "file")}
)


# -- settings and the allowlist -------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """One `allow` entry: a bucket and a key prefix (`bucket/prefix*`) or one exact key."""

    bucket: str
    prefix: str
    exact: bool

    @classmethod
    def parse(cls, entry: Any, where: str) -> Grant:
        if not isinstance(entry, str) or "/" not in entry:
            raise ConfigError(
                f"{where}: {entry!r} is not 'bucket/prefix*' (write 'bucket/*' for a whole bucket)"
            )
        bucket, rest = entry.split("/", 1)
        if not _BUCKET.fullmatch(bucket):
            raise ConfigError(f"{where}: {bucket!r} is not an S3 bucket name")
        exact = not rest.endswith("*")
        prefix = rest if exact else rest[:-1]
        if (exact and not rest) or any(c in prefix for c in "*?[]"):
            raise ConfigError(f"{where}: {entry!r}: only one '*', at the very end, is understood")
        return cls(bucket, prefix, exact)

    def covers(self, bucket: str, key: str) -> bool:
        if bucket != self.bucket:
            return False
        return key == self.prefix if self.exact else key.startswith(self.prefix)

    def __str__(self) -> str:
        return f"{self.bucket}/{self.prefix}{'' if self.exact else '*'}"


def check_settings(settings: Mapping[str, Any]) -> None:
    """Refuse a broken [integrations.s3] at start, naming the key at fault."""
    for key in _SECRETS:
        if key in settings:
            raise ConfigError(
                f"integrations.s3.{key}: secrets are never written in broker.toml; "
                f"use {key}_env (an environment variable) or {key}_file (a file)"
            )
    unknown = sorted(set(settings) - CONFIG_KEYS)
    if unknown:
        raise ConfigError(
            f"integrations.s3.{unknown[0]}: unknown key (known: {', '.join(sorted(CONFIG_KEYS))})"
        )
    allow = settings.get("allow", [])
    if not isinstance(allow, list):
        raise ConfigError('integrations.s3.allow: must be a list like ["agent-scratch/*"]')
    for i, entry in enumerate(allow):
        Grant.parse(entry, f"integrations.s3.allow[{i}]")
    endpoint = settings.get("endpoint_url")
    if endpoint is not None and (
        not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://"))
    ):
        raise ConfigError(f"integrations.s3.endpoint_url: {endpoint!r} is not an http(s) URL")
    region = settings.get("region")
    if region is not None and (not isinstance(region, str) or not region.strip()):
        raise ConfigError(f"integrations.s3.region: {region!r} is not a region name")
    style = settings.get("addressing_style", "auto")
    if style not in _STYLES:
        raise ConfigError(f"integrations.s3.addressing_style: {style!r} is not one of {_STYLES}")
    found = {key: resolve_secret(settings, key, "integrations.s3") for key in _SECRETS}
    if bool(found["access_key_id"]) != bool(found["secret_access_key"]):
        raise ConfigError(
            "integrations.s3.secret_access_key_env: access_key_id_env and "
            "secret_access_key_env (or their *_file forms) go together"
        )


def _grants(settings: Mapping[str, Any]) -> list[Grant]:
    return [
        Grant.parse(e, f"integrations.s3.allow[{i}]")
        for i, e in enumerate(settings.get("allow") or [])
    ]


def check_key(key: str, pointer: str) -> None:
    """Refuse keys that some tool on the way could read as a path or a control sequence."""
    if any(unicodedata.category(c) == "Cc" for c in key):
        raise InvalidParams(pointer, "the key holds control characters", "bad_key")
    if key.startswith("/"):
        raise InvalidParams(pointer, "the key must not start with '/'", "bad_key")
    if any(part in (".", "..") for part in key.split("/")):
        raise InvalidParams(pointer, "the key must not hold '.' or '..' path segments", "bad_key")
    if len(key.encode("utf-8")) > 1024:
        raise InvalidParams(pointer, "the key is longer than S3's 1024 bytes", "bad_key")


def check_target(settings: Mapping[str, Any], bucket: str, key: str, field: str = "") -> None:
    """The key is well-formed and the allowlist covers it; else InvalidParams naming both."""
    bucket_ptr, key_ptr = f"/params/{field}bucket", f"/params/{field}key"
    check_key(key, key_ptr)
    grants = _grants(settings)
    if not any(g.bucket == bucket for g in grants):
        allowed = ", ".join(map(str, grants)) or "nothing ([integrations.s3] allow is empty)"
        message = f"bucket {bucket!r} is not allowed on this host; allowed: {allowed}"
        raise InvalidParams(bucket_ptr, message, "not_allowed")
    if not any(g.covers(bucket, key) for g in grants):
        mine = ", ".join(str(g) for g in grants if g.bucket == bucket)
        message = f"key {key!r} is outside what is allowed in bucket {bucket!r}: {mine}"
        raise InvalidParams(key_ptr, message, "not_allowed")


# -- errors at the edge --------------------------------------------------------------


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
BOTOCORE_REASONS: tuple[tuple[type[BotoCoreError], str], ...] = (
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
    (ReadTimeoutError, "failed: S3 did not answer in time while {doing}; send the request again"),
    (HTTPClientError, "failed: the connection to S3 broke while {doing}; send the request again"),
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
    for kind, template in BOTOCORE_REASONS:
        if isinstance(exc, kind):
            return EffectFailed(template.format(name=type(exc).__name__, **words))
    return EffectFailed(
        f"failed: the S3 client failed while {op.doing} ({type(exc).__name__}); "
        "send the request again later, or ask the operator"
    )


@contextmanager
def _edge(op: Op) -> Iterator[None]:
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, op) from exc


# -- clients -------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _make_clients(
    endpoint: str | None,
    region: str | None,
    style: str,
    key_id: str | None,
    secret: str | None,
    token: str | None,
) -> tuple[S3Client, S3Client]:
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


def _clients(ctx: Context) -> tuple[S3Client, S3Client]:
    """(reader, writer) for this host's settings; the writer never retries."""
    settings = ctx.settings
    try:
        creds = [ctx.secret(key) for key in _SECRETS]
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


def _endpoint(ctx: Context) -> str:
    return str(ctx.settings.get("endpoint_url") or "the AWS S3 endpoint")


# -- what the broker saw -------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """An object as the broker saw it: its bucket's versioning and its current version."""

    versioning: str  # Enabled | Suspended | off | unknown (the host may not read it)
    exists: bool
    etag: str | None = None
    version_id: str | None = None
    size: int | None = None
    content_type: str | None = None

    @property
    def versioned(self) -> bool:
        return self.versioning == "Enabled"

    def describe(self) -> str:
        if not self.exists:
            return "did not exist"
        version = f", version {self.version_id}" if self.version_id else ""
        return f"had ETag {self.etag}{version}"

    def brief(self) -> JSON:
        """What an output says about the object: enough to undo, nothing more."""
        if not self.exists:
            return {"exists": False}
        return {
            "exists": True,
            "etag": self.etag,
            "version_id": self.version_id,
            "bytes": self.size,
        }

    def to_json(self) -> JSON:
        return {**self.brief(), "versioning": self.versioning, "content_type": self.content_type}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> State:
        return cls(
            versioning=str(data["versioning"]),
            exists=bool(data["exists"]),
            etag=data.get("etag"),
            version_id=data.get("version_id"),
            size=data.get("bytes"),
            content_type=data.get("content_type"),
        )


def read_state(
    reader: S3Client, ctx: Context, bucket: str, key: str, version_id: str | None = None
) -> State:
    """The bucket's versioning and the key's current (or given) version, from S3."""
    op = Op(f"reading s3://{bucket}/{key}", bucket, key, endpoint=_endpoint(ctx))
    with _edge(op):
        versioning: str
        try:
            versioning = reader.get_bucket_versioning(Bucket=bucket).get("Status") or "off"
        except ClientError as exc:
            if error_code(exc) != "AccessDenied":
                raise
            versioning = "unknown"
        try:
            if version_id:
                head = reader.head_object(Bucket=bucket, Key=key, VersionId=version_id)
            else:
                head = reader.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) == "NoSuchKey":
                return State(versioning, exists=False)
            raise
    return State(
        versioning,
        exists=True,
        etag=head.get("ETag"),
        version_id=head.get("VersionId"),
        size=head.get("ContentLength"),
        content_type=head.get("ContentType"),
    )


def _latest(reader: S3Client, ctx: Context, bucket: str, key: str) -> tuple[str, bool] | None:
    """(version id, is a delete marker) of the key's latest version, or None."""
    op = Op(f"listing the versions of s3://{bucket}/{key}", bucket, key, endpoint=_endpoint(ctx))
    with _edge(op):
        listing = reader.list_object_versions(Bucket=bucket, Prefix=key)
    for entry in listing.get("Versions", []):
        if entry.get("Key") == key and entry.get("IsLatest"):
            return str(entry.get("VersionId")), False
    for marker in listing.get("DeleteMarkers", []):
        if marker.get("Key") == key and marker.get("IsLatest"):
            return str(marker.get("VersionId")), True
    return None


def _fetch(
    reader: S3Client, ctx: Context, bucket: str, key: str, state: State, version: str | None = None
) -> bytes | None:
    """The object's bytes when it is small enough to show, else None."""
    if not state.exists or state.size is None or state.size > SHOW_MAX:
        return None
    op = Op(f"reading s3://{bucket}/{key}", bucket, key, endpoint=_endpoint(ctx))
    with _edge(op):
        if version:
            got = reader.get_object(Bucket=bucket, Key=key, VersionId=version)
        else:
            got = reader.get_object(Bucket=bucket, Key=key)
        with got["Body"] as stream:
            return stream.read(SHOW_MAX + 1)


@dataclass(frozen=True)
class Seen:
    """What the broker observed about a request's objects, and at which stage."""

    stage: str  # "policy" (classified) | "approver" (the preview a person saw)
    target: State
    source: State | None = None

    @property
    def who(self) -> str:
        if self.stage == "approver":
            return "it was shown to the approver"
        return "the broker classified this request"


def _seen_path(ctx: Context) -> Path:
    name = f"{ctx.sandbox}\0{ctx.request_id}\0{ctx.request_sha256}".encode()
    return ctx.state_dir / "s3" / "seen" / f"{hashlib.sha256(name).hexdigest()}.json"


def remember(ctx: Context, seen: Seen) -> None:
    """Keep what was observed until apply; a failure only weakens apply's condition."""
    path = _seen_path(ctx)
    if seen.stage == "policy" and (kept := recall(ctx)) and kept.stage == "approver":
        return  # what a person saw outranks a later classification
    doc = {
        "stage": seen.stage,
        "target": seen.target.to_json(),
        "source": seen.source.to_json() if seen.source else None,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("s3: cannot keep what was observed for %s: %s", ctx.request_id, exc)
        return
    cutoff = time.time() - SEEN_MAX_AGE_S
    for old in path.parent.iterdir():  # observations of requests that were never applied
        with suppress(OSError):
            if old.stat().st_mtime < cutoff:
                old.unlink()


def recall(ctx: Context) -> Seen | None:
    try:
        doc = json.loads(_seen_path(ctx).read_text(encoding="utf-8"))
        source = doc.get("source")
        return Seen(
            doc["stage"],
            State.from_json(doc["target"]),
            State.from_json(source) if source else None,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def forget(ctx: Context) -> None:
    with suppress(OSError):
        _seen_path(ctx).unlink(missing_ok=True)


# -- conditions ----------------------------------------------------------------------


Condition = dict[str, str]  # {"IfMatch": etag} | {"IfNoneMatch": "*"} | {}


def _expect(state: State) -> Condition:
    return {"IfMatch": state.etag or "*"} if state.exists else {"IfNoneMatch": "*"}


def _unquote(etag: str | None) -> str:
    return (etag or "").strip().removeprefix("W/").strip('"')


def _holds(cond: Condition, state: State) -> bool:
    if "IfMatch" in cond:
        return state.exists and _unquote(cond["IfMatch"]) == _unquote(state.etag)
    if "IfNoneMatch" in cond:
        return not state.exists
    return True


def _agent_condition(params: Params) -> Condition:
    if "if_match" in params:
        return {"IfMatch": str(params["if_match"])}
    if params.get("if_none_match") == "*":
        return {"IfNoneMatch": "*"}
    return {}


def _words(cond: Condition) -> str:
    if "IfMatch" in cond:
        return f"if_match {cond['IfMatch']}"
    return "if_none_match: * (the key must not exist)"


def condition(target: str, params: Params, seen: Seen | None, now: State) -> tuple[Condition, str]:
    """The condition a write sends, and the reason given when S3 refuses it (412)."""
    agent = _agent_condition(params)
    if seen is not None and seen.target.versioned and not now.versioned:
        raise EffectFailed(
            f"failed: versioning of the bucket of {target} was turned off since {seen.who}; "
            "send the request again so that it is classified on the bucket as it is now"
        )
    # What a person approved, or what made an unversioned write reversible, must still hold.
    if seen is not None and (seen.stage == "approver" or not seen.target.versioned):
        was = seen.target
        if agent and not _holds(agent, was):
            raise EffectFailed(
                f"failed: the request's {_words(agent)} did not hold when {seen.who} "
                f"({target} {was.describe()}); send it again without that condition, or with "
                "one that matches"
            )
        return _expect(was), (
            f"failed: {target} changed since {seen.who} (then it {was.describe()}); "
            "send the request again to act on it as it is now"
        )
    if agent:
        return agent, (
            f"failed: {target} does not meet the request's {_words(agent)} "
            f"(it {now.describe()}); send the request again without it to replace the object, "
            "or write to another key"
        )
    return _expect(now), f"failed: {target} changed while the broker was writing it; send again"


# -- bodies and previews -------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    """The bytes a put writes: inline (body, body_b64) or a stored attachment."""

    data: bytes | None
    path: Path | None
    size: int
    sha256: str
    content_type: str

    @classmethod
    def of(cls, params: Params, ctx: Context) -> Body:
        if "body" in params:
            data = str(params["body"]).encode("utf-8")
            kind = "text/plain; charset=utf-8"
        elif "body_b64" in params:
            data = _b64(str(params["body_b64"]))
            kind = "application/octet-stream"
        else:
            path = _attachment(params, ctx)
            digest = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            return cls(
                None,
                path,
                path.stat().st_size,
                digest.hexdigest(),
                params.get("content_type") or "application/octet-stream",
            )
        return cls(
            data,
            None,
            len(data),
            hashlib.sha256(data).hexdigest(),
            params.get("content_type") or kind,
        )

    def head(self) -> bytes | None:
        """All of the bytes when they are small enough to show."""
        if self.size > SHOW_MAX:
            return None
        if self.data is not None:
            return self.data
        assert self.path is not None
        return self.path.read_bytes()[: SHOW_MAX + 1]

    @contextmanager
    def stream(self) -> Iterator[bytes | IO[bytes]]:
        if self.data is not None:
            yield self.data
            return
        assert self.path is not None
        with self.path.open("rb") as f:
            yield f


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidParams(
            "/params/body_b64", "body_b64 is not valid base64", "bad_base64"
        ) from exc


def _attachment(params: Params, ctx: Context) -> Path:
    name = str(params["body_attachment"])
    try:
        path = ctx.attachment(name)
    except EffectFailed as exc:
        raise InvalidParams(
            "/params/body_attachment",
            f"no attachment named {name!r} came with the request; list it in 'attachments' "
            f"and write <request>.{name}.bin before the request",
            "missing_attachment",
        ) from exc
    if not path.is_file():
        raise InvalidParams(
            "/params/body_attachment", f"attachment {name!r} is not stored", "missing_attachment"
        )
    return path


def _text(data: bytes | None) -> str | None:
    if data is None or len(data) > SHOW_MAX:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def _shown(old: bytes | None, new: bytes | None, target: str, new_size: int) -> tuple[str, str]:
    """(body, body_kind): a diff of old and new text, the new text, or what it is."""
    old_text, new_text = _text(old), _text(new)
    if new_text is None:
        return f"({new_size} bytes, binary or larger than {SHOW_MAX} bytes: not shown)", "text"
    if old_text is None or old_text == new_text:
        return new_text, "text"
    diff = difflib.unified_diff(
        old_text.splitlines(keepends=True),
        new_text.splitlines(keepends=True),
        fromfile=f"{target} (now)",
        tofile=f"{target} (after)",
    )
    return "".join(diff), "diff"


_VERSIONING = {
    "Enabled": "enabled",
    "Suspended": "suspended (treated as off)",
    "off": "off",
    "unknown": "unknown: the host may not read it (treated as off)",
}


def _state_facts(state: State, label: str = "current") -> list[tuple[str, str]]:
    if not state.exists:
        return [("exists", "no: a new object")]
    return [
        ("exists", "yes"),
        (f"{label} size", f"{state.size} bytes"),
        (f"{label} ETag", str(state.etag)),
        (f"{label} version", state.version_id or "none (unversioned)"),
    ]


def _write_undo(state: State, params: Params) -> tuple[bool, str]:
    """(reversible, the words for the approver) for a put or copy onto `state`."""
    if params.get("if_none_match") == "*" and state.exists:
        return True, "none needed: the key exists, so this write will fail (if_none_match)"
    if state.versioned:
        after = f"; version {state.version_id} is current again" if state.exists else ""
        return True, f"reversible: the bucket keeps versions; undo removes the new one{after}"
    if not state.exists:
        return True, "reversible: a new key; undo deletes it"
    return False, "IRREVERSIBLE: the bucket keeps no versions; the current content is lost"


def _condition_fact(params: Params, state: State) -> list[tuple[str, str]]:
    agent = _agent_condition(params)
    if not agent:
        return []
    holds = "holds now" if _holds(agent, state) else f"FAILS now: the object {state.describe()}"
    return [("condition", f"{_words(agent)}: {holds}")]


# -- the handlers --------------------------------------------------------------------


@dataclass(frozen=True)
class _Undo:
    """One delete that undoes an output, and what a person sees before it runs."""

    bucket: str
    key: str
    version_id: str | None  # delete this version or marker; None: the key, if still `etag`
    etag: str | None
    preview: Preview


class _ObjectEffect(Handler):
    """What the three effects share: settings, the allowlist, observing, undoing."""

    idempotent = False  # a re-run conditional write would fail as a conflict
    config_keys = CONFIG_KEYS

    def check_config(self, settings: Mapping[str, Any]) -> None:
        check_settings(settings)

    def check(self, params: Params, ctx: Context) -> None:
        check_target(ctx.settings, params["bucket"], params["key"])
        if "if_match" in params and "if_none_match" in params:
            raise InvalidParams(
                "/params/if_none_match", "give if_match or if_none_match, not both", "conflict"
            )

    def reversible_for(self, params: Params, ctx: Context) -> bool:
        try:
            state = self._observe(params, ctx, "policy")
        except EffectFailed:
            return False  # fail closed: a person sees the preview, or why it failed
        return self._reversible(state, params)

    def apply(self, params: Params, ctx: Context) -> JSON:
        try:
            return self._apply(params, ctx)
        finally:
            forget(ctx)

    def _observe(self, params: Params, ctx: Context, stage: str) -> State:
        reader, _ = _clients(ctx)
        state = read_state(reader, ctx, params["bucket"], params["key"])
        remember(ctx, Seen(stage, state))
        return state

    def _reversible(self, state: State, params: Params) -> bool:
        raise NotImplementedError

    def _apply(self, params: Params, ctx: Context) -> JSON:
        raise NotImplementedError

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        """What `revert` will do to this output, computed from S3 as it is now."""
        return self._undo(output, ctx).preview

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        """Undo what `apply` returned as `output`; EffectFailed when it cannot be undone."""
        undo = self._undo(output, ctx)
        reader, writer = _clients(ctx)
        target = f"s3://{undo.bucket}/{undo.key}"
        op = Op(
            f"undoing {self.name} on {target}",
            undo.bucket,
            undo.key,
            write=True,
            conflict=f"failed: {target} changed since the undo was planned; nothing was undone",
            endpoint=_endpoint(ctx),
        )
        with _edge(op):
            if undo.version_id:
                writer.delete_object(Bucket=undo.bucket, Key=undo.key, VersionId=undo.version_id)
            else:
                writer.delete_object(Bucket=undo.bucket, Key=undo.key, IfMatch=undo.etag or "*")
        now = read_state(reader, ctx, undo.bucket, undo.key)
        return {
            "bucket": undo.bucket,
            "key": undo.key,
            "undid": self.name,
            "removed_version_id": undo.version_id,
            "now": now.brief(),
        }

    def _undo(self, output: Mapping[str, Any], ctx: Context) -> _Undo:
        raise NotImplementedError

    @staticmethod
    def _undo_target(output: Mapping[str, Any], ctx: Context) -> tuple[str, str, str]:
        bucket, key = output.get("bucket"), output.get("key")
        if not isinstance(bucket, str) or not isinstance(key, str):
            raise EffectFailed("this output does not say which object it wrote (bucket, key)")
        try:
            check_target(ctx.settings, bucket, key)
        except InvalidParams as exc:
            raise EffectFailed(
                f"s3://{bucket}/{key} is no longer allowed on this host ({exc.issues[0].message})"
            ) from exc
        return bucket, key, f"s3://{bucket}/{key}"


class _WriteEffect(_ObjectEffect):
    """put_object and copy_object: one object written, conditionally, and undoable."""

    reversible = True
    undo = (
        "in a versioned bucket undo removes the version written (the previous one is "
        "current again); a new key in an unversioned bucket is deleted; an overwrite in "
        "an unversioned bucket cannot be undone"
    )

    def _reversible(self, state: State, params: Params) -> bool:
        return _write_undo(state, params)[0]

    def _output(
        self, params: Params, answer: Mapping[str, Any], etag: Any, size: int, previous: State
    ) -> JSON:
        version = answer.get("VersionId")
        version = version if version and version != "null" else None
        versioned = previous.versioned and version is not None
        return {
            "bucket": params["bucket"],
            "key": params["key"],
            "etag": etag,
            "version_id": version,
            "bytes": size,
            "versioned": versioned,
            "previous": previous.brief(),
            "revertible": versioned or not previous.exists,
        }

    def _undo(self, output: Mapping[str, Any], ctx: Context) -> _Undo:
        bucket, key, target = self._undo_target(output, ctx)
        previous = output.get("previous")
        if not isinstance(previous, Mapping) or "exists" not in previous:
            raise EffectFailed(f"this output does not say what {target} held before")
        reader, _ = _clients(ctx)
        now = read_state(reader, ctx, bucket, key)
        version = output.get("version_id")
        if output.get("versioned") and version:
            latest = _latest(reader, ctx, bucket, key)
            if latest != (version, False):
                raise EffectFailed(
                    f"{target} changed after this write (its latest version is "
                    f"{latest[0] if latest else 'gone'}); undoing now would discard that "
                    "change: restore it by hand"
                )
            if previous.get("exists"):
                prev_version = previous.get("version_id") or "null"
                title = (
                    f"remove version {version} of {target}: version {prev_version} is current again"
                )
                restored = State("Enabled", True, size=previous.get("bytes"))
                old = _fetch(reader, ctx, bucket, key, restored, prev_version)
            else:
                title = f"remove version {version} of {target}: the key no longer exists, as before"
                old = b""
            preview = self._preview(title, bucket, key, now, old, reader, ctx)
            return _Undo(bucket, key, version, None, preview)
        if previous.get("exists"):
            raise EffectFailed(
                f"this write replaced {target} in a bucket without versioning; "
                "the previous content is gone"
            )
        if not now.exists or _unquote(now.etag) != _unquote(str(output.get("etag"))):
            raise EffectFailed(
                f"{target} changed after this write (it {now.describe()}); undoing now would "
                "delete someone else's change: restore it by hand"
            )
        title = f"delete {target}, which did not exist before this write"
        preview = self._preview(title, bucket, key, now, b"", reader, ctx)
        return _Undo(bucket, key, None, now.etag, preview)

    @staticmethod
    def _preview(
        title: str,
        bucket: str,
        key: str,
        now: State,
        restored: bytes | None,
        reader: S3Client,
        ctx: Context,
    ) -> Preview:
        target = f"s3://{bucket}/{key}"
        current = _fetch(reader, ctx, bucket, key, now)
        if restored is None:
            body, kind = "(the restored content is binary or too large to show)", "text"
        else:
            body, kind = _shown(current, restored, target, len(restored))
        return Preview(
            title=title,
            target=f"s3: {target}",
            body=body,
            body_kind=kind,
            facts=(("versioning", _VERSIONING[now.versioning]), *_state_facts(now)),
        )


class PutObject(_WriteEffect):
    """Write one object: inline text, base64 bytes, or an attachment."""

    name = "s3.put_object"

    def check(self, params: Params, ctx: Context) -> None:
        super().check(params, ctx)
        given = [f for f in ("body", "body_b64", "body_attachment") if f in params]
        if len(given) != 1:
            raise InvalidParams(
                "/params/body",
                "give exactly one of body (text), body_b64 (base64) or body_attachment "
                f"(an attachment's name); got {', '.join(given) or 'none'}",
                "one_body",
            )
        if "body_b64" in params:
            _b64(str(params["body_b64"]))
        if "body_attachment" in params:
            _attachment(params, ctx)
        metadata = params.get("metadata") or {}
        if sum(len(k) + len(str(v)) for k, v in metadata.items()) > 2048:
            raise InvalidParams("/params/metadata", "metadata is larger than S3's 2 KB", "too_big")

    def preview(self, params: Params, ctx: Context) -> Preview:
        bucket, key = params["bucket"], params["key"]
        target = f"s3://{bucket}/{key}"
        state = self._observe(params, ctx, "approver")
        body = Body.of(params, ctx)
        reader, _ = _clients(ctx)
        shown, kind = _shown(
            _fetch(reader, ctx, bucket, key, state), body.head(), target, body.size
        )
        facts = [("versioning", _VERSIONING[state.versioning]), *_state_facts(state)]
        facts += [
            ("new size", f"{body.size} bytes"),
            ("new sha256", body.sha256),
            ("content type", body.content_type),
        ]
        if params.get("metadata"):
            facts.append(("metadata", json.dumps(params["metadata"], sort_keys=True)))
        facts += _condition_fact(params, state)
        facts.append(("undo", _write_undo(state, params)[1]))
        verb = "overwrite" if state.exists else "create"
        return Preview(
            title=f"{verb} {target} ({body.size} bytes)",
            target=f"s3: {target}",
            body=shown,
            body_kind=kind,
            facts=tuple(facts),
        )

    def _apply(self, params: Params, ctx: Context) -> JSON:
        bucket, key = params["bucket"], params["key"]
        check_target(ctx.settings, bucket, key)  # the allowlist may have shrunk since intake
        target = f"s3://{bucket}/{key}"
        body = Body.of(params, ctx)
        reader, writer = _clients(ctx)
        now = read_state(reader, ctx, bucket, key)
        cond, conflict = condition(target, params, recall(ctx), now)
        extra: dict[str, Any] = {"ContentType": body.content_type, **cond}
        if params.get("metadata"):
            extra["Metadata"] = dict(params["metadata"])
        op = Op(f"writing {target}", bucket, key, True, conflict, _endpoint(ctx))
        with _edge(op), body.stream() as data:
            answer = writer.put_object(Bucket=bucket, Key=key, Body=data, **extra)
        return {
            **self._output(params, answer, answer.get("ETag"), body.size, now),
            "sha256": body.sha256,
        }


class CopyObject(_WriteEffect):
    """Copy one object onto a key; both sides must be in the allowlist."""

    name = "s3.copy_object"

    def check(self, params: Params, ctx: Context) -> None:
        super().check(params, ctx)
        check_target(ctx.settings, params["source_bucket"], params["source_key"], "source_")

    def _source(self, params: Params, ctx: Context, reader: S3Client) -> State:
        bucket, key = params["source_bucket"], params["source_key"]
        state = read_state(reader, ctx, bucket, key, params.get("source_version_id"))
        if not state.exists:
            raise EffectFailed(f"failed: the source s3://{bucket}/{key} does not exist")
        return state

    def _observe(self, params: Params, ctx: Context, stage: str) -> State:
        return self._observe_both(params, ctx, stage)[0]

    def _observe_both(self, params: Params, ctx: Context, stage: str) -> tuple[State, State]:
        reader, _ = _clients(ctx)
        source = self._source(params, ctx, reader)
        state = read_state(reader, ctx, params["bucket"], params["key"])
        remember(ctx, Seen(stage, state, source))
        return state, source

    def preview(self, params: Params, ctx: Context) -> Preview:
        bucket, key = params["bucket"], params["key"]
        target = f"s3://{bucket}/{key}"
        source_name = f"s3://{params['source_bucket']}/{params['source_key']}"
        state, source = self._observe_both(params, ctx, "approver")
        reader, _ = _clients(ctx)
        new = _fetch(
            reader, ctx, params["source_bucket"], params["source_key"], source, source.version_id
        )
        old = _fetch(reader, ctx, bucket, key, state)
        shown, kind = _shown(old, new, target, source.size or 0)
        facts = [
            ("source", source_name),
            ("source size", f"{source.size} bytes"),
            ("source ETag", str(source.etag)),
            ("source version", source.version_id or "none (unversioned)"),
            ("versioning", _VERSIONING[state.versioning]),
            *_state_facts(state),
            *_condition_fact(params, state),
            ("undo", _write_undo(state, params)[1]),
        ]
        verb = "overwrite" if state.exists else "create"
        return Preview(
            title=f"{verb} {target} with a copy of {source_name} ({source.size} bytes)",
            target=f"s3: {target}",
            body=shown,
            body_kind=kind,
            facts=tuple(facts),
        )

    def _apply(self, params: Params, ctx: Context) -> JSON:
        bucket, key = params["bucket"], params["key"]
        check_target(ctx.settings, bucket, key)
        check_target(ctx.settings, params["source_bucket"], params["source_key"], "source_")
        target = f"s3://{bucket}/{key}"
        reader, writer = _clients(ctx)
        seen = recall(ctx)
        source = self._source(params, ctx, reader)
        was = seen.source if seen is not None and seen.stage == "approver" else None
        if seen is not None and was is not None and _unquote(was.etag) != _unquote(source.etag):
            raise EffectFailed(
                f"failed: the source s3://{params['source_bucket']}/{params['source_key']} "
                f"changed since {seen.who} (then it {was.describe()}); send the request again"
            )
        now = read_state(reader, ctx, bucket, key)
        cond, conflict = condition(target, params, seen, now)
        if not _holds(cond, now):  # moto ignores CopyObject's destination conditions
            raise EffectFailed(conflict)
        copy_source: CopySourceTypeDef = {
            "Bucket": params["source_bucket"],
            "Key": params["source_key"],
        }
        if source.version_id:
            copy_source["VersionId"] = source.version_id
        extra: dict[str, Any] = {"CopySourceIfMatch": source.etag or "*", **cond}
        if "content_type" in params or "metadata" in params:
            extra["MetadataDirective"] = "REPLACE"
            kind = params.get("content_type") or source.content_type
            extra["ContentType"] = kind or "application/octet-stream"
            extra["Metadata"] = dict(params.get("metadata") or {})
        op = Op(f"copying onto {target}", bucket, key, True, conflict, _endpoint(ctx))
        with _edge(op):
            answer = writer.copy_object(
                Bucket=bucket,
                Key=key,
                CopySource=copy_source,
                **extra,
            )
        etag = answer.get("CopyObjectResult", {}).get("ETag")
        return {
            **self._output(params, answer, etag, source.size or 0, now),
            "source": {
                "bucket": params["source_bucket"],
                "key": params["source_key"],
                "version_id": source.version_id,
            },
        }


class DeleteObject(_ObjectEffect):
    """Delete one object; in a versioned bucket that leaves a delete marker, undoable."""

    name = "s3.delete_object"
    reversible = False  # per request: reversible in a versioned bucket
    undo = (
        "in a versioned bucket undo removes the delete marker, so the object is back; "
        "in an unversioned bucket the object is gone for good"
    )

    def _reversible(self, state: State, params: Params) -> bool:
        return state.versioned or not state.exists

    def preview(self, params: Params, ctx: Context) -> Preview:
        bucket, key = params["bucket"], params["key"]
        target = f"s3://{bucket}/{key}"
        state = self._observe(params, ctx, "approver")
        facts = [("versioning", _VERSIONING[state.versioning]), *_state_facts(state)]
        facts += _condition_fact(params, state)
        if not state.exists:
            return Preview(
                title=f"delete {target}: it does not exist, nothing will happen",
                target=f"s3: {target}",
                facts=tuple(facts),
            )
        if state.versioned:
            facts.append(("undo", "reversible: undo removes the delete marker"))
        else:
            facts.append(("undo", "IRREVERSIBLE: the bucket keeps no versions"))
        reader, _ = _clients(ctx)
        current = _text(_fetch(reader, ctx, bucket, key, state))
        return Preview(
            title=f"delete {target} ({state.size} bytes)",
            target=f"s3: {target}",
            body=current if current is not None else f"({state.size} bytes: not shown)",
            facts=tuple(facts),
        )

    def _apply(self, params: Params, ctx: Context) -> JSON:
        bucket, key = params["bucket"], params["key"]
        check_target(ctx.settings, bucket, key)
        target = f"s3://{bucket}/{key}"
        reader, writer = _clients(ctx)
        now = read_state(reader, ctx, bucket, key)
        cond, conflict = condition(target, params, recall(ctx), now)
        out: JSON = {"bucket": bucket, "key": key, "versioned": now.versioned}
        if "IfNoneMatch" in cond:  # it did not exist when seen: there is nothing to delete
            if now.exists:
                raise EffectFailed(conflict)
            return {**out, "deleted": False, "previous": now.brief(), "revertible": False}
        op = Op(f"deleting {target}", bucket, key, True, conflict, _endpoint(ctx))
        with _edge(op):
            answer = writer.delete_object(Bucket=bucket, Key=key, IfMatch=cond["IfMatch"])
        marker = answer.get("VersionId") if answer.get("DeleteMarker") else None
        return {
            **out,
            "deleted": True,
            "delete_marker_version_id": marker,
            "previous": now.brief(),
            "revertible": bool(now.versioned and marker),
        }

    def _undo(self, output: Mapping[str, Any], ctx: Context) -> _Undo:
        bucket, key, target = self._undo_target(output, ctx)
        if not output.get("deleted"):
            raise EffectFailed(f"nothing to undo: {target} did not exist when it was deleted")
        marker = output.get("delete_marker_version_id")
        if not (output.get("versioned") and marker):
            raise EffectFailed(
                f"{target} was deleted from a bucket without versioning; it is gone for good"
            )
        reader, _ = _clients(ctx)
        latest = _latest(reader, ctx, bucket, key)
        if latest != (marker, True):
            raise EffectFailed(
                f"{target} changed after the delete (its latest version is "
                f"{latest[0] if latest else 'gone'}); restore it by hand"
            )
        previous = output.get("previous") or {}
        version = previous.get("version_id") or "null"  # "null": written before versioning
        restored = State("Enabled", True, size=previous.get("bytes"))
        text = _text(_fetch(reader, ctx, bucket, key, restored, version))
        preview = Preview(
            title=f"remove the delete marker {marker} of {target}: version {version} is current "
            "again",
            target=f"s3: {target}",
            body=text if text is not None else "(the restored content is binary or too large)",
            facts=(
                ("restored version", version),
                ("restored ETag", str(previous.get("etag"))),
                ("restored size", f"{previous.get('bytes')} bytes"),
            ),
        )
        return _Undo(bucket, key, str(marker), None, preview)


__all__ = ["CopyObject", "DeleteObject", "PutObject"]
