"""The credential of one apply: what it may do (`Scope`), what a provider minted for it
(`Grant`), the providers' contract, and `Grants`, which mints for one handler call and
revokes everything it minted when the call ends.

A handler asks `ctx.credential(Scope(...))` for exactly what this request needs (one
repository and the permissions of the effect, one object's ARN and its actions). When
the integration names a provider (`credential = "NAME"` and `[credentials.NAME]`, or a
GitHub App's keys), the provider mints a credential for that scope only; a refusal
fails the apply (`CredentialRefused`) and nothing falls back to a broader credential.
When it names none, `credential` returns None and the handler uses its static secret:
a standing credential, marked so on the card and in `broker effects`.

Built-in providers live in `broker/credentials/`; a plugin's are found under the
`broker.credentials` entry-point group, by kind, the same way.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Any, Protocol

from broker import clock
from broker.errors import ConfigError, CredentialRefused
from broker.settings import Settings

log = logging.getLogger(__name__)

BUILTIN = {
    "github_app": "broker.credentials.github_app:GitHubApp",
    "aws_sts": "broker.credentials.aws_sts:AssumeRole",
    "openbao": "broker.credentials.openbao:OpenBao",
}
"""Provider kind → its class, for the providers the broker ships."""
STANDING = "standing credential"

_counts_lock = threading.Lock()
counts = {"minted": 0, "revoked": 0, "unrevoked": 0, "refused": 0}
"""What every `Grants` of this process did; `unrevoked` is a mint nobody could revoke."""
by_provider: dict[tuple[str, str], int] = {}
"""The same, per provider name (`github_app:acme-app`): (provider, what) → count, for
the Prometheus counters (broker/observability/metrics.py)."""


@dataclass(frozen=True)
class Scope:
    """What one handler call needs: a service, its resources, the actions on them.

    `resources` are as the service names them (`acme/api`, `arn:aws:s3:::b/k`);
    `actions` likewise (`contents:write`, `s3:PutObject`); `endpoint` is where the
    integration talks to the service, when the provider must mint there too."""

    service: str
    resources: tuple[str, ...]
    actions: tuple[str, ...]
    endpoint: str = ""
    read: tuple[str, ...] = ()
    """Resources read only (an S3 copy's source), beside `resources`."""

    def describe(self) -> str:
        """One line for the card and the ledger: what the credential can reach."""
        where = ", ".join(self.resources)
        line = f"{self.service}: {where} only; {', '.join(self.actions)}"
        return line + (f"; read-only {', '.join(self.read)}" if self.read else "")


@dataclass(frozen=True)
class Grant:
    """A credential minted for one scope. `values` hold the secret parts (never shown,
    never recorded); `id` names it at the provider (a token's fingerprint, a role
    session, a lease) so its use can be found in the service's own audit trail."""

    scope: Scope
    provider: str
    id: str
    expires_at: str | None
    values: Mapping[str, str] = field(repr=False)
    minted_at: str | None = None
    """When `Grants` got it (set there: a provider need not)."""

    @property
    def token(self) -> str:
        return self.values["token"]

    def summary(self, revoked: bool | None) -> dict[str, Any]:
        """What the ledger, the audit event and `broker show` record: never a secret.
        `lifetime` is what it was minted for, however soon it was revoked."""
        return {
            "scope": self.scope.describe(),
            "provider": self.provider,
            "id": self.id,
            "minted_at": self.minted_at,
            "expires_at": self.expires_at,
            "lifetime": lifetime(self.minted_at, self.expires_at),
            "revoked": revoked,
        }


def lifetime(start: str | None, end: str | None) -> str | None:
    """'30s', or '60 min' (to the minute: a service stamps expiry in whole seconds,
    after minting began) from two RFC 3339 times; None when either is unknown."""
    try:
        began, ends = clock.parse_iso(start), clock.parse_iso(end)
    except ValueError:
        return None
    if began is None or ends is None:
        return None
    seconds = max(0, round((ends - began).total_seconds()))
    return f"{seconds}s" if seconds < 120 else f"{round(seconds / 60)} min"


class Provider(Protocol):
    """Mints and revokes credentials of one configured kind.

    `mint(scope, ref)` returns a Grant for exactly `scope` (ref: the request's
    `SANDBOX/ID` and a digest prefix, to name the credential after the approval) or
    raises CredentialRefused with a reason the agent can act on. It must return within
    its own deadline. `revoke(grant)` ends it early; raise anything to say it could not."""

    def mint(self, scope: Scope, ref: str) -> Grant: ...

    def revoke(self, grant: Grant) -> None: ...


ProviderFactory = Callable[[Settings], Provider]


def fingerprint(secret: str) -> str:
    """A short digest naming a secret in records without revealing it."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def provider_class(kind: str, where: str) -> ProviderFactory:
    """The provider class of `kind` (built-in, else the `broker.credentials` group)."""
    target = BUILTIN.get(kind)
    if target is None:
        found = [ep for ep in entry_points(group="broker.credentials") if ep.name == kind]
        if not found:
            known = ", ".join(sorted(BUILTIN))
            raise ConfigError(f"{where}.kind: unknown credential provider {kind!r} ({known})")
        loaded: ProviderFactory = found[0].load()
        return loaded
    module, _, name = target.partition(":")
    factory: ProviderFactory = getattr(importlib.import_module(module), name)
    return factory


def provider_for(
    integration: Settings, credentials: Mapping[str, Mapping[str, Any]]
) -> Provider | None:
    """The provider an integration's table names (`credential = "NAME"`), or its GitHub
    App keys (always minted narrowed), or None: the integration uses standing secrets."""
    name = integration.get("credential")
    if name is not None:
        where = f"{integration.where}.credential"
        table = credentials.get(str(name)) if isinstance(name, str) else None
        if table is None:
            raise ConfigError(f"{where}: no [credentials.{name}] table")
        settings = Settings(table, f"credentials.{name}", integration.base_dir)
        return provider_class(str(table.get("kind", "")), settings.where)(settings)
    if "app_id" in integration and integration.where == "integrations.github":
        return provider_class("github_app", integration.where)(integration)
    return None


def kind_of_credential(integration: Settings, credentials: Mapping[str, Mapping[str, Any]]) -> str:
    """What an integration applies with, in words: minted (by which provider), a
    standing credential (static `*_env` / `*_file` references), or none."""
    try:
        provider = provider_for(integration, credentials)
    except ConfigError as exc:
        return f"misconfigured: {exc}"
    if provider is not None:
        name = getattr(provider, "name", type(provider).__name__)
        return f"minted per apply ({name}), narrowed to the request, revoked after"
    if _references(integration):
        return STANDING
    return "none"


def _references(table: Mapping[str, Any]) -> bool:
    for key, value in table.items():
        if isinstance(value, Mapping) and _references(value):
            return True
        if isinstance(key, str) and key.endswith(("_env", "_file")) and isinstance(value, str):
            return True
    return False


class Grants:
    """The credentials minted for one handler call; `close()` revokes them all.

    One Grant per distinct scope within the call (a handler that builds two clients for
    one scope gets the same one); nothing outlives the call or crosses to another."""

    def __init__(self, provider: Callable[[], Provider | None], ref: str) -> None:
        self._provider = provider
        self.ref = ref
        self._minted: dict[Scope, Grant] = {}
        self._revoked: dict[Scope, bool] = {}
        self._lock = threading.Lock()

    def credential(self, scope: Scope) -> Grant | None:
        """A Grant for `scope`; None when the integration has no provider (standing)."""
        try:
            provider = self._provider()
        except ConfigError as exc:
            raise CredentialRefused(
                f"failed: this host's credential provider is misconfigured ({exc}); "
                "ask the operator; nothing was applied"
            ) from exc
        if provider is None:
            return None
        with self._lock:
            if scope in self._minted:
                return self._minted[scope]
        try:
            grant = provider.mint(scope, self.ref)
        except CredentialRefused:
            _count("refused", provider)
            raise
        _count("minted", provider)
        grant = replace(grant, minted_at=clock.stamp())
        with self._lock:
            self._minted[scope] = grant
        return grant

    def secrets(self) -> list[str]:
        with self._lock:
            return [v for g in self._minted.values() for v in g.values.values() if v]

    def close(self) -> list[dict[str, Any]]:
        """Revoke what was minted (a failure is logged and counted, never raised);
        the summaries of every grant, for the ledger and the audit event."""
        with self._lock:
            pending = [(s, g) for s, g in self._minted.items() if s not in self._revoked]
        provider = self._provider() if pending else None
        for scope, grant in pending:
            self._revoked[scope] = _revoke(provider, grant, self.ref)
        with self._lock:
            return [g.summary(self._revoked.get(s)) for s, g in self._minted.items()]


def _revoke(provider: Provider | None, grant: Grant, ref: str) -> bool:
    try:
        if provider is not None:
            provider.revoke(grant)
    except Exception as exc:
        _count("unrevoked", provider)
        # a provider's own refusal says why in words of its own (never a secret)
        why = exc.reason if isinstance(exc, CredentialRefused) else type(exc).__name__
        log.warning(
            "could not revoke the credential %s (%s) minted for %s: %s; it lives until %s",
            grant.id,
            grant.provider,
            ref,
            why,
            grant.expires_at or "it expires",
        )
        return False
    _count("revoked", provider)
    return True


def _count(what: str, provider: Provider | None) -> None:
    name = str(getattr(provider, "name", type(provider).__name__))
    with _counts_lock:
        counts[what] += 1
        by_provider[(name, what)] = by_provider.get((name, what), 0) + 1


def counted() -> dict[tuple[str, str], int]:
    """A copy of `by_provider`, taken under its lock."""
    with _counts_lock:
        return dict(by_provider)


def held(output: Mapping[str, Any] | None) -> list[str]:
    """What an apply held, one line per credential, for the card after apply (`broker
    show`, the web): its scope, provider and id, lifetime and whether it was revoked."""
    lines = []
    for used in (output or {}).get("credential") or []:
        if not isinstance(used, Mapping):
            continue
        revoked = used.get("revoked")
        ended = (
            "revoked after"
            if revoked is True
            else "NOT revoked: it lives until it expires"
            if revoked is False
            else "not revoked"
        )
        lines.append(
            f"{used.get('scope')} (by {used.get('provider')}, {used.get('id')}; "
            f"{used.get('lifetime') or 'lifetime unknown'}, {ended})"
        )
    return lines


def no_credential(scope: Scope) -> Grant | None:
    """Outside a handler call the broker opened (a test's bare Context): standing."""
    return None
