"""Every error the broker raises on purpose.

    BrokerError
    ├── ConfigError            broker.toml is missing, unreadable or wrong
    │   └── PolicyError        the policy file cannot be loaded; names rule and key
    ├── RegistryError          an effect cannot be registered or found
    │   ├── UnknownEffect      no handler is registered under that name
    │   └── DuplicateEffect    two handlers claim one name; names both
    ├── LedgerError            the state store refused or is inconsistent
    │   ├── RequestNotFound    no request answers to that id
    │   ├── AmbiguousRequest   the id exists in several sandboxes: use SANDBOX/ID
    │   ├── IllegalTransition  a state change the request's life does not allow
    │   ├── StoreUnavailable   the shared store (PostgreSQL) does not answer
    │   └── LeaseLost          another broker took this host's lease: stop serving
    ├── AuditError             the audit log cannot be written or read
    ├── SandboxError           the Docker engine or a container misbehaved
    ├── StateBusy              another process serves this state dir
    ├── OwnerGone              the serving broker closed its control connection
    ├── DecisionError          a decision cannot be recorded (stale sha256, not pending…)
    │   ├── NotAnApprover      this person may not decide this request (its rule's approvers)
    │   └── StepUpRequired     a fresh sign-in with the identity provider comes first
    ├── SignInError            an OIDC sign-in failed (forged, stale or replayed token)
    ├── ControlError           a kill switch, remembered rule or proposal cannot change so
    ├── NotifyError            a notification service (Slack) refused or did not answer
    └── Outcome                stop here: this is the request's answer (control flow)
        ├── Rejected           the request breaks the protocol or its schema → invalid
        ├── PolicyDenied       the policy (or a limit it enforces) said no → denied
        └── EffectFailed       the handler ran and the service refused or broke → failed
            ├── InvalidParams  the handler found params it cannot act on → invalid
            └── CredentialRefused  no narrowed credential could be minted: nothing applied

Handlers raise `EffectFailed` (or `InvalidParams`) with a reason an agent can act on,
translating their library's exceptions at their edge, `from exc`.

An `Outcome` ends a request on its way in (admission) or out (apply). What befalls a
request that waits is not one: a person's denial, an expiry or a kill switch is a
move of its recorded state (`broker.lifecycle`), taken where it is decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from broker.models import Verdict

Answer = Literal["denied", "invalid", "failed"]
"""The result status an `Outcome` gives its request."""


class BrokerError(Exception):
    """Base of every error the broker raises on purpose."""


class ConfigError(BrokerError):
    """broker.toml is missing, unreadable or wrong; the message names the key."""


class PolicyError(ConfigError):
    """The policy file cannot be loaded; the message names the rule and the key."""


class RegistryError(BrokerError):
    """An effect handler cannot be registered or found."""


class UnknownEffect(RegistryError):
    """No handler is registered under that effect name."""


class DuplicateEffect(RegistryError):
    """Two handlers claim the same effect name."""


class LedgerError(BrokerError):
    """The state store refused an operation or is inconsistent."""


class RequestNotFound(LedgerError):
    """No request answers to that id."""


class AmbiguousRequest(LedgerError):
    """The id exists in several sandboxes; name it as SANDBOX/ID."""


class IllegalTransition(LedgerError):
    """A state change the request's life (broker.lifecycle.transitions) does not allow."""


class StoreUnavailable(LedgerError):
    """The shared store (PostgreSQL) does not answer; nothing of the attempt committed."""


class LeaseLost(LedgerError):
    """Another broker holds this host's lease now; this one must stop serving."""


class AuditError(BrokerError):
    """The audit log cannot be written or read."""


class SandboxError(BrokerError):
    """The Docker engine or a sandbox container misbehaved."""


class StateBusy(BrokerError):
    """Another process serves this state dir (it holds the state lock)."""


class OwnerGone(BrokerError):
    """The broker that owns the state dir closed its control connection (stopped, died)."""


class NotifyError(BrokerError):
    """A notification service (Slack's Web API) refused a call or did not answer."""


class DecisionError(BrokerError):
    """A decision cannot be recorded (stale sha256, request not pending, …)."""


class NotAnApprover(DecisionError):
    """The decider is not among the rule's approvers, or is the agent that asked."""


class StepUpRequired(DecisionError):
    """The rule asks for a recent (or stronger) sign-in than the decider's: `max_age_s`
    is how recent, `acr` the classes the provider must report, for the way back."""

    def __init__(self, message: str, max_age_s: float, acr: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.max_age_s = max_age_s
        self.acr = tuple(acr)


class SignInError(BrokerError):
    """An OIDC sign-in cannot be accepted: the message says why, for the person."""


class ControlError(BrokerError):
    """A kill switch or a remembered rule cannot be changed as asked."""


class Issue(NamedTuple):
    """One thing wrong with a request: a JSON-pointer path, a code and a sentence (a
    named tuple, not a dataclass: `broker run`'s client imports this module, and
    dataclasses costs it ~10 ms of imports)."""

    path: str
    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "code": self.code, "message": self.message}


class Outcome(BrokerError):
    """Stop processing this request: the exception is its answer.

    `issues` are what is wrong with the request, recorded with its answer."""

    status: Answer = "failed"
    issues: tuple[Issue, ...] = ()

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Rejected(Outcome):
    """The request breaks the protocol or its schema; its result is `invalid`."""

    status: Answer = "invalid"

    def __init__(self, reason: str, issues: Sequence[Issue] = ()) -> None:
        super().__init__(reason)
        self.issues = tuple(issues)


class PolicyDenied(Outcome):
    """The policy (or a limit it enforces) said no; its result is `denied`. `rule` names
    which; `verdict` and `facts` are what the policy said and was told (for replay)."""

    status: Answer = "denied"

    def __init__(
        self,
        reason: str,
        rule: str,
        verdict: Verdict | None = None,
        facts: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(reason)
        self.rule = rule
        self.verdict = verdict
        self.facts = facts


class EffectFailed(Outcome):
    """The handler ran and the service refused or broke; its result is `failed`."""

    status: Answer = "failed"


class InvalidParams(EffectFailed):
    """The handler found params it cannot act on; its result is `invalid`."""

    status: Answer = "invalid"

    def __init__(self, path: str, message: str, code: str = "invalid_param") -> None:
        super().__init__(f"invalid: {message}")
        self.issues = (Issue(path, code, message),)


class CredentialRefused(EffectFailed):
    """The provider could not mint this apply's narrowed credential; nothing was applied
    with a broader one instead."""
