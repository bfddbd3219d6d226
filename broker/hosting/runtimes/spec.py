"""The hardening every sandbox gets, expressed once, whatever runtime starts it.

A :class:`SandboxSpec` says what the container must be: no network, a read-only root,
no capabilities, no way to gain privileges, SANDBOX_UID, the limits, the outbox bound
read-write and the results read-only (plus a workspace and read-only extras when
asked). Each runtime translates it into its own options (broker.hosting.runtimes.docker,
.podman) and must then prove every property on the created container before it
starts (broker.hosting.runtimes.proof). :func:`prepare_dirs` makes the two host
directories a sandbox sees, with the owners and modes that make them safe.

The records here are NamedTuples, not dataclasses: `broker run` builds them before
its container exists, and the dataclasses module (with inspect, ast and dis) and the
code each class generates cost ~15 ms of every cold start.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

from broker.errors import SandboxError

__all__ = [
    "DEFAULT_LIMITS",
    "LABEL",
    "PROTOCOL_ENV",
    "SANDBOX_ID",
    "SANDBOX_UID",
    "Bind",
    "SandboxLimits",
    "SandboxPaths",
    "SandboxSpec",
    "memory_bytes",
    "sandbox_spec",
]

SANDBOX_UID = 10001
"""The uid and gid agents run as; the image's ``agent`` user (see the Dockerfile)."""

LABEL = "io.sandbox-broker.hosting.sandbox"
"""Label key on every sandbox container; its value is the sandbox id."""

SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
PROTOCOL_ENV = ("OUTBOX_DIR", "RESULTS_DIR", "SANDBOX_ID")


class SandboxLimits(NamedTuple):
    """Resource ceilings for one sandbox container."""

    pids: int = 256
    memory: str = "512m"
    nano_cpus: int = 1_000_000_000
    tmpfs_size: str = "64m"


DEFAULT_LIMITS = SandboxLimits()


class SandboxPaths(NamedTuple):
    """The host side of one sandbox's directories."""

    sandbox_id: str
    root: Path
    outbox: Path
    results: Path


class Bind(NamedTuple):
    """One host directory bound into the sandbox."""

    host: str
    inside: str
    writable: bool


class SandboxSpec(NamedTuple):
    """Everything a runtime needs to start one hardened sandbox, and to prove it."""

    sandbox_id: str
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    binds: tuple[Bind, ...]
    labels: Mapping[str, str]
    limits: SandboxLimits = SandboxLimits()
    name: str | None = None
    user: str = f"{SANDBOX_UID}:{SANDBOX_UID}"
    tmpfs: Mapping[str, str] = MappingProxyType({})
    entrypoint: tuple[str, ...] | None = None  # None: the image's own

    @property
    def memory(self) -> int:
        return memory_bytes(self.limits.memory)


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def memory_bytes(text: str) -> int:
    """'512m' -> bytes, as Docker and Podman read a memory limit."""
    found = re.fullmatch(r"\s*(\d+)\s*([bkmg]?)b?\s*", text.lower())
    if found is None:
        raise SandboxError(f"memory limit {text!r} is not a size like 512m")
    return int(found.group(1)) * _UNITS[found.group(2)]


def sandbox_spec(
    paths: SandboxPaths,
    image: str,
    command: Sequence[str],
    *,
    limits: SandboxLimits = DEFAULT_LIMITS,
    env: Mapping[str, str] | None = None,
    workspace: Path | None = None,
    name: str | None = None,
    read_only_mounts: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> SandboxSpec:
    """The spec of one sandbox; `read_only_mounts` maps host paths to container paths.

    The environment holds only OUTBOX_DIR, RESULTS_DIR, SANDBOX_ID and ``env`` (the
    extras a configuration names; never the host's own environment)."""
    extras = dict(env or {})
    clash = sorted(set(extras) & set(PROTOCOL_ENV))
    if clash:
        raise SandboxError(f"sandbox env may not set {', '.join(clash)}: the broker sets them")
    binds = [
        Bind(str(paths.outbox), "/outbox", writable=True),
        Bind(str(paths.results), "/results", writable=False),
    ]
    if workspace is not None:
        binds.append(Bind(str(workspace), "/workspace", writable=True))
    binds += [Bind(host, inside, False) for host, inside in (read_only_mounts or {}).items()]
    return SandboxSpec(
        sandbox_id=paths.sandbox_id,
        image=image,
        command=tuple(command),
        env={
            **extras,
            "OUTBOX_DIR": "/outbox",
            "RESULTS_DIR": "/results",
            "SANDBOX_ID": paths.sandbox_id,
        },
        binds=tuple(binds),
        labels={**(labels or {}), LABEL: paths.sandbox_id},
        limits=limits,
        name=name,
        tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={limits.tmpfs_size},mode=1777"},
    )


def prepare_dirs(state_dir: Path, sandbox_id: str, agent_uid: int = SANDBOX_UID) -> SandboxPaths:
    """Create (or repair) the outbox and results directories of ``sandbox_id``.

    The outbox is writable by ``agent_uid`` alone (the host uid that is SANDBOX_UID in
    the sandbox: itself, or a rootless Podman user); the results directory belongs to
    the broker and is only readable in the sandbox. Existing results are kept. Needs
    root to give the outbox to another uid; raises SandboxError otherwise.
    """
    if not SANDBOX_ID.match(sandbox_id):
        raise SandboxError(f"sandbox id {sandbox_id!r} must match {SANDBOX_ID.pattern[:-2]}")
    sandboxes = state_dir / "sandboxes"
    root = sandboxes / sandbox_id
    paths = SandboxPaths(sandbox_id, root, root / "outbox", root / "results")
    try:
        sandboxes.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.mkdir(mode=0o755, exist_ok=True)
        paths.outbox.mkdir(mode=0o700, exist_ok=True)
        if paths.outbox.stat().st_uid != agent_uid or paths.outbox.stat().st_gid != agent_uid:
            os.chown(paths.outbox, agent_uid, agent_uid)
        paths.outbox.chmod(0o700)
        paths.results.mkdir(mode=0o755, exist_ok=True)
        if paths.results.stat().st_uid != os.getuid():
            os.chown(paths.results, os.getuid(), os.getgid())
        paths.results.chmod(0o755)
    except PermissionError as exc:
        raise SandboxError(
            f"cannot prepare {root}: {exc.strerror}; the broker must run as root "
            f"to hand the outbox to uid {agent_uid}"
        ) from exc
    except OSError as exc:
        raise SandboxError(f"cannot prepare {root}: {exc.strerror or exc}") from exc
    return paths
