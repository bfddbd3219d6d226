"""Docker as a sandbox runtime, through docker-py and the engine's socket.

The spec becomes ``containers.create`` options (:func:`hardened`); the created
container's inspect (``Container.attrs``) is read back into
:class:`~broker.hosting.runtimes.proof.Observed` and proven before ``start``.
Docker's own exceptions stop here: what callers see is :class:`SandboxError`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Mount

from broker.errors import SandboxError
from broker.hosting.runtimes.base import Handle, Log
from broker.hosting.runtimes.proof import Observed, bind_mounts, prove
from broker.hosting.runtimes.spec import LABEL, SANDBOX_UID, SandboxSpec

__all__ = ["DockerRuntime", "engine", "hardened", "observe", "remove"]


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


def hardened(spec: SandboxSpec) -> dict[str, Any]:
    """The container options of ``spec`` (docker-py's `containers.create`)."""
    return {
        "detach": True,
        "auto_remove": False,
        "user": spec.user,
        "environment": dict(spec.env),
        "mounts": [
            Mount(b.inside, b.host, type="bind", read_only=not b.writable) for b in spec.binds
        ],
        "labels": dict(spec.labels),
        "network_mode": "none",
        "read_only": True,
        "tmpfs": dict(spec.tmpfs),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": spec.limits.pids,
        "mem_limit": spec.limits.memory,
        "nano_cpus": spec.limits.nano_cpus,
        "entrypoint": None if spec.entrypoint is None else list(spec.entrypoint),
    }


def observe(attrs: Mapping[str, Any]) -> Observed:
    """Docker's inspect of a created container, as the facts the proof compares."""
    host = attrs.get("HostConfig") or {}
    config = attrs.get("Config") or {}
    drop = {c.upper().removeprefix("CAP_") for c in host.get("CapDrop") or ()}
    caps = None
    if "CapDrop" in host:  # the engine's default set unless ALL is dropped
        caps = frozenset(host.get("CapAdd") or ()) if "ALL" in drop else frozenset({"defaults"})
    opts = host.get("SecurityOpt")
    binds = bind_mounts(attrs)
    return Observed(
        network=host.get("NetworkMode"),
        read_only_root=host.get("ReadonlyRootfs"),
        capabilities=caps,
        no_new_privileges=None
        if opts is None
        else any(o.startswith("no-new-privileges") for o in opts),
        privileged=host.get("Privileged"),
        user=config.get("User"),
        pids=host.get("PidsLimit"),
        memory=host.get("Memory"),
        nano_cpus=host.get("NanoCpus"),
        binds=binds,
    )


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


class DockerRuntime:
    """Sandboxes on a Docker engine (rootful: the engine's daemon runs as root)."""

    name = "docker"

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self.client = client if client is not None else engine()

    def start(self, spec: SandboxSpec) -> Container:
        try:
            # create + start, not run: run() would try to pull a missing image.
            container = self.client.containers.create(
                spec.image, list(spec.command), name=spec.name, **hardened(spec)
            )
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(
                f"image {spec.image} is missing; build it with: broker image build"
            ) from exc
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot create sandbox {spec.sandbox_id}: {exc}") from exc
        try:
            prove(spec, observe(self.inspect(container)), self.name)
            container.start()
        except docker.errors.DockerException as exc:
            remove(container)
            raise SandboxError(f"cannot start sandbox {spec.sandbox_id}: {exc}") from exc
        except BaseException:  # unproven, or a Ctrl-C mid-start: nobody else knows it yet
            remove(container)
            raise
        return container

    def inspect(self, container: Container) -> Mapping[str, Any]:
        """The engine's inspect of a created container (docker-py fetched it on create)."""
        return container.attrs

    def remove(self, handle: Handle) -> None:
        remove(handle)  # type: ignore[arg-type]

    def leftovers(self) -> list[Handle]:
        for _ in range(3):  # the SDK inspects each listed container: one removed meanwhile 404s
            try:
                found = self.client.containers.list(all=True, filters={"label": LABEL})
            except docker.errors.NotFound:
                continue
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot list sandbox containers: {exc}") from exc
            return list(found)
        raise SandboxError("cannot list sandbox containers: they kept changing while listed")

    def ensure_image(self, tag: str, *, force: bool = False, log: Log = print) -> str:
        from broker.hosting import images

        return images.ensure_image(self.client, tag, force=force, log=log)

    def image_env(self, tag: str) -> Mapping[str, str]:
        env = self.client.images.get(tag).attrs["Config"]["Env"] or []
        return dict(item.split("=", 1) for item in env)

    def agent_uid(self) -> int:
        return SANDBOX_UID

    def close(self) -> None:
        self.client.close()
