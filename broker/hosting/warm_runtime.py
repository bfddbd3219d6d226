"""What the warm pool asks of a runtime beyond the seam (broker.hosting.runtimes.base):
a container by its id (another process made it) and an image's entrypoint.

A runtime that has ``get(container_id) -> Handle | None`` and
``image_entrypoint(tag) -> tuple[str, ...]`` is asked those; Docker (docker-py) and
Podman (its CLI) are otherwise asked here, their errors translated.
"""

from __future__ import annotations

import json
from typing import Any

from broker.errors import SandboxError
from broker.hosting.runtimes.base import Handle, Runtime

__all__ = ["find", "image_entrypoint"]


def find(runtime: Runtime, container_id: str) -> Handle | None:
    """The container ``container_id`` as a Handle; None when it has gone."""
    own = getattr(runtime, "get", None)
    if callable(own):
        found: Handle | None = own(container_id)
        return found
    client = getattr(runtime, "client", None)
    if client is not None:
        return _docker_get(client, container_id)
    podman = getattr(runtime, "podman", None)
    if podman is not None:
        return _podman_get(podman, container_id)
    raise SandboxError(f"the {runtime.name} runtime cannot find a container by its id")


def _docker_get(client: Any, container_id: str) -> Handle | None:
    import docker.errors

    try:
        found: Handle = client.containers.get(container_id)
    except docker.errors.NotFound:
        return None
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot inspect container {container_id[:12]}: {exc}") from exc
    return found


def _podman_get(podman: Any, container_id: str) -> Handle | None:
    from broker.hosting.runtimes.podman import PodmanContainer

    try:
        attrs = podman.inspect(container_id)
    except SandboxError:
        return None
    config = attrs.get("Config") or {}
    return PodmanContainer(podman, str(attrs["Id"]), attrs.get("Name"), config.get("Labels") or {})


def image_entrypoint(runtime: Runtime, image: str) -> tuple[str, ...]:
    """The image's ENTRYPOINT (empty when it has none): the launcher replaces it, so
    the command handed over is put after it."""
    own = getattr(runtime, "image_entrypoint", None)
    if callable(own):
        return tuple(own(image))
    client = getattr(runtime, "client", None)
    podman = getattr(runtime, "podman", None)
    try:
        if client is not None:
            config = client.images.get(image).attrs.get("Config") or {}
        elif podman is not None:
            config = json.loads(podman("image", "inspect", image))[0].get("Config") or {}
        else:
            raise SandboxError(f"the {runtime.name} runtime cannot show an image's entrypoint")
    except SandboxError:
        raise
    except Exception as exc:  # docker-py's or json's: the image cannot be read
        raise SandboxError(f"cannot read image {image}: {exc}") from exc
    return tuple(config.get("Entrypoint") or ())
