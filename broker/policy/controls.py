"""What people change on running brokers without a restart: the kill switch (effects
disabled by name or glob) and the remembered rules people accepted from proposals.

Both live in the store, so on a shared store they hold for the whole fleet at once.
Every change bumps the store's policy generation; a running broker reloads them when
it moves, on every Reload (a CLI nudge, a NOTIFY on PostgreSQL, the periodic rescan).
Every change is an audit event naming who made it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from broker import clock
from broker.errors import ControlError, PolicyError
from broker.policy.ruleset import Rule, remembered_rule
from broker.store.base import Store

__all__ = ["RULE", "SWITCH", "LiveControls", "Switch", "disable", "enable", "switches"]

log = logging.getLogger("broker")
SWITCH = "switch"
RULE = "rule"  # an accepted remembered rule: {"rule": {...}, "from", "accepted_by", ...}


@dataclass(frozen=True)
class Switch:
    """An effect glob that is off: its requests are denied with `reason`."""

    glob: str
    reason: str
    by: str
    at: str

    def covers(self, effect: str) -> bool:
        return fnmatchcase(effect, self.glob)

    def denial(self, effect: str) -> str:
        return (
            f"denied: {effect} is disabled by {self.by} since {self.at} ({self.reason}); "
            "do not retry it until a person enables it again"
        )

    def to_json(self) -> dict[str, str]:
        return {"glob": self.glob, "reason": self.reason, "by": self.by, "at": self.at}


def switches(ledger: Store) -> list[Switch]:
    """The effects disabled now, by glob."""
    found = [_switch(glob, value) for glob, value in ledger.controls(SWITCH).items()]
    return sorted(found, key=lambda s: s.glob)


def _switch(glob: str, value: Mapping[str, Any]) -> Switch:
    return Switch(
        glob, str(value.get("reason", "")), str(value.get("by", "")), str(value.get("at", ""))
    )


def disable(ledger: Store, glob: str, reason: str, by: str) -> Switch:
    """Turn `glob`'s effects off everywhere this store reaches; audited."""
    if not glob.strip():
        raise ControlError("name the effect (or a glob such as 'github.*') to disable")
    if not reason.strip():
        raise ControlError("a kill switch needs a reason (--reason): it goes back to agents")
    switch = Switch(glob, reason.strip(), by, clock.stamp())
    with ledger.transaction():
        ledger.put_control(SWITCH, glob, switch.to_json())
        ledger.queue_audit(_event("effect_disabled", switch.at, by, glob, reason=switch.reason))
    return switch


def enable(ledger: Store, glob: str, by: str) -> Switch:
    """Turn a disabled glob back on (exactly as it was disabled); audited."""
    with ledger.transaction():
        found = ledger.controls(SWITCH).get(glob)
        if found is None:
            off = ", ".join(s.glob for s in switches(ledger)) or "none is"
            raise ControlError(f"{glob!r} is not disabled (disabled now: {off})")
        ledger.put_control(SWITCH, glob, None)
        at = clock.stamp()
        ledger.queue_audit(_event("effect_enabled", at, by, glob))
    return _switch(glob, found)


def _event(kind: str, at: str, by: str, glob: str, **extra: str) -> dict[str, Any]:
    return {"at": at, "event": kind, "by": by, "effect": glob, **extra}


class LiveControls:
    """A running broker's view of the controls, reloaded when their generation moves."""

    def __init__(self, ledger: Store) -> None:
        self.ledger = ledger
        self.generation = -1
        self.switches: tuple[Switch, ...] = ()
        self.remembered: tuple[Rule, ...] = ()

    def refresh(self) -> bool:
        """Reload if anything changed since the last look; whether it did."""
        generation = self.ledger.policy_generation()
        if generation == self.generation:
            return False
        self.generation = generation
        self.switches = tuple(switches(self.ledger))
        self.remembered = tuple(self._rules())
        return True

    def disabled(self, effect: str) -> Switch | None:
        return next((s for s in self.switches if s.covers(effect)), None)

    def _rules(self) -> list[Rule]:
        rules = []
        for key, value in sorted(self.ledger.controls(RULE).items(), key=lambda kv: int(kv[0])):
            try:
                only = value.get("reversible_only") is True
                rules.append(remembered_rule(int(key), value.get("rule"), only))
            except (PolicyError, ValueError) as exc:  # fail closed: a broken allow allows nothing
                log.warning("remembered rule %s is ignored: %s", key, exc)
        return rules
