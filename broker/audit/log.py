"""The audit log: append-only JSONL, one event per line, each line hash-chained.

Every line carries `prev`, the hash of the line before it, and `hash`: with the host's
audit key (`[audit] key_env`/`key_file`, kept outside the state dir) the HMAC-SHA256 of
its canonical form without `hash` under that key, marked `"alg": "hmac-sha256"`;
without one, its sha256. Editing, removing or reordering any line breaks the chain at
that line, and `broker.audit.verify` says which. Without the key nobody can append a line
or re-seal the chain so that it verifies: the first time a keyed line is written the
ledger records, signed with the key, the event from which every line is keyed
(`keyed_mark`), so a log stripped of its marks and re-chained with plain sha256 is
refused too. The signed checkpoints exported off the state dir
(broker.audit.checkpoints) show a log cut short or rewritten by whoever holds it. Events
reach the log through the store's queue (broker.store.base), each exactly once, in order.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from broker.clock import REAL, Clock, iso, now
from broker.errors import AuditError
from broker.models import Record, canonical_json, sha256_hex

GENESIS = "0" * 64
T = TypeVar("T")


def event(kind: str, record: Record, at: str | None = None, **extra: Any) -> dict[str, Any]:
    """One audit event about `record`; None-valued extras are left out."""
    entry: dict[str, Any] = {
        "at": at or iso(now()),
        "event": kind,
        "sandbox": record.sandbox,
        "id": record.id,
        "effect": record.effect,
        "sha256": record.sha256,
    }
    entry.update({k: v for k, v in extra.items() if v is not None})
    return entry


KEYED = "hmac-sha256"


def line_hash(entry: dict[str, Any], key: bytes | None = None) -> str:
    """A line's hash: keyed (HMAC-SHA256) when the line says so, else its sha256."""
    body = canonical_json({k: v for k, v in entry.items() if k != "hash"})
    if entry.get("alg") == KEYED:
        if key is None:
            raise AuditError("a keyed audit line cannot be checked without the audit key")
        return hmac.new(key, body, hashlib.sha256).hexdigest()
    return sha256_hex(body)


def chain(
    events: Sequence[tuple[int, dict[str, Any]]], head: str, key: bytes | None = None
) -> tuple[list[bytes], str]:
    """Chain `events` ((seq, event), in order) after `head`, keyed under `key` when
    given: their lines and the new head (the file log and a shared store alike)."""
    lines: list[bytes] = []
    for seq, event in events:
        entry = {"seq": seq, **event, "prev": head}
        if key is not None:
            entry["alg"] = KEYED
        entry["hash"] = head = line_hash(entry, key)
        lines.append(canonical_json(entry))
    return lines, head


class Queue(Protocol):
    """Where events wait for the log: the store's audit queue, written in the same
    transaction as the change each records (broker.store.base.Store has these)."""

    def audit_backlog(self, after: int = 0) -> list[tuple[int, dict[str, Any]]]: ...

    def drop_audit(self, upto: int, head: str) -> None: ...

    def transaction(self) -> AbstractContextManager[None]: ...

    def audit_keyed_from(self) -> tuple[int, str] | None: ...

    def mark_audit_keyed(self, seq: int, mac: str) -> None: ...


def keyed_mark(key: bytes, seq: int) -> str:
    """The signature of "every line from event `seq` on is keyed", under `key`."""
    return hmac.new(key, canonical_json({"audit_keyed_from": seq}), hashlib.sha256).hexdigest()


def first_keyed_seq(path: Path) -> int | None:
    """The seq of the log's first keyed line (None: it holds none)."""
    if not path.exists():
        return None
    with path.open("rb") as f:
        for raw in f:
            if KEYED.encode() not in raw:
                continue
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("alg") == KEYED:
                return int(entry["seq"])
    return None


def remember_keyed(ledger: Queue, log: AuditLog) -> bool:
    """Record in the ledger, signed, from which event the log is keyed (once): from then
    on `verify` refuses an unkeyed line there, whatever its own marks say. True when the
    ledger holds the record (or there is no key and nothing to record)."""
    if log.key is None:
        return True
    if ledger.audit_keyed_from() is not None:
        return True
    seq = first_keyed_seq(log.path)
    if seq is None:
        return False
    with ledger.transaction():
        ledger.mark_audit_keyed(seq, keyed_mark(log.key, seq))
    return True


class AuditLog:
    """Appends events, chained, to `path`; reads them back for verify/tail/export."""

    def __init__(self, path: Path, key: bytes | None = None) -> None:
        self.path = path
        self.key = key
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_path = path.with_name(path.name + ".lock")
        self._left: tuple[int, int, int] | None = None  # the file as our last append left it
        with self._locked():
            self.last_seq, self.head = self._recover_tail()

    def _locked(self) -> _Flock:
        return _Flock(self._lock_path)

    def _head(self) -> tuple[int, str]:
        """The chain's head, under the lock: read again from the file unless it is as our
        last append left it (same inode, size and mtime: nobody appended, truncated or
        replaced it since), which spares a serving broker an open and a read per commit."""
        if self._left is not None:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                st = None
            if st is not None and (st.st_ino, st.st_size, st.st_mtime_ns) == self._left:
                return self.last_seq, self.head
        self._left = None
        return self._recover_tail()

    def _recover_tail(self) -> tuple[int, str]:
        """Drop a torn last line (a crash mid-write), then read the chain's head."""
        if not self.path.exists():
            return 0, GENESIS
        with self.path.open("rb+") as f:
            size = f.seek(0, os.SEEK_END)
            span = 4096
            while True:
                if size == 0:
                    return 0, GENESIS
                start = max(0, size - span)
                f.seek(start)
                tail = f.read()
                if not tail.endswith(b"\n"):
                    cut = tail.rfind(b"\n")
                    size = start + cut + 1 if cut >= 0 else start
                    f.truncate(size)
                    continue
                lines = tail.rstrip(b"\n").split(b"\n")
                if len(lines) >= 2 or start == 0:
                    break
                span *= 4
            if not lines or not lines[-1]:
                return 0, GENESIS
            try:
                last = json.loads(lines[-1])
                return int(last["seq"]), str(last["hash"])
            except (ValueError, KeyError, TypeError) as exc:
                raise AuditError(f"{self.path}: the last line is not an audit event") from exc

    def append(self, events: list[tuple[int, dict[str, Any]]], *, sync: bool = True) -> int:
        """Append queued events not yet in the log; return the last seq.

        Several processes may append (the broker, a CLI decision): under a lock, the
        head is read again so the chain never forks. With `sync=False` the caller
        fsyncs later (`sync()`), and keeps the events queued in the ledger until then.
        """
        with self._locked():
            self.last_seq, self.head = self._head()
            return self._append(events, sync)

    def sync(self) -> None:
        """Make what was appended durable."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        except OSError as exc:
            raise AuditError(f"{self.path}: cannot sync: {exc.strerror}") from exc
        finally:
            os.close(fd)

    def _append(self, events: list[tuple[int, dict[str, Any]]], sync: bool) -> int:
        fresh = [(seq, e) for seq, e in events if seq > self.last_seq]  # not before a crash
        if not fresh:
            return self.last_seq
        lines, head = chain(fresh, self.head, self.key)
        return self._write([line + b"\n" for line in lines], sync, fresh[-1][0], head)

    def append_lines(self, lines: Iterable[tuple[int, str]], *, sync: bool = False) -> int:
        """Copy lines chained elsewhere (a shared store's chain), skipping those held."""
        with self._locked():
            self.last_seq, self.head = self._head()
            fresh = [(seq, line) for seq, line in lines if seq > self.last_seq]
            if not fresh:
                return self.last_seq
            last = json.loads(fresh[-1][1])
            data = [line.encode("utf-8") + b"\n" for _, line in fresh]
            return self._write(data, sync, int(last["seq"]), str(last["hash"]))

    def _write(self, lines: list[bytes], sync: bool, last: int, head: str) -> int:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                data = b"".join(lines)
                written = os.write(fd, data)
                while written < len(data):
                    written += os.write(fd, data[written:])
                if sync:
                    os.fsync(fd)
                st = os.fstat(fd)
                self._left = (st.st_ino, st.st_size, st.st_mtime_ns)
            finally:
                os.close(fd)
        except OSError as exc:
            self._left = None
            raise AuditError(f"{self.path}: cannot append: {exc.strerror}") from exc
        self.head, self.last_seq = head, last
        return last


class _Flock:
    """An exclusive lock on a side file, released on exit."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


class AuditWriter:
    """The serving broker's side of the log: events queued in the ledger are appended
    after each commit, and fsynced at most once a second (or when idle). Until an
    event's line is fsynced it stays queued in the ledger, so a crash loses none:
    they are appended again at start. `durable` is what the next transaction may
    drop from the queue."""

    def __init__(
        self,
        ledger: Queue,
        log: AuditLog,
        sync_every_s: float = 1.0,
        checkpoints: Callable[[int, str, bool], None] | None = None,
        clock: Clock = REAL,
    ) -> None:
        self.ledger = ledger
        self.log = log
        self.clock = clock
        self.checkpoints = checkpoints  # told of each durable head; exports some of them
        self.sync_every_s = sync_every_s
        self.durable: tuple[int, str] | None = None
        self._appended = 0  # the last event appended to the log (maybe not fsynced)
        self._synced = 0
        self._synced_at = 0.0
        self._undurable_since: float | None = None  # when the oldest unsynced line went in
        self._keyed_known = log.key is None  # the ledger records from where lines are keyed
        # observers (broker.observability.tap): the events each flush appended; each sync's lag
        self.observers: list[Callable[[list[dict[str, Any]]], None]] = []
        self.on_sync: list[Callable[[float], None]] = []

    def flush(self) -> None:
        backlog = self.ledger.audit_backlog(after=self._appended)
        if backlog:
            self._appended = self.log.append(backlog, sync=False)
            if self._undurable_since is None:
                self._undurable_since = self.clock.monotonic()
            if not self._keyed_known:
                self._keyed_known = remember_keyed(self.ledger, self.log)
        if self.observers:
            tell(self.observers, [event for _, event in backlog])
        if self.clock.monotonic() - self._synced_at >= self.sync_every_s:
            self.sync()

    def sync(self, final: bool = False) -> None:
        """Make what was appended durable; `final` (at stop) also exports a checkpoint."""
        if self._appended > self._synced:
            self.log.sync()
            self._synced = self._appended
            self.durable = (self._appended, self.log.head)
            if self.on_sync and self._undurable_since is not None:
                tell(self.on_sync, self.clock.monotonic() - self._undurable_since)
            self._undurable_since = None
            if self.checkpoints is not None:
                self.checkpoints(self._appended, self.log.head, False)
        if final and self.checkpoints is not None and self._synced:
            self.checkpoints(self._synced, self.log.head, True)
        self._synced_at = self.clock.monotonic()

    def undurable_for(self) -> float:
        """How long the oldest line appended but not yet fsynced has waited (0: none)."""
        since = self._undurable_since
        return 0.0 if since is None else max(0.0, self.clock.monotonic() - since)

    def take_durable(self) -> tuple[int, str] | None:
        durable, self.durable = self.durable, None
        return durable


def tell(observers: list[Callable[[T], None]], value: T) -> None:
    """Observers never break the log: their failures are logged, the events stand."""
    for observer in observers:
        try:
            observer(value)
        except Exception:
            logging.getLogger("broker").exception("an audit observer failed")


def flush(ledger: Queue, log: AuditLog) -> None:
    """Append the ledger's queued events to the log and forget them (for CLI surfaces)."""
    backlog = ledger.audit_backlog()
    if backlog:
        last = log.append(backlog)
        with ledger.transaction():
            ledger.drop_audit(last, log.head)
        remember_keyed(ledger, log)
