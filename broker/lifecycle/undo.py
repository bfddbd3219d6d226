"""Undoing an applied effect, and settling one whose fate is unknown.

`undo`: a handler that can reverse what it applied implements
`revert(output, ctx) -> dict` (and, to show what it will do first,
`revert_preview(output, ctx) -> Preview`). The reversal is recorded as a new request
of the host (sandbox `host`, effect `undo:<effect>`), in the ledger and the audit log;
the original request's result is terminal and stays as the agent read it.

`reconcile`: a request that ended `unknown` (the broker stopped mid-apply of a
non-idempotent effect) is settled by a person who checked the service: applied or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.audit.log import event as audit_event
from broker.clock import iso, now
from broker.config import Config
from broker.context import opened
from broker.errors import DecisionError, EffectFailed
from broker.models import Decision, Preview, Record, canonical_json, sha256_hex
from broker.registry import Effect, Registry
from broker.store.base import Store

HOST_SANDBOX = "host"


@dataclass(frozen=True)
class UndoPlan:
    record: Record
    effect: Effect
    preview: Preview


def plan(ledger: Store, registry: Registry, config: Config, ref: str) -> UndoPlan:
    """What undoing `ref` would do; refuses clearly when it cannot be done."""
    record = ledger.find(ref)
    where = f"{record.sandbox}/{record.id}"
    if record.state != "applied":
        raise DecisionError(f"{where} was not applied (it is {record.state}): nothing to undo")
    if record.effect not in registry:
        raise DecisionError(f"{where}: effect {record.effect} is no longer registered")
    effect = registry.effect(record.effect or "")
    if not effect.revertible:
        raise DecisionError(
            f"{where}: {record.effect} cannot be undone by the broker ({effect.undo})"
        )
    if _undone(ledger, record):
        raise DecisionError(f"{where} was already undone")
    try:
        with opened(config, record) as ctx:
            preview = effect.revert_preview(record.output or {}, ctx)
    except EffectFailed as exc:
        why = exc.reason.removeprefix("failed: ")
        raise DecisionError(f"{where}: cannot be undone: {why}") from exc
    return UndoPlan(record, effect, preview)


def _undo_id(record: Record) -> str:
    return f"undo-{record.sandbox}-{record.id}"[:64]


def _undone(ledger: Store, record: Record) -> bool:
    done = ledger.get(HOST_SANDBOX, _undo_id(record))
    return done is not None and done.state == "applied"


def execute(
    ledger: Store,
    config: Config,
    chosen: UndoPlan,
    who: str,
    *,
    surface: str = "cli",
    reason: str | None = None,
) -> Record:
    """Revert, recording the reversal as a request of the host; returns its record."""
    original = chosen.record
    stamp = iso(now())
    assert stamp is not None
    record = _undo_record(original, who, stamp)
    with ledger.transaction():
        existing = ledger.get(HOST_SANDBOX, record.id)
        record = ledger.update(existing, **_fields(record)) if existing else ledger.insert(record)
        ledger.queue_audit(
            audit_event(
                "undo_requested",
                original,
                stamp,
                by=who,
                undo=record.id,
                surface=surface,
                reason=reason,
            )
        )
    try:
        with opened(config, original) as ctx:
            output = chosen.effect.revert(original.output or {}, ctx)
        state, reason = "applied", f"undone by {who}"
    except EffectFailed as exc:
        output, state, reason = None, "failed", exc.reason
    done = iso(now())
    with ledger.transaction():
        record = ledger.update(record, state=state, output=output, reason=reason, completed_at=done)
        ledger.queue_audit(
            audit_event(
                "undone" if state == "applied" else "undo_failed",
                original,
                done or stamp,
                by=who,
                reason=reason,
                undo=record.id,
            )
        )
    return record


def _undo_record(original: Record, who: str, stamp: str) -> Record:
    """The host's request that reverts `original`: its own id, envelope and digest."""
    envelope = {
        "version": 1,
        "id": _undo_id(original),
        "effect": f"undo:{original.effect}",
        "params": {"undo_of": f"{original.sandbox}/{original.id}", "output": original.output},
    }
    payload = canonical_json(envelope)
    return Record(
        sandbox=HOST_SANDBOX,
        id=_undo_id(original),
        name=_undo_id(original),
        state="applying",
        received_at=stamp,
        effect=f"undo:{original.effect}",
        payload=payload.decode("utf-8"),
        sha256=sha256_hex(payload),
        decided_by=who,
        decided_at=stamp,
    )


def reconcile(ledger: Store, ref: str, applied: bool, who: str, reason: str | None) -> Record:
    """Record what a person found for an `unknown` request; its result stays as read."""
    with ledger.transaction():
        record = ledger.find(ref)
        where = f"{record.sandbox}/{record.id}"
        if record.state != "unknown":
            raise DecisionError(f"{where} is {record.state}, not unknown: nothing to reconcile")
        previous = [d for d in ledger.decisions(*record.key) if d.verdict.startswith("reconciled")]
        if previous:
            raise DecisionError(f"{where} was already reconciled by {previous[0].approver}")
        stamp = iso(now())
        assert stamp is not None
        verdict = "reconciled:applied" if applied else "reconciled:not-applied"
        ledger.add_decision(
            Decision(
                record.sandbox, record.id, who, verdict, reason, "cli", record.sha256 or "", stamp
            )
        )
        ledger.queue_audit(
            audit_event("reconciled", record, stamp, by=who, applied=applied, reason=reason)
        )
    return record


def _fields(record: Record) -> dict[str, Any]:
    return {
        "state": record.state,
        "payload": record.payload,
        "sha256": record.sha256,
        "decided_by": record.decided_by,
        "decided_at": record.decided_at,
        "received_at": record.received_at,
        "output": None,
        "reason": None,
        "completed_at": None,
    }
