"""kind = "github_app": an installation token for exactly one repository and the
permissions of the effect, revoked when the call ends.

PyGithub's installation auth asks GitHub for a token to everything the installation
reaches, with every permission the App has; this sends the exchange itself, with
`repositories` and `permissions` (`POST /app/installations/{id}/access_tokens`), checks
that GitHub narrowed the token as asked, and revokes it (`DELETE /installation/token`).

    [credentials.acme-app]
    kind = "github_app"
    app_id = 12345
    installation_id = 6789
    private_key_file = "github-app.pem"     # or private_key_env
    base_url = "https://api.github.com"     # default: the integration's base_url
    timeout = 10                            # seconds for the exchange (the deadline)
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import httpx

from broker.clock import REAL
from broker.credentials import pool
from broker.errors import ConfigError, CredentialRefused
from broker.grants import Grant, Scope, fingerprint
from broker.settings import Settings

KEYS = frozenset(
    {"kind", "app_id", "installation_id", "private_key_env", "private_key_file"}
    | {"base_url", "timeout"}
)
MINT_CALL = ("POST", "/app/installations/{installation_id}/access_tokens")
REVOKE_CALL = ("DELETE", "/installation/token")
HEADERS = {"Accept": "application/json", "X-GitHub-Api-Version": "2022-11-28"}
LEVELS = {"read": 1, "write": 2, "admin": 3}
JWT_REUSE_S = 300  # GitHub takes an App's JWT for 10 minutes; it reaches no repository itself

_lock = threading.Lock()
_jwts: dict[tuple[int, str], tuple[float, str]] = {}  # (app, key digest) → (made at, JWT)


class GitHubApp:
    """Installation tokens narrowed to one repository and the effect's permissions."""

    kind = "github_app"

    def __init__(self, settings: Settings) -> None:
        where = settings.where
        if where.startswith("credentials."):
            settings.only(KEYS)
        for name in ("app_id", "installation_id"):
            value = settings.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}.{name}: a GitHub App needs it, a positive integer")
        timeout = settings.get("timeout", 10)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise ConfigError(f"{where}.timeout: expected seconds, more than 0")
        self.settings = settings
        self.app_id = int(settings["app_id"])
        self.installation = int(settings["installation_id"])
        self.base_url = str(settings.get("base_url", "")).rstrip("/")
        self.timeout = float(timeout)
        self.name = f"github_app:{where.removeprefix('credentials.')}"

    def mint(self, scope: Scope, ref: str) -> Grant:
        """A token for `scope.resources` (one `owner/name`) with `scope.actions`
        (`contents:write`, …), or CredentialRefused saying why."""
        if scope.service != "github" or len(scope.resources) != 1:
            raise CredentialRefused("failed: a GitHub App token is minted for one repository")
        repo = scope.resources[0]
        permissions = dict(a.split(":", 1) for a in scope.actions)
        body = {"repositories": [repo.split("/", 1)[1]], "permissions": permissions}
        url = (self.base_url or scope.endpoint).rstrip("/")
        path = MINT_CALL[1].format(installation_id=self.installation)
        answer = self._send("POST", url + path, f"Bearer {self._jwt()}", body, repo)
        if answer.status_code != 201:
            raise CredentialRefused(_refusal(answer, repo, self.installation))
        data = answer.json()
        token = str(data.get("token") or "")
        grant = Grant(
            scope, self.name, fingerprint(token), data.get("expires_at"), {"token": token}
        )
        wider = _wider(data, repo, permissions)
        if not token or wider:
            if token:
                self.revoke(grant)
            raise CredentialRefused(
                f"failed: GitHub did not narrow the App's token to {repo} as asked ({wider}); "
                "nothing was applied; ask the operator"
            )
        return grant

    def revoke(self, grant: Grant) -> None:
        url = (self.base_url or grant.scope.endpoint).rstrip("/") + REVOKE_CALL[1]
        answer = self._send("DELETE", url, f"token {grant.token}", None, grant.scope.resources[0])
        if answer.status_code not in (204, 401):  # 401: it is no longer valid anyway
            raise CredentialRefused(f"GitHub answered {answer.status_code} to the revocation")

    def _jwt(self) -> str:
        import jwt
        from github import Auth

        try:
            key = self.settings.secret("private_key")
        except ConfigError as exc:
            raise CredentialRefused(
                f"failed: the host's GitHub App key is unavailable ({exc}); ask the operator"
            ) from exc
        if not key:
            raise CredentialRefused(
                f"failed: {self.settings.where}.private_key_file: a GitHub App needs its "
                "private key; ask the operator"
            )
        mark = (self.app_id, hashlib.sha256(key.encode()).hexdigest())
        with _lock:
            made = _jwts.get(mark)
        if made is not None and REAL.monotonic() - made[0] < JWT_REUSE_S:
            return made[1]
        try:
            signed = str(Auth.AppAuth(self.app_id, key).create_jwt())
            with _lock:
                _jwts[mark] = (REAL.monotonic(), signed)
            return signed
        except (ValueError, TypeError, jwt.PyJWTError) as exc:
            raise CredentialRefused(
                "failed: the host's GitHub App private key cannot sign a token "
                f"({type(exc).__name__}); ask the operator to check private_key_file"
            ) from exc

    def _send(self, verb: str, url: str, auth: str, body: Any, repo: str) -> httpx.Response:
        headers = {**HEADERS, "Authorization": auth, "User-Agent": "sandbox-outbox-broker"}
        try:
            return pool.client().request(
                verb, url, json=body, headers=headers, timeout=self.timeout
            )
        except httpx.TimeoutException as exc:
            raise CredentialRefused(
                f"failed: GitHub did not mint a token for {repo} within {self.timeout:g} s; "
                "nothing was applied; try again later"
            ) from exc
        except httpx.HTTPError as exc:
            raise CredentialRefused(
                f"failed: GitHub could not be reached to mint a token for {repo} "
                f"({type(exc).__name__}); nothing was applied; try again later"
            ) from exc


def _refusal(answer: httpx.Response, repo: str, installation: int) -> str:
    try:
        message = str(answer.json().get("message", ""))[:200]
    except ValueError:
        message = ""
    said = f" ({message})" if message else ""
    if answer.status_code == 422:
        return (
            f"failed: the host's GitHub App (installation {installation}) cannot reach {repo} "
            f"with the permissions this effect needs{said}; ask the operator to install the "
            "App on it or grant them; nothing was applied"
        )
    return (
        f"failed: GitHub refused to mint a token for {repo}: {answer.status_code}{said}; "
        "ask the operator; nothing was applied"
    )


def _wider(data: Any, repo: str, asked: dict[str, str]) -> str:
    """What in GitHub's answer is wider than asked ('' when nothing is)."""
    if data.get("repository_selection") == "all":
        return "it reaches every repository"
    names = {str(r.get("full_name", "")).lower() for r in data.get("repositories") or []}
    if names and names != {repo.lower()}:
        return f"it reaches {', '.join(sorted(names))}"
    for name, level in (data.get("permissions") or {}).items():
        if LEVELS.get(str(level), 9) > LEVELS.get(asked.get(name, ""), 0):
            return f"{name}: {level}"
    return ""
