"""Inputs whose start-up check passed, remembered in the state dir.

`broker run` checks its config as `broker serve` does (the registry's entry points,
every integration's settings, the policy: ≈ 0.15 s of CPU) so that a fault is one line
before a sandbox exists. Inputs that passed once pass again: when this run's inputs
are ones a check passed before, the run starts its sandbox at once and checks only when
it first builds a broker (broker.cli.assembly.Checked), which it does when the sandbox
writes. A fault found then still stops the run with its one line, and the container is
removed; nothing is served unchecked.

The inputs, hashed into one key: the digest of broker.toml's and the policy's paths and
bytes with the broker's version and the state dir (broker.inputs); the values of the
environment variables and the status of the files that broker.toml's `*_env` and
`*_file` settings name; and the modification times of the site-packages directories
on sys.path (an installed, removed or upgraded distribution, whose entry points may
add a plugin, changes its directory). Anything else a check reads is read again when
the broker is built.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.inputs import digest, read_toml, sha256

if TYPE_CHECKING:
    from broker.config import Config

__all__ = ["forget", "key", "passed_before", "remember"]

FILE = "checked.json"
KEEP = 8  # keys remembered (several configs may share a state dir)


def key(cfg: Config) -> str:
    """What a check of `cfg` depends on, hashed (see the module's docstring)."""
    found = sha256(digest(cfg.state_dir, cfg.source, cfg.policy_path).encode())
    data = _tables(cfg.source)
    base = cfg.base_dir or Path.cwd()
    for setting, value in sorted(_references(data)):
        found.update(f"\0{setting}={value}\0".encode())
        if setting.endswith("_env"):
            env = os.environ.get(value)
            found.update(b"-" if env is None else sha256(env.encode()).digest())
        else:
            try:
                st = (base / value).stat()
                found.update(f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode())
            except OSError as exc:
                found.update(f"unreadable {exc.errno}".encode())
    for entry in sys.path:  # where distributions are installed (not the script's dir)
        if not entry.endswith(("site-packages", "dist-packages")):
            continue
        with contextlib.suppress(OSError):
            found.update(f"\0{entry}:{os.stat(entry or '.').st_mtime_ns}".encode())
    return found.hexdigest()


def passed_before(cfg: Config) -> list[str] | None:
    """The warnings of the check these inputs passed before; None: not known to pass."""
    remembered = _read(cfg.state_dir / FILE)
    warnings = remembered.get(key(cfg))
    if isinstance(warnings, list) and all(isinstance(w, str) for w in warnings):
        return warnings
    return None


def remember(cfg: Config, warnings: list[str]) -> None:
    """Record that `cfg`'s inputs passed the check, with its warnings (best effort: a
    state dir that cannot take it only means the next run checks again)."""
    path = cfg.state_dir / FILE
    remembered = {k: v for k, v in _read(path).items() if isinstance(v, list)}
    remembered.pop(this := key(cfg), None)
    remembered[this] = warnings  # the newest last: the oldest are dropped first
    _write(cfg, dict(list(remembered.items())[-KEEP:]))


def forget(cfg: Config) -> None:
    """A check of `cfg` failed after all: the next run checks before it starts."""
    remembered = _read(cfg.state_dir / FILE)
    if remembered.pop(key(cfg), None) is not None:
        _write(cfg, remembered)


def _write(cfg: Config, kept: dict[str, Any]) -> None:
    path = cfg.state_dir / FILE
    tmp = path.with_name(f".{FILE}.{os.getpid()}")
    with contextlib.suppress(OSError):
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(kept, out)
        os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tables(source: Path | None) -> Mapping[str, Any]:
    if source is None:
        return {}
    from broker.errors import ConfigError

    try:
        return read_toml(source, ConfigError, "configuration file")
    except ConfigError:
        return {}  # unreadable now: the key names that (via the digest), the check says it


def _references(table: Mapping[str, Any], where: str = "") -> Iterator[tuple[str, str]]:
    """Every `*_env` and `*_file` setting with a name in it, as (dotted key, value)."""
    for name, value in table.items():
        dotted = f"{where}.{name}" if where else str(name)
        if isinstance(value, Mapping):
            yield from _references(value, dotted)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, Mapping):
                    yield from _references(item, f"{dotted}[{i}]")
        elif isinstance(value, str) and str(name).endswith(("_env", "_file")):
            yield dotted, value
