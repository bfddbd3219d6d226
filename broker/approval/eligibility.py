"""Whether this person may decide this request, now: never the agent that asked; one of
the rule's `approvers` (a name, or a member of a group as their ID token says at this
moment); and signed in recently enough when the rule (or, for an irreversible request,
[web.oidc] step_up_irreversible) asks for a step-up.

Groups and sign-in times come only from the decision's `Proof` (an OIDC sign-in whose
session ends with its token): a bearer token, a Slack click or the CLI carries none,
so they count by name only. The host's own terminal (`cli`, `prompt`) is not asked for
a step-up: the OS account signed in to the host, which is the broker's own trust root.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.clock import REAL, Clock, parse_duration
from broker.config import Config
from broker.errors import ConfigError, NotAnApprover, StepUpRequired
from broker.identity import Proof
from broker.models import Record
from broker.people import People
from broker.policy.deciders import GROUP, StepUp

__all__ = ["HOST_SURFACES", "Eligibility"]

HOST_SURFACES = frozenset({"cli", "prompt"})


@dataclass(frozen=True)
class Eligibility:
    """What broker.toml says about deciders: who is whom, the irreversible default."""

    people: People = field(default_factory=People)
    irreversible: StepUp | None = None

    @classmethod
    def of(cls, config: Config) -> Eligibility:
        oidc = config.web.get("oidc")
        default = None
        if isinstance(oidc, Mapping):
            default = _irreversible(oidc.get("step_up_irreversible", "15m"))
        return cls(People.of(config.approvers), default)

    def check(
        self, record: Record, person: str, surface: str, proof: Proof | None, now: Clock = REAL
    ) -> None:
        """Raise NotAnApprover or StepUpRequired, naming why, unless `person` may decide."""
        where = f"{record.sandbox}/{record.id}"
        if self.people.acts_for(person, record.sandbox):
            raise NotAnApprover(
                f"{person} is the agent that asked for {where} (acts_for); "
                "it can never decide its own requests"
            )
        if proof is not None and now.now().timestamp() >= proof.expires:
            raise StepUpRequired(f"the sign-in for {where} has expired; sign in again", 0.0)
        verdict = record.verdict or {}
        allowed = tuple(verdict.get("approvers", ()))
        if allowed and not _among(person, proof, allowed):
            raise NotAnApprover(
                f"{person} is not among the approvers of {where} "
                f"({', '.join(allowed)}, as {verdict.get('rule', 'its rule')} says)"
            )
        terms = self.step_up_for(record)
        if terms is not None and surface not in HOST_SURFACES:
            _fresh(where, terms, proof, now)

    def step_up_for(self, record: Record) -> StepUp | None:
        """The rule's step-up, else the default for a request not known reversible."""
        terms = (record.verdict or {}).get("step_up")
        if isinstance(terms, Mapping):
            return StepUp.from_json(terms)
        return self.irreversible if record.reversible is not True else None


def _among(person: str, proof: Proof | None, allowed: tuple[str, ...]) -> bool:
    groups = proof.groups if proof is not None else frozenset()
    for entry in allowed:
        if entry.startswith(GROUP):
            if entry[len(GROUP) :] in groups:
                return True
        elif entry == person:
            return True
    return False


def _fresh(where: str, terms: StepUp, proof: Proof | None, now: Clock) -> None:
    need = f"{where} needs a sign-in with the identity provider within {terms.max_age_s:g} s"
    if proof is None:
        raise StepUpRequired(f"{need}; a token or a chat click cannot show one", terms.max_age_s)
    if proof.auth_time is None or now.now().timestamp() - proof.auth_time > terms.max_age_s:
        raise StepUpRequired(f"{need}; yours is older", terms.max_age_s, terms.acr)
    if terms.acr and proof.acr not in terms.acr:
        raise StepUpRequired(
            f"{where} needs a sign-in of class {' or '.join(terms.acr)}; "
            f"the provider reported {proof.acr or 'none'}",
            terms.max_age_s,
            terms.acr,
        )
    missing = [m for m in terms.amr if m not in proof.amr]
    if missing:
        raise StepUpRequired(
            f"{where} needs a sign-in with {', '.join(terms.amr)}; "
            f"the provider reported {', '.join(proof.amr) or 'no method'}",
            terms.max_age_s,
            terms.acr,
        )


def _irreversible(value: Any) -> StepUp | None:
    if value is False:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ConfigError(f"web.oidc.step_up_irreversible: {exc} (or false)") from exc
    return StepUp(seconds)
