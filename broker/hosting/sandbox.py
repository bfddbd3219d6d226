"""Docker sandboxes: where agents run, with no network, no credentials, no host state.

A sandbox is one container started by :func:`start` from the agent image (built by
:func:`broker.hosting.images.ensure_image` from ``sandbox_images/``). It sees exactly
two host directories made by :func:`prepare_dirs` under ``<state_dir>/sandboxes/<id>/``:

    outbox/   -> /outbox   read-write; owned by SANDBOX_UID, mode 0700
    results/  -> /results  read-only;  owned by the broker, mode 0755

plus, when asked, a workspace at ``/workspace``. Everything else in the state dir
(ledger, audit log, attachments) stays out of reach. Every container carries the
label ``LABEL=<sandbox id>`` so :func:`leftovers` finds the ones a crash left behind.

Docker's own exceptions stop here: what callers see is :class:`SandboxError`.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Mount

from broker.errors import SandboxError

__all__ = [
    "LABEL",
    "SANDBOX_UID",
    "SandboxLimits",
    "SandboxPaths",
    "engine",
    "hardened",
    "leftovers",
    "prepare_dirs",
    "remove",
    "start",
]

SANDBOX_UID = 10001
"""The uid and gid agents run as; the image's ``agent`` user (see the Dockerfile)."""

LABEL = "io.sandbox-broker.hosting.sandbox"
"""Label key on every sandbox container; its value is the sandbox id."""

_SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_PROTOCOL_ENV = ("OUTBOX_DIR", "RESULTS_DIR", "SANDBOX_ID")

Log = Callable[[str], None]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource ceilings for one sandbox container."""

    pids: int = 256
    memory: str = "512m"
    nano_cpus: int = 1_000_000_000
    tmpfs_size: str = "64m"


@dataclass(frozen=True)
class SandboxPaths:
    """The host side of one sandbox's directories."""

    sandbox_id: str
    root: Path
    outbox: Path
    results: Path


def prepare_dirs(state_dir: Path, sandbox_id: str) -> SandboxPaths:
    """Create (or repair) the outbox and results directories of ``sandbox_id``.

    The outbox is writable by SANDBOX_UID alone; the results directory belongs to the
    broker and is only readable in the sandbox. Existing results are kept. Needs
    root, to give the outbox to SANDBOX_UID; raises SandboxError otherwise.
    """
    if not _SANDBOX_ID.match(sandbox_id):
        raise SandboxError(f"sandbox id {sandbox_id!r} must match {_SANDBOX_ID.pattern[:-2]}")
    sandboxes = state_dir / "sandboxes"
    root = sandboxes / sandbox_id
    paths = SandboxPaths(sandbox_id, root, root / "outbox", root / "results")
    try:
        sandboxes.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.mkdir(mode=0o755, exist_ok=True)
        paths.outbox.mkdir(mode=0o700, exist_ok=True)
        os.chown(paths.outbox, SANDBOX_UID, SANDBOX_UID)
        paths.outbox.chmod(0o700)
        paths.results.mkdir(mode=0o755, exist_ok=True)
        os.chown(paths.results, os.getuid(), os.getgid())
        paths.results.chmod(0o755)
    except PermissionError as exc:
        raise SandboxError(
            f"cannot prepare {root}: {exc.strerror}; the broker must run as root "
            f"to hand the outbox to uid {SANDBOX_UID}"
        ) from exc
    except OSError as exc:
        raise SandboxError(f"cannot prepare {root}: {exc.strerror or exc}") from exc
    return paths


def engine() -> docker.DockerClient:
    """Connect to the Docker engine named by the environment (DOCKER_HOST, else the socket)."""
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    client: docker.DockerClient | None = None
    try:
        if where.startswith("unix://"):
            _check_socket(where.removeprefix("unix://"))
        client = docker.from_env()
        client.ping()
    except (OSError, docker.errors.DockerException) as exc:  # requests' errors are OSErrors
        if client is not None:
            client.close()
        raise SandboxError(
            f"the Docker engine at {where} does not answer ({exc}); "
            "start one with: bash scripts/docker-up.sh"
        ) from exc
    return client


def _check_socket(path: str) -> None:
    """Connect once to a unix socket; the SDK leaks its socket when this fails."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        probe.connect(path)


def hardened(
    paths: SandboxPaths,
    limits: SandboxLimits = SandboxLimits(),
    env: Mapping[str, str] | None = None,
    workspace: Path | None = None,
    *,
    read_only_mounts: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The container options every sandbox gets (docker-py's `containers.create`);
    `read_only_mounts` maps host paths to container paths, bound read-only."""
    extras = dict(env or {})
    clash = sorted(set(extras) & set(_PROTOCOL_ENV))
    if clash:
        raise SandboxError(f"sandbox env may not set {', '.join(clash)}: the broker sets them")
    mounts = [
        Mount("/outbox", str(paths.outbox), type="bind", read_only=False),
        Mount("/results", str(paths.results), type="bind", read_only=True),
    ]
    if workspace is not None:
        mounts.append(Mount("/workspace", str(workspace), type="bind", read_only=False))
    for host, inside in (read_only_mounts or {}).items():
        mounts.append(Mount(inside, host, type="bind", read_only=True))
    return {
        "detach": True,
        "auto_remove": False,
        "user": f"{SANDBOX_UID}:{SANDBOX_UID}",
        "environment": {
            **extras,
            "OUTBOX_DIR": "/outbox",
            "RESULTS_DIR": "/results",
            "SANDBOX_ID": paths.sandbox_id,
        },
        "mounts": mounts,
        "labels": {**(labels or {}), LABEL: paths.sandbox_id},
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,exec,nosuid,nodev,size={limits.tmpfs_size},mode=1777"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": limits.pids,
        "mem_limit": limits.memory,
        "nano_cpus": limits.nano_cpus,
    }


def start(
    client: docker.DockerClient,
    paths: SandboxPaths,
    image: str,
    command: Sequence[str],
    *,
    limits: SandboxLimits = SandboxLimits(),
    env: Mapping[str, str] | None = None,
    workspace: Path | None = None,
    name: str | None = None,
    read_only_mounts: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Container:
    """Start ``command`` in a new sandbox container and return it (detached).

    The container has no network, a read-only root, a small /tmp (tmpfs; exec is
    allowed, agents run what they write), no capabilities, runs as SANDBOX_UID, and
    its environment holds only OUTBOX_DIR, RESULTS_DIR, SANDBOX_ID and ``env`` (the
    extras a configuration names; never the host's own environment). ``workspace``,
    if given, is mounted read-write at /workspace and must be writable by
    SANDBOX_UID. The caller removes the container with :func:`remove`.
    """
    options = hardened(
        paths, limits, env, workspace, read_only_mounts=read_only_mounts, labels=labels
    )
    try:
        # create + start, not run: run() would try to pull a missing image from a registry.
        container = client.containers.create(image, list(command), name=name, **options)
    except docker.errors.ImageNotFound as exc:
        raise SandboxError(f"image {image} is missing; build it with: broker image build") from exc
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot create sandbox {paths.sandbox_id}: {exc}") from exc
    try:
        container.start()
    except docker.errors.DockerException as exc:
        remove(container)
        raise SandboxError(f"cannot start sandbox {paths.sandbox_id}: {exc}") from exc
    except BaseException:  # a Ctrl-C mid-start: nobody else knows the container yet
        remove(container)
        raise
    return container


def remove(container: Container) -> None:
    """Kill and delete ``container``; one that is already gone is fine."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # its removal is already under way
            return
        raise SandboxError(f"cannot remove container {container.short_id}: {exc}") from exc


def leftovers(client: docker.DockerClient) -> list[Container]:
    """Every sandbox container on the engine, running or not (for cleanup after a crash)."""
    for _ in range(3):  # the SDK inspects each listed container: one removed meanwhile 404s
        try:
            found: list[Container] = client.containers.list(all=True, filters={"label": LABEL})
        except docker.errors.NotFound:
            continue
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot list sandbox containers: {exc}") from exc
        return found
    raise SandboxError("cannot list sandbox containers: they kept changing while listed")
