"""Podman as a sandbox runtime, rootful or rootless, through its command line.

The CLI, not Podman's Docker-compatible socket: Podman has no daemon, and a rootless
user has no socket unless a `podman system service` is kept running for them; the
CLI is what every Podman host has, and ``podman inspect`` prints the same facts as
JSON. The spec becomes ``podman create`` arguments (:func:`create_args`); the created
container's inspect is read back (:func:`observe`) and proven before ``podman start``.

Rootless (Podman run by an unprivileged user): ``--userns keep-id:uid=…,gid=…`` maps
that user to SANDBOX_UID inside, so the outbox on the user's own file system is the
user's, and files the agent writes are too; nothing needs root.

CONTAINERS_CONF, when not set, is the one scripts/podman-up.sh writes (see its header).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import SandboxError
from broker.hosting.runtimes.base import Handle, Log
from broker.hosting.runtimes.podman_cli import DEFAULT_CONF, Podman
from broker.hosting.runtimes.proof import Observed, bind_mounts, prove
from broker.hosting.runtimes.spec import LABEL, SANDBOX_UID, SandboxSpec

__all__ = ["DEFAULT_CONF", "Podman", "PodmanContainer", "PodmanRuntime", "create_args", "observe"]


def create_args(spec: SandboxSpec, keep_id: int | None = None) -> list[str]:
    """``podman create`` arguments for ``spec``; ``keep_id``: the rootless user's uid."""
    args = ["--pull", "never", "--user", spec.user, "--network", "none"]
    args += ["--read-only", "--read-only-tmpfs=false", "--cap-drop", "all"]
    args += ["--security-opt", "no-new-privileges", "--no-hosts", "--log-driver", "k8s-file"]
    args += ["--pids-limit", str(spec.limits.pids), "--memory", str(spec.memory)]
    args += ["--cpus", f"{spec.limits.nano_cpus / 1e9:g}"]
    args += ["--unsetenv", "container", "--unsetenv", "TERM"]  # podman's own defaults
    if keep_id is not None:
        uid, gid = spec.user.split(":")
        args += ["--userns", f"keep-id:uid={uid},gid={gid}"]
    if spec.name:
        args += ["--name", spec.name]
    if spec.entrypoint is not None:
        args += ["--entrypoint", json.dumps(list(spec.entrypoint))]
    for key, value in spec.labels.items():
        args += ["--label", f"{key}={value}"]
    for key, value in spec.env.items():
        args += ["--env", f"{key}={value}"]
    for inside, options in spec.tmpfs.items():
        args += ["--tmpfs", f"{inside}:{options}"]
    for b in spec.binds:
        mode = "rw=true" if b.writable else "ro=true"
        args += ["--mount", f"type=bind,source={b.host},destination={b.inside},{mode}"]
    return [*args, spec.image, *spec.command]


def observe(attrs: Mapping[str, Any]) -> Observed:
    """Podman's inspect of a created container, as the facts the proof compares.

    Podman resolves ``--cap-drop all`` into the list it dropped; what the process may
    hold is the bounding and effective sets, printed as null when empty."""
    host = attrs.get("HostConfig") or {}
    config = attrs.get("Config") or {}
    caps = None
    if "BoundingCaps" in attrs and "EffectiveCaps" in attrs:
        caps = frozenset(attrs["BoundingCaps"] or ()) | frozenset(attrs["EffectiveCaps"] or ())
    opts = host.get("SecurityOpt")
    binds = bind_mounts(attrs)
    return Observed(
        network=host.get("NetworkMode"),
        read_only_root=host.get("ReadonlyRootfs"),
        capabilities=caps,
        no_new_privileges=None if opts is None else "no-new-privileges" in opts,
        privileged=host.get("Privileged"),
        user=config.get("User"),
        pids=host.get("PidsLimit"),
        memory=host.get("Memory"),
        nano_cpus=host.get("NanoCpus"),
        binds=binds,
    )


@dataclass
class PodmanContainer:
    """One Podman container, with the part of docker-py's Container the broker uses."""

    podman: Podman
    id: str
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def short_id(self) -> str:
        return self.id[:12]

    @property
    def status(self) -> str:
        return str(self.podman.inspect(self.id)["State"]["Status"])

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        code = self.podman("wait", self.id, timeout=timeout or 10**6)
        return {"StatusCode": int(code.strip().splitlines()[-1])}

    def logs(
        self, stdout: bool = True, stderr: bool = True, stream: bool = False, follow: bool = False
    ) -> Any:
        if stream:
            return self._stream(follow)
        argv = self.podman.argv(["logs", self.id])
        done = subprocess.run(argv, capture_output=True, env=self.podman.env(), timeout=60)
        return (done.stdout if stdout else b"") + (done.stderr if stderr else b"")

    def _stream(self, follow: bool) -> Iterator[bytes]:
        argv = self.podman.argv(["logs", *(["--follow"] if follow else []), self.id])
        with subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.podman.env()
        ) as proc:
            out = proc.stdout
            assert out is not None
            yield from iter(lambda: out.read1(65536), b"")  # type: ignore[attr-defined]


class PodmanRuntime:
    """Sandboxes on Podman: rootful as root, rootless as any other user."""

    def __init__(self, podman: Podman | None = None) -> None:
        self.podman = podman or Podman()
        info = json.loads(self.podman("info", "--format", "json"))
        self.rootless = bool(info["host"]["security"]["rootless"])
        self.cgroups = str(info["host"].get("cgroupVersion", "?"))
        self.name = "podman rootless" if self.rootless else "podman"

    def start(self, spec: SandboxSpec) -> PodmanContainer:
        keep_id = self.agent_uid() if self.rootless else None
        try:
            ref = self.podman("create", *create_args(spec, keep_id)).strip().splitlines()[-1]
        except SandboxError as exc:
            if "image not known" in str(exc) or "no such image" in str(exc).lower():
                raise SandboxError(
                    f"image {spec.image} is missing; build it with: broker image build "
                    "--runtime podman"
                ) from exc
            raise SandboxError(f"cannot create sandbox {spec.sandbox_id}: {exc}") from exc
        container = PodmanContainer(self.podman, ref, spec.name, dict(spec.labels))
        try:
            prove(spec, self.observe(container), self.name)
            self.podman("start", ref)
        except BaseException:  # unproven, failed, or a Ctrl-C mid-start
            self.remove(container)
            raise
        return container

    def inspect(self, container: PodmanContainer) -> Mapping[str, Any]:
        return self.podman.inspect(container.id)

    def observe(self, container: PodmanContainer) -> Observed:
        # Rootless on cgroup v1 drops the limits ("Resource limits are not supported and
        # ignored on cgroups V1 rootless systems") and its inspect shows 0: refused.
        return observe(self.inspect(container))

    def remove(self, handle: Handle) -> None:
        try:
            self.podman("rm", "--force", "--ignore", str(handle.id))
        except SandboxError as exc:
            raise SandboxError(f"cannot remove container {handle.short_id}: {exc}") from exc

    def leftovers(self) -> list[Handle]:
        rows = json.loads(
            self.podman("ps", "--all", "--filter", f"label={LABEL}", "--format", "json")
        )
        return [
            PodmanContainer(
                self.podman, row["Id"], (row.get("Names") or [None])[0], row.get("Labels") or {}
            )
            for row in rows
        ]

    def ensure_image(self, tag: str, *, force: bool = False, log: Log = print) -> str:
        from broker.hosting.runtimes import podman_images

        return podman_images.ensure_image(self.podman, tag, force=force, log=log)

    def image_env(self, tag: str) -> Mapping[str, str]:
        found = json.loads(self.podman("image", "inspect", tag))
        return dict(item.split("=", 1) for item in found[0]["Config"].get("Env") or [])

    def image_entrypoint(self, tag: str) -> tuple[str, ...]:
        found = json.loads(self.podman("image", "inspect", tag))
        return tuple(found[0].get("Config", {}).get("Entrypoint") or ())

    def image_id(self, tag: str) -> str | None:
        try:
            found = json.loads(self.podman("image", "inspect", tag))
        except SandboxError:  # no such image
            return None
        return str(found[0]["Id"]) if found and found[0].get("Id") else None

    def get(self, container_id: str) -> PodmanContainer | None:
        try:
            attrs = self.podman.inspect(container_id)
        except SandboxError:
            return None
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        return PodmanContainer(self.podman, str(attrs["Id"]), attrs.get("Name"), labels)

    def agent_uid(self) -> int:
        """Rootful: SANDBOX_UID itself; rootless: the user (keep-id maps it inside)."""
        if not self.rootless:
            return SANDBOX_UID
        if self.podman.user is None:
            return os.getuid()
        import pwd

        return pwd.getpwnam(self.podman.user).pw_uid

    def close(self) -> None:
        pass
