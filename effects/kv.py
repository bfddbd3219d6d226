"""Secrets an integration reads per apply from a KV path of the provider it names, so
no standing copy sits in the broker's environment: `<key>_kv = "PATH#FIELD"` in place
of `<key>_env` / `<key>_file`, and `credential = "NAME"` naming a `kind = "openbao"`
provider (broker/credentials/openbao.py).

    [integrations.email]
    credential = "bao"
    password_kv = "smtp/relay#password"       # KV v2 path under the mount, then the field

    [integrations.http.destinations.ci.secret_headers]
    Authorization = { value_kv = "http/ci#token", prefix = "Bearer " }

`reader(ctx, fetch=...)` is `ctx.secret` with those references read through
`ctx.credential` (one read per path per call, with a child token revoked when the call
ends). Where the secret is not needed (a check on the loop, a preview that masks it)
a reference stands for itself (`STAND_IN`), so the settings parse and nothing reaches
the provider. A secret that cannot be read fails the apply (CredentialRefused): the
handler never falls back to another secret.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from broker.errors import ConfigError, CredentialRefused, EffectFailed
from effects.base import Context, Scope, Settings

Secret = Callable[[str], str | None]
STAND_IN = "https://kv-secret.invalid/read-when-applied"
"""What a KV reference reads as where the secret is not needed: a valid URL, header
value, signing key or password, so the settings that hold it parse as they will."""
_REFERENCE = re.compile(r"([A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*)#([A-Za-z0-9_.\-]+)")


def parse(value: Any, where: str) -> tuple[str, str]:
    """`"PATH#FIELD"` → (path, field); ConfigError naming `where` otherwise."""
    found = _REFERENCE.fullmatch(value) if isinstance(value, str) else None
    if found is None or ".." in found.group(1).split("/"):
        raise ConfigError(f'{where}: expected "PATH#FIELD" (a KV path, then the field)')
    return found.group(1), found.group(2)


def scope(path: str) -> Scope:
    """What one read needs: the one KV path, read only."""
    return Scope("kv", (path,), ("read",))


def static(table: Mapping[str, Any], where: str) -> Secret:
    """At start (no context): `<key>_env` / `<key>_file` resolved, a KV reference
    checked and standing for itself; it needs `credential` naming its provider."""
    settings = Settings.of(table, where)

    def secret(key: str) -> str | None:
        ref = settings.reference(key, "kv")
        if ref is None:
            return settings.secret(key)
        parse(ref, f"{where}.{key}_kv")
        if not isinstance(table.get("credential"), str):
            raise ConfigError(
                f'{where}.{key}_kv: name the provider it is read from: credential = "NAME" '
                'and [credentials.NAME] kind = "openbao"'
            )
        return STAND_IN

    return secret


def reader(ctx: Context, where: str, fetch: bool | Callable[[str], bool]) -> Secret:
    """`ctx.secret`, with KV references read from the provider when `fetch` (or
    `fetch(key)`) says so, else standing for themselves."""
    settings = Settings.of(ctx.settings, where)

    def secret(key: str) -> str | None:
        ref = settings.reference(key, "kv")
        if ref is None:
            return ctx.secret(key)
        path, field = parse(ref, f"{where}.{key}_kv")
        if not (fetch(key) if callable(fetch) else fetch):
            return STAND_IN
        grant = ctx.credential(scope(path))
        if grant is None:
            raise EffectFailed(
                f'failed: {where}.{key}_kv names no provider (credential = "NAME"); '
                "ask the operator; nothing was applied"
            )
        value = grant.values.get(field)
        if not value:
            raise CredentialRefused(
                f"failed: the secret at {path} has no field {field!r}; ask the operator; "
                "nothing was applied"
            )
        return value

    return secret
