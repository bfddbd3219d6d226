"""[integrations.github], checked, and a PyGithub client with the host's credentials.

Secrets come only through `ctx.secret` (and `Settings.secret` at start): a relative
token_file or private_key_file is read beside broker.toml.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from broker.errors import ConfigError, EffectFailed
from broker.settings import only_keys
from effects.base import Context, Scope, Settings

if TYPE_CHECKING:  # imported by the calls that use them: a start never pays for PyGithub
    from github import Github
    from urllib3.util.retry import Retry

DEFAULT_BASE_URL = "https://api.github.com"
DEFAULT_TIMEOUT_S = 15
USER_AGENT = "sandbox-outbox-broker"
CONFIG_KEYS = frozenset(
    {
        "base_url",
        "repos",
        "allow_mentions",
        "timeout",
        "token_env",
        "token_file",
        "app_id",
        "private_key_env",
        "private_key_file",
        "installation_id",
        "protected_paths",
        # approving in the pull request: read by broker.integrations.github_threads
        "approve_in_pr",
        "staging_prefix",
        "staging_public",
        "agent_logins",
        "webhook_secret_env",
        "webhook_secret_file",
        "poll_interval",
        "issues_repo",
        "credential",
    }
)
APP_TOKEN_CALL = ("POST", "/app/installations/{installation_id}/access_tokens")
"""What a GitHub App's provider sends first (broker/credentials/github_app.py)."""
APP_REVOKE_CALL = ("DELETE", "/installation/token")
"""What it sends when the call ends."""
_LOOPBACK_NAMES = {"localhost"}


@dataclass(frozen=True)
class GitHubSettings:
    """[integrations.github], checked."""

    base_url: str
    repos: tuple[str, ...]
    allow_mentions: bool
    timeout: int
    protected_paths: tuple[str, ...] = ()


def check_settings(settings: Mapping[str, Any]) -> GitHubSettings:
    """Validate [integrations.github]; raises ConfigError naming the key at fault."""
    where = "integrations.github"
    only_keys(where, settings, CONFIG_KEYS)
    base_url = settings.get("base_url", DEFAULT_BASE_URL)
    if not isinstance(base_url, str):
        raise ConfigError(f"{where}.base_url: expected a URL, got {base_url!r}")
    parts = urlsplit(base_url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(f"{where}.base_url: {base_url!r} is not an http(s) URL")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise ConfigError(
            f"{where}.base_url: {base_url!r} would send the host's credentials in clear "
            "text; use https (plain http is accepted for 127.0.0.1 and localhost only)"
        )
    if parts.query or parts.fragment or parts.username:
        raise ConfigError(f"{where}.base_url: no query, fragment or user-info, please")
    repos = settings.get("repos", [])
    if not isinstance(repos, list) or not all(
        isinstance(r, str) and r.count("/") == 1 for r in repos
    ):
        raise ConfigError(f"{where}.repos: must be a list of owner/name globs, e.g. ['acme/*']")
    mentions = settings.get("allow_mentions", False)
    if not isinstance(mentions, bool):
        raise ConfigError(f"{where}.allow_mentions: expected true or false")
    timeout = settings.get("timeout", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 0 < timeout <= 600:
        raise ConfigError(f"{where}.timeout: expected whole seconds between 1 and 600")
    protected = settings.get("protected_paths", [])
    if not isinstance(protected, list) or not all(isinstance(g, str) and g for g in protected):
        raise ConfigError(f"{where}.protected_paths: must be a list of globs")
    _check_credentials(settings, where)
    return GitHubSettings(base_url.rstrip("/"), tuple(repos), mentions, timeout, tuple(protected))


def _check_credentials(settings: Mapping[str, Any], where: str) -> None:
    token = [k for k in ("token_env", "token_file") if k in settings]
    app = [k for k in ("app_id", "installation_id") if k in settings]
    key = [k for k in ("private_key_env", "private_key_file") if k in settings]
    if len(token) > 1 or len(key) > 1:
        raise ConfigError(f"{where}.{(token + key)[-1]}: give one of *_env or *_file, not both")
    if "credential" in settings and (token or app or key):
        raise ConfigError(
            f"{where}.credential: give either a provider ([credentials.NAME]) or the "
            f"credentials here ({(token + app + key)[0]}), not both"
        )
    if token and (app or key):
        raise ConfigError(
            f"{where}.{(app + key)[0]}: give either a token (token_env) or a GitHub App "
            "(app_id, private_key_file, installation_id), not both"
        )
    if app or key:
        for name in ("app_id", "installation_id"):
            value = settings.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}.{name}: a GitHub App needs it, a positive integer")
        if not key:
            raise ConfigError(f"{where}.private_key_file: a GitHub App needs its private key")
    for name in ("token_env", "private_key_env", "token_file", "private_key_file"):
        value = settings.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{where}.{name}: expected a name, got {value!r}")
    for name in ("token", "private_key"):
        if f"{name}_env" in settings:  # a variable is checked at start; a file when used
            Settings.of(settings, where).secret(name)


def _loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _retry() -> Retry:
    """Retry reads on gateway errors, briefly; never a write, never a long rate-limit sleep."""
    from urllib3.util.retry import Retry

    return Retry(
        total=2,
        backoff_factor=0.2,
        status_forcelist=(502, 503, 504),
        allowed_methods=frozenset({"GET", "HEAD"}),
        respect_retry_after_header=False,
        raise_on_status=False,
    )


def settings_of(ctx: Context) -> GitHubSettings:
    """The checked settings; broken ones (checked at start too) fail the request."""
    try:
        return check_settings(ctx.settings)
    except ConfigError as exc:
        raise EffectFailed(
            f"failed: GitHub is misconfigured on this host ({exc}); ask the operator"
        ) from exc


def scope_for(repo: str, permissions: tuple[str, ...], ctx: Context) -> Scope:
    """What one call needs of GitHub: one repository, these permissions, and metadata."""
    actions = tuple(sorted({*permissions, "metadata:read"}))
    return Scope("github", (repo,), actions, endpoint=settings_of(ctx).base_url)


def client(ctx: Context, scope: Scope | None = None) -> Github:
    """A PyGithub client for one handler call: with a token minted for `scope` when the
    integration names a provider (a GitHub App), else with the host's standing token."""
    from github import Auth, Github

    settings = settings_of(ctx)
    grant = ctx.credential(scope) if scope is not None else None
    try:
        token = grant.token if grant is not None else ctx.secret("token")
    except ConfigError as exc:
        raise EffectFailed(
            f"failed: the host's GitHub credentials are unavailable ({exc}); ask the operator"
        ) from exc
    if not token:
        raise EffectFailed(
            "failed: GitHub is not configured on this host ([integrations.github] token_env, "
            "or app_id, private_key_file and installation_id); ask the operator"
        )
    return Github(
        auth=Auth.Token(token),
        base_url=settings.base_url,
        timeout=settings.timeout,
        user_agent=USER_AGENT,
        retry=_retry(),
        seconds_between_requests=None,
        seconds_between_writes=None,
    )
