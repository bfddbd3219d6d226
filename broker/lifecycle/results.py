"""Result files: /results/<id>.json, written by temp file + rename, never followed.

No fsync: the ledger is the durability point, and results the ledger has not seen
written are rewritten from it at start (the `synced` flag).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from broker import codec
from broker.faults import fault
from broker.intake.outbox import Served
from broker.models import Record, Result

log = logging.getLogger("broker")

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_TRUNC


def render(result: Result) -> bytes:
    return codec.dump_bytes(result.to_json()) + b"\n"


def write(dir_fd: int, result: Result) -> None:
    """Atomically replace `<id>.json` in the directory `dir_fd` with `result`."""
    write_bytes(dir_fd, f"{result.id}.json", render(result))


def write_bytes(dir_fd: int, name: str, data: bytes) -> None:
    tmp = f".{name}.tmp"
    try:
        fd = os.open(tmp, _FLAGS, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(tmp, dir_fd=dir_fd)
        fd = os.open(tmp, _FLAGS, 0o644, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o644)  # readable in the sandbox whatever the broker's umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def read(dir_fd: int, request_id: str) -> dict[str, Any] | None:
    try:
        fd = os.open(
            f"{request_id}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        value: dict[str, Any] = json.loads(f.read())
        return value


class Answers:
    """Writes results after the commit, and remembers which were written so the next
    transaction can mark them synced (an unsynced result is written again at start).
    Observers hear of every result written; their failures never touch the request."""

    def __init__(
        self, served: Served, given: Callable[[tuple[str, str]], int] | None = None
    ) -> None:
        self.served = served
        self.given = given  # approvals so far, for a pending result (protocol version 2)
        self.counted: dict[tuple[str, str], int] = {}  # pending results' approvals, as written
        self.observers: list[Callable[[Record], None]] = []
        self.written: list[tuple[str, str, str]] = []

    def recount(self) -> list[tuple[str, str]]:
        """The pending requests whose approvals changed since their result was written (a
        person's approval short of the quorum changes no state, so nothing else tells)."""
        if self.given is None:
            return []
        return [key for key, given in list(self.counted.items()) if self.given(key) != given]

    def write(self, record: Record) -> None:
        given = None
        if record.state == "pending" and record.version >= 2 and self.given is not None:
            given = self.counted[record.key] = self.given(record.key)
        else:
            self.counted.pop(record.key, None)
        result = record.result(given)
        box = self.served.boxes.get(record.sandbox)
        if result is None or box is None:
            return
        try:
            write(box.results_fd, result)
        except OSError as exc:
            log.error("sandbox %s: cannot write result %s: %s", record.sandbox, record.id, exc)
            return
        fault("after_result")
        self.written.append((record.sandbox, record.id, record.state))
        for observer in self.observers:
            try:
                observer(record)
            except Exception:
                log.exception("an observer failed; the request is unaffected")

    def take_written(self) -> list[tuple[str, str, str]]:
        written, self.written = self.written, []
        return written
