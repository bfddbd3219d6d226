"""A request's life as a person reads it on a decided card: received → pending → each
decision → decided → applying → the outcome, with who and when, and how long each took.

Pure over the record and its decisions; the ledger stores no time for the start of an
apply, so `applying` carries none (its duration runs from the decision to the outcome).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from broker.clock import iso, parse_iso
from broker.models import Decision, Record

APPLIED = frozenset({"applied", "failed", "unknown"})


def _step(
    step: str, at: str | None, by: str | None = None, note: str | None = None
) -> dict[str, Any]:
    return {"step": step, "at": at, "by": by, "note": note}


def waited_from(record: Record) -> str | None:
    """When it began waiting for people: its deadline minus its rule's timeout."""
    verdict = record.verdict or {}
    expires = parse_iso(record.expires_at)
    if verdict.get("action") != "approve" or expires is None:
        return None
    return iso(expires - timedelta(seconds=float(verdict.get("timeout_s", 0))))


def seconds_between(start: str | None, end: str | None) -> float | None:
    begun, ended = parse_iso(start), parse_iso(end)
    if begun is None or ended is None:
        return None
    return round(max(0.0, (ended - begun).total_seconds()), 3)


def timeline(record: Record, decisions: Sequence[Decision]) -> list[dict[str, Any]]:
    """The steps this request went through, oldest first."""
    steps = [_step("received", record.received_at, record.sandbox)]
    began = waited_from(record)
    if began is not None:
        steps.append(_step("pending", began, None, f"until {record.expires_at}"))
    for d in decisions:
        steps.append(_step(d.verdict, d.at, d.approver, f"via {d.surface}"))
    if record.decided_at is not None:
        steps.append(_step("decided", record.decided_at, record.decided_by))
    if record.state in APPLIED and record.decided_at is not None:
        steps.append(_step("applying", None, "the broker"))
    if record.terminal:
        steps.append(_step(record.state, record.completed_at or record.decided_at))
    return steps


def durations(record: Record) -> dict[str, float | None]:
    """Seconds it waited for people, took to apply, and took in all."""
    began = waited_from(record)
    applied = record.state in APPLIED
    return {
        "waited_s": seconds_between(began, record.decided_at) if began else None,
        "apply_s": seconds_between(record.decided_at, record.completed_at) if applied else None,
        "total_s": seconds_between(record.received_at, record.completed_at),
    }
