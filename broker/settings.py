"""An integration's settings: one table of broker.toml, read-only, with dotted keys as
TOML writes them and secrets resolved from references, never written in the file.

    github = Settings.of(raw, "integrations.github")
    token = github.secret("token")          # token_env or token_file; ConfigError naming the key
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from broker.errors import ConfigError

SECRET_WORDS = re.compile(
    r"(token|password|passwd|secret|api_key|apikey|private_key|access_key|credentials?)$", re.I
)


def only_keys(where: str, table: Mapping[str, Any], keys: Iterable[str]) -> None:
    """Refuse the first key of the config table at `where` (in sorted order) that is not
    one of `keys`, naming the keys it may hold: a typo stops the start, not a default."""
    known = sorted(set(keys))
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (one of {', '.join(known)})")


class Settings(Mapping[str, Any]):
    """One table of broker.toml (an integration's settings), read-only, knowing where it
    came from: `secret(key)` resolves a reference in it the one way secrets resolve
    (`*_file` beside broker.toml), and errors name the key in full."""

    def __init__(self, data: Mapping[str, Any], where: str, base_dir: Path | None = None) -> None:
        self._data = data
        self.where = where
        self.base_dir = base_dir

    @classmethod
    def of(cls, settings: Mapping[str, Any], where: str) -> Settings:
        """`settings` as Settings (a plain mapping resolves relative files from the
        current directory, as a test building one by hand expects)."""
        return settings if isinstance(settings, Settings) else cls(settings, where)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Settings({self.where}: {sorted(self._data)})"

    def only(self, keys: Iterable[str]) -> None:
        """Refuse the first key (in sorted order) that is not one of `keys`."""
        only_keys(self.where, self._data, keys)

    @staticmethod
    def key(*parts: str) -> str:
        """A dotted key naming exactly `parts`, as TOML writes it: a part holding
        anything but letters, digits, '-' and '_' is quoted (`remotes."github.com".token`)."""
        for part in parts:
            if '"' in part or not part:
                raise ValueError(f"{part!r} cannot be part of a settings key")
        return _joined(parts)

    def table(self, dotted: str) -> Settings | None:
        """The nested table at a dotted key (`remotes.origin`), or None."""
        return self._at(_key_parts(dotted))

    def _at(self, parts: list[str]) -> Settings | None:
        node: Any = self._data
        for part in parts:
            node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            return None
        return Settings(node, f"{self.where}.{_joined(parts)}", self.base_dir)

    def reference(self, key: str, suffix: str) -> Any:
        """The raw value of `<key>_<suffix>` (a dotted key reaches a nested table), or
        None: a reference resolved elsewhere (`_kv`, read per call: effects/kv.py)."""
        *path, leaf = _key_parts(key)
        table = self._at(path) if path else self
        return None if table is None else table._data.get(f"{leaf}_{suffix}")

    def secret(self, key: str) -> str | None:
        """The value behind `<key>_env` / `<key>_file` (a dotted key reaches a nested
        table; `Settings.key` quotes names holding dots), or None when neither is set;
        ConfigError naming the key if unreadable."""
        *path, leaf = _key_parts(key)
        table = self._at(path) if path else self
        if table is None:
            return None
        return resolve_secret(table._data, leaf, table.where, self.base_dir)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_KEY_PART = re.compile(r'"([^"]+)"|([^".]+)')


def _joined(parts: Iterable[str]) -> str:
    return ".".join(p if _BARE_KEY.fullmatch(p) else f'"{p}"' for p in parts)


def _key_parts(dotted: str) -> list[str]:
    """`a."b.c".d` → ["a", "b.c", "d"]; anything unquoted splits at each dot."""
    parts: list[str] = []
    pos = 0
    while pos <= len(dotted):
        found = _KEY_PART.match(dotted, pos)
        end = found.end() if found else pos
        if found is None or (end < len(dotted) and dotted[end] != "."):
            return dotted.split(".")  # not TOML-shaped: read as it always was
        parts.append(found.group(1) or found.group(2))
        pos = end + 1
    return parts


def resolve_secret(
    table: Mapping[str, Any], key: str, where: str, base: Path | None = None
) -> str | None:
    """The value behind `<key>_env` or `<key>_file`, or None when neither is set.

    A relative `_file` is read next to broker.toml (`base`), wherever the command runs.
    """
    env_name = table.get(f"{key}_env")
    file_name = table.get(f"{key}_file")
    if env_name is not None:
        value = os.environ.get(str(env_name))
        if value is None:
            raise ConfigError(f"{where}.{key}_env: environment variable {env_name} is not set")
        return value
    if file_name is not None:
        path = Path(str(file_name))
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"{where}.{key}_file: cannot read {file_name}: {exc.strerror}"
            ) from exc
    return None


def check_no_literal_secrets(table: Mapping[str, Any], where: str) -> None:
    for key, value in table.items():
        if isinstance(value, Mapping):
            check_no_literal_secrets(value, f"{where}.{key}")
        elif SECRET_WORDS.search(key) and not isinstance(value, list):
            raise ConfigError(
                f"{where}.{key}: secrets are never written in broker.toml; "
                f"use {key}_env (an environment variable) or {key}_file (a file)"
            )
