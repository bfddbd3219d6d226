"""Policy replay: every past request in the ledger classified again by another policy,
and what would change (`broker policy replay`, the inbox's "what would change").

Each request is classified with what the broker classified it with at the time: its
recorded canonical params, its recorded reversibility and the facts recorded with its
verdict (the protected paths it touched), and the sandbox's earlier requests; no live
service is asked. Its old verdict is the one recorded. Requests that never reached the
policy (invalid ones, replays of an earlier request, ones not classified yet) are
skipped and counted. The risky direction, a request that would now apply without a
person, is listed first.
"""

from __future__ import annotations

import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from broker.clock import iso, parse_iso
from broker.errors import PolicyError
from broker.models import Record, Verdict
from broker.policy.controls import LiveControls
from broker.policy.history import History, Past, past_of
from broker.policy.ruleset import Policy, parse_policy
from broker.policy.verdict import decide
from broker.registry import Registry
from broker.review.drafting import target_of
from broker.store.base import Store

__all__ = ["LOOSENED_EXIT", "Change", "Report", "policy_from_text", "replay"]

LOOSENED_EXIT = 3
"""`broker policy replay` exits with this when the policy would loosen any verdict."""
STRICTNESS = {"auto": 0, "approve": 1, "deny": 2}
MAX_POLICY_TEXT = 60_000


@dataclass(frozen=True)
class Change:
    """One past request whose verdict would change."""

    record: Record
    old: dict[str, Any]  # the recorded verdict: action, rule, approvals, on_timeout
    new: Verdict

    @property
    def arrow(self) -> str:
        return f"{self.old['action']}→{self.new.action}"

    @property
    def unattended(self) -> bool:
        """Would now apply without a person (the risky direction)."""
        return self.new.action == "auto" and self.old["action"] != "auto"

    @property
    def was(self) -> str:
        """What happened to it then: `denied by bob`, `applied (auto)`, `expired`."""
        r = self.record
        if r.decided_by and r.decided_by != "policy":
            by = "approved" if r.state in ("applied", "failed", "unknown") else r.state
            head = f"{by} by {r.decided_by}"
            return head if by == r.state else f"{head}, then {r.state}"
        return f"{r.state} (by the policy)" if r.decided_by == "policy" else r.state

    @property
    def people_denied(self) -> bool:
        """A person said no to it then (neither the policy nor a deadline did)."""
        r = self.record
        return r.state == "denied" and r.decided_by not in (None, "policy")

    @property
    def loosened(self) -> bool:
        old, new = STRICTNESS[self.old["action"]], STRICTNESS[self.new.action]
        if new != old:
            return new < old
        return _looser_terms(self.old, self.new)

    def to_json(self) -> dict[str, Any]:
        r = self.record
        params = r.envelope.get("params") or {}
        return {
            "ref": f"{r.sandbox}/{r.id}",
            "sandbox": r.sandbox,
            "id": r.id,
            "effect": r.effect,
            "received_at": r.received_at,
            "target": target_of(r.effect or "", params),
            "change": self.arrow,
            "direction": "loosened" if self.loosened else "tightened",
            "unattended": self.unattended,
            "was": self.was,
            "people_denied": self.people_denied,
            "old": {k: self.old.get(k) for k in ("action", "rule", "approvals", "on_timeout")},
            "new": {
                "action": self.new.action,
                "rule": self.new.rule,
                "reason": self.new.reason,
                "approvals": self.new.approvals if self.new.action == "approve" else None,
                "on_timeout": self.new.on_timeout if self.new.action == "approve" else None,
            },
        }


def _looser_terms(old: Mapping[str, Any], new: Verdict) -> bool:
    """Both wait for people: fewer approvals, or applied when nobody answers."""
    if new.action != "approve":
        return False
    fewer = new.approvals < int(old.get("approvals", 1))
    return fewer or (new.on_timeout == "approve" and old.get("on_timeout") != "approve")


def _stricter_terms(old: Mapping[str, Any], new: Verdict) -> bool:
    if new.action != "approve":
        return False
    more = new.approvals > int(old.get("approvals", 1))
    return more or (new.on_timeout != "approve" and old.get("on_timeout") == "approve")


@dataclass
class Report:
    """What replaying `policy` over the ledger found."""

    policy: str
    since: str | None
    sandbox: str | None
    replayed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    without_facts: int = 0
    changes: list[Change] = field(default_factory=list)
    by_effect: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    people_before: int = 0
    people_after: int = 0

    @property
    def loosened(self) -> list[Change]:
        """Loosened changes: first those that would apply what a person denied, then
        those that would apply without a person, then the rest."""
        found = [c for c in self.changes if c.loosened]
        return sorted(
            found, key=lambda c: (not (c.unattended and c.people_denied), not c.unattended)
        )

    @property
    def overruled(self) -> list[Change]:
        """Requests people denied that this policy would apply without anyone."""
        return [c for c in self.changes if c.unattended and c.people_denied]

    @property
    def tightened(self) -> list[Change]:
        return [c for c in self.changes if not c.loosened]

    @property
    def exit_code(self) -> int:
        return LOOSENED_EXIT if self.loosened else 0

    @property
    def warning(self) -> str | None:
        """The loudest line of the report, when people's denials would be overruled."""
        n = len(self.overruled)
        if not n:
            return None
        return f"would auto-apply {n} request{'s' if n != 1 else ''} people denied"

    def rate(self, people: int) -> float | None:
        return round(people / self.replayed, 4) if self.replayed else None

    def to_json(self) -> dict[str, Any]:
        loose = self.loosened
        return {
            "warning": self.warning,
            "policy": self.policy,
            "since": self.since,
            "sandbox": self.sandbox,
            "replayed": self.replayed,
            "unchanged": self.replayed - len(self.changes),
            "changed": len(self.changes),
            "skipped": dict(sorted(self.skipped.items())),
            "without_facts": self.without_facts,
            "loosened": len(loose),
            "unattended": sum(1 for c in loose if c.unattended),
            "would_auto_apply_denied": len(self.overruled),
            "tightened": len(self.tightened),
            "by_effect": {
                effect: dict(sorted(counts.items()))
                for effect, counts in sorted(self.by_effect.items())
            },
            "approval_rate": {
                "before": self.rate(self.people_before),
                "after": self.rate(self.people_after),
                "before_count": self.people_before,
                "after_count": self.people_after,
            },
            "exit_code": self.exit_code,
            "changes": [c.to_json() for c in [*loose, *self.tightened]],
        }


def policy_from_text(text: str, registry: Registry, source: str = "the pasted policy") -> Policy:
    """A policy from TOML text, checked as strictly as `broker serve` checks its file."""
    if len(text) > MAX_POLICY_TEXT:
        raise PolicyError(f"{source}: longer than {MAX_POLICY_TEXT} characters")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from exc
    return parse_policy(data, registry.reversibility(), source, registry.schemas())


def recorded_verdict(record: Record) -> dict[str, Any] | None:
    """What the policy said when the request came in, or None if it never said."""
    if record.verdict and record.verdict.get("action") in STRICTNESS:
        return record.verdict
    if record.state == "denied" and record.decided_by == "policy":  # a ledger before facts
        reason = record.reason or ""
        rule = reason.partition("(")[2].partition(")")[0] if "(" in reason else "?"
        return {"action": "deny", "rule": rule or "?"}
    return None


def _skip(record: Record) -> str | None:
    if record.state == "invalid":
        return "invalid"
    if record.replay_of is not None:
        return "replays of an earlier request"
    old = recorded_verdict(record)
    if record.effect is None or old is None:
        return "not classified by the policy"
    if str(old.get("rule", "")).startswith("disabled:"):
        return "denied by a kill switch, not by the policy"
    return None


def classify(
    policy: Policy, controls: LiveControls | None, record: Record, history: History
) -> tuple[Verdict, list[str]]:
    """One recorded request classified again as admission classifies it (broker.policy.verdict)."""
    params = record.envelope.get("params") or {}
    protected = tuple((record.facts or {}).get("protected") or ())
    return decide(
        policy,
        controls,
        record.effect or "",
        params,
        reversible=bool(record.reversible),
        protected=protected,
        history=history,
    )


def replay_controls(ledger: Store) -> LiveControls:
    """The controls a replay classifies with: the remembered rules people accepted, and
    no kill switch (an emergency stop, not policy)."""
    controls = LiveControls(ledger)
    controls.refresh()
    controls.switches = ()
    return controls


def replay(
    policy: Policy,
    records: Iterable[Record],
    *,
    controls: LiveControls | None = None,
    since: datetime | None = None,
    sandbox: str | None = None,
    effect: str | None = None,
    baseline: LiveControls | None = None,
) -> Report:
    """Classify every request of `records` (the ledger) received since `since` in
    `sandbox` (None: any), of `effect` (None: any), again by `policy`, and report what
    changes from its recorded verdict (or, with `baseline`, from its verdict under
    `policy` with those controls instead). A request's history is the sandbox's
    earlier requests (as `Store.history` lists them), read only by rules that need it."""
    report = Report(policy.source, iso(since), sandbox)
    earlier: dict[str, list[Past]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r.seq or 0):
        before = earlier[record.sandbox]
        count = len(before)
        if record.state != "invalid" and record.replay_of is None:
            before.extend(past_of([record]))
        if (sandbox is not None and record.sandbox != sandbox) or (
            effect is not None and record.effect != effect
        ):
            continue
        received = parse_iso(record.received_at)
        if since is not None and (received is None or received < since):
            continue
        why = _skip(record)
        if why is not None:
            report.skipped[why] += 1
            continue
        old = recorded_verdict(record)
        assert old is not None
        now = received.timestamp() if received else 0.0
        history = History(lambda b=before, n=count: b[:n], now)  # type: ignore[misc]
        new, _ = classify(policy, controls, record, history)
        if baseline is not None:
            old = classify(policy, baseline, record, history)[0].to_json()
        _count(report, record, old, new)
    return report


def _count(report: Report, record: Record, old: dict[str, Any], new: Verdict) -> None:
    report.replayed += 1
    report.without_facts += record.facts is None
    report.people_before += old["action"] == "approve"
    report.people_after += new.action == "approve"
    effect = record.effect or "?"
    arrow = f"{old['action']}→{new.action}"
    same = old["action"] == new.action
    if same and not (_looser_terms(old, new) or _stricter_terms(old, new)):
        report.by_effect[effect]["unchanged"] += 1
        return
    report.by_effect[effect][arrow if not same else f"{arrow} (terms)"] += 1
    report.changes.append(Change(record, old, new))
