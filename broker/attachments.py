"""The content-addressed store of attachments: <state>/attachments/<sha256>."""

from __future__ import annotations

import os
from pathlib import Path

from broker.models import sha256_hex


def store(state_dir: Path, data: bytes) -> str:
    """Write bytes to <state>/attachments/<sha256>, durably, once."""
    digest = sha256_hex(data)
    folder = state_dir / "attachments"
    target = folder / digest
    if target.exists():
        return digest
    folder.mkdir(mode=0o700, exist_ok=True)
    tmp = folder / f".{digest}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, target)
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return digest


def path(state_dir: Path, digest: str) -> Path:
    return state_dir / "attachments" / digest
