"""Docker sandboxes: where agents run, with no network, no credentials, no host state.

A sandbox is one container started by :func:`start` from the agent image (built by
:func:`broker.hosting.images.ensure_image` from ``sandbox_images/``). It sees exactly
two host directories made by :func:`prepare_dirs` under ``<state_dir>/sandboxes/<id>/``:

    outbox/   -> /outbox   read-write; owned by SANDBOX_UID, mode 0700
    results/  -> /results  read-only;  owned by the broker, mode 0755

plus, when asked, a workspace at ``/workspace``. Everything else in the state dir
(ledger, audit log, attachments) stays out of reach. Every container carries the
label ``LABEL=<sandbox id>`` so ``DockerRuntime.leftovers`` (``broker sandbox ls``) finds the
ones a crash left behind.

The hardening itself is runtime-neutral (broker.hosting.runtimes.spec) and proven on
each created container (broker.hosting.runtimes.proof); this module is its docker-py
face, for the integrations that keep a container and `exec` in it (the AutoGen
executor): the same create body and proof as the runtime `broker run` uses
(broker.hosting.runtimes.docker). docker-py's exceptions stop here: what callers see
is :class:`SandboxError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from broker.errors import SandboxError
from broker.hosting.images import engine
from broker.hosting.runtimes.docker import DockerRuntime, create_body
from broker.hosting.runtimes.spec import (
    DEFAULT_LIMITS,
    LABEL,
    SANDBOX_UID,
    SandboxLimits,
    SandboxPaths,
    prepare_dirs,
    sandbox_spec,
)

__all__ = [
    "LABEL",
    "SANDBOX_UID",
    "SandboxLimits",
    "SandboxPaths",
    "engine",
    "hardened",
    "prepare_dirs",
    "remove",
    "start",
]


def hardened(
    paths: SandboxPaths,
    limits: SandboxLimits = DEFAULT_LIMITS,
    env: Mapping[str, str] | None = None,
    workspace: Path | None = None,
    *,
    read_only_mounts: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Engine API create body every sandbox gets (its HostConfig is the hardening);
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
    return create_body(spec)


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
    runtime = DockerRuntime()  # the one create, proof and start `broker run` uses too
    handle = runtime.start(spec)
    try:
        return client.containers.get(str(handle.id))  # docker-py's, for `exec`
    except docker.errors.DockerException as exc:
        runtime.remove(handle)
        raise SandboxError(f"cannot start sandbox {paths.sandbox_id}: {exc}") from exc
    except BaseException:
        runtime.remove(handle)
        raise


def remove(container: Container) -> None:
    """Kill and delete ``container``; one that is already gone is fine."""
    DockerRuntime().remove(container)
