"""Remembered decisions as reviewed rules: a reviewer who approves a request may propose
the narrowest rule matching it (broker.review.drafting); it is stored as a proposal and takes
effect only when someone accepts it (`broker policy accept N`, or the inbox).

Proposals are the store's controls of kind "proposal", numbered; accepting one writes
the rule as kind "rule" (what broker.policy.controls loads into every running broker) in the
same transaction, with an audit event naming who did it. A deny rule of the policy
file still wins over an accepted rule, and protected paths stay with people
(broker.policy.ruleset). Withdrawing an accepted rule removes it; the proposal stays, as a
record of what was allowed and when.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from broker import clock
from broker.codec import dumps
from broker.errors import ControlError, PolicyError
from broker.models import Record
from broker.policy.controls import RULE
from broker.policy.history import NO_HISTORY
from broker.policy.ruleset import Policy, remembered_rule
from broker.review.drafting import DraftError, draft_rule
from broker.review.replay import recorded_verdict, replay, replay_controls
from broker.store.base import Store

__all__ = ["PROPOSAL", "accept", "impact", "listing", "propose", "reject", "withdraw"]

PROPOSAL = "proposal"
STATES = ("proposed", "accepted", "rejected", "withdrawn")


def _event(
    kind: str, number: str, by: str, value: Mapping[str, Any], **extra: Any
) -> dict[str, Any]:
    rule = value["rule"]
    return {
        "at": clock.stamp(),
        "event": kind,
        "by": by,
        "proposal": int(number),
        "effect": rule.get("effect"),
        "from": value.get("from"),
        "rule_sha256": hashlib.sha256(dumps(rule).encode("utf-8")).hexdigest(),
        **{k: v for k, v in extra.items() if v is not None},
    }


def impact(
    ledger: Store, policy: Policy, rule: Mapping[str, Any], reversible_only: bool = False
) -> dict[str, Any]:
    """What the rule would have done to the ledger's past requests of its effect: how
    many it matches, and how many of those would have applied without a person that
    did not (under the policy and the rules accepted now)."""
    controls = replay_controls(ledger)
    candidate = remembered_rule(0, dict(rule), reversible_only)
    widened = replay_controls(ledger)
    widened.remembered = (*controls.remembered, candidate)
    effect = str(rule["effect"])
    records = ledger.all()
    found = replay(policy, records, controls=widened, effect=effect, baseline=controls)
    matched = sum(1 for c in found.changes if c.unattended)
    matches = sum(
        1
        for r in records
        if r.effect == effect
        and r.state != "invalid"
        and r.replay_of is None
        and recorded_verdict(r) is not None
        and candidate.matches(effect, r.envelope.get("params") or {}, NO_HISTORY)
        and (not reversible_only or r.reversible is True)
    )
    return {
        "replayed": found.replayed,
        "matches": matches,
        "would_auto": matched,
        "at": clock.stamp(),
    }


def propose(
    ledger: Store, policy: Policy, record: Record, by: str, reversible: bool | None = None
) -> tuple[str, dict[str, Any], bool]:
    """Draft the narrowest rule for `record` and store it as a proposal: its number,
    the proposal, and whether it is new (an equal rule proposed or accepted before is
    returned as it is). DraftError when no rule narrow enough can be drafted."""
    if record.effect is None or record.payload is None:
        raise DraftError("this request never reached the policy; no rule is proposed")
    params = record.envelope.get("params") or {}
    protected = tuple((record.facts or {}).get("protected") or ())
    ref = f"{record.sandbox}/{record.id}"
    reason = f"remembered: {by} approved requests like {ref} and the rule was accepted"
    undoable = bool(record.reversible if reversible is None else reversible)
    drafted = draft_rule(record.effect, params, protected, reason=reason, reversible=undoable)
    remembered_rule(0, drafted.rule)  # what every broker will load must load
    with ledger.transaction():
        for known, earlier in ledger.controls(PROPOSAL).items():
            same = _same_rule(earlier.get("rule"), drafted.rule)
            if same and earlier.get("state") in ("proposed", "accepted"):
                return known, earlier, False
        number = ledger.next_control_key(PROPOSAL)
        value: dict[str, Any] = {
            "state": "proposed",
            "rule": drafted.rule,
            "from": ref,
            "request_sha256": record.sha256,
            "reversible": undoable,
            "notes": list(drafted.notes),
            "proposed_by": by,
            "proposed_at": clock.stamp(),
            "decided_by": None,
            "decided_at": None,
            "decision_reason": None,
            "replay": impact(ledger, policy, drafted.rule, undoable),
        }
        ledger.put_control(PROPOSAL, number, value)
        ledger.queue_audit(_event("rule_proposed", number, by, value))
    return number, value, True


def _same_rule(a: Any, b: Mapping[str, Any]) -> bool:
    if not isinstance(a, Mapping):
        return False
    return a.get("effect") == b.get("effect") and a.get("when") == b.get("when")


def _open(ledger: Store, number: str, states: tuple[str, ...], doing: str) -> dict[str, Any]:
    number = number.strip()
    value = ledger.controls(PROPOSAL).get(number)
    if value is None:
        known = sorted(ledger.controls(PROPOSAL), key=lambda k: int(k) if k.isdigit() else 0)
        listed = ", ".join(known[-10:]) or "none yet"
        raise ControlError(f"no proposal {number!r} (proposals: {listed})")
    if value.get("state") not in states:
        raise ControlError(
            f"proposal {number} is {value.get('state')}; only a "
            f"{' or '.join(states)} one can be {doing}"
        )
    return dict(value)


def accept(ledger: Store, number: str, by: str) -> dict[str, Any]:
    """Make proposal `number` a rule every broker applies from its next request on."""
    with ledger.transaction():
        value = _open(ledger, number, ("proposed",), "accepted")
        try:
            remembered_rule(int(number), value["rule"])
        except (PolicyError, ValueError) as exc:
            raise ControlError(f"proposal {number} cannot be accepted: {exc}") from exc
        stamp = clock.stamp()
        value.update(state="accepted", decided_by=by, decided_at=stamp)
        entry = {
            "rule": value["rule"],
            "from": value.get("from"),
            "proposed_by": value.get("proposed_by"),
            "accepted_by": by,
            "accepted_at": stamp,
            "reversible_only": value.get("reversible") is True,
        }
        ledger.put_control(RULE, number.strip(), entry)
        ledger.put_control(PROPOSAL, number.strip(), value)
        ledger.queue_audit(_event("rule_accepted", number, by, value))
    return value


def reject(ledger: Store, number: str, by: str, reason: str | None) -> dict[str, Any]:
    """Turn proposal `number` down: nothing takes effect."""
    with ledger.transaction():
        value = _open(ledger, number, ("proposed",), "rejected")
        value.update(
            state="rejected",
            decided_by=by,
            decided_at=clock.stamp(),
            decision_reason=reason or None,
        )
        ledger.put_control(PROPOSAL, number.strip(), value)
        ledger.queue_audit(_event("rule_rejected", number, by, value, reason=reason or None))
    return value


def withdraw(ledger: Store, number: str, by: str, reason: str | None) -> dict[str, Any]:
    """Remove an accepted rule: requests like it wait for people again."""
    with ledger.transaction():
        value = _open(ledger, number, ("accepted",), "withdrawn")
        value.update(state="withdrawn", withdrawn_by=by, withdrawn_at=clock.stamp())
        if reason:
            value["withdraw_reason"] = reason
        ledger.put_control(RULE, number.strip(), None)
        ledger.put_control(PROPOSAL, number.strip(), value)
        ledger.queue_audit(_event("rule_withdrawn", number, by, value, reason=reason or None))
    return value


def listing(ledger: Store, policy: Policy | None = None) -> list[dict[str, Any]]:
    """Every proposal by number, each with its rule and state; an open one's replay is
    brought up to date when `policy` is given."""
    found = []
    for number, value in ledger.controls(PROPOSAL).items():
        item = {"number": int(number) if number.isdigit() else number, **value}
        if policy is not None and value.get("state") == "proposed":
            try:
                item["replay"] = impact(
                    ledger, policy, value["rule"], value.get("reversible") is True
                )
            except (PolicyError, KeyError) as exc:
                item["replay"] = {"error": str(exc)}
        found.append(item)
    return sorted(found, key=lambda p: (isinstance(p["number"], str), p["number"]))
