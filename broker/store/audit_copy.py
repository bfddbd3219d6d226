"""A broker's local copy of its host's audit chain, when the chain lives in PostgreSQL.

The shared store chains every event at its commit (postgres.py); the serving broker
copies its host's lines into <state>/audit.jsonl after each commit, as they are, and
fsyncs the copy at most once a second. Lines others of the host chained (a CLI
decision) are fetched when the copy finds a gap. A local file that is not a copy of
the store's chain (from before this host used PostgreSQL, or edited) is set aside,
never appended to.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

from broker import clock
from broker.audit.log import AuditLog, tell
from broker.clock import REAL, Clock
from broker.errors import AuditError, LedgerError

log = logging.getLogger("broker.audit.log")
_CHAIN = frozenset({"seq", "prev", "hash", "alg"})  # the chain's own fields, not the event


class Chained(Protocol):
    """What the copy reads from the shared store (postgres.PostgresStore)."""

    host: str | None
    committed_lines: list[tuple[int, str]]

    def audit_lines_after(self, seq: int) -> list[tuple[int, str]]: ...


class AuditCopy:
    """The serving broker's side of the audit log on a shared store (an AuditSink)."""

    durable: tuple[int, str] | None = None  # the store is the durability point

    def __init__(
        self,
        store: Chained,
        audit_log: AuditLog,
        sync_every_s: float = 1.0,
        checkpoints: Callable[[int, str, bool], None] | None = None,
        clock: Clock = REAL,
    ) -> None:
        self.store = store
        self.clock = clock
        self.log = self._checked(audit_log)
        self.sync_every_s = sync_every_s
        self.checkpoints = checkpoints  # told of each durable head of the copy
        self.observers: list[Callable[[list[dict[str, Any]]], None]] = []
        self.on_sync: list[Callable[[float], None]] = []
        self._dirty_since: float | None = None
        self._synced_at = 0.0
        self._failing = False

    def _checked(self, audit_log: AuditLog) -> AuditLog:
        if audit_log.last_seq == 0:
            return audit_log
        ours = dict(self.store.audit_lines_after(audit_log.last_seq - 1)[:1])
        line = ours.get(audit_log.last_seq)
        if line is not None and json.loads(line).get("hash") == audit_log.head:
            return audit_log
        aside = audit_log.path.with_name(
            f"{audit_log.path.name}.before-{clock.iso(self.clock.now())}".replace(":", "")
        )
        os.replace(audit_log.path, aside)
        log.warning(
            "%s is not a copy of host %s's chain in the shared store; set aside as %s",
            audit_log.path,
            self.store.host,
            aside.name,
        )
        return AuditLog(audit_log.path)

    def flush(self) -> None:
        lines, self.store.committed_lines = self.store.committed_lines, []
        try:
            if not lines or lines[0][0] != self.log.last_seq + 1:
                lines = self.store.audit_lines_after(self.log.last_seq)  # a gap: fetch it
            if lines:
                self.log.append_lines(lines, sync=False)
                if self._dirty_since is None:
                    self._dirty_since = self.clock.monotonic()
                if self.observers:
                    events = [json.loads(line) for _, line in lines]
                    tell(self.observers, [_event(e) for e in events])
            if self.clock.monotonic() - self._synced_at >= self.sync_every_s:
                self.sync()
            self._failing = False
        except (AuditError, LedgerError, OSError) as exc:
            if not self._failing:  # the chain is safe in the store; the copy catches up
                log.warning("the local audit copy is behind: %s", exc)
            self._failing = True

    def sync(self, final: bool = False) -> None:
        if self._dirty_since is not None:
            self.log.sync()
            tell(self.on_sync, self.clock.monotonic() - self._dirty_since)
            self._dirty_since = None
            if self.checkpoints is not None:
                self.checkpoints(self.log.last_seq, self.log.head, False)
        if final and self.checkpoints is not None and self.log.last_seq:
            self.checkpoints(self.log.last_seq, self.log.head, True)
        self._synced_at = self.clock.monotonic()

    def undurable_for(self) -> float:
        since = self._dirty_since
        return 0.0 if since is None else max(0.0, self.clock.monotonic() - since)

    def take_durable(self) -> tuple[int, str] | None:
        return None


def _event(line: dict[str, Any]) -> dict[str, Any]:
    """A chained line as the event it carries (the chain's own fields left out)."""
    return {k: v for k, v in line.items() if k not in _CHAIN}
