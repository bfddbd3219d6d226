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

from broker.approval import decisions as approval
from broker.approval.card import Narrowing, extend
from broker.approval.decisions import Ballot, Tally
from broker.clock import now, parse_iso
from broker.config import Config
from broker.errors import DecisionError, NotAnApprover, RequestNotFound, StepUpRequired
from broker.identity import Proof
from broker.models import Record
from broker.observability.stats import summarize
from broker.policy.ruleset import batch_allowed
from broker.registry import Registry
from broker.store.base import Store

LedgerFactory = Callable[[], Store]


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
    "staged",
]
STATES: tuple[str, ...] = get_args(State)


class Refused(DecisionError):
    """A decision the ledger would not take; `code` says why (stale, not_pending, …)."""

    def __init__(self, code: str, message: str, step_up_s: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.step_up_s = step_up_s  # step_up_required: how recent a sign-in must be


@dataclass(frozen=True)
class Pick:
    """One request of a batch decision, with the sha256 of the card the person saw."""

    sandbox: str
    id: str
    sha256: str

    @property
    def ref(self) -> str:
        return f"{self.sandbox}/{self.id}"


@dataclass(frozen=True)
class Picked:
    """What a batch decision did to one request: recorded, or refused with a code."""

    pick: Pick
    recorded: bool
    settled: bool = False
    code: str | None = None
    message: str = ""
    status: str | None = None


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
        self._idle: queue.LifoQueue[Store] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._closed = False

    @contextmanager
    def ledger(self) -> Iterator[Store]:
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

    def pending(self, narrowing: Narrowing | None = None) -> list[dict[str, Any]]:
        """Cards of what waits, oldest first (as `broker pending --json`), narrowed."""
        keep = narrowing or Narrowing()
        with self.ledger() as ledger:
            cards = [self._card(ledger, r) for r in ledger.in_states(["pending"])]
        return [c for c in cards if keep.keeps(c)]

    def neighbours(
        self, key: tuple[str, str]
    ) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
        """The waiting requests before and after `key` in arrival order (for j/k); from a
        request that no longer waits, the next is the oldest one waiting."""
        with self.ledger() as ledger:
            keys = [r.key for r in ledger.in_states(["pending"])]
        if key not in keys:
            return None, next(iter(keys), None)
        at = keys.index(key)
        return (keys[at - 1] if at else None), (keys[at + 1] if at + 1 < len(keys) else None)

    def next_waiting(self, approver: str, after: tuple[str, str]) -> Record | None:
        """The request to show `approver` after deciding on `after`: the next one waiting
        that they have not decided on yet (after it in arrival order, else from the top)."""
        with self.ledger() as ledger:
            done = ledger.get(*after)
            mark = done.seq if done is not None and done.seq is not None else 0
            waiting = [
                r
                for r in ledger.in_states(["pending"])
                if r.key != after and all(d.approver != approver for d in ledger.decisions(*r.key))
            ]
        later = [r for r in waiting if (r.seq or 0) > mark]
        return next(iter(later or waiting), None)

    def card(self, sandbox: str, request_id: str) -> dict[str, Any]:
        with self.ledger() as ledger:
            record = ledger.get(sandbox, request_id)
            if record is None:
                raise RequestNotFound(f"no request {request_id!r} in sandbox {sandbox!r}")
            return self._card(ledger, record)

    def _card(self, ledger: Store, record: Record) -> dict[str, Any]:
        card = approval.card(ledger, record, self.registry)
        received = parse_iso(record.received_at)
        card["age_s"] = round((now() - received).total_seconds(), 1) if received else None
        return extend(card, record.output)

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

    def decide(self, ballot: Ballot) -> Tally:
        """Record the ballot, then flush the audit log and nudge the broker."""
        with self.ledger() as ledger:
            try:
                return approval.decide_and_wake(self.config, ledger, ballot)
            except RequestNotFound:
                raise
            except StepUpRequired as exc:
                raise Refused("step_up_required", str(exc), exc.max_age_s) from exc
            except NotAnApprover as exc:
                raise Refused("not_an_approver", str(exc)) from exc
            except DecisionError as exc:
                raise Refused(_why(ledger, ballot), str(exc)) from exc

    def decide_many(
        self,
        picks: Iterable[Pick],
        verdict: str,
        *,
        approver: str,
        reason: str | None,
        surface: str,
        proof: Proof | None = None,
    ) -> list[Picked]:
        """One decision per picked request, each bound to its own sha256 and recorded on
        its own; a request whose rule says `batch = false` is refused, never decided."""
        outcomes: list[Picked] = []
        seen: set[tuple[str, str]] = set()
        for pick in picks:
            key = (pick.sandbox, pick.id)
            if key in seen:
                outcomes.append(Picked(pick, False, code="duplicate", message="listed twice"))
                continue
            seen.add(key)
            ballot = Ballot(pick.ref, verdict, approver, reason, surface, pick.sha256, proof)
            outcomes.append(self._decide_one(pick, ballot))
        return outcomes

    def _decide_one(self, pick: Pick, ballot: Ballot) -> Picked:
        with self.ledger() as ledger:
            record = ledger.get(pick.sandbox, pick.id)
        if record is None:
            return Picked(pick, False, code="not_found", message=f"no request {pick.ref}")
        if not batch_allowed(record.verdict):
            rule = (record.verdict or {}).get("rule", "its rule")
            return Picked(
                pick,
                False,
                code="batch_forbidden",
                message=f"{pick.ref}: {rule} asks for a decision on this request alone; "
                "open it and decide there",
                status=record.state,
            )
        try:
            tally = self.decide(ballot)
        except RequestNotFound as exc:
            return Picked(pick, False, code="not_found", message=str(exc))
        except Refused as exc:
            return Picked(pick, False, code=exc.code, message=exc.message, status=record.state)
        return Picked(pick, True, tally.settled, status=tally.record.state)


def _why(ledger: Store, ballot: Ballot) -> str:
    """The refusal's code, read back from the ledger."""
    record = ledger.find(ballot.ref)
    if record.state != "pending":
        return "not_pending"
    seen = (ballot.sha256 or "").strip().lower()
    if len(seen) < 12 or not (record.sha256 or "").startswith(seen):
        return "stale"
    if any(d.approver == ballot.approver for d in ledger.decisions(*record.key)):
        return "already_decided"
    return "refused"
