"""Container runtimes that hold sandboxes, behind one seam (`base.Runtime`): Docker
(`docker`) and Podman rootful or rootless (`podman`, its images in `podman_images`);
the hardening expressed once (`spec`) and proven per runtime at start (`proof`)."""

from __future__ import annotations

from broker.errors import SandboxError
from broker.hosting.runtimes.base import Runtime

__all__ = ["NAMES", "open_runtime"]

NAMES = ("docker", "podman")
"""What `[sandbox] runtime` and `--runtime` accept."""


def open_runtime(name: str) -> Runtime:
    """Connect to the runtime ``name``; SandboxError when it is unknown or does not answer."""
    if name == "docker":
        from broker.hosting.runtimes.docker import DockerRuntime

        return DockerRuntime()
    if name == "podman":
        from broker.hosting.runtimes.podman import PodmanRuntime

        return PodmanRuntime()
    raise SandboxError(f"unknown sandbox runtime {name!r}; choose one of {', '.join(NAMES)}")
