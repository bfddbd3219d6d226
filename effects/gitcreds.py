"""The token one git.push call holds for its remote: a GitHub App installation token
minted for the remote's repository alone (`contents: read` to fetch for an assessment
or a preview, `contents: write` to push or undo) when `[integrations.git]` names a
provider (`credential = "NAME"`), else the remote's standing `token_env` / `token_file`.

A remote on local disk (a path, `file://`) needs none. A mint that is refused fails the
call (CredentialRefused) and nothing falls back to a standing token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from broker.errors import ConfigError, EffectFailed
from effects.base import Context, Scope, Settings

Access = Literal["read", "write"] | None
REMOTE_KEYS = frozenset(
    {"url", "token_env", "token_file", "username", "default_branch", "repository", "api_url"}
)
GITHUB_API = "https://api.github.com"


def minted(settings: Mapping[str, Any], url: str) -> bool:
    """Whether a remote at `url` gets a minted token: the integration names a provider
    and the remote is reached over http(s)."""
    return "credential" in settings and urlsplit(url).scheme in ("http", "https")


def repository(table: Mapping[str, Any]) -> str:
    """`owner/name` of the remote: its `repository`, else its URL's path without `.git`."""
    given = table.get("repository")
    if given is None:
        given = urlsplit(str(table["url"])).path.strip("/").removesuffix(".git")
    return str(given)


def check_remote(settings: Mapping[str, Any], table: Mapping[str, Any], where: str) -> None:
    """A remote with a minted token holds no standing one and names its repository."""
    if not minted(settings, str(table["url"])):
        return
    standing = [k for k in ("token_env", "token_file") if k in table]
    if standing:
        raise ConfigError(
            f"{where}.{standing[0]}: [integrations.git] names a provider (credential), which "
            "mints this remote's token per push; remove the standing token"
        )
    name = repository(table)
    if name.count("/") != 1 or not all(name.split("/")):
        raise ConfigError(
            f'{where}.repository: the remote\'s GitHub repository, "owner/name" '
            "(its URL does not say it)"
        )


def token(ctx: Context, name: str, table: Mapping[str, Any], access: Access) -> str | None:
    """The token of this call for remote `name`: minted for `access`, or standing.
    `access` None (a check on the loop) mints nothing and holds no minted token."""
    if not minted(ctx.settings, str(table["url"])):
        return ctx.secret(Settings.key("remotes", name, "token"))
    if access is None:
        return None
    endpoint = str(table.get("api_url", GITHUB_API)).rstrip("/")
    scope = Scope(
        "github", (repository(table),), (f"contents:{access}", "metadata:read"), endpoint=endpoint
    )
    grant = ctx.credential(scope)
    if grant is None:  # `credential` names a table the broker did not load: never standing
        raise EffectFailed(
            "failed: [integrations.git] names a credential provider this broker has not "
            "loaded; ask the operator; nothing was pushed"
        )
    return grant.token
