"""kind = "openbao": a secret read per call from a KV v2 path of OpenBao (or Vault) with
a child token made for that one read, revoked right after.

    [credentials.hooks]
    kind = "openbao"
    address = "https://bao.internal:8200"   # http only on loopback
    token_env = "BROKER_BAO_TOKEN"          # the broker's own token: may create child tokens
    mount = "secret"                        # the KV v2 mount
    policies = ["broker-read-hooks"]        # the child token's policies (a subset of the broker's)
    timeout = 5                             # the deadline of each call

The child token lives 30 s and may be used once (the read); the broker revokes it by
its accessor after the call all the same, so a token that escaped reads nothing more.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from broker import clock
from broker.credentials import pool
from broker.errors import ConfigError, CredentialRefused
from broker.grants import Grant, Scope
from broker.settings import Settings

KEYS = frozenset({"kind", "address", "token_env", "token_file", "mount", "policies", "timeout"})
CHILD_KEY = "openbao_token"
"""Where a Grant keeps the child token, beside the KV data's own keys."""
CHILD = {"ttl": "30s", "num_uses": 1, "no_parent": False, "renewable": False}


class OpenBao:
    """KV v2 secrets read per call with a single-purpose child token."""

    kind = "openbao"

    def __init__(self, settings: Settings) -> None:
        where = settings.where
        settings.only(KEYS)
        address = settings.get("address")
        parts = urlsplit(address) if isinstance(address, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{where}.address: OpenBao's URL, e.g. https://bao.internal:8200")
        if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ConfigError(f"{where}.address: use https (http only on loopback)")
        policies = settings.get("policies", [])
        if not isinstance(policies, list) or not all(isinstance(p, str) for p in policies):
            raise ConfigError(f"{where}.policies: a list of policy names")
        self.settings = settings
        self.address = str(address).rstrip("/")
        self.mount = str(settings.get("mount", "secret"))
        self.policies = list(policies)
        self.timeout = float(settings.get("timeout", 5))
        self.name = f"openbao:{where.removeprefix('credentials.')}"

    def mint(self, scope: Scope, ref: str) -> Grant:
        """The KV data at `scope.resources[0]` (a path under the mount), as `values`."""
        if scope.service != "kv" or len(scope.resources) != 1:
            raise CredentialRefused("failed: an OpenBao secret is read from one KV path")
        path = scope.resources[0]
        parent = self._parent()
        body: dict[str, Any] = {
            **CHILD,
            "display_name": f"broker {ref}"[:100],
            "meta": {"request": ref},
        }
        if self.policies:
            body["policies"] = self.policies
        made = self._call("POST", "/v1/auth/token/create", parent, body, path)
        auth = made.get("auth") or {}
        child, accessor = str(auth.get("client_token", "")), str(auth.get("accessor", ""))
        lease = timedelta(seconds=int(auth.get("lease_duration") or 30))
        expires = clock.iso(clock.now() + lease)
        grant = Grant(scope, self.name, f"accessor {accessor}", expires, {"token": child})
        try:
            read = self._call(
                "GET", f"/v1/{quote(self.mount)}/data/{quote(path)}", child, None, path
            )
        except CredentialRefused:
            self.revoke(grant)
            raise
        data = (read.get("data") or {}).get("data") or {}
        values = {**{str(k): str(v) for k, v in data.items()}, CHILD_KEY: child}
        return Grant(scope, self.name, grant.id, grant.expires_at, values)

    def revoke(self, grant: Grant) -> None:
        """Revoke the child token by its accessor. A spent one is gone already, or going:
        OpenBao then answers 200, or 400 "token not found" while it deletes it."""
        body = {"accessor": grant.id.removeprefix("accessor ")}
        what = grant.scope.resources[0]
        path = "/v1/auth/token/revoke-accessor"
        self._call("POST", path, self._parent(), body, what, gone=True)

    def _parent(self) -> str:
        try:
            return self.settings.secret("token") or ""
        except ConfigError as exc:
            raise CredentialRefused(
                f"failed: the broker's OpenBao token is unavailable ({exc}); ask the operator"
            ) from exc

    def _call(
        self, verb: str, path: str, token: str, body: Any, what: str, gone: bool = False
    ) -> dict[str, Any]:
        """The call's JSON; CredentialRefused saying why not. `gone`: a token not found
        is what was asked for (a revocation)."""
        try:
            answer = pool.client().request(
                verb,
                self.address + path,
                json=body,
                headers={"X-Vault-Token": token},
                timeout=self.timeout,
            )
        except httpx.TimeoutException as exc:
            raise CredentialRefused(
                f"failed: OpenBao did not answer within {self.timeout:g} s for {what}; "
                "nothing was applied; try again later"
            ) from exc
        except httpx.HTTPError as exc:
            raise CredentialRefused(
                f"failed: OpenBao could not be reached for {what} ({type(exc).__name__}); "
                "nothing was applied; try again later"
            ) from exc
        if gone and answer.status_code == 400 and "token not found" in answer.text:
            return {}
        if answer.status_code == 503:
            raise CredentialRefused(
                f"failed: OpenBao is sealed or unavailable (503) for {what}; nothing was applied; "
                "ask the operator"
            )
        if answer.status_code >= 300:
            raise CredentialRefused(
                f"failed: OpenBao refused {what} ({answer.status_code}); nothing was applied; "
                "ask the operator"
            )
        return dict(answer.json()) if answer.content else {}
