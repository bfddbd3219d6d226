"""Credentials in headers: the plain and secret headers broker.toml sets for a
destination, checked, and every secret masked wherever it could be echoed back."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import ConfigError
from broker.masking import MASK as MASK
from broker.masking import Masker
from broker.settings import only_keys
from effects.base import Settings

Secret = Callable[[str], str | None]
"""A settings key -> the secret behind it (`ctx.secret`, or `Settings.secret` at start)."""

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@dataclass(frozen=True)
class Headers:
    """Headers from broker.toml: plain ones and ones whose values are secrets."""

    plain: Mapping[str, str] = field(default_factory=dict)
    secret: Mapping[str, str] = field(default_factory=dict)
    bare: tuple[str, ...] = ()  # the secrets without their prefixes, to mask echoes

    @property
    def names(self) -> frozenset[str]:
        return frozenset(k.lower() for k in (*self.plain, *self.secret))

    def values(self) -> list[str]:
        return [*self.secret.values(), *self.bare]


_CREDENTIAL_NAME = re.compile(
    r"^(authorization|proxy-authorization|cookie)$|api[-_]?key|token|secret|passw|signature",
    re.IGNORECASE,
)


def parse_headers(table: Mapping[str, Any], where: str, secret: Secret) -> Headers:
    """`headers = {...}` and `secret_headers = {Name = {value_env|value_file, prefix}}`;
    `secret(key)` resolves a key relative to `table` (`secret_headers."X-Key".value`)."""
    plain = table.get("headers", {})
    if not isinstance(plain, Mapping):
        raise ConfigError(f"{where}.headers: expected a table of header names to values")
    for name, value in plain.items():
        _check_header(name, value, f"{where}.headers.{name}")
        if _CREDENTIAL_NAME.search(name):
            raise ConfigError(
                f"{where}.headers.{name}: looks like a credential; put it under "
                f'secret_headers as {{ value_env = "..." }} so it is never written here'
            )
    secrets: dict[str, str] = {}
    bare: list[str] = []
    raw = table.get("secret_headers", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.secret_headers: expected a table of header names")
    for name, ref in raw.items():
        here = f"{where}.secret_headers.{name}"
        if not isinstance(ref, Mapping):
            raise ConfigError(f'{here}: expected {{ value_env = "VAR" }} or {{ value_file = ... }}')
        only_keys(here, ref, {"value_env", "value_file", "value_kv", "prefix"})
        if sum(k in ref for k in ("value_env", "value_file", "value_kv")) != 1:
            # value_kv: read per apply from the integration's provider (effects/kv.py)
            raise ConfigError(f"{here}: set exactly one of value_env, value_file and value_kv")
        prefix = ref.get("prefix", "")
        if not isinstance(prefix, str):
            raise ConfigError(f'{here}.prefix: expected a string such as "Bearer "')
        _check_header(name, prefix, f"{here}.prefix")
        if name.lower() in {k.lower() for k in plain}:
            raise ConfigError(f"{here}: also set under headers; keep one")
        value = secret(Settings.key("secret_headers", name, "value"))
        if not value:
            raise ConfigError(f"{here}: the secret is empty")
        if any(c in value for c in "\r\n\x00"):
            raise ConfigError(f"{here}: the secret's value holds a line break")
        secrets[name] = prefix + value
        bare.append(value)
    return Headers(dict(plain), secrets, tuple(bare))


def _check_header(name: Any, value: Any, where: str) -> None:
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        raise ConfigError(f"{where}: {name!r} is not a valid header name")
    if not isinstance(value, str) or any(c in value for c in "\r\n\x00"):
        raise ConfigError(f"{where}: header values are strings without line breaks")


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret masked in every form it can be echoed in (raw, base64,
    URL-encoded, a prefix cut off at the end: broker.masking)."""
    return Masker(secrets).text(text)


def scrub_bytes(data: bytes, secrets: Iterable[str]) -> bytes:
    """The same for bytes."""
    return Masker(secrets).bytes(data)
