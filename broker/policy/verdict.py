"""The one place a request's verdict is computed: the kill switch, then the policy (its
rules, the remembered rules people accepted, the sandbox's quotas and history,
protected paths). Admission, `broker policy explain` and `broker policy replay` all ask
here, so what they say is what the broker does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from broker.clock import REAL, Clock
from broker.models import Record, Verdict
from broker.policy.controls import LiveControls
from broker.policy.history import NO_HISTORY, History, past_of
from broker.policy.ruleset import Policy
from broker.store.base import Store

__all__ = ["decide", "ledger_history"]


def decide(
    policy: Policy,
    controls: LiveControls | None,
    effect: str,
    params: Mapping[str, Any],
    *,
    reversible: bool,
    protected: Sequence[str] = (),
    history: History = NO_HISTORY,
) -> tuple[Verdict, list[str]]:
    """The verdict for one request and a line per step that led to it."""
    if controls is not None:
        switch = controls.disabled(effect)
        if switch is not None:
            line = f"kill switch ({switch.glob}): {effect} is disabled by {switch.by}"
            return Verdict("deny", f"disabled:{switch.glob}", switch.denial(effect)), [line]
        if controls.remembered:
            policy = policy.with_remembered(controls.remembered)
    return policy.explain(effect, params, reversible, protected, history)


def ledger_history(
    ledger: Store,
    sandbox: str,
    exclude_id: str,
    unwritten: Sequence[Record] = (),
    clock: Clock = REAL,
) -> History:
    """The sandbox's earlier requests as the ledger holds them now (read on first use),
    with those of the same wake-up whose rows are written later (`unwritten`: inline
    applies), so a burst in one wake-up counts toward a quota like a trickle."""

    def load() -> list[Any]:
        stored = [r for r in ledger.history(sandbox) if r.id != exclude_id]
        known = {r.id for r in stored}
        later = [r for r in unwritten if r.sandbox == sandbox and r.id not in known]
        return past_of([*stored, *later])

    return History(load, clock.time())  # rate windows end now, on `clock`
