"""Podman driven as the rootless user from a root process (broker.hosting.runtimes.podman_cli)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.hosting.runtimes.podman_cli import Podman
from tests.sandbox.conftest import ROOTLESS_USER


def test_rootless_podman_answers_from_a_dir_its_user_cannot_enter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker started where the rootless user may not go (root's home, a 0700 temp
    dir) still drives that user's Podman: it runs in the user's home. Podman refused
    with "cannot chdir to …: Permission denied", and every rootless test skipped."""
    podman = Podman(ROOTLESS_USER)
    try:
        podman.prefix()
    except KeyError:
        pytest.skip(f"no rootless Podman user {ROOTLESS_USER}")
    tmp_path.chmod(0o700)
    monkeypatch.chdir(tmp_path)
    assert podman("info", "--format", "{{.Host.Security.Rootless}}").strip() == "true"
