"""From a name in an outbox to a Request, never trusting what the sandbox wrote.

Every fd on outbox and claim dirs is used here. A file is claimed first (renamed into
the broker's private claim dir on the same file system, under a name of its own),
then read from there: relative to the dir fd, O_NOFOLLOW|O_NONBLOCK, a regular file
with one link, at most limit+1 bytes, parsed as strict JSON (broker.intake.strict_json).
Only the claimed name, the inode that was read, is ever removed afterwards.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import stat
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from broker import attachments
from broker.clock import REAL, Clock
from broker.config import Limits
from broker.errors import Issue, Rejected
from broker.faults import fault
from broker.intake.outbox import Outbox
from broker.intake.strict_json import parse_json
from broker.models import Request
from broker.names import ATTACHMENT_NAME, REQUEST_ID, REQUEST_NAME, Kind, classify
from broker.validation import Validator

__all__ = [
    "ATTACHMENT_NAME",
    "REQUEST_ID",
    "REQUEST_NAME",
    "BadNames",
    "Claims",
    "Kind",
    "Read",
    "being_written",
    "classify",
    "exists",
    "parse_json",
    "read_file",
]
log = logging.getLogger("broker")


def _reject(code: str, message: str, path: str = "") -> Rejected:
    return Rejected(f"invalid: {message}", [Issue(path, code, message)])


def read_file(dir_fd: int, name: str, limit: int) -> bytes:
    """The bytes of a regular file `name` in `dir_fd`, at most `limit` of them.

    Raises Rejected for anything that is not a regular, singly linked, small enough
    file; never follows a link and never blocks on a FIFO or device.
    """
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise
    _check_kind(before)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (40, 31):  # ELOOP: swapped for a symlink; EMLINK
            raise _reject("not_regular_file", "the request is a symbolic link") from exc
        raise
    try:
        st = os.fstat(fd)
        _check_kind(st)
        if st.st_size > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _too_large(limit)
    return data


def _too_large(limit: int) -> Rejected:
    return _reject("too_large", f"the file is larger than the {limit}-byte limit")


def _check_kind(st: os.stat_result) -> None:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        raise _reject("not_regular_file", "the request is a symbolic link; write a regular file")
    if not stat.S_ISREG(mode):
        kind = (
            "directory"
            if stat.S_ISDIR(mode)
            else "FIFO"
            if stat.S_ISFIFO(mode)
            else "socket"
            if stat.S_ISSOCK(mode)
            else "device"
        )
        raise _reject("not_regular_file", f"the request is a {kind}; write a regular file")
    if st.st_nlink != 1:
        raise _reject("hard_link", "the request file has several hard links; write a new file")


def being_written(dir_fd: int, name: str) -> bool:
    """Whether some process holds this regular file open for writing.

    A read lease cannot be taken on a file open for writing anywhere (EAGAIN), which
    tells a request still being written from one that is complete. Where leases are
    not allowed (another owner, no CAP_LEASE), we cannot tell, and read it.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError as exc:
            return exc.errno == errno.EAGAIN
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    finally:
        os.close(fd)


def exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


class BadNames:
    """Logs each file name that is not a request name once, and past `limit` distinct
    names of one sandbox one summary line a minute for it with a count, so a flood of
    bad names cannot flood the log on every rescan, nor hide another sandbox's."""

    def __init__(self, limit: int = 1000, every_s: float = 60.0, clock: Clock = REAL) -> None:
        self.limit = limit
        self.clock = clock
        self.every_s = every_s
        self._seen: dict[str, set[str]] = {}
        self._suppressed: dict[str, int] = {}
        self._told_at: dict[str, float] = {}

    def note(self, sandbox: str, name: str) -> None:
        seen = self._seen.setdefault(sandbox, set())
        if name in seen:
            return
        if len(seen) < self.limit:
            seen.add(name)
            log.warning("sandbox %s: ignoring %r: not a request name", sandbox, name)
            return
        self._suppressed[sandbox] = self._suppressed.get(sandbox, 0) + 1
        now = self.clock.monotonic()
        told = self._told_at.get(sandbox)
        if told is None or now - told >= self.every_s:
            log.warning(
                "sandbox %s: ignoring %d more files whose names are not request names (each "
                "is logged once, up to %d names per sandbox)",
                sandbox,
                self._suppressed[sandbox],
                self.limit,
            )
            self._suppressed[sandbox] = 0
            self._told_at[sandbox] = now


@dataclass
class Read:
    """What reading one claimed request gave: the request, or why it is refused."""

    box: Outbox
    stem: str
    where: str  # its name in the claim dir
    claimed: list[str] = field(default_factory=list)  # everything to remove once recorded
    raw: bytes = b""
    doc: Any = None
    request: Request | None = None
    rejected: Rejected | None = None

    @property
    def hostile(self) -> bool:
        """Refused before it parsed (a link, a FIFO…): removed at once, not when idle."""
        return self.rejected is not None and self.doc is None


class Claims:
    """Claims and reads what sandboxes wrote into their outboxes."""

    def __init__(
        self, limits: Limits, validator: Validator, state_dir: Any, clock: Clock = REAL
    ) -> None:
        self.clock = clock
        self.limits = limits
        self.validator = validator
        self.state_dir = state_dir
        self.bad_names = BadNames(clock=clock)
        self._counter = 0

    def claim(self, box: Outbox, name: str, kind: Kind = Kind.REQUEST) -> str | None:
        """Move `name` out of the sandbox's reach; return its claimed name, or None."""
        found, _, _ = classify(name)
        if found is not kind:
            if found is Kind.BAD:
                self.bad_names.note(box.sandbox, name)
            return None
        if being_written(box.outbox_fd, name):
            return None  # its writer's close (IN_CLOSE_WRITE) brings it back
        self._counter += 1
        target = f"{name}~{os.getpid()}-{self._counter}"
        try:
            os.rename(name, target, src_dir_fd=box.outbox_fd, dst_dir_fd=box.claim_fd)
        except FileNotFoundError:
            return None  # already taken (an event and a rescan for the same file)
        return target

    def read(self, box: Outbox, stem: str, where: str) -> Read | None:
        """Read a claimed request and its attachments; None if the file is gone."""
        got = Read(box, stem, where, [where])
        try:
            got.raw = read_file(box.claim_fd, where, self.limits.max_request_bytes)
            fault("after_read")
            got.doc = parse_json(got.raw, self.limits.max_depth)
            self.validator.envelope(got.doc)
            doc = got.doc
            got.request = Request(
                sandbox=box.sandbox,
                id=doc.get("id", stem),
                name=stem,
                effect=doc["effect"],
                params=doc["params"],
                reason=doc.get("reason"),
                idempotency_key=doc.get("idempotency_key"),
                attachments=self._attachments(got, doc.get("attachments") or []),
                version=doc["version"],
            )
        except FileNotFoundError:
            return None
        except Rejected as exc:
            got.rejected = exc
        return got

    def _attachments(self, got: Read, names: list[str]) -> dict[str, str]:
        """Take each listed attachment into the content-addressed store."""
        digests: dict[str, str] = {}
        for i, att in enumerate(names):
            file_name = f"{got.stem}.{att}.bin"
            where = self._claim_attachment(got.box, file_name)
            if where is None:
                raise Rejected(
                    f"invalid: attachment {att!r} is missing; write {file_name} into the "
                    "outbox (by rename) before the request that lists it",
                    [Issue(f"/attachments/{i}", "missing_attachment", f"no file {file_name}")],
                )
            got.claimed.append(where)
            try:
                data = read_file(got.box.claim_fd, where, self.limits.max_attachment_bytes)
            except Rejected as exc:
                first = exc.issues[0] if exc.issues else None
                message = f"attachment {att!r}: {first.message if first else exc.reason}"
                code = first.code if first else "bad_attachment"
                raise Rejected(
                    f"invalid: {message}", [Issue(f"/attachments/{i}", code, message)]
                ) from exc
            digests[att] = attachments.store(self.state_dir, data)
        return digests

    def _claim_attachment(self, box: Outbox, file_name: str) -> str | None:
        claimed = self.claim(box, file_name, kind=Kind.ATTACHMENT)
        if claimed is not None:
            return claimed
        for leftover in box.claimed():  # after a crash, it may be claimed already
            if leftover.split("~", 1)[0] == file_name:
                return leftover
        return None

    def drop_orphans(self, box: Outbox, names: list[str]) -> None:
        """Remove attachments whose request did not come within the grace period: each
        is claimed first, so only the file that was judged old is removed."""
        requests = {n.removesuffix(".json") for n in names if n.endswith(".json")}
        cutoff = self.clock.time() - self.limits.attachment_grace_s
        for name in names:
            kind, stem, _ = classify(name)
            if kind is not Kind.ATTACHMENT or stem in requests:
                continue
            try:
                st = os.stat(name, dir_fd=box.outbox_fd, follow_symlinks=False)
            except OSError:
                continue
            if st.st_mtime >= cutoff:
                continue
            where = self.claim(box, name, kind=Kind.ATTACHMENT)
            if where is not None:
                remove(box, where)
                log.warning(
                    "sandbox %s: removed attachment %r: no request listed it within %ds",
                    box.sandbox,
                    name,
                    self.limits.attachment_grace_s,
                )


class Consumed:
    """Claimed files whose request is recorded, removed when the loop is idle: unlinks
    can be slow, and the loop must stay responsive."""

    def __init__(self, clock: Clock = REAL) -> None:
        self._files: deque[tuple[Outbox, str]] = deque()
        self.clock = clock

    def __bool__(self) -> bool:
        return bool(self._files)

    def add(self, box: Outbox, claimed: str) -> None:
        self._files.append((box, claimed))

    def purge(self, budget_s: float | None = None) -> None:
        """Remove all of them, or as many as fit in `budget_s`."""
        end = None if budget_s is None else self.clock.monotonic() + budget_s
        while self._files and (end is None or self.clock.monotonic() < end):
            box, name = self._files.popleft()
            if box.claim_fd >= 0:
                remove(box, name)


def remove(box: Outbox, claimed: str) -> None:
    """Remove a claimed entry (a directory a hostile sandbox renamed in, too)."""
    fault("before_remove")
    try:
        st = os.stat(claimed, dir_fd=box.claim_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(claimed, dir_fd=box.claim_fd)
        else:
            os.unlink(claimed, dir_fd=box.claim_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("sandbox %s: cannot remove %r: %s", box.sandbox, claimed, exc.strerror)
    fault("after_remove")
