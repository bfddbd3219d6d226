"""The state dir's lock file and control socket as any process sees them: who owns
the state dir, whether it is held now, and where to connect (broker.loop.ownership
holds the lock and serves the socket). Light: `broker run`'s client reads these alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = ["MAX_LINE", "Owner", "read_owner", "served", "socket_path", "unix_address"]

MAX_LINE = 64 * 1024
"""The longest line of the control protocol (JSON) either side reads."""


class Owner(NamedTuple):
    """Who holds a state dir: its pid, what it runs, since when, and the digest of the
    start-up check it passed (None: it runs no sandboxes for others)."""

    pid: int
    command: str
    since: str
    checked: str | None = None

    def __str__(self) -> str:
        return f"pid {self.pid}, `{self.command}`, since {self.since}"


def read_owner(state_dir: Path) -> Owner | None:
    """The owner the lock file names, if any (the file may be stale: the lock decides)."""
    try:
        data = json.loads((state_dir / "broker.lock").read_text(encoding="utf-8"))
        checked = data.get("checked")
        return Owner(
            int(data["pid"]),
            str(data["command"]),
            str(data["since"]),
            checked if isinstance(checked, str) else None,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def served(state_dir: Path) -> bool:
    """Whether some process owns (serves) `state_dir` right now; never blocks."""
    try:
        fd = os.open(state_dir / "broker.lock", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops our own shared lock, if we got it
    return False


def socket_path(state_dir: Path) -> Path:
    return state_dir / "control" / "broker.sock"


UNIX_PATH_MAX = 107  # the kernel's sun_path holds 108 bytes, its NUL included


@contextlib.contextmanager
def unix_address(path: Path) -> Iterator[str]:
    """An AF_UNIX address for `path` however deep the state dir is: past the kernel's
    limit, its directory is opened and named through /proc/self/fd (Linux), which
    bind and connect resolve to the directory itself."""
    if len(os.fsencode(str(path))) <= UNIX_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)
