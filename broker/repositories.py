"""Protected paths belong to the repository: `[repositories.NAME]` in broker.toml, read
by every effect that can write to it (git.push to its remotes, a pull request from
`files` on GitHub, and any later one).

    [repositories.api]
    github = "acme/api"                      # github.* effects on this repository
    git_remotes = ["origin"]                 # [integrations.git.remotes.*] pushing to it
    protected_paths = [".github/workflows/**", ".github/actions/**", "deploy/**"]

A repository not listed, and one whose table leaves `protected_paths` out, has the
default set (`DEFAULT_PROTECTED`): CI workflows and actions run with the repository's
secrets. `protected_paths = []` opts out, explicitly. The older per-integration keys
(`[integrations.git] protected_paths`, `[integrations.github] protected_paths`) still
count, for every repository of either kind, so a path protected once is protected for
every effect. (files.write and s3.* keep theirs per root and bucket.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from broker.errors import ConfigError
from broker.settings import only_keys

DEFAULT_PROTECTED = (".github/workflows/**", ".github/actions/**")
KEYS = frozenset({"github", "git_remotes", "protected_paths"})
LEGACY = ("git", "github")  # integrations whose own protected_paths apply to every repository


class Repository(NamedTuple):
    """One `[repositories.NAME]` table, checked."""

    name: str
    github: str | None
    remotes: tuple[str, ...]
    protected: tuple[str, ...]


class Repositories(NamedTuple):
    """Every repository the host names, and the paths protected in each."""

    tables: tuple[Repository, ...] = ()
    legacy: tuple[str, ...] = ()

    def for_github(self, repo: str) -> tuple[str, ...]:
        """The protected paths of GitHub repository `owner/name` (any case)."""
        found = [t for t in self.tables if t.github == repo.lower()]
        return self._with_legacy(found)

    def for_remote(self, remote: str) -> tuple[str, ...]:
        """The protected paths of what `[integrations.git.remotes.<remote>]` pushes to."""
        return self._with_legacy([t for t in self.tables if remote in t.remotes])

    def _with_legacy(self, found: list[Repository]) -> tuple[str, ...]:
        own = [g for t in found for g in t.protected] if found else list(DEFAULT_PROTECTED)
        return tuple(dict.fromkeys([*own, *self.legacy]))


def parse(table: Mapping[str, Any], integrations: Mapping[str, Mapping[str, Any]]) -> Repositories:
    """`[repositories.*]` and the per-integration keys; a fault names the key."""
    if not isinstance(table, Mapping):
        raise ConfigError("repositories: must be tables [repositories.NAME]")
    found = tuple(_repository(name, spec) for name, spec in table.items())
    for key in ("github", "remotes"):
        seen: dict[str, str] = {}
        for repo in found:
            for value in [repo.github] if key == "github" else list(repo.remotes):
                if value is not None and value in seen:
                    raise ConfigError(
                        f"repositories.{repo.name}: {value} is also repositories.{seen[value]}'s; "
                        "a repository is described once"
                    )
                if value is not None:
                    seen[value] = repo.name
    legacy: list[str] = []
    for name in LEGACY:
        legacy += _globs(
            (integrations.get(name) or {}).get("protected_paths", []),
            f"integrations.{name}.protected_paths",
        )
    return Repositories(found, tuple(dict.fromkeys(legacy)))


def _repository(name: str, spec: Any) -> Repository:
    where = f"repositories.{name}"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table")
    only_keys(where, spec, KEYS)
    github = spec.get("github")
    if github is not None and (
        not isinstance(github, str) or not re.fullmatch(r"[\w.-]+/[\w.-]+", github)
    ):
        raise ConfigError(f"{where}.github: expected owner/name, got {github!r}")
    remotes = spec.get("git_remotes", [])
    if not isinstance(remotes, list) or not all(isinstance(r, str) and r for r in remotes):
        raise ConfigError(f"{where}.git_remotes: must be a list of remote names")
    if github is None and not remotes:
        raise ConfigError(f"{where}: name its github repository, its git_remotes, or both")
    protected = spec.get("protected_paths", list(DEFAULT_PROTECTED))
    globs = _globs(protected, f"{where}.protected_paths")
    return Repository(name, github.lower() if github else None, tuple(remotes), tuple(globs))


def _globs(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(g, str) and g for g in value):
        raise ConfigError(f"{where}: must be a list of globs")
    return list(value)
