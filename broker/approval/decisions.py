"""Decisions by people: approve or deny a pending request, with quorum.

A decision (a `Ballot`) names who decided, through which surface, the verdict, the
reason, and the sha256 of the request the decider saw; one for any other sha256 is
refused. `decide` answers with the request's `Tally`: settled or not, approvals so far.
Decisions are written to the ledger by whichever host-side surface took them (CLI,
terminal prompt, web); the serving broker is nudged and applies what was approved.
The sandbox has no way in: nothing here reads the outbox.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker import clock
from broker.approval.eligibility import Eligibility
from broker.approval.timeline import durations, timeline
from broker.audit.checkpoints import audit_log
from broker.audit.log import event as audit_event
from broker.audit.log import flush
from broker.clock import REAL, Clock, iso, parse_iso
from broker.config import Config
from broker.errors import BrokerError, DecisionError
from broker.grants import held
from broker.identity import Proof, approver_name, same_person
from broker.lifecycle.transitions import Lifecycle
from broker.models import Decision, Record
from broker.outcomes import links, service_warning
from broker.policy.ruleset import batch_allowed, slack_buttons
from broker.registry import Registry
from broker.store.base import Store

VERDICTS = ("approve", "deny")
log = logging.getLogger("broker.approval.decisions")


@dataclass(frozen=True)
class Ballot:
    """One person's verdict on one pending request, as a surface took it.

    `sha256` is what the decider saw (a prefix of at least 12 hex digits is accepted
    from a terminal); None means "the request as recorded", for surfaces that show it.
    """

    ref: str  # ID or SANDBOX/ID
    verdict: str  # approve | deny
    approver: str
    reason: str | None
    surface: str  # cli | prompt | web | slack | api | autogen …
    sha256: str | None
    proof: Proof | None = None  # an OIDC sign-in: issuer, subject, groups, auth_time


@dataclass(frozen=True)
class Tally:
    """What a ballot did: the request as it now stands, and whether it is settled."""

    record: Record
    settled: bool
    approvals: int
    needed: int


def needed(record: Record) -> int:
    return int((record.verdict or {}).get("approvals", 1))


def approvers(ledger: Store, record: Record) -> list[str]:
    return [d.approver for d in ledger.decisions(*record.key) if d.verdict == "approve"]


def decide(
    ledger: Store, ballot: Ballot, now: Clock = REAL, rules: Eligibility | None = None
) -> Tally:
    """Record one person's verdict on a pending request; settle it when quorum is met.

    `ballot.sha256` is what the decider saw (a prefix of at least 12 hex digits is
    accepted from a terminal); None means "the request as recorded", for surfaces that
    show it. `now` is the clock its deadline is judged on (a test's FakeClock).
    `rules` says who may decide (broker.approval.eligibility; none: the rule's terms
    with nobody mapped and no default step-up).
    """
    verdict, reason = ballot.verdict, ballot.reason
    if verdict not in VERDICTS:
        raise DecisionError(f"verdict must be approve or deny, not {verdict!r}")
    if verdict == "deny" and not (reason and reason.strip()):
        raise DecisionError("a denial needs a reason: it goes back to the agent")
    if not ballot.approver.strip():
        raise DecisionError("a decision needs the name of the person who took it")
    approver = approver_name(ballot.approver)  # `Alice` and "alice " are one person to a quorum
    with ledger.transaction():
        record = ledger.find(ballot.ref)
        _check_decidable(record, ballot.sha256, now)
        (rules or Eligibility()).check(record, approver, ballot.surface, ballot.proof, now)
        previous = ledger.decisions(*record.key)
        if any(same_person(d.approver, approver) for d in previous):
            raise DecisionError(
                f"{approver} has already decided on {record.sandbox}/{record.id}; "
                "a quorum needs different people"
            )
        stamp = iso(now.now())
        assert stamp is not None
        decision = _record(ledger, record, ballot, approver, stamp)
        return _settle(ledger, record, [*previous, decision], stamp)


def _record(ledger: Store, record: Record, ballot: Ballot, approver: str, stamp: str) -> Decision:
    """The decision as the ledger keeps it, bound to the digest recorded, and its audit
    event (with the decider's proof of identity, when a surface gave one)."""
    decision = Decision(
        record.sandbox,
        record.id,
        approver,
        ballot.verdict,
        ballot.reason,
        ballot.surface,
        record.sha256 or "",
        stamp,
    )
    ledger.add_decision(decision)
    ledger.queue_audit(
        audit_event(
            "decision",
            record,
            stamp,
            by=approver,
            verdict=ballot.verdict,
            reason=ballot.reason,
            surface=ballot.surface,
            **({"identity": ballot.proof.audit()} if ballot.proof else {}),
        )
    )
    return decision


def _check_decidable(record: Record, sha256: str | None, now: Clock) -> None:
    """Refuse a decision on a request that is not waiting, past its deadline, or other
    bytes than the decider saw."""
    where = f"{record.sandbox}/{record.id}"
    if record.state != "pending":
        raise DecisionError(f"{where} is not waiting for a decision (it is {record.state})")
    deadline = parse_iso(record.expires_at)
    if deadline is not None and deadline <= now.now():
        raise DecisionError(
            f"{where}: its deadline passed at {record.expires_at}; "
            f"it resolves by its on_timeout ({record.on_timeout})"
        )
    if sha256 is not None and not _same_sha(sha256, record.sha256 or ""):
        raise DecisionError(
            f"{where}: the decision is for request {sha256[:12]}…, "
            f"but the request is {str(record.sha256)[:12]}…; look at it again"
        )


def _settle(ledger: Store, record: Record, decisions: list[Decision], stamp: str) -> Tally:
    """A denial settles it; approvals settle it once there are enough of them."""
    last = decisions[-1]
    need = needed(record)
    approvals = [d for d in decisions if d.verdict == "approve"]
    life = Lifecycle(ledger)
    if last.verdict == "deny":
        record = life.refuse(record, last.approver, str(last.reason), stamp)
        return Tally(record, True, len(approvals), need)
    if len(approvals) < need:
        return Tally(record, False, len(approvals), need)
    said = "; ".join(f"{d.approver}: {d.reason}" if d.reason else d.approver for d in approvals)
    by = ", ".join(d.approver for d in approvals)
    record = life.approve(record, by, f"approved by {said}", stamp)
    return Tally(record, True, len(approvals), need)


def decide_and_wake(config: Config, ledger: Store, ballot: Ballot) -> Tally:
    """What every surface does: `decide`, append its audit events, wake the broker."""
    tally = decide(ledger, ballot, rules=Eligibility.of(config))
    wake(config, ledger, f"decision on {ballot.ref}")
    return tally


def wake(config: Config, ledger: Store, what: str) -> None:
    """After a surface committed a change: append its audit lines, wake the broker."""
    try:
        flush(ledger, audit_log(config))
    except (BrokerError, OSError):
        # the change is committed; the serving broker appends its audit lines
        log.warning("%s recorded; audit flush left to the broker", what)
    nudge(config.state_dir)


def _same_sha(seen: str, actual: str) -> bool:
    seen = seen.strip().lower()
    return len(seen) >= 12 and actual.startswith(seen)


def nudge(state_dir: Path) -> None:
    """Wake a serving broker: it reloads decisions from the ledger."""
    control = state_dir / "control"
    try:
        control.mkdir(parents=True, exist_ok=True)
        fd = os.open(control / "nudge", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
    except OSError:
        pass  # the broker's periodic reload picks the decision up anyway


def card(ledger: Store, record: Record, registry: Registry | None = None) -> dict[str, Any]:
    """Everything a person needs to decide, from the ledger: the same for CLI and web."""
    verdict = record.verdict or {}
    preview = record.preview or {}
    effect = record.effect or ""
    handler = registry.get(effect) if registry and effect in registry else None
    expires = parse_iso(record.expires_at)
    left = (expires - clock.now()).total_seconds() if expires else None
    decisions = ledger.decisions(*record.key)
    return {
        "sandbox": record.sandbox,
        "id": record.id,
        "ref": f"{record.sandbox}/{record.id}",
        "effect": record.effect,
        "status": record.state,
        "request_sha256": record.sha256,
        "received_at": record.received_at,
        "what": {
            "title": preview.get("title", ""),
            "body": preview.get("body", ""),
            "body_kind": preview.get("body_kind", "text"),
            "facts": preview.get("facts", []),
        },
        "where": preview.get("target", record.effect),
        "why": {"rule": verdict.get("rule"), "reason": verdict.get("reason")},
        "if_nobody_answers": {
            "expires_at": record.expires_at,
            "seconds_left": None if left is None else max(0.0, round(left, 1)),
            "on_timeout": record.on_timeout,
        },
        "agent_reason": record.envelope.get("reason"),
        "reversible": record.reversible,
        "idempotent": handler.idempotent if handler else None,
        "undo": handler.undo if handler else None,
        "approvals": {"have": approvers(ledger, record), "needed": needed(record)},
        "batch": batch_allowed(verdict),
        "slack_buttons": slack_buttons(verdict, record.reversible),
        "decided_by": record.decided_by,
        "reason": record.reason,
        "decisions": [_decision_row(d) for d in decisions],
        **_outcome(record, decisions),
    }


def _decision_row(d: Decision) -> dict[str, Any]:
    """One person's decision as a card lists it (with the digest they decided on)."""
    return {
        "approver": d.approver,
        "verdict": d.verdict,
        "reason": d.reason,
        "surface": d.surface,
        "at": d.at,
        "sha256": d.sha256,
    }


def _outcome(record: Record, decisions: list[Decision]) -> dict[str, Any]:
    """What came back and when, the same on every surface (broker.outcomes)."""
    return {
        "decided_at": record.decided_at,
        "completed_at": record.completed_at,
        "output": record.output,
        "credential": held(record.output),  # what the apply held (broker/grants.py)
        "warning": service_warning(record.state, record.output),
        "links": [{"key": k, "url": u} for k, u in links(record.output)],
        "durations": durations(record),
        "timeline": timeline(record, decisions),
    }
