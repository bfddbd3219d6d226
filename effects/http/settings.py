"""`[integrations.http]`, checked: the limits, the extra CA, and the destinations the
host names (base URL, headers, secret headers, networks and methods of their own)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from broker.clock import parse_duration
from broker.errors import ConfigError, InvalidParams
from broker.settings import only_keys
from effects import kv
from effects.base import Settings
from effects.netguard import (
    Allowed,
    Headers,
    IPNetwork,
    Secret,
    check_ca_file,
    parse_allowed,
    parse_headers,
    parse_networks,
    parse_url,
)

DESTINATION_KEYS = frozenset(
    {"base_url", "headers", "secret_headers", "allow_networks", "methods", "response"}
)
# every method http.request sends (its schema's enum), in the order they are listed
METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")


@dataclass(frozen=True)
class Destination:
    """`[integrations.http.destinations.NAME]`."""

    name: str
    base: httpx.URL
    headers: Headers
    allow: tuple[IPNetwork, ...] = ()
    methods: tuple[str, ...] | None = None  # None: any method http.request sends
    response: Allowed = field(default_factory=Allowed)  # what of a response returns to the sandbox

    def allows(self, method: str) -> bool:
        return self.methods is None or method in self.methods


@dataclass(frozen=True)
class HttpSettings:
    """`[integrations.http]`, checked."""

    allow: tuple[IPNetwork, ...] = ()
    destinations: Mapping[str, Destination] = field(default_factory=dict)
    max_bytes: int = 1024 * 1024
    max_time: float = 30.0
    max_redirects: int = 5
    ca_file: str | None = None


def _positive(table: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where}.{key}: expected a whole number >= 0, got {value!r}")
    return value


def settings_from(table: Mapping[str, Any], secret: Secret | None = None) -> HttpSettings:
    """Parse and check `[integrations.http]`; a fault names the key. Secrets come from
    `secret` (`ctx.secret`), else resolve in `table` as at start."""
    where = "integrations.http"
    secret = secret or kv.static(table, where)
    try:
        max_time = parse_duration(table.get("max_response_time", "30s"))
    except ValueError as exc:
        raise ConfigError(f"{where}.max_response_time: {exc}") from exc
    ca_file = check_ca_file(table.get("ca_file"), f"{where}.ca_file")
    raw = table.get("destinations", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.destinations: expected tables [{where}.destinations.NAME]")
    destinations = {name: _destination(name, spec, secret) for name, spec in raw.items()}
    return HttpSettings(
        allow=parse_networks(table.get("allow_networks"), f"{where}.allow_networks"),
        destinations=destinations,
        max_bytes=_positive(table, "max_response_bytes", 1024 * 1024, where),
        max_time=max_time,
        max_redirects=_positive(table, "max_redirects", 5, where),
        ca_file=ca_file,
    )


def _destination(name: str, spec: Any, secret: Secret) -> Destination:
    where = f"integrations.http.destinations.{name}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", name):
        raise ConfigError(f"{where}: a destination name is letters, digits, '-' and '_'")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table")
    only_keys(where, spec, DESTINATION_KEYS)
    base = spec.get("base_url")
    if not isinstance(base, str):
        raise ConfigError(f"{where}.base_url: required, an http(s) URL")
    try:
        url = parse_url(base)
    except InvalidParams as exc:
        raise ConfigError(f"{where}.base_url: {exc.issues[0].message}") from exc
    if url.query or url.fragment:
        raise ConfigError(f"{where}.base_url: no query or fragment; requests add their own")
    headers = parse_headers(
        spec, where, lambda key: secret(f"{Settings.key('destinations', name)}.{key}")
    )
    return Destination(
        name=name,
        base=url,
        headers=headers,
        allow=parse_networks(spec.get("allow_networks"), f"{where}.allow_networks"),
        methods=_methods(spec.get("methods"), f"{where}.methods"),
        # a service that is sent a secret may echo it in any encoding: status by default
        response=parse_allowed(spec.get("response"), f"{where}.response", bool(headers.secret)),
    )


def _methods(value: Any, where: str) -> tuple[str, ...] | None:
    """`methods = ["GET", "head"]`: upper case, in METHODS order; absent is None (any)."""
    if value is None:
        return None
    listed = ", ".join(METHODS)
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of methods from {listed}")
    given = set()
    for item in value:
        if not isinstance(item, str) or item.upper() not in METHODS:
            raise ConfigError(
                f"{where}: {item!r} is not a method http.request sends (one of {listed})"
            )
        given.add(item.upper())
    return tuple(m for m in METHODS if m in given)
