"""[integrations.s3], checked, and the allowlist: nothing outside `allow` is read or
written, whatever a request says."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from broker.errors import ConfigError, InvalidParams
from effects.base import Settings
from effects.normal_forms import nfc

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
SECRETS = ("access_key_id", "secret_access_key", "session_token")
"""The credentials, each a `<name>_env` or `<name>_file` reference."""
_STYLES = ("auto", "path", "virtual")
CONFIG_KEYS = frozenset(
    {"allow", "endpoint_url", "region", "addressing_style", "protected_keys", "credential"}
    | {f"{s}_{how}" for s in SECRETS for how in ("env", "file")}
)


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
    for key in SECRETS:
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
    protected = settings.get("protected_keys", [])
    if not isinstance(protected, list) or not all(
        isinstance(g, str) and "/" in g for g in protected
    ):
        raise ConfigError(
            'integrations.s3.protected_keys: must be a list of "bucket/key" globs, '
            'e.g. ["agent-scratch/config/*"]'
        )
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
    found = {key: Settings.of(settings, "integrations.s3").secret(key) for key in SECRETS}
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


def protected(settings: Mapping[str, Any], bucket: str, key: str) -> list[str]:
    """`bucket/key` if [integrations.s3] protected_keys names it."""
    name = f"{bucket}/{key}"
    globs = settings.get("protected_keys") or []
    return [name] if any(fnmatchcase(name, g) for g in globs) else []


def check_key(key: str, pointer: str) -> None:
    """Refuse keys that some tool on the way could read as a path or a control sequence,
    or that have two spellings (`a//b`, text not in NFC)."""
    if any(unicodedata.category(c) == "Cc" for c in key):
        raise InvalidParams(pointer, "the key holds control characters", "bad_key")
    nfc(key, pointer, "the key")
    if "//" in key:
        raise InvalidParams(
            pointer, "the key holds an empty segment ('//'); write it with single '/'", "bad_key"
        )
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
