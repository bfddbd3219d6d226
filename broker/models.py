"""The records that travel along the data path, frozen, with explicit JSON forms."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Literal

from broker import codec

__all__ = [
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSIONS",
    "STATUSES",
    "TERMINAL",
    "Decision",
    "Preview",
    "Record",
    "Request",
    "Result",
    "State",
    "Verdict",
    "canonical_json",
    "sha256_hex",
]

PROTOCOL_VERSION = 2
"""The newest outbox protocol this broker speaks: version 2 adds withdrawals
(`<id>.withdraw`, broker.intake.withdrawals); requests and results are unchanged."""
PROTOCOL_VERSIONS = (1, 2)
"""The versions a request may carry; its result answers in the version it was asked in."""
State = Literal[
    "received",  # recorded; being assessed or previewed, or a replay waiting for its first
    "pending",  # waiting for people (result file: pending)
    "approved",  # people said yes; the broker is about to apply it
    "applying",  # committed before the handler is called
    "applied",
    "denied",
    "expired",
    "invalid",
    "failed",
    "unknown",
    "staged",  # staged mode: validated, classified and previewed; nothing applied
]
"""A request's state in the ledger; `broker.lifecycle.transitions` holds the legal moves."""
TERMINAL: frozenset[State] = frozenset(
    {"applied", "denied", "expired", "invalid", "failed", "unknown", "staged"}
)
STATUSES: frozenset[State] = TERMINAL | {"pending"}


# built once, not per call as json.dumps does: a request's path takes this form ~9 times
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> bytes:
    """The one byte form that hashes and approvals are bound to."""
    return _CANONICAL.encode(value).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Request:
    """A request that passed the envelope check, as recorded in the ledger."""

    sandbox: str
    id: str
    name: str
    effect: str
    params: dict[str, Any]
    reason: str | None = None
    idempotency_key: str | None = None
    attachments: dict[str, str] = field(default_factory=dict)  # name -> sha256
    version: int = 1  # as the agent wrote it: the sha256 covers it

    @property
    def integration(self) -> str:
        return self.effect.split(".", 1)[0]

    def envelope(self) -> dict[str, Any]:
        """The canonical envelope: what the sha256 (and so an approval) covers."""
        env: dict[str, Any] = {
            "version": self.version,
            "id": self.id,
            "effect": self.effect,
            "params": self.params,
        }
        if self.reason is not None:
            env["reason"] = self.reason
        if self.idempotency_key is not None:
            env["idempotency_key"] = self.idempotency_key
        if self.attachments:
            env["attachments"] = dict(sorted(self.attachments.items()))
        return env

    @cached_property
    def payload(self) -> bytes:
        return canonical_json(self.envelope())

    @cached_property
    def sha256(self) -> str:
        return sha256_hex(self.payload)

    def to_json(self) -> dict[str, Any]:
        return {"sandbox": self.sandbox, "name": self.name, **self.envelope()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Request:
        return cls(
            sandbox=data["sandbox"],
            id=data["id"],
            name=data["name"],
            effect=data["effect"],
            params=data["params"],
            reason=data.get("reason"),
            idempotency_key=data.get("idempotency_key"),
            attachments=dict(data.get("attachments") or {}),
            version=int(data.get("version", 1)),
        )


@dataclass(frozen=True)
class Result:
    """What the agent reads in /results/<id>.json; PROTOCOL.md field for field."""

    id: str
    status: str
    effect: str | None = None
    reason: str | None = None
    output: dict[str, Any] | None = None
    errors: tuple[dict[str, str], ...] = ()
    request_sha256: str | None = None
    decided_by: str | None = None
    received_at: str | None = None
    decided_at: str | None = None
    completed_at: str | None = None
    expires_at: str | None = None
    on_timeout: str | None = None
    replayed: bool = False
    version: int = 1  # the request's: an agent reads the version it wrote
    approvals: tuple[int, int] | None = None  # pending, version 2: (given so far, needed)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": self.version,
            "id": self.id,
            "effect": self.effect,
            "status": self.status,
            "reason": self.reason,
            "output": self.output,
            "errors": list(self.errors),
            "request_sha256": self.request_sha256,
            "decided_by": self.decided_by,
            "received_at": self.received_at,
            "decided_at": self.decided_at,
            "completed_at": self.completed_at,
        }
        if self.status == "pending":
            data["expires_at"] = self.expires_at
            data["on_timeout"] = self.on_timeout
            if self.approvals is not None and self.version >= 2:
                data["approvals"] = {"given": self.approvals[0], "needed": self.approvals[1]}
        if self.replayed:
            data["replayed"] = True
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(
            id=data["id"],
            status=data["status"],
            effect=data.get("effect"),
            reason=data.get("reason"),
            output=data.get("output"),
            errors=tuple(data.get("errors") or ()),
            request_sha256=data.get("request_sha256"),
            decided_by=data.get("decided_by"),
            received_at=data.get("received_at"),
            decided_at=data.get("decided_at"),
            completed_at=data.get("completed_at"),
            expires_at=data.get("expires_at"),
            on_timeout=data.get("on_timeout"),
            replayed=bool(data.get("replayed", False)),
            version=int(data.get("version", 1)),
            approvals=_counts(data.get("approvals")),
        )


def _counts(value: Any) -> tuple[int, int] | None:
    if isinstance(value, dict) and "given" in value and "needed" in value:
        return int(value["given"]), int(value["needed"])
    return None


@dataclass(frozen=True)
class Verdict:
    """The policy's answer for one request: which rule, what action, and its terms."""

    action: str  # auto | approve | deny
    rule: str  # "rules[2]" or "default"
    reason: str
    approvals: int = 1
    timeout_s: float = 3600.0
    on_timeout: str = "deny"
    batch: bool = True  # may a person decide it within a selection (policy `batch`)
    slack_buttons: bool = False  # Approve/Deny buttons in Slack (policy `slack_buttons`)
    slack_buttons_irreversible: bool = False  # ...on irreversible requests too
    approvers: tuple[str, ...] = ()  # who may decide (names, "group:NAME"); empty: anyone
    step_up: Mapping[str, Any] | None = None  # policy.deciders.StepUp's JSON form
    notify: str | None = None  # the group told of it ([notify.groups.NAME])
    approve_in_pr: bool | None = None  # the rule's say on the pull request card; None: unsaid

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "action": self.action,
            "rule": self.rule,
            "reason": self.reason,
            "approvals": self.approvals,
            "timeout_s": self.timeout_s,
            "on_timeout": self.on_timeout,
        }
        if not self.batch:  # the decision-surface terms, written only when not the default
            data["batch"] = False
        if self.slack_buttons:
            data["slack_buttons"] = True
        if self.slack_buttons_irreversible:
            data["slack_buttons_irreversible"] = True
        if self.approvers:
            data["approvers"] = list(self.approvers)
        if self.step_up is not None:
            data["step_up"] = dict(self.step_up)
        if self.notify is not None:
            data["notify"] = self.notify
        if self.approve_in_pr is not None:
            data["approve_in_pr"] = self.approve_in_pr
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        return cls(
            action=data["action"],
            rule=data["rule"],
            reason=data["reason"],
            approvals=int(data.get("approvals", 1)),
            timeout_s=float(data.get("timeout_s", 3600.0)),
            on_timeout=data.get("on_timeout", "deny"),
            batch=data.get("batch", True) is not False,
            slack_buttons=data.get("slack_buttons") is True,
            slack_buttons_irreversible=data.get("slack_buttons_irreversible") is True,
            approvers=tuple(data.get("approvers", ())),
            step_up=data.get("step_up"),
            notify=data.get("notify"),
            approve_in_pr=data.get("approve_in_pr"),
        )


@dataclass(frozen=True)
class Preview:
    """The literal artefact a person must see before approving: never a summary.

    `title` says what will happen in one line; `target` names the service and the
    destination; `body` is the exact content, diff or message; `facts` are short
    key/value lines (object size, old ETag, …).
    """

    title: str
    target: str
    body: str = ""
    body_kind: str = "text"  # text | diff | json
    facts: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "target": self.target,
            "body": self.body,
            "body_kind": self.body_kind,
            "facts": [list(f) for f in self.facts],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Preview:
        return cls(
            title=data["title"],
            target=data["target"],
            body=data.get("body", ""),
            body_kind=data.get("body_kind", "text"),
            facts=tuple((str(k), str(v)) for k, v in data.get("facts", [])),
        )


@dataclass(frozen=True)
class Record:
    """One request's row. `state` walks received → … → a terminal status."""

    sandbox: str
    id: str
    name: str
    state: State
    received_at: str
    effect: str | None = None
    payload: str | None = None
    sha256: str | None = None
    idempotency_key: str | None = None
    reason: str | None = None
    errors: list[dict[str, str]] | None = None
    output: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None
    preview: dict[str, Any] | None = None
    reversible: bool | None = None
    decided_by: str | None = None
    replay_of: str | None = None
    decided_at: str | None = None
    completed_at: str | None = None
    expires_at: str | None = None
    on_timeout: str | None = None
    seen: dict[str, Any] | None = None  # what handlers remembered (ctx.remember) until it ends
    facts: dict[str, Any] | None = None  # what the policy was told beside params (replay)
    seq: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.sandbox, self.id)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @cached_property
    def envelope(self) -> dict[str, Any]:
        return codec.loads(self.payload) if self.payload else {}

    def result(self, given: int | None = None) -> Result | None:
        """The result file this row shows (None: nothing yet); `given`: approvals so far."""
        if self.state not in TERMINAL and self.state != "pending":
            return None
        needed = int((self.verdict or {}).get("approvals", 1))
        return Result(
            id=self.id,
            status=self.state,
            effect=self.effect,
            reason=self.reason,
            output=self.output,
            errors=tuple(self.errors or ()),
            request_sha256=self.sha256,
            decided_by=self.decided_by,
            received_at=self.received_at,
            decided_at=self.decided_at,
            completed_at=self.completed_at,
            expires_at=self.expires_at,
            on_timeout=self.on_timeout,
            replayed=self.replay_of is not None,
            version=self.version,
            approvals=None if given is None else (given, needed),
        )

    @property
    def version(self) -> int:
        """The request's protocol version: its canonical payload ends with `version`."""
        return 2 if self.payload and self.payload.endswith(',"version":2}') else 1

    def evolve(self, **changes: Any) -> Record:
        """A copy with `changes`; unknown names raise, like dataclasses.replace."""
        unknown = changes.keys() - _RECORD_FIELDS_SET
        if unknown:
            raise TypeError(f"Record has no field {sorted(unknown)[0]!r}")
        new = object.__new__(Record)
        new.__dict__.update(self.__dict__, **changes)  # 15x cheaper than replace()
        if "payload" in changes:
            new.__dict__.pop("envelope", None)  # parsed from the old payload
        return new


@dataclass(frozen=True)
class Decision:
    """One person's verdict on one request, bound to the sha256 they saw."""

    sandbox: str
    id: str
    approver: str
    verdict: str  # approve | deny | reconciled:applied | reconciled:not-applied
    reason: str | None
    surface: str  # cli | prompt | web | api
    sha256: str
    at: str


_RECORD_FIELDS_SET = frozenset(f.name for f in fields(Record))
