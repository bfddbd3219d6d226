"""The JSON shapes of /api/v1, as pydantic models: they are its OpenAPI document."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SANDBOX = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
REQUEST_ID = r"^[A-Za-z0-9_-]{1,128}$"
SHA256 = r"^[0-9a-fA-F]{12,64}$"
MAX_BATCH = 100


class ErrorDetail(BaseModel):
    code: str = Field(description="stable, machine-readable: stale, not_pending, …")
    message: str = Field(description="a sentence for a person")


class ErrorBody(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok"]


class Me(BaseModel):
    approver: str = Field(description="the authenticated approver; decisions are recorded as")


class What(BaseModel):
    title: str
    body: str = Field(description="the exact content, diff or message")
    body_kind: str = Field(description="text | diff | json")
    facts: list[list[str]] = Field(description="[key, value] pairs")


class Why(BaseModel):
    rule: str | None
    reason: str | None


class Deadline(BaseModel):
    expires_at: str | None
    seconds_left: float | None
    on_timeout: str | None = Field(description="deny | approve: what happens at expires_at")


class Approvals(BaseModel):
    have: list[str]
    needed: int


class Link(BaseModel):
    key: str = Field(description="the output's key that holds the URL")
    url: str


class Durations(BaseModel):
    waited_s: float | None = Field(description="waiting for people, to the decision")
    apply_s: float | None = Field(description="from the decision to the outcome")
    total_s: float | None = Field(description="from received to the outcome")


class Step(BaseModel):
    step: str = Field(description="received | pending | approve | deny | decided | applying | …")
    at: str | None
    by: str | None
    note: str | None


class Card(BaseModel):
    """Everything a person needs to decide: the same card as `broker show --json`."""

    sandbox: str
    id: str
    ref: str
    effect: str | None
    status: str
    request_sha256: str | None
    received_at: str
    age_s: float | None
    what: What
    where: str | None
    why: Why
    if_nobody_answers: Deadline
    agent_reason: str | None = Field(description="the agent's words, never verified")
    reversible: bool | None
    idempotent: bool | None
    undo: str | None
    approvals: Approvals
    decided_by: str | None
    reason: str | None
    batch: bool = Field(description="false when the rule says `batch = false`: decide it alone")
    slack_buttons: bool = Field(description="whether Slack messages carry Approve/Deny buttons")
    summary: str = Field(description='the size of the change: "+3 −1 lines", "12 lines"')
    lines: int = Field(description="how many lines the body has")
    markers: list[str] = Field(description="irreversible | reversible, and overwrite")
    output: Any = Field(description="what the handler returned, once applied")
    warning: str | None = Field(
        description="set when an applied effect's output shows a service error (HTTP ≥ 400)"
    )
    decided_at: str | None = None
    completed_at: str | None = None
    links: list[Link] = Field(default=[], description="the http(s) URLs in the output")
    credential: list[str] = Field(
        default=[],
        description="what the apply held, one line each: scope, provider and id, lifetime, "
        "revoked (never the secret)",
    )
    durations: Durations | None = None
    timeline: list[Step] = Field(default=[], description="the request's life, oldest first")


class Summary(BaseModel):
    """One request in a listing."""

    sandbox: str
    id: str
    ref: str
    effect: str | None
    status: str
    title: str
    where: str | None
    received_at: str
    decided_at: str | None
    completed_at: str | None
    decided_by: str | None
    reason: str | None
    expires_at: str | None
    on_timeout: str | None


class PendingList(BaseModel):
    cursor: int = Field(description="pass to /changes to learn when to look again")
    requests: list[Card]


class RequestList(BaseModel):
    cursor: int
    requests: list[Summary]


class Changes(BaseModel):
    cursor: int = Field(description="grows with every change to requests or decisions")
    changed: bool = Field(description="whether cursor differs from `since`")


class DecisionIn(BaseModel):
    """A verdict on a pending request, bound to the sha256 the decider saw."""

    model_config = ConfigDict(extra="forbid")

    verdict: Literal["approve", "deny"]
    reason: str | None = Field(
        None, max_length=2000, description="goes back to the agent; required to deny"
    )
    request_sha256: str = Field(
        pattern=SHA256,
        description="the request_sha256 of the card you read (at least 12 hex digits)",
    )


class DecisionOut(BaseModel):
    settled: bool = Field(description="false while a quorum still needs more approvals")
    approvals: int
    needed: int
    request: Card


class BatchItemIn(BaseModel):
    """One request of a batch, bound to the sha256 of the card the decider read."""

    model_config = ConfigDict(extra="forbid")

    sandbox: str = Field(pattern=SANDBOX)
    id: str = Field(pattern=REQUEST_ID)
    request_sha256: str = Field(pattern=SHA256)


class BatchIn(BaseModel):
    """One verdict over a selection: each request still gets a decision of its own."""

    model_config = ConfigDict(extra="forbid")

    verdict: Literal["approve", "deny"]
    reason: str | None = Field(
        None, max_length=2000, description="goes back to every agent; required to deny"
    )
    requests: list[BatchItemIn] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="the selection: there is no 'all'; list each request you read",
    )


class BatchItemOut(BaseModel):
    sandbox: str
    id: str
    ref: str
    recorded: bool = Field(description="whether this request's decision was recorded")
    settled: bool = Field(description="false while a quorum still needs more approvals")
    status: str | None = Field(description="the request's state after the decision")
    code: str | None = Field(
        description="why not recorded: stale, not_pending, already_decided, batch_forbidden, "
        "not_found, duplicate"
    )
    message: str


class BatchOut(BaseModel):
    recorded: int
    refused: int
    results: list[BatchItemOut] = Field(description="one per request, in the order sent")


class Counts(BaseModel):
    auto: int
    approved: int
    denied: int
    expired: int
    invalid: int
    failed: int
    staged: int = Field(description="answered in staged mode: nothing was applied")
    waiting: int


class StatsRow(BaseModel):
    counts: Counts
    human_decisions: int
    approval_rate: float | None
    median_time_to_decision_s: float | None
    p90_time_to_decision_s: float | None
    rubber_stamp: bool
    advice: str | None


class Stats(BaseModel):
    effects: dict[str, StatsRow]
    overall: StatsRow
