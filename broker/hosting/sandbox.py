"""Docker sandboxes: where agents run, with no network, no credentials, no host state.

A sandbox is one container started by :func:`start` from the agent image (built by
:func:`broker.hosting.images.ensure_image` from ``sandbox_images/``). It sees exactly
two host directories made by :func:`prepare_dirs` under ``<state_dir>/sandboxes/<id>/``:

    outbox/   -> /outbox   read-write; owned by SANDBOX_UID, mode 0700
    results/  -> /results  read-only;  owned by the broker, mode 0755

plus, when asked, a workspace at ``/workspace``. Everything else in the state dir
(ledger, audit log, attachments) stays out of reach. Every container carries the
label ``LABEL=<sandbox id>`` so :func:`leftovers` finds the ones a crash left behind.

The hardening itself is runtime-neutral (broker.hosting.runtimes.spec) and proven on
each created container (broker.hosting.runtimes.proof); this module is the Docker
face of it that the integrations use. Other runtimes: broker.hosting.runtimes.
Docker's own exceptions stop here: what callers see is :class:`SandboxError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
from docker.models.containers import Container

from broker.errors import SandboxError
from broker.hosting.runtimes import docker as docker_runtime
from broker.hosting.runtimes.spec import (
    DEFAULT_LIMITS,
    LABEL,
    SANDBOX_ID,
    SANDBOX_UID,
    SandboxLimits,
    SandboxPaths,
    sandbox_spec,
)

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

engine = docker_runtime.engine


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


def hardened(
    paths: SandboxPaths,
    limits: SandboxLimits = DEFAULT_LIMITS,
    env: Mapping[str, str] | None = None,
    workspace: Path | None = None,
    *,
    read_only_mounts: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The container options every sandbox gets (docker-py's `containers.create`);
    `read_only_mounts` maps host paths to container paths, bound read-only."""
    spec = sandbox_spec(
        paths,
        "",
        (),
        limits=limits,
        env=env,
        workspace=workspace,
        read_only_mounts=read_only_mounts,
        labels=labels,
    )
    return docker_runtime.hardened(spec)


def start(
    client: docker.DockerClient,
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
) -> Container:
    """Start ``command`` in a new sandbox container and return it (detached).

    The container has no network, a read-only root, a small /tmp (tmpfs; exec is
    allowed, agents run what they write), no capabilities, runs as SANDBOX_UID, and
    its environment holds only OUTBOX_DIR, RESULTS_DIR, SANDBOX_ID and ``env`` (the
    extras a configuration names; never the host's own environment). ``workspace``,
    if given, is mounted read-write at /workspace and must be writable by
    SANDBOX_UID. Each property is proven on the created container before it starts.
    The caller removes the container with :func:`remove`.
    """
    spec = sandbox_spec(
        paths,
        image,
        command,
        limits=limits,
        env=env,
        workspace=workspace,
        name=name,
        read_only_mounts=read_only_mounts,
        labels=labels,
    )
    return docker_runtime.DockerRuntime(client).start(spec)


def remove(container: Container) -> None:
    """Kill and delete ``container``; one that is already gone is fine."""
    docker_runtime.remove(container)


def leftovers(client: docker.DockerClient) -> list[Container]:
    """Every sandbox container on the engine, running or not (for cleanup after a crash)."""
    found: list[Container] = docker_runtime.DockerRuntime(client).leftovers()  # type: ignore[assignment]
    return found
