"""What the broker would decide for one request file, computed as admission computes it:
the envelope and params schemas, the handler's canonical form and checks, its
per-request reversibility and protected paths (asking the service where the handler
does), then the gate (broker.policy.verdict: the kill switches and remembered rules in the ledger,
the sandbox's history when one is named, the policy). `broker policy explain` prints it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.config import Config
from broker.context import opened
from broker.errors import BrokerError, EffectFailed, Outcome
from broker.intake import claims as intake
from broker.intake.canonical import canonical_request
from broker.models import Record, Request, Verdict
from broker.policy.controls import LiveControls
from broker.policy.history import NO_HISTORY
from broker.policy.ruleset import Policy
from broker.policy.verdict import decide, ledger_history
from broker.registry import Registry
from broker.store.base import Store
from broker.validation import Validator


@dataclass(frozen=True)
class Explanation:
    """The broker's answer for a request: a verdict with its trace, or the outcome that
    ends it before the policy (invalid, failed), and what was assessed on the way."""

    verdict: Verdict | None
    trace: list[str] = field(default_factory=list)
    outcome: str | None = None  # "invalid: ..." when no rule is consulted
    params: dict[str, Any] = field(default_factory=dict)  # the canonical params
    reversible: bool | None = None
    protected: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.to_json() if self.verdict else None,
            "trace": self.trace,
            "outcome": self.outcome,
            "params": self.params,
            "reversible": self.reversible,
            "protected_paths": list(self.protected),
        }


def explain(
    data: bytes,
    cfg: Config,
    registry: Registry,
    policy: Policy,
    ledger: Store | None = None,
    sandbox: str | None = None,
) -> Explanation:
    """The decision for the request file's bytes `data` (with the ledger's controls, and
    `sandbox`'s history, when given); BrokerError if it is no request."""
    doc = intake.parse_json(data, cfg.limits.max_depth)
    if not isinstance(doc, dict) or not isinstance(doc.get("effect"), str):
        raise BrokerError("not a request (no 'effect')")
    effect = doc["effect"]
    if effect not in registry:
        raise BrokerError(
            f"no effect named {effect!r} is registered: the broker answers such a "
            "request `invalid` before any rule is consulted"
        )
    validator = Validator(registry.schemas())
    try:
        validator.envelope(doc)
        request = Request(
            sandbox="explain",
            id=str(doc.get("id", "explain")),
            name="explain",
            effect=effect,
            params=doc["params"],
            reason=doc.get("reason"),
            attachments={n: "" for n in doc.get("attachments") or []},
        )
        request = canonical_request(request, registry, validator, cfg)
    except Outcome as exc:
        return Explanation(None, outcome=exc.reason)
    return _assess(request, cfg, registry, policy, ledger, sandbox)


def _assess(
    request: Request,
    cfg: Config,
    registry: Registry,
    policy: Policy,
    ledger: Store | None,
    sandbox: str | None,
) -> Explanation:
    effect = registry.effect(request.effect)
    record = Record(
        sandbox=request.sandbox,
        id=request.id,
        name=request.name,
        state="received",
        received_at="",
        effect=request.effect,
        payload=request.payload.decode("utf-8"),
        sha256=request.sha256,
    )
    params = dict(request.params)
    try:
        with opened(cfg, record) as ctx:  # an assessment may mint (read-only): revoked here
            effect.check(request.params, ctx)
            reversible = effect.reversible_for(request.params, ctx)
            protected = effect.protected_for(request.params, ctx)
    except EffectFailed as exc:
        return Explanation(None, outcome=exc.reason, params=params)
    controls = None
    history = NO_HISTORY
    if ledger is not None:
        controls = LiveControls(ledger)
        controls.refresh()
        if sandbox is not None:
            history = ledger_history(ledger, sandbox, "")
    verdict, trace = decide(
        policy,
        controls,
        effect.name,
        request.params,
        reversible=reversible,
        protected=protected,
        history=history,
    )
    return Explanation(verdict, trace, None, params, reversible, protected)
