"""Start marks: durable evidence that a non-idempotent handler was called."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from broker.errors import EffectFailed
from broker.models import Record, sha256_hex

log = logging.getLogger("broker")


class StartMarks:
    """Durable marks that a non-idempotent handler was called, one file per request.

    `applying` is committed before a handler runs, but a crash can come before the call
    as well as after it. The mark, fsynced before the call, tells the two apart on
    restart: no mark, the effect never started and is applied; a mark, a person must
    reconcile it. A mark that cannot be written stops the apply (fail closed).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, record: Record) -> Path:
        return self.folder / sha256_hex(f"{record.sandbox}/{record.id}".encode())

    def mark(self, record: Record) -> None:
        try:
            self.folder.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(self._path(record), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            dir_fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise EffectFailed(
                "failed: the broker could not record that the effect was starting "
                f"({exc.strerror}); it was not applied; try again later"
            ) from exc

    def seen(self, record: Record) -> bool:
        return self._path(record).exists()

    def clear(self, record: Record) -> None:
        try:
            self._path(record).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove the start mark of %s/%s: %s", record.sandbox, record.id, exc)
