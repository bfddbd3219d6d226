"""Whether some process serves a state dir right now: a shared lock held while serving.

Every serving broker holds a shared ``flock`` on ``<state>/serving.lock`` for as long
as its loop runs; :func:`served` asks, without waiting, whether anyone holds it. Host
integrations (broker.integrations.autogen) use it to file their sandbox into a running
broker instead of starting a second one on the same state dir.

This is only a signal, not ownership: two brokers can still be started side by side.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["LOCK_NAME", "holding", "served"]

LOCK_NAME = "serving.lock"


def _open(state_dir: Path) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    return os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


@contextmanager
def holding(state_dir: Path) -> Iterator[None]:
    """Say "served" for `state_dir` while the block runs (silently not, if it cannot)."""
    try:
        fd = _open(state_dir)
    except OSError:
        yield  # a signal for integrations only: serving goes on without it
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def served(state_dir: Path) -> bool:
    """True while some process holds `state_dir` as served (never blocks)."""
    if not (state_dir / LOCK_NAME).exists():
        return False
    fd = _open(state_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our own lock, if we got it
    return False
