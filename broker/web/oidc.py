"""The inbox as an OpenID Connect relying party: [web.oidc], the provider's discovery
document and keys, the authorization code flow with PKCE, and the ID token checked.

    [web.oidc]
    issuer = "https://login.example.com"     # https, or a loopback address for tests
    client_id = "broker-inbox"
    client_secret_env = "OIDC_CLIENT_SECRET"  # or client_secret_file; none: a public client
    scopes = ["openid", "profile", "email", "groups"]
    groups_claim = "groups"                   # the claim carrying the person's groups
    sign_in_groups = ["platform"]             # who may sign in (besides [approvers] oidc_sub)
    algorithms = ["RS256", "ES256"]           # pinned: never none, never an HMAC
    step_up_irreversible = "15m"              # false: irreversible requests need no step-up

The ID token must be signed by a key of the provider's JWKS (fetched again, at most
once a minute, when a token names a key not yet seen: keys rotate) with one of the
pinned algorithms; `iss` must be the issuer, `aud` the client id (and `azp` too when
there are several), `exp` in the future, `iat` not, `nonce` the one this flow sent.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from authlib.common.security import generate_token
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri, prepare_token_request
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from joserfc.jwt import JWTClaimsRegistry

from broker.addresses import is_loopback
from broker.clock import REAL, Clock
from broker.config import Config
from broker.errors import ConfigError, SignInError
from broker.identity import Proof
from broker.settings import check_no_literal_secrets, only_keys, resolve_secret

__all__ = ["OIDC_KEYS", "OidcSettings", "Provider", "oidc_settings"]

OIDC_KEYS = {
    "issuer",
    "client_id",
    "client_secret_env",
    "client_secret_file",
    "scopes",
    "groups_claim",
    "sign_in_groups",
    "algorithms",
    "step_up_irreversible",
}
ASYMMETRIC = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"}
ASYMMETRIC |= {"EdDSA", "Ed25519"}
LEEWAY_S = 60  # clocks of two hosts differ a little
REFETCH_S = 60.0  # keys fetched again at most this often (an unknown kid)
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class OidcSettings:
    """[web.oidc], checked."""

    issuer: str
    client_id: str
    client_secret: str | None = None
    scopes: tuple[str, ...] = ("openid", "profile", "email")
    groups_claim: str = "groups"
    sign_in_groups: frozenset[str] = frozenset()
    algorithms: tuple[str, ...] = ("RS256", "ES256")


def oidc_settings(config: Config) -> OidcSettings | None:
    """[web.oidc], or None when it is absent; a mistake names its key."""
    table = config.web.get("oidc")
    if table is None:
        return None
    if not isinstance(table, Mapping):
        raise ConfigError("[web.oidc] must be a table")
    check_no_literal_secrets(table, "web.oidc")
    only_keys("web.oidc", table, OIDC_KEYS)
    issuer = _text(table, "issuer").rstrip("/")
    _transport("web.oidc.issuer", issuer)
    algorithms = _texts(table, "algorithms", ["RS256", "ES256"])
    weak = [a for a in algorithms if a not in ASYMMETRIC]
    if weak or not algorithms:
        raise ConfigError(
            f"web.oidc.algorithms: {weak[0] if weak else 'an empty list'} is not accepted; "
            f"name asymmetric signature algorithms only ({', '.join(sorted(ASYMMETRIC))})"
        )
    scopes = _texts(table, "scopes", ["openid", "profile", "email"])
    if "openid" not in scopes:
        raise ConfigError('web.oidc.scopes: must include "openid"')
    return OidcSettings(
        issuer,
        _text(table, "client_id"),
        resolve_secret(table, "client_secret", "web.oidc", config.base_dir),
        tuple(scopes),
        str(table.get("groups_claim", "groups")),
        frozenset(_texts(table, "sign_in_groups", [])),
        tuple(algorithms),
    )


def _text(table: Mapping[str, Any], key: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"web.oidc.{key}: required, a string")
    return value.strip()


def _texts(table: Mapping[str, Any], key: str, default: list[str]) -> list[str]:
    value = table.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"web.oidc.{key}: expected a list of strings")
    return list(value)


def _transport(where: str, url: str) -> None:
    """https, or http to a loopback address (a provider run by the tests)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname and is_loopback(parts.hostname):
        return
    raise ConfigError(f"{where}: {url!r} must be an https URL (http only to a loopback address)")


@dataclass(frozen=True)
class Started:
    """An authorization request on its way to the provider: where to send the browser,
    and what the callback must find again (kept by the inbox, never by the browser)."""

    url: str
    state: str
    nonce: str
    verifier: str


class Provider:
    """The issuer's endpoints and keys (cached), the flow's two legs, the token checked."""

    def __init__(
        self,
        settings: OidcSettings,
        clock: Clock = REAL,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._http = httpx.Client(timeout=TIMEOUT_S, transport=transport, follow_redirects=False)
        self._meta: dict[str, Any] | None = None
        self._keys: KeySet | None = None
        self._keys_at = float("-inf")
        self._lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    # -- discovery and keys ---------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """The discovery document, fetched once; its issuer must be the configured one."""
        with self._lock:
            if self._meta is None:
                url = f"{self.settings.issuer}/.well-known/openid-configuration"
                meta = self._get_json(url)
                if meta.get("issuer", "").rstrip("/") != self.settings.issuer:
                    raise SignInError(
                        f"the provider's discovery document names issuer {meta.get('issuer')!r}, "
                        f"not {self.settings.issuer!r}"
                    )
                for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                    if not isinstance(meta.get(key), str):
                        raise SignInError(f"the provider's discovery document has no {key}")
                    try:
                        _transport(key, meta[key])
                    except ConfigError as exc:
                        raise SignInError(str(exc)) from exc
                self._meta = meta
            return self._meta

    def keys(self, kid: str | None, *, again: bool = False) -> KeySet:
        """The provider's keys; fetched again when `kid` is unknown or `again` (a
        signature that did not verify: the keys may have rotated), at most once a
        minute, so forged tokens cannot make the inbox hammer the provider."""
        with self._lock:
            cached = self._keys
            known = cached is not None and not again and (kid is None or _has(cached, kid))
            due = self.clock.monotonic() - self._keys_at >= REFETCH_S
            if cached is not None and (known or not due):
                return cached
        fetched = self._get_json(self.metadata()["jwks_uri"])
        try:
            keys = KeySet.import_key_set(fetched)  # type: ignore[arg-type]
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            raise SignInError(f"the provider's keys cannot be read: {exc}") from exc
        with self._lock:
            self._keys, self._keys_at = keys, self.clock.monotonic()
        return keys

    def _get_json(self, url: str) -> dict[str, Any]:
        try:
            response = self._http.get(url)
            response.raise_for_status()
            data = response.json()
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise SignInError(f"the identity provider did not answer at {url}: {exc}") from exc
        if not isinstance(data, dict):
            raise SignInError(f"the identity provider's answer at {url} is not a JSON object")
        return data

    # -- the flow -------------------------------------------------------------------

    def start(self, redirect_uri: str, *, max_age_s: float | None = None) -> Started:
        """A fresh state, nonce and PKCE verifier, and the provider's URL carrying them.
        `max_age_s` asks for a recent sign-in (step-up) and a login prompt."""
        state, nonce, verifier = generate_token(43), generate_token(43), generate_token(64)
        extra: dict[str, Any] = {"nonce": nonce}
        if max_age_s is not None:
            extra.update(max_age=int(max_age_s), prompt="login")
        url = prepare_grant_uri(
            self.metadata()["authorization_endpoint"],
            client_id=self.settings.client_id,
            response_type="code",
            redirect_uri=redirect_uri,
            scope=" ".join(self.settings.scopes),
            state=state,
            code_challenge=create_s256_code_challenge(verifier),
            code_challenge_method="S256",
            **extra,
        )
        return Started(str(url), state, nonce, verifier)

    def finish(self, redirect_uri: str, code: str, started: Started) -> Proof:
        """Exchange the code (with the PKCE verifier) and check the ID token it brings."""
        body = prepare_token_request(
            "authorization_code",
            code=code,
            redirect_uri=redirect_uri,
            code_verifier=started.verifier,
            **({} if self.settings.client_secret else {"client_id": self.settings.client_id}),
        )
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        secret = self.settings.client_secret
        if secret:  # client_secret_basic: each part form-encoded first (RFC 6749, 2.3.1)
            pair = f"{quote(self.settings.client_id, safe='')}:{quote(secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        try:
            response = self._http.post(
                self.metadata()["token_endpoint"], content=body, headers=headers
            )
            token = response.json()
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise SignInError(f"the provider's token endpoint did not answer: {exc}") from exc
        if response.status_code != 200 or not isinstance(token, dict):
            said = token.get("error", response.status_code) if isinstance(token, dict) else ""
            raise SignInError(f"the provider refused the sign-in code ({said})")
        id_token = token.get("id_token")
        if not isinstance(id_token, str):
            raise SignInError("the provider answered without an ID token")
        return self.verify(id_token, started.nonce)

    # -- the ID token ---------------------------------------------------------------

    def verify(self, id_token: str, nonce: str) -> Proof:
        """The person an ID token proves, or SignInError saying what is wrong with it."""
        try:
            header = jws.extract_compact(id_token.encode("ascii")).protected
        except (JoseError, ValueError, UnicodeError) as exc:
            raise SignInError(f"the ID token is not a signed JWT: {exc}") from exc
        alg = header.get("alg")
        if alg not in self.settings.algorithms:
            raise SignInError(
                f"the ID token is signed with {alg!r}; this inbox accepts only "
                f"{', '.join(self.settings.algorithms)} (web.oidc.algorithms)"
            )
        kid = header.get("kid")
        kid = kid if isinstance(kid, str) else None
        try:
            decoded = self._decode(id_token, self.keys(kid))
        except JoseError:
            try:  # perhaps signed with a key published since: fetch them again, once
                decoded = self._decode(id_token, self.keys(kid, again=True))
            except JoseError as exc:
                raise SignInError(f"the ID token's signature does not verify: {exc}") from exc
        claims = decoded.claims
        self._check_claims(claims, nonce)
        return self._proof(claims)

    def _decode(self, id_token: str, keys: KeySet) -> jwt.Token:
        return jwt.decode(id_token, keys, algorithms=list(self.settings.algorithms))

    def _check_claims(self, claims: Mapping[str, Any], nonce: str) -> None:
        registry = JWTClaimsRegistry(
            now=lambda: int(self.clock.now().timestamp()),
            leeway=LEEWAY_S,
            iss={"essential": True, "value": self.settings.issuer},
            aud={"essential": True, "value": self.settings.client_id},
            sub={"essential": True},
            exp={"essential": True},
            iat={"essential": True},
            nonce={"essential": True, "value": nonce},
        )
        try:
            registry.validate(dict(claims))
        except JoseError as exc:
            raise SignInError(f"the ID token is not for this sign-in: {exc}") from exc
        aud = claims.get("aud")
        if isinstance(aud, list) and len(aud) > 1 and claims.get("azp") != self.settings.client_id:
            raise SignInError("the ID token names several audiences and another party (azp)")

    def _proof(self, claims: Mapping[str, Any]) -> Proof:
        groups = claims.get(self.settings.groups_claim, [])
        if isinstance(groups, str):
            groups = [groups]
        if not isinstance(groups, list):
            groups = []
        amr = claims.get("amr", [])
        auth_time = claims.get("auth_time")
        name = next(
            (str(claims[k]) for k in ("name", "preferred_username", "email") if claims.get(k)),
            str(claims["sub"]),
        )
        return Proof(
            issuer=str(claims["iss"]),
            subject=str(claims["sub"]),
            name=name,
            expires=float(claims["exp"]),
            auth_time=float(auth_time) if isinstance(auth_time, (int, float)) else None,
            groups=frozenset(str(g) for g in groups),
            acr=str(claims["acr"]) if isinstance(claims.get("acr"), str) else None,
            amr=tuple(str(m) for m in amr) if isinstance(amr, list) else (),
        )


def _has(keys: KeySet, kid: str) -> bool:
    return any(key.kid == kid for key in keys.keys)
