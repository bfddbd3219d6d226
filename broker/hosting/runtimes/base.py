"""The runtime seam: what `broker run`, the CLI and the tests ask of a container runtime.

A runtime starts a :class:`~broker.hosting.runtimes.spec.SandboxSpec` (creating the
container, proving its hardening from the runtime's own inspect, then starting it),
lists and removes sandbox containers, and makes the agent image. What it returns is
a :class:`Handle`: docker-py's Container satisfies it, and so does Podman's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from broker.hosting.runtimes.spec import SandboxSpec

__all__ = ["Handle", "Log", "Runtime"]

Log = Callable[[str], None]


class Handle(Protocol):
    """One sandbox container, as the runner and `broker sandbox ls` use it."""

    @property
    def id(self) -> str | None: ...
    @property
    def short_id(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def status(self) -> str: ...

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        """Until it exits (timeout=seconds): {"StatusCode": exit code}."""

    def logs(self, *args: Any, **kwargs: Any) -> Any:
        """bytes (stdout=, stderr=), or an iterator of bytes with stream=True, follow=True."""


class Runtime(Protocol):
    """A container runtime that can hold sandboxes (Docker, Podman rootful or rootless)."""

    name: str

    def start(self, spec: SandboxSpec) -> Handle:
        """Create, prove, start; a container that fails its proof is removed unstarted."""

    def remove(self, handle: Handle) -> None:
        """Kill and delete; one that is already gone is fine."""

    def leftovers(self) -> list[Handle]:
        """Every sandbox container of this runtime, running or not."""

    def ensure_image(self, tag: str, *, force: bool = False, log: Log = print) -> str:
        """The agent image ``tag``, built from sandbox_images/ unless current."""

    def image_env(self, tag: str) -> Mapping[str, str]:
        """The environment an image sets (what a sandbox may see besides the spec's)."""

    def image_entrypoint(self, tag: str) -> tuple[str, ...]:
        """The image's ENTRYPOINT, empty when it has none (a warm launcher replaces it)."""

    def image_id(self, tag: str) -> str | None:
        """The id of the image ``tag`` names now; None when there is none (a pooled
        sandbox of another id was made from an image since rebuilt)."""

    def get(self, container_id: str) -> Handle | None:
        """A sandbox container by its id (another process may have made it); None: gone."""

    def agent_uid(self) -> int:
        """The host uid that owns what the sandbox's SANDBOX_UID writes."""

    def close(self) -> None: ...
