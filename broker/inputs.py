"""Where broker.toml, the state dir and the policy are, and the digest of what the
start-up check reads.

One place resolves them, for `load_config` (broker.config) and for `broker run`'s
client (broker.cli.run_client), so that the two cannot disagree: a run whose digest
is the one a serving owner names in its lock file is run by that owner, which checked
exactly these bytes. Light on purpose (os, tomllib): the client imports this
and not the config's validation, the registry or the pipeline.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker import __version__
from broker.errors import ConfigError

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = ["Located", "default_state_dir", "digest", "locate", "read_toml", "sha256"]


class Located:
    """broker.toml's path (None: no file) and tables, the state dir and the policy's
    path, both as the options, the environment and the file name them."""

    __slots__ = ("data", "path", "policy_path", "state_dir")

    def __init__(
        self, path: Path | None, data: dict[str, Any], state_dir: Path, policy_path: Path | None
    ) -> None:
        self.path = path
        self.data = data
        self.state_dir = state_dir
        self.policy_path = policy_path


def locate(
    path: Path | None = None, state_dir: Path | None = None, policy: Path | None = None
) -> Located:
    """broker.toml: `path`, else $BROKER_CONFIG, else <state_dir>/broker.toml (an
    absent default file is no file at all, an absent file someone named is an error);
    the state dir and the policy as options or the file give them."""
    if path is None and os.environ.get("BROKER_CONFIG"):
        path = Path(os.environ["BROKER_CONFIG"])
    data: dict[str, Any] = {}
    if path is not None:
        data = read_toml(path, ConfigError, "configuration file")
    else:
        default = (state_dir or default_state_dir()) / "broker.toml"
        if default.exists():
            path, data = default, read_toml(default, ConfigError, "configuration file")
    section = data.get("broker", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [broker] must be a table")
    for key in ("state_dir", "policy"):
        if not isinstance(section.get(key, ""), str):
            raise ConfigError(f"{path}: broker.{key}: expected a path (a string)")
    base = path.parent if path else Path.cwd()
    state = state_dir or (base / section["state_dir"] if "state_dir" in section else None)
    state = Path(state) if state else default_state_dir()
    policy_path = policy or (base / section["policy"] if "policy" in section else None)
    return Located(path, data, state.absolute(), policy_path.absolute() if policy_path else None)


def default_state_dir() -> Path:
    env = os.environ.get("BROKER_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME")
    return Path(xdg) / "broker" if xdg else Path.home() / ".local" / "state" / "broker"


def digest(state_dir: Path, source: Path | None, policy_path: Path | None) -> str:
    """What the start-up check of a config reads: the broker's version, the state dir,
    and broker.toml's and the policy's resolved paths and bytes."""
    found = sha256(f"{__version__}\0{state_dir.resolve()}".encode())
    for path in (source, policy_path):
        found.update(b"\0" + str(path.resolve() if path else "").encode() + b"\0")
        if path is not None:
            try:
                found.update(path.read_bytes())
            except OSError as exc:  # the check itself says what is wrong with it
                found.update(f"unreadable {exc.errno}".encode())
    return found.hexdigest()


def read_toml(path: Path, error: type[ConfigError], what: str) -> dict[str, Any]:
    """A TOML file's tables; any problem is one `error` naming the file."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise error(f"{path}: no such {what}") from exc
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: not valid TOML: {exc}") from exc


def sha256(data: bytes = b"") -> _Hash:
    """SHA-256 from the interpreter's own module (_sha256; _sha2 from 3.12), or hashlib's
    where this Python was built without it. Not hashlib's first: it loads OpenSSL's
    libcrypto (3–6 ms measured here), which every `broker run` paid before its sandbox
    started, for the few kilobytes of inputs and image sources it hashes."""
    builtin = "_sha2" if sys.version_info >= (3, 12) else "_sha256"
    try:
        made: _Hash = __import__(builtin).sha256(data)
    except ImportError:
        from hashlib import sha256 as openssl

        made = openssl(data)
    return made
