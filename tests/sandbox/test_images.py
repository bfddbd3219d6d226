"""The image build lock: one build at a time per user and engine, and never a wait for ever."""

from __future__ import annotations

import fcntl
import os
import re
import threading
from pathlib import Path

import pytest

from broker.errors import SandboxError
from broker.hosting import images

ENGINE = f"test-{os.getpid()}"  # a lock of this test's own, not a real engine's


def held_elsewhere() -> tuple[Path, int]:
    """Take the lock as another build would: its own open file, flocked."""
    path = images.build_lock(ENGINE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return path, fd


def test_a_build_stuck_holding_the_lock_is_a_clear_error_not_a_hang() -> None:
    path, fd = held_elsewhere()
    try:
        with (
            pytest.raises(
                SandboxError,
                match=re.escape(f"another {ENGINE} image build still holds {path} after 0s"),
            ),
            images.one_build_at_a_time(ENGINE, wait=0.3),
        ):
            pytest.fail("the lock was taken while another build held it")
    finally:
        os.close(fd)
        path.unlink()


def test_a_build_waits_for_the_one_before_it_and_then_runs() -> None:
    path, fd = held_elsewhere()
    order: list[str] = []
    release = threading.Timer(0.3, lambda: (order.append("first ended"), os.close(fd)))
    release.start()
    try:
        with images.one_build_at_a_time(ENGINE, wait=30):
            order.append("second built")
    finally:
        release.join()
        path.unlink()
    assert order == ["first ended", "second built"]
