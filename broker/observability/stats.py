"""The approval-rate signal: how often the gate fires and whether it is still read.

When people approve more than 95% of at least 20 decisions for an effect, the gate
has become a formality: auto-apply that effect or narrow the agent's scope.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from broker.clock import parse_iso
from broker.models import Record

OUTCOMES = ("auto", "approved", "denied", "expired", "invalid", "failed", "staged")
RUBBER_STAMP_RATE = 0.95
RUBBER_STAMP_MIN = 20
POLICY = ("policy", "policy (on_timeout)")


def outcome(record: Record) -> str | None:
    """Which of OUTCOMES a request counts under (None while it is undecided)."""
    if record.state in ("invalid", "staged"):  # staged: nobody decided, nothing applied
        return record.state
    if record.state == "expired":
        return "expired"
    if record.state == "failed" and record.decided_by in POLICY:
        return "failed"
    if record.decided_by is None:
        return None
    if record.decided_by in POLICY:
        return "denied" if record.state == "denied" else "auto"
    return "denied" if record.state == "denied" else "approved"


def human(record: Record) -> bool:
    return record.decided_by is not None and record.decided_by not in POLICY


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarize(records: Iterable[Record], since: datetime | None = None) -> dict[str, Any]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    waits: dict[str, list[float]] = defaultdict(list)
    for record in records:
        received = parse_iso(record.received_at)
        if since and received and received < since:
            continue
        kind = outcome(record)
        effect = record.effect or "(unparsed)"
        if kind is None:
            counts[effect]["waiting"] += 1
            continue
        counts[effect][kind] += 1
        decided = parse_iso(record.decided_at)
        if human(record) and received and decided:
            waits[effect].append((decided - received).total_seconds())
    rows = {effect: _row(counts[effect], waits[effect]) for effect in sorted(counts)}
    total: Counter[str] = Counter()
    for c in counts.values():
        total.update(c)
    return {
        "effects": rows,
        "overall": _row(total, [w for ws in waits.values() for w in ws]),
    }


def _row(counts: Counter[str], waits: list[float]) -> dict[str, Any]:
    approved = counts["approved"]
    human_decisions = len(waits)
    rate = (approved / human_decisions) if human_decisions else None
    flagged = bool(
        rate is not None and human_decisions >= RUBBER_STAMP_MIN and rate > RUBBER_STAMP_RATE
    )
    return {
        "counts": {k: counts[k] for k in (*OUTCOMES, "waiting")},
        "human_decisions": human_decisions,
        "approval_rate": None if rate is None else round(rate, 4),
        "median_time_to_decision_s": _round(_percentile(sorted(waits), 50)),
        "p90_time_to_decision_s": _round(_percentile(sorted(waits), 90)),
        "rubber_stamp": flagged,
        "advice": (
            "people approve almost everything here: auto-apply this effect in the policy "
            "or narrow the agent's scope"
            if flagged
            else None
        ),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
