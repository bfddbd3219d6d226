"""The request's life: one method per transition, each writing the request's ledger row
and queueing its audit event in the same transaction.

    (new) ─┬─ reject ───────────────────────────────► invalid
           ├─ deny ─────────────────────────────────► denied
           ├─ auto ─────────────────────────────────► applying
           ├─ hold ───► received ─┬─ deny ──────────► denied
           │                      ├─ auto ──────────► applying
           │                      ├─ park ──────────► pending
           │                      ├─ stage ─────────► staged (staged mode: nothing applied)
           │                      └─ settle_replay ─► (the first request's outcome)
           ├─ park ─────────────────────────────────► pending
           └─ replay ─► received (waits for its first) | the first's outcome

    pending ─┬─ approve ─► approved ─ start ─► applying ─┬─ finish ─► applied | failed | invalid
             ├─ refuse ──► denied                        └─ lose ───► unknown (a restart)
             ├─ withdraw ► denied (the agent took it back: protocol version 2)
             ├─ expire ──► expired
             └─ expire ──► applying (on_timeout = approve, reversible effects only)

Terminal states never change. A move not drawn here raises IllegalTransition; callers
that race (a decision and an expiry) re-read the row inside the transaction first.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from broker import clock
from broker import staged as staging
from broker.audit.log import event as audit_event
from broker.clock import REAL, Clock
from broker.errors import IllegalTransition, Outcome, PolicyDenied
from broker.models import TERMINAL, Record, State, Verdict
from broker.outcomes import service_status, service_warning
from broker.store.base import Store

Redact = Callable[[Any], Any]

_FIRST: frozenset[State] = frozenset({"received", "pending", "applying"})
ALLOWED: dict[State | None, frozenset[State]] = {
    None: _FIRST | TERMINAL,  # terminal: invalid, denied, or a replay's copied outcome
    "received": _FIRST - {"received"} | TERMINAL,
    "pending": frozenset({"approved", "denied", "expired", "applying"}),
    "approved": frozenset({"applying", "denied"}),  # denied: its effect was switched off
    "applying": frozenset({"applied", "failed", "invalid", "unknown"}),
    **{state: frozenset() for state in TERMINAL},
}
"""Where each state may go; None is a request the ledger has not recorded yet."""

APPLIED_BY_TIMEOUT = "policy (on_timeout)"
WITHDRAWER = "agent"
WITHDRAWN = "withdrawn by the agent"


def _identity(value: Any) -> Any:
    return value


class Lifecycle:
    """The transitions, over one ledger connection; `redact` masks what is written."""

    def __init__(self, ledger: Store, redact: Redact = _identity, clock: Clock = REAL) -> None:
        self.ledger = ledger
        self.redact = redact
        self.clock = clock  # every stamp and deadline it writes

    # -- plumbing -----------------------------------------------------------------

    def audit(self, kind: str, record: Record, at: str | None = None, **extra: Any) -> None:
        stamp = at or clock.iso(self.clock.now())
        self.ledger.queue_audit(self.redact(audit_event(kind, record, stamp, **extra)))

    def _move(self, record: Record, **changes: Any) -> Record:
        """Write `changes` (always a new `state`) as one insert or one update."""
        new_state: State = changes["state"]
        old: State | None = record.state if record.seq is not None else None
        if new_state not in ALLOWED[old]:
            raise IllegalTransition(
                f"{record.sandbox}/{record.id}: cannot go from {old or 'new'} to {new_state}"
            )
        if new_state in TERMINAL:
            changes.setdefault("seen", None)  # what the approver saw ends with the request
        if record.seq is None:
            return self.ledger.insert(record.evolve(**changes))
        # what work off the loop learnt since the row was written travels with the move
        changes.setdefault("reversible", record.reversible)
        changes.setdefault("seen", record.seen)
        changes.setdefault("facts", record.facts)
        return self.ledger.update(record, **changes)

    def _unwritten(self, record: Record, **changes: Any) -> Record:
        if record.seq is not None or changes["state"] not in ALLOWED[None]:
            return self._move(record, **changes)
        return record.evolve(**changes)

    # -- a new request --------------------------------------------------------------

    def receive(self, record: Record) -> None:
        """The request was read: its first audit event (its row comes with its verdict)."""
        self.audit("received", record, name=record.name)

    def reject(self, record: Record, exc: Outcome) -> Record:
        """A protocol or schema violation (invalid), or a policy refusal (denied)."""
        stamp = clock.iso(self.clock.now())
        issues = [i.to_json() for i in exc.issues]
        rule = exc.rule if isinstance(exc, PolicyDenied) else None
        by = "policy" if rule is not None else None
        told: dict[str, Any] = {}  # what the policy said and was told, for replay
        if isinstance(exc, PolicyDenied) and exc.verdict is not None:
            told = {"verdict": exc.verdict.to_json(), "facts": exc.facts}
        record = self._move(
            record,
            **told,
            state=exc.status,
            reason=self.redact(exc.reason),
            errors=self.redact(issues),
            decided_by=by,
            decided_at=stamp if by else None,
            completed_at=stamp,
        )
        extra: dict[str, Any] = {"reason": record.reason}
        if rule is not None:
            extra["rule"] = rule
        if issues:
            extra["errors"] = [f"{i['path']}: {i['code']}" for i in issues][:20]
        self.audit(exc.status, record, **extra)
        return record

    def hold(self, record: Record) -> Record:
        """Recorded, waiting for work off the loop (an assessment or a preview)."""
        return self._move(record, state="received")

    def auto(self, record: Record, verdict: Verdict, *, write: bool = True) -> Record:
        """The policy applies it without a person. With `write` False the row is written
        by the request's next move in the same transaction (an inline apply's finish):
        one write instead of two, and nothing committed in between either way."""
        move = self._move if write else self._unwritten
        record = move(
            record,
            state="applying",
            verdict=verdict.to_json(),
            decided_by="policy",
            decided_at=clock.iso(self.clock.now()),
            reason=f"applied automatically ({verdict.rule}): {verdict.reason}",
        )
        self.audit("decided", record, action="auto", rule=verdict.rule, by="policy")
        self.audit("applying", record)
        return record

    def park(self, record: Record, verdict: Verdict, preview: dict[str, Any]) -> Record:
        """It waits for people until its deadline; the card shows `preview`."""
        on_timeout = verdict.on_timeout
        if on_timeout == "approve" and not record.reversible:
            on_timeout = "deny"  # fail closed: this request cannot be undone
        expires = self.clock.now() + timedelta(seconds=verdict.timeout_s)
        record = self._move(
            record,
            state="pending",
            verdict=verdict.to_json(),
            preview=self.redact(preview),
            expires_at=clock.iso(expires),
            on_timeout=on_timeout,
            reason=f"waiting for {verdict.approvals} approval(s): {verdict.reason}",
        )
        self.audit(
            "pending",
            record,
            rule=verdict.rule,
            expires_at=record.expires_at,
            on_timeout=on_timeout,
        )
        return record

    def stage(self, record: Record, verdict: Verdict, preview: dict[str, Any]) -> Record:
        """Staged mode: validated, classified and previewed, and not applied; the agent
        reads the verdict that would have applied and the preview. Nobody decided it."""
        preview = self.redact(preview)
        record = self._move(
            record,
            state="staged",
            verdict=verdict.to_json(),
            preview=preview,
            output=staging.output(verdict, preview),
            reason=self.redact(staging.reason(verdict)),
            completed_at=clock.iso(self.clock.now()),
        )
        self.audit("staged", record, action=verdict.action, rule=verdict.rule, reason=record.reason)
        return record

    def replay(self, record: Record, first: Record) -> Record:
        """Same idempotency key, same payload: the first request's outcome, not a new apply."""
        record = record.evolve(replay_of=first.id)
        if first.terminal:
            record = self._move(record, **_copied(first, self.clock))
        else:
            record = self._move(record, state="received")
        self.audit("replayed", record, of=first.id, status=record.state)
        return record

    def settle_replays(self, first: Record) -> list[Record]:
        """The replays that waited for `first`, given its outcome now that it has one."""
        if not first.terminal or first.idempotency_key is None:
            return []  # only a request with a key can have replays waiting on it
        settled = []
        for replay in self.ledger.replays_of(first):
            replay = self._move(replay, **_copied(first, self.clock))
            self.audit("replayed", replay, of=first.id, status=replay.state)
            settled.append(replay)
        return settled

    # -- people and deadlines ---------------------------------------------------------

    def approve(self, record: Record, by: str, reason: str, stamp: str) -> Record:
        """Quorum met: people approved it."""
        record = self._move(
            record, state="approved", decided_by=by, decided_at=stamp, reason=reason
        )
        self.audit("decided", record, stamp, action="approve", by=by)
        return record

    def refuse(self, record: Record, by: str, reason: str, stamp: str) -> Record:
        """A person denied it; the agent reads `reason`."""
        record = self._move(
            record,
            state="denied",
            decided_by=by,
            decided_at=stamp,
            completed_at=stamp,
            reason=f"denied by {by}: {reason}",
        )
        self.audit("denied", record, stamp, by=by, reason=record.reason)
        return record

    def withdraw(self, record: Record, said: str | None) -> Record:
        """The agent withdrew it while it waited (`said`: the withdrawal's own reason)."""
        stamp = clock.iso(self.clock.now())
        reason = WITHDRAWN + (f": {said}" if said else "")
        record = self._move(
            record,
            state="denied",
            decided_by=WITHDRAWER,
            decided_at=stamp,
            completed_at=stamp,
            reason=self.redact(reason),
        )
        self.audit("denied", record, stamp, by=WITHDRAWER, withdrawn=True, reason=record.reason)
        return record

    def expire(self, record: Record) -> Record:
        """Its deadline passed: applied if on_timeout approves a reversible effect, else expired."""
        stamp = clock.iso(self.clock.now())
        waited = _human(float((record.verdict or {}).get("timeout_s", 0)))
        if record.on_timeout == "approve" and record.reversible:
            record = self._move(
                record,
                state="applying",
                decided_by=APPLIED_BY_TIMEOUT,
                decided_at=stamp,
                reason=(
                    f"applied by policy: nobody decided within {waited}, and this "
                    "reversible effect is approved when its deadline passes"
                ),
            )
            self.audit("decided", record, action="approve", by=APPLIED_BY_TIMEOUT)
            self.audit("applying", record)
            return record
        record = self._move(
            record,
            state="expired",
            decided_by=APPLIED_BY_TIMEOUT,
            decided_at=stamp,
            completed_at=stamp,
            reason=(
                f"expired: nobody decided within {waited}, so it was not applied; "
                "ask a person to review it, or send a reversible alternative"
            ),
        )
        self.audit("expired", record, reason=record.reason)
        return record

    def halt(self, record: Record, reason: str) -> Record:
        """Its effect was disabled (a kill switch) before it was applied: approved by people,
        or due to be applied at its deadline (on_timeout = "approve")."""
        stamp = clock.iso(self.clock.now())
        record = self._move(record, state="denied", completed_at=stamp, reason=reason)
        self.audit("denied", record, stamp, by="kill switch", reason=reason)
        return record

    # -- applying ---------------------------------------------------------------------

    def start(self, record: Record) -> Record:
        """Approved by people: the apply is committed before the handler is called."""
        record = self._move(record, state="applying")
        self.audit("applying", record)
        return record

    def finish(
        self,
        record: Record,
        status: State,
        reason: str | None,
        output: dict[str, Any] | None,
        issues: list[dict[str, str]],
        credential: list[dict[str, Any]] | None = None,
    ) -> Record:
        """The handler came back: applied, failed or invalid, with what it said (and the
        scopes of what was minted for it, for the audit event, failed or not)."""
        if status == "applied" and reason is None:
            reason = record.reason or "applied"
        record = self._move(
            record,
            state=status,
            reason=self.redact(reason),
            output=self.redact(output),
            errors=self.redact(issues) or None,
            completed_at=clock.iso(self.clock.now()),
        )
        # a service's error status is said in the event too: every observer tells one outcome
        self.audit(
            status,
            record,
            reason=record.reason,
            http_status=service_status(status, record.output),
            warning=service_warning(status, record.output),
            **({"credential": credential} if credential else _credential(record.output)),
        )
        return record

    def lose(self, record: Record) -> Record:
        """A restart found it mid-apply and it is not safe to repeat: a person reconciles."""
        record = self._move(
            record,
            state="unknown",
            completed_at=clock.iso(self.clock.now()),
            reason=(
                "unknown: the broker stopped while applying this effect, which is not "
                "safe to repeat; a person must check whether it happened "
                "(broker reconcile) before you retry"
            ),
        )
        self.audit("unknown", record, reason=record.reason)
        return record


def _copied(first: Record, now: Clock) -> dict[str, Any]:
    """The first request's outcome, on the replay's own clock."""
    stamp = clock.iso(now.now())
    return {
        "state": first.state,
        "reason": first.reason,
        "output": first.output,
        "errors": first.errors,
        "decided_by": first.decided_by,
        "decided_at": stamp,
        "completed_at": stamp,
    }


def _human(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


def _credential(output: dict[str, Any] | None) -> dict[str, Any]:
    """The minted credentials' scopes (broker/grants.py), for the audit event."""
    used = (output or {}).get("credential")
    return {"credential": used} if isinstance(used, list) else {}
