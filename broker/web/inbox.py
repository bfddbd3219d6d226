"""What the API and the pages share: the web's own ledger connections, cards, history,
and decisions recorded the way the CLI records them (flush the audit log, nudge the
serving broker, which applies what was approved).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from broker import approval
from broker.config import Config
from broker.errors import DecisionError, RequestNotFound
from broker.ledger import Ledger, Record
from broker.models import now, parse_iso
from broker.registry import Registry
from broker.stats import summarize

LedgerFactory = Callable[[], Ledger]


State = Literal[
    "received",
    "pending",
    "approved",
    "applying",
    "applied",
    "denied",
    "expired",
    "invalid",
    "failed",
    "unknown",
]
STATES: tuple[str, ...] = get_args(State)


class Refused(DecisionError):
    """A decision the ledger would not take; `code` says why (stale, not_pending, …)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Filters:
    """History filters; None means any."""

    effect: str | None = None
    sandbox: str | None = None
    status: str | None = None


class Inbox:
    """The ledger as reviewers see it, through a small pool of the web's own connections."""

    def __init__(
        self, config: Config, registry: Registry, ledger_factory: LedgerFactory, size: int = 4
    ) -> None:
        self.config = config
        self.registry = registry
        self._factory = ledger_factory
        self._idle: queue.LifoQueue[Ledger] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._closed = False

    @contextmanager
    def ledger(self) -> Iterator[Ledger]:
        """A connection for one request; at most `size` are open at once."""
        with self._slots:
            try:
                ledger = self._idle.get_nowait()
            except queue.Empty:
                ledger = self._factory()
            try:
                yield ledger
            finally:
                if self._closed:
                    ledger.close()
                else:
                    self._idle.put(ledger)

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    # -- reading -------------------------------------------------------------------

    def cursor(self) -> int:
        with self.ledger() as ledger:
            return ledger.change_mark()

    def pending(self) -> list[dict[str, Any]]:
        """Cards of what waits, oldest first (as `broker pending --json`)."""
        with self.ledger() as ledger:
            return [self._card(ledger, r) for r in ledger.in_states(["pending"])]

    def card(self, sandbox: str, request_id: str) -> dict[str, Any]:
        with self.ledger() as ledger:
            record = ledger.get(sandbox, request_id)
            if record is None:
                raise RequestNotFound(f"no request {request_id!r} in sandbox {sandbox!r}")
            return self._card(ledger, record)

    def _card(self, ledger: Ledger, record: Record) -> dict[str, Any]:
        card = approval.card(ledger, record, self.registry)
        received = parse_iso(record.received_at)
        card["age_s"] = round((now() - received).total_seconds(), 1) if received else None
        return card

    def waiting(self) -> int:
        with self.ledger() as ledger:
            return len(ledger.in_states(["pending"]))

    def history(
        self, filters: Filters, limit: int = 100, *, states: Iterable[str] | None = None
    ) -> list[Record]:
        """The newest requests matching `filters` (status, else any of `states`)."""
        if filters.status:
            states = [filters.status]
        with self.ledger() as ledger:
            return ledger.search(
                effect=filters.effect, sandbox=filters.sandbox, states=states, limit=limit
            )

    def stats(self, since: datetime | None) -> dict[str, Any]:
        with self.ledger() as ledger:
            return summarize(ledger.all(), since)

    def effects(self) -> list[str]:
        return sorted(h.name for h in self.registry)

    # -- deciding ------------------------------------------------------------------

    def decide(
        self,
        sandbox: str,
        request_id: str,
        verdict: str,
        *,
        approver: str,
        reason: str | None,
        sha256: str,
        surface: str,
    ) -> approval.Outcome:
        """Record `approver`'s verdict, then flush the audit log and nudge the broker."""
        ref = f"{sandbox}/{request_id}"
        with self.ledger() as ledger:
            try:
                return approval.decide_and_wake(
                    self.config,
                    ledger,
                    ref,
                    verdict,
                    approver=approver,
                    reason=reason,
                    surface=surface,
                    sha256=sha256,
                )
            except RequestNotFound:
                raise
            except DecisionError as exc:
                raise Refused(_why(ledger, ref, approver, sha256), str(exc)) from exc


def _why(ledger: Ledger, ref: str, approver: str, sha256: str) -> str:
    """The refusal's code, read back from the ledger."""
    record = ledger.find(ref)
    if record.state != "pending":
        return "not_pending"
    seen = sha256.strip().lower()
    if len(seen) < 12 or not (record.sha256 or "").startswith(seen):
        return "stale"
    if any(d.approver == approver for d in ledger.decisions(*record.key)):
        return "already_decided"
    return "refused"
