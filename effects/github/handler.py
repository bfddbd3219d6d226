"""What the github.* handlers share: settings, the repository allowlist, an `Api` per
call, the edge, and the agent's text as it will be posted."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from fnmatch import fnmatchcase
from typing import Any

from broker.errors import InvalidParams
from broker.typing import Params
from effects.base import Context, Handler
from effects.github.api import Api
from effects.github.errors import edge
from effects.github.settings import (
    CONFIG_KEYS,
    DEFAULT_BASE_URL,
    check_settings,
    client,
    scope_for,
    settings_of,
)
from effects.github.text import Text


class GitHubHandler(Handler):
    """What the github.* effects share: settings, the allowlist, a client per call."""

    config_keys = CONFIG_KEYS
    permissions: tuple[str, ...] = ("issues",)
    """What the effect's apply and undo write; its preview reads the same, read-only."""

    def check_config(self, settings: Mapping[str, Any]) -> None:
        check_settings(settings)

    def canonical(self, params: Params, ctx: Context) -> Params:
        """GitHub names repositories case-insensitively: `owner/name` in lower case."""
        return {**params, "repo": params["repo"].lower()}

    def check(self, params: Params, ctx: Context) -> None:
        self._allowed(params["repo"], ctx)

    @staticmethod
    def _allowed(repo: str, ctx: Context) -> None:
        if set(repo.split("/")) & {".", ".."}:
            raise InvalidParams("/params/repo", f"{repo!r} is not owner/name")
        globs = settings_of(ctx).repos
        if globs and not any(fnmatchcase(repo.lower(), g.lower()) for g in globs):
            raise InvalidParams(
                "/params/repo",
                f"{repo} is not among the repositories this host allows ({', '.join(globs)})",
                "repo_not_allowed",
            )

    def _api(self, params: Params, ctx: Context, write: bool = False) -> Api:
        """An Api on the request's repository, with a credential for it alone: the
        effect's permissions to write (apply, undo), else to read (preview)."""
        self._allowed(params["repo"], ctx)
        level = "write" if write else "read"
        wanted = tuple(f"{p}:{level}" for p in self.needs(params))
        return Api(client(ctx, scope_for(params["repo"], wanted, ctx)), params["repo"])

    def needs(self, params: Params) -> tuple[str, ...]:
        """The GitHub App permissions this request needs (besides metadata)."""
        return self.permissions

    @staticmethod
    def _url(ctx: Context) -> str:
        return str(ctx.settings.get("base_url", DEFAULT_BASE_URL))

    def _edge(self, doing: str, ctx: Context) -> AbstractContextManager[None]:
        return edge(doing, self._url(ctx))

    @staticmethod
    def _text(ctx: Context) -> Text:
        return Text(bool(ctx.settings.get("allow_mentions", False)))
