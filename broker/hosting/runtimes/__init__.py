"""Container runtimes that hold sandboxes, behind one seam (`base.Runtime`): Docker
(`docker`) and Podman rootful or rootless (`podman`, its images in `podman_images`);
the hardening expressed once (`spec`) and proven per runtime at start (`proof`); and
what `[sandbox]` in broker.toml asks of them (its runtime, limits and env)."""

from __future__ import annotations

import os

from broker.config import Config
from broker.errors import SandboxError
from broker.hosting.runtimes.base import Runtime
from broker.hosting.runtimes.spec import SandboxLimits

__all__ = ["NAMES", "extra_env", "limits_from", "open_runtime", "runtime_name"]

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


def limits_from(config: Config) -> SandboxLimits:
    """[sandbox] pids, memory, cpus, tmpfs from broker.toml, over sane defaults."""
    section = config.sandbox
    base = SandboxLimits()
    cpus = section.get("cpus")
    return SandboxLimits(
        pids=int(section.get("pids", base.pids)),
        memory=str(section.get("memory", base.memory)),
        nano_cpus=int(float(cpus) * 1e9) if cpus is not None else base.nano_cpus,
        tmpfs_size=str(section.get("tmpfs", base.tmpfs_size)),
    )


def extra_env(config: Config) -> dict[str, str]:
    """Only what [sandbox] env explicitly lists: names whose values come from the host."""
    names = config.sandbox.get("env", [])
    return {name: os.environ[name] for name in names if name in os.environ}


def runtime_name(config: Config, chosen: str | None = None) -> str:
    """--runtime, else [sandbox] runtime, else docker."""
    return chosen or str(config.sandbox.get("runtime", "docker"))
