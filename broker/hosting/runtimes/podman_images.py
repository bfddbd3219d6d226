"""The agent image in a Podman store: the same sandbox_images/ sources and digest label
as on Docker (broker.hosting.images), built by ``podman build`` without network.

The base is python:3.12-slim or broker-base:bookworm when the store has one, else
broker-base:bookworm built from Debian packages by sandbox_images/build-base.sh with
ENGINE=podman (root; no image registry needs to be reachable). A rootless user's
store is its own: an image built by root is not there, so it is built again for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from broker.clock import REAL
from broker.errors import SandboxError
from broker.hosting import images
from broker.hosting.runtimes.base import Log
from broker.hosting.runtimes.podman_cli import Podman
from broker.hosting.runtimes.spec import SANDBOX_UID

__all__ = ["BUILD_TIMEOUT", "ensure_image"]

BUILD_TIMEOUT = 900
"""Seconds an image build may take (a Debian base is about a minute to several)."""


def ensure_image(podman: Podman, tag: str, *, force: bool = False, log: Log = print) -> str:
    """Make sure ``tag`` exists in podman's store, built from the current sources.

    One build at a time on this machine (a lock file in the temp dir): two `broker run`s
    or test workers starting together would each debootstrap a base otherwise."""
    with images.one_build_at_a_time("podman"):
        return _ensure(podman, tag, force, log)


def _ensure(podman: Podman, tag: str, force: bool, log: Log) -> str:
    digest = images.sources_digest()
    labels = _labels(podman, tag)
    if labels is not None and not force:
        if labels.get(images.IMAGE_LABEL) == digest:
            return tag
        log(f"image {tag} was built from other sources; rebuilding it")
    present = (b for b in (images.DEFAULT_BASE, images.FALLBACK_BASE) if podman.exists("image", b))
    base = next(present, None)
    if base is None:
        base = images.FALLBACK_BASE
        _build_base(podman, log)
    log(f"building {tag} from {base} (podman)")
    started = REAL.monotonic()
    podman(
        "build",
        "--network",
        "none",
        "--pull=never",
        *("--build-arg", f"BASE={base}", "--build-arg", f"SANDBOX_UID={SANDBOX_UID}"),
        *("--label", f"{images.IMAGE_LABEL}={digest}", "--tag", tag),
        *(["--no-cache"] if force else []),
        str(images.IMAGES_DIR),
        timeout=BUILD_TIMEOUT,
    )
    log(f"built {tag} in {REAL.monotonic() - started:.1f}s")
    return tag


def _labels(podman: Podman, tag: str) -> dict[str, str] | None:
    """The image's labels, or None when the store has no such image."""
    if not podman.exists("image", tag):
        return None
    found = json.loads(podman("image", "inspect", tag))
    return dict(found[0].get("Labels") or {})


def _build_base(podman: Podman, log: Log) -> None:
    """broker-base:bookworm into ``podman``'s store: debootstrap needs root, so a
    rootless user driven from root gets a copy of root's (built there if needed)."""
    if podman.user is not None and os.getuid() == 0:
        root = Podman(binary=podman.binary)
        if not root.exists("image", images.FALLBACK_BASE):
            _build_base(root, log)
        log(f"copying {images.FALLBACK_BASE} into {podman.user}'s store")
        with tempfile.TemporaryDirectory(prefix="broker-base-") as tmp:
            archive = Path(tmp) / "base.tar"
            root("save", "--output", str(archive), images.FALLBACK_BASE, timeout=BUILD_TIMEOUT)
            os.chmod(tmp, 0o755)
            archive.chmod(0o644)
            podman("load", "--input", str(archive), timeout=BUILD_TIMEOUT)
        return
    script = images.IMAGES_DIR / "build-base.sh"
    log(f"running {script} for podman (debootstrap; about a minute)")
    env = {**podman.env(), "ENGINE": "podman"}
    done = subprocess.run(["bash", str(script), images.FALLBACK_BASE], env=env, check=False)
    if done.returncode != 0:
        raise SandboxError(
            f"{script} failed (exit {done.returncode}); it needs root, debootstrap "
            "and a reachable Debian mirror (see its messages above); a rootless user "
            f"can `podman load` a {images.FALLBACK_BASE} that root built"
        )
