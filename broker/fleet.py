"""Names across a fleet of brokers sharing one PostgreSQL store: the host id, and
sandbox ids qualified by it (`HOST.SANDBOX`), so that two hosts' `default` sandboxes
are two sandboxes. With the embedded SQLite ledger nothing is qualified."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

from broker.errors import ConfigError

HOST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
"""A host id: no dot, so `HOST.SANDBOX` splits one way."""
HOST_ID_FILE = "host_id"


def host_id_from(section: Mapping[str, object]) -> str | None:
    """[broker] host_id, or the one host_id_env names; None when neither is set."""
    return host_id_setting(section.get("host_id"), env=section.get("host_id_env"))


def host_id_setting(value: object, env: object = None) -> str | None:
    """[broker] host_id, checked; else the one named by host_id_env (a Kubernetes node
    name from the downward API: its dots become '-'); None when neither is set."""
    if value is None and env is not None:
        if not isinstance(env, str) or not os.environ.get(env):
            raise ConfigError(f"broker.host_id_env: ${env} is not set")
        value = os.environ[env].replace(".", "-")
    if value is None:
        return None
    if not isinstance(value, str) or not HOST_ID.fullmatch(value):
        raise ConfigError(
            f"broker.host_id: {value!r} is not a host id (letters, digits, '-' and '_', "
            "at most 63, no dot)"
        )
    return value


def kept_host_id(state_dir: Path) -> str:
    """The host id kept in the state dir, derived and written there the first time."""
    path = state_dir / HOST_ID_FILE
    try:
        kept = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        kept = ""
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the host id: {exc.strerror}") from exc
    if HOST_ID.fullmatch(kept):
        return kept
    import secrets  # once per state dir: not on every start

    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0]).strip("-_")
    derived = f"{name[:50] or 'host'}-{secrets.token_hex(3)}"
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{HOST_ID_FILE}.{secrets.token_hex(4)}")
        tmp.write_text(derived + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot keep the host id: {exc.strerror}") from exc
    return derived


def qualify(host: str | None, sandbox: str) -> str:
    """The sandbox's id across the fleet (unchanged without a host)."""
    return sandbox if host is None else f"{host}.{sandbox}"


def local(host: str | None, sandbox: str) -> str:
    """The sandbox's id on its own host (its directory's name)."""
    if host is not None and sandbox.startswith(f"{host}."):
        return sandbox[len(host) + 1 :]
    return sandbox


def host_of(sandbox: str) -> str:
    """The host a qualified sandbox id names ('' for an unqualified one)."""
    host, dot, _ = sandbox.partition(".")
    return host if dot else ""
