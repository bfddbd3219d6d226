"""The agent image: built from ``sandbox_images/`` on the engine, reused while its
sources are unchanged (their digest is a label on the image), on a base that works
here: python:3.12-slim when present or pullable, else a Debian base built from
packages (no image registry needs to be reachable).

Docker's own exceptions stop here: what callers see is :class:`SandboxError`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # docker-py is imported by what builds: a run with a current image needs none
    import docker
    from docker.models.images import Image

from broker.clock import REAL
from broker.errors import SandboxError
from broker.hosting.runtimes.spec import SANDBOX_UID
from broker.inputs import sha256

__all__ = [
    "DEFAULT_BASE",
    "DEFAULT_IMAGE",
    "FALLBACK_BASE",
    "IMAGE_LABEL",
    "build_lock",
    "current",
    "engine",
    "ensure_image",
    "one_build_at_a_time",
]

IMAGE_LABEL = "io.sandbox-broker.image-digest"
"""Label on the agent image: digest of the sources it was built from."""

DEFAULT_IMAGE = "broker-sandbox:py"
DEFAULT_BASE = "python:3.12-slim"
FALLBACK_BASE = "broker-base:bookworm"
_PACKAGED_IMAGES = Path(__file__).resolve().parents[1] / "_sandbox_images"
IMAGES_DIR = (
    _PACKAGED_IMAGES
    if _PACKAGED_IMAGES.is_dir()
    else Path(__file__).resolve().parents[2] / "sandbox_images"
)
"""The image sources: inside the wheel when installed, else the checkout's sandbox_images/."""
PULL_TIMEOUT = 15
"""Seconds a base-image pull may stay silent before the Debian fallback is built."""
BUILD_WAIT = 600.0
"""Seconds a build waits for another one's lock (one_build_at_a_time) before it gives up."""

Log = Callable[[str], None]


def engine() -> docker.DockerClient:
    """docker-py's client of the engine named by the environment (DOCKER_HOST, else the
    socket): for builds and for the integrations that keep a container and exec in it."""
    import docker
    import docker.errors

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


def ensure_image(
    client: docker.DockerClient,
    tag: str = DEFAULT_IMAGE,
    *,
    base: str | None = None,
    force: bool = False,
    log: Log = print,
) -> str:
    """Make sure the agent image ``tag`` exists and matches ``sandbox_images/``; return the tag.

    An image built from the same sources is reused unless ``force``. One build at a
    time on this machine: two `broker run`s or test workers starting together would
    each build, and the later tag would make the earlier image, and the warm
    containers made from it, stale. The base is
    ``base`` when given; otherwise the first that works of: python:3.12-slim or
    broker-base:bookworm already on the engine, python:3.12-slim pulled (giving up
    after PULL_TIMEOUT silent seconds), broker-base:bookworm built from Debian
    packages by ``sandbox_images/build-base.sh`` (root, about a minute).
    """
    with one_build_at_a_time("docker"):
        return _ensure(client, tag, base, force, log)


def _ensure(client: docker.DockerClient, tag: str, base: str | None, force: bool, log: Log) -> str:
    import docker.errors

    digest = sources_digest()
    try:
        previous: Image | None = client.images.get(tag)
    except docker.errors.ImageNotFound:
        previous = None
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot inspect image {tag}: {exc}") from exc
    if previous is not None and not force:
        if previous.labels.get(IMAGE_LABEL) == digest:
            return tag
        log(f"image {tag} was built from other sources; rebuilding it")

    chosen = _base_image(client, base, log)
    log(f"building {tag} from {chosen}")
    started = REAL.monotonic()
    _build(client, tag, chosen, digest, force)
    log(f"built {tag} in {REAL.monotonic() - started:.1f}s")
    if previous is not None and previous.id is not None:
        _remove_if_untagged(client, previous.id)
    return tag


def build_lock(engine: str) -> Path:
    """This user's lock file for builds on ``engine``, in the temp dir."""
    import tempfile  # with shutil and random: not on a run's path unless it builds

    return Path(tempfile.gettempdir()) / f"sandbox-broker-{engine}-image-{os.getuid()}.lock"


@contextmanager
def one_build_at_a_time(engine: str, wait: float = BUILD_WAIT) -> Iterator[None]:
    """Hold this user's build lock for ``engine`` (:func:`build_lock`).

    A build still held after ``wait`` seconds is stuck, not slow (a base image from
    Debian's packages takes about a minute): the caller gets a SandboxError saying so
    instead of waiting with it for ever. The lock goes with its holder's process.
    """
    import fcntl

    path = build_lock(engine)
    with path.open("a") as lock:
        deadline = REAL.monotonic() + wait
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if REAL.monotonic() >= deadline:
                    raise SandboxError(
                        f"another {engine} image build still holds {path} after {wait:.0f}s "
                        "of waiting; wait for it to end, or stop it"
                    ) from None
                REAL.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(client: docker.DockerClient, tag: str, base: str, digest: str, force: bool) -> None:
    import docker.errors

    try:
        client.images.build(
            path=str(IMAGES_DIR),
            tag=tag,
            buildargs={"BASE": base, "SANDBOX_UID": str(SANDBOX_UID)},
            labels={IMAGE_LABEL: digest},
            network_mode="none",
            nocache=force,
            rm=True,
            forcerm=True,
        )
    except docker.errors.BuildError as exc:
        tail = [
            str(line.get("stream") or line.get("error") or "").strip() for line in exc.build_log
        ]
        detail = "; ".join(line for line in tail[-5:] if line)
        raise SandboxError(f"building {tag} from {base} failed: {exc.msg} ({detail})") from exc
    except docker.errors.DockerException as exc:
        raise SandboxError(f"building {tag} from {base} failed: {exc}") from exc


def _remove_if_untagged(client: docker.DockerClient, image_id: str) -> None:
    """Drop the image a rebuild replaced, unless something still uses or names it."""
    import docker.errors

    try:
        if not client.images.get(image_id).tags:
            client.images.remove(image_id)
    except docker.errors.DockerException:
        pass  # a container may still run on it; it is only disk space


def current(labels: Mapping[str, str] | None) -> bool:
    """Whether an image with these labels (None: no such image) was built from today's
    sources: then it is used as it is."""
    return labels is not None and labels.get(IMAGE_LABEL) == sources_digest()


def sources_digest() -> str:
    """sha256 over what the Dockerfile copies, so a changed client means a new image."""
    h = sha256()
    for rel in (
        "Dockerfile",
        *(f"client/outbox{m}.py" for m in ("", "_cli", "_mcp", "_mcp_tools")),
    ):
        h.update(rel.encode() + b"\0" + (IMAGES_DIR / rel).read_bytes() + b"\0")
    return h.hexdigest()


def _base_image(client: docker.DockerClient, base: str | None, log: Log) -> str:
    """Return a base image present on the engine, pulling or building one if needed."""
    if base is not None:
        candidates = [base]
    else:
        candidates = [DEFAULT_BASE, FALLBACK_BASE]
    for candidate in candidates:
        if _has_image(client, candidate):
            return candidate
    wanted = candidates[0]
    if wanted != FALLBACK_BASE:
        failure = _pull(client, wanted)
        if failure is None:
            return wanted
        if base is not None:
            raise SandboxError(f"cannot pull base image {wanted}: {failure}")
        log(f"cannot pull {wanted} ({failure}); building {FALLBACK_BASE} from Debian packages")
    _build_fallback_base(log)
    return FALLBACK_BASE


def _has_image(client: docker.DockerClient, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot inspect image {tag}: {exc}") from exc
    return True


def _pull(client: docker.DockerClient, tag: str) -> str | None:
    """Pull ``tag`` with a short read timeout; return why it failed, or None."""
    import docker.errors

    saved = client.api.timeout
    client.api.timeout = PULL_TIMEOUT
    try:
        client.images.pull(tag)
    except (docker.errors.DockerException, OSError) as exc:  # OSError: timeouts, resets
        text = str(getattr(exc, "explanation", None) or exc)
        return text.splitlines()[0] if text else type(exc).__name__
    finally:
        client.api.timeout = saved
    return None


def _build_fallback_base(log: Log) -> None:
    script = IMAGES_DIR / "build-base.sh"
    log(f"running {script} (debootstrap; about a minute)")
    import subprocess  # building is rare: a run that finds its image current never needs it

    done = subprocess.run(["bash", str(script), FALLBACK_BASE], check=False)
    if done.returncode != 0:
        raise SandboxError(
            f"{script} failed (exit {done.returncode}); it needs root, debootstrap "
            "and a reachable Debian mirror (see its messages above)"
        )
