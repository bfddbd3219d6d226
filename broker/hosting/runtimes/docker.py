"""Docker as a sandbox runtime, through the Engine API on its socket (runtimes.engine).

The spec becomes the engine's create body (:func:`create_body`); the created
container's inspect is read back into :class:`~broker.hosting.runtimes.proof.Observed`
and proven before it starts. The engine's errors stop here: what callers see is
:class:`SandboxError`. docker-py's face of the same (for the AutoGen executor's
long-lived containers) is broker.hosting.sandbox, on this create body and proof.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from broker.errors import SandboxError
from broker.hosting.runtimes.base import Handle, Log
from broker.hosting.runtimes.engine import EngineClient, EngineContainer, EngineError
from broker.hosting.runtimes.proof import Observed, bind_mounts, prove
from broker.hosting.runtimes.spec import LABEL, SANDBOX_UID, SandboxSpec

__all__ = ["DockerRuntime", "create_body", "observe"]


def create_body(spec: SandboxSpec) -> dict[str, Any]:
    """The Engine API's create body for ``spec`` (POST /containers/create)."""
    body: dict[str, Any] = {
        "Image": spec.image,
        "Cmd": list(spec.command),
        "User": spec.user,
        "Env": [f"{key}={value}" for key, value in spec.env.items()],
        "Labels": dict(spec.labels),
        "HostConfig": {
            "Mounts": [
                {"Type": "bind", "Source": b.host, "Target": b.inside, "ReadOnly": not b.writable}
                for b in spec.binds
            ],
            "NetworkMode": "none",
            "ReadonlyRootfs": True,
            "Tmpfs": dict(spec.tmpfs),
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "PidsLimit": spec.limits.pids,
            "Memory": spec.memory,
            "NanoCpus": spec.limits.nano_cpus,
            "AutoRemove": False,
        },
    }
    if spec.entrypoint is not None:
        body["Entrypoint"] = list(spec.entrypoint)
    return body


def observe(attrs: Mapping[str, Any]) -> Observed:
    """Docker's inspect of a created container, as the facts the proof compares."""
    host = attrs.get("HostConfig") or {}
    config = attrs.get("Config") or {}
    drop = {c.upper().removeprefix("CAP_") for c in host.get("CapDrop") or ()}
    caps = None
    if "CapDrop" in host:  # the engine's default set unless ALL is dropped
        caps = frozenset(host.get("CapAdd") or ()) if "ALL" in drop else frozenset({"defaults"})
    opts = host.get("SecurityOpt")
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
        binds=bind_mounts(attrs),
    )


class DockerRuntime:
    """Sandboxes on a Docker engine (rootful: the engine's daemon runs as root)."""

    name = "docker"

    def __init__(self, client: EngineClient | None = None) -> None:
        try:
            self.client = client if client is not None else EngineClient()
        except EngineError as exc:
            raise SandboxError(str(exc)) from exc

    def start(self, spec: SandboxSpec) -> EngineContainer:
        # create + start, not the CLI's run: that would pull a missing image.
        query = {"name": spec.name} if spec.name else None
        try:
            made = self.client.call("POST", "/containers/create", create_body(spec), query=query)
        except EngineError as exc:
            raise self._refused(spec, exc) from exc
        container = EngineContainer(self.client, {"Id": made["Id"]})
        try:
            container.attrs = self.inspect(container)
            prove(spec, observe(container.attrs), self.name)
            self.client.call("POST", f"/containers/{quote(container.id)}/start")
        except EngineError as exc:
            self.remove(container)
            raise SandboxError(f"cannot start sandbox {spec.sandbox_id}: {exc}") from exc
        except BaseException:  # unproven, or a Ctrl-C mid-start: nobody else knows it yet
            self.remove(container)
            raise
        return container

    def _refused(self, spec: SandboxSpec, exc: EngineError) -> SandboxError:
        if exc.status == 404 and "image" in str(exc).lower():
            return SandboxError(f"image {spec.image} is missing; build it with: broker image build")
        if exc.status == 0:
            return SandboxError(f"{exc}; start the Docker engine with: bash scripts/docker-up.sh")
        return SandboxError(f"cannot create sandbox {spec.sandbox_id}: {exc}")

    def inspect(self, container: Any) -> Mapping[str, Any]:
        """The engine's inspect of a created container."""
        path = f"/containers/{quote(container.id)}/json"
        found: Mapping[str, Any] = self.client.call("GET", path)
        return found

    def remove(self, handle: Handle) -> None:
        try:
            self.client.call("DELETE", f"/containers/{quote(str(handle.id))}", query={"force": 1})
        except EngineError as exc:
            if exc.status in (404, 409):  # already gone, or its removal already under way
                return
            raise SandboxError(f"cannot remove container {handle.short_id}: {exc}") from exc

    def leftovers(self) -> list[Handle]:
        query = {"all": 1, "filters": json.dumps({"label": [LABEL]})}
        try:
            listed = self.client.call("GET", "/containers/json", query=query)
        except EngineError as exc:
            raise SandboxError(f"cannot list sandbox containers: {exc}") from exc
        return [EngineContainer(self.client, attrs) for attrs in listed]

    def image_labels(self, tag: str) -> Mapping[str, str] | None:
        """The labels of image ``tag``; None when the engine has no such image."""
        found = self._image(tag)
        return None if found is None else dict((found.get("Config") or {}).get("Labels") or {})

    def ensure_image(self, tag: str, *, force: bool = False, log: Log = print) -> str:
        from broker.hosting import images

        if not force and images.current(self.image_labels(tag)):
            return tag  # the usual case: one inspect, and docker-py is not even imported
        client = images.engine()
        try:
            return images.ensure_image(client, tag, force=force, log=log)
        finally:
            client.close()

    def image_env(self, tag: str) -> Mapping[str, str]:
        env = self._image_config(tag).get("Env") or []
        return dict(item.split("=", 1) for item in env)

    def image_entrypoint(self, tag: str) -> tuple[str, ...]:
        return tuple(self._image_config(tag).get("Entrypoint") or ())

    def image_id(self, tag: str) -> str | None:
        found = self._image(tag)
        return str(found["Id"]) if found and found.get("Id") else None

    def _image_config(self, tag: str) -> Mapping[str, Any]:
        found = self._image(tag)
        if found is None:
            raise SandboxError(f"cannot inspect image {tag}: no such image")
        config: Mapping[str, Any] = found.get("Config") or {}
        return config

    def _image(self, tag: str) -> Mapping[str, Any] | None:
        """The engine's inspect of image ``tag``; None when it has no such image."""
        try:
            found: Mapping[str, Any] = self.client.call("GET", f"/images/{quote(tag)}/json")
        except EngineError as exc:
            if exc.status == 404:
                return None
            raise SandboxError(f"cannot inspect image {tag}: {exc}") from exc
        return found

    def get(self, container_id: str) -> EngineContainer | None:
        container = EngineContainer(self.client, {"Id": container_id})
        try:
            container.attrs = self.inspect(container)
        except EngineError as exc:
            if exc.status == 404:
                return None
            raise SandboxError(f"cannot inspect container {container_id[:12]}: {exc}") from exc
        return container

    def agent_uid(self) -> int:
        return SANDBOX_UID

    def close(self) -> None:
        """Nothing to close: every call opened and closed its own connection."""
