"""The HTTP API under /api/v1: the inbox's powers for integrations, JSON in and out.

Every endpoint but `health` (and the OpenAPI document) needs an approver: a bearer
token, or the inbox's session cookie, with which a POST also needs the session's
`X-CSRF-Token` header. Errors are `{"error": {"code": …, "message": …}}`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from broker.clock import parse_duration
from broker.errors import BrokerError, RequestNotFound
from broker.ledger import Record
from broker.models import now
from broker.web.auth import Gate, Identity, same_secret
from broker.web.inbox import Filters, Inbox, Refused, State

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SANDBOX = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
REQUEST_ID = r"^[A-Za-z0-9_-]{1,128}$"
Status = State


class ApiError(Exception):
    """An answer other than success: HTTP status, a stable code, a sentence."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


# -- the JSON shapes -------------------------------------------------------------------


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
        pattern=r"^[0-9a-fA-F]{12,64}$",
        description="the request_sha256 of the card you read (at least 12 hex digits)",
    )


class DecisionOut(BaseModel):
    settled: bool = Field(description="false while a quorum still needs more approvals")
    approvals: int
    needed: int
    request: Card


class Counts(BaseModel):
    auto: int
    approved: int
    denied: int
    expired: int
    invalid: int
    failed: int
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


def summary(record: Record) -> dict[str, Any]:
    preview = record.preview or {}
    return {
        "sandbox": record.sandbox,
        "id": record.id,
        "ref": f"{record.sandbox}/{record.id}",
        "effect": record.effect,
        "status": record.state,
        "title": str(preview.get("title", "")),
        "where": preview.get("target", record.effect),
        "received_at": record.received_at,
        "decided_at": record.decided_at,
        "completed_at": record.completed_at,
        "decided_by": record.decided_by,
        "reason": record.reason,
        "expires_at": record.expires_at,
        "on_timeout": record.on_timeout,
    }


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


SandboxPath = Annotated[str, Path(pattern=SANDBOX, description="the sandbox id")]
IdPath = Annotated[str, Path(pattern=REQUEST_ID, description="the request id")]


def the_inbox(request: Request) -> Inbox:
    """The app's Inbox (set by create_app)."""
    inbox: Inbox = request.app.state.inbox
    return inbox


def approver(request: Request) -> Identity:
    """The authenticated approver, or a 401; a cookie-authenticated POST needs its CSRF token."""
    gate: Gate = request.app.state.gate
    identity = gate.identity(request)
    if identity is None:
        raise ApiError(
            401,
            "unauthenticated",
            "sign in: send Authorization: Bearer <your approver token>",
            {"WWW-Authenticate": "Bearer"},
        )
    if (
        request.method not in SAFE_METHODS
        and identity.session is not None
        and not same_secret(identity.session.csrf, request.headers.get("x-csrf-token"))
    ):
        raise ApiError(403, "csrf", "a cookie-authenticated POST needs the X-CSRF-Token header")
    return identity


InboxDep = Annotated[Inbox, Depends(the_inbox)]
Who = Annotated[Identity, Depends(approver)]
GUARDED = _responses(401, 403, 422, 500)
router = APIRouter(responses=_responses(422, 500))


@router.get("/health", response_model=Health, responses=_responses(503))
def health(inbox: InboxDep) -> dict[str, Any]:
    """Whether the web surface can read the ledger."""
    try:
        inbox.cursor()
    except BrokerError as exc:
        raise ApiError(503, "ledger_unavailable", str(exc)) from exc
    return {"status": "ok"}


@router.get("/me", response_model=Me, responses=GUARDED)
def me(who: Who) -> dict[str, Any]:
    """Who the token or session belongs to."""
    return {"approver": who.approver}


@router.get("/pending", response_model=PendingList, responses=GUARDED)
def pending(inbox: InboxDep, who: Who) -> dict[str, Any]:
    """The cards of every request waiting for a person, oldest first."""
    cursor = inbox.cursor()
    return {"cursor": cursor, "requests": inbox.pending()}


@router.get("/requests", response_model=RequestList, responses=GUARDED)
def requests(
    inbox: InboxDep,
    who: Who,
    status: Status | None = None,
    effect: Annotated[str | None, Query(max_length=200)] = None,
    sandbox: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    """Recent requests, newest first, filtered by status, effect and sandbox."""
    cursor = inbox.cursor()
    records = inbox.history(Filters(effect, sandbox, status), limit)
    return {"cursor": cursor, "requests": [summary(r) for r in records]}


@router.get(
    "/requests/{sandbox}/{request_id}",
    response_model=Card,
    responses={**GUARDED, **_responses(404)},
)
def show(sandbox: SandboxPath, request_id: IdPath, inbox: InboxDep, who: Who) -> dict[str, Any]:
    """One request's card: the literal preview, flags, rule, deadline, on-timeout."""
    try:
        return inbox.card(sandbox, request_id)
    except RequestNotFound as exc:
        raise ApiError(404, "not_found", str(exc)) from exc


@router.post(
    "/requests/{sandbox}/{request_id}/decision",
    response_model=DecisionOut,
    responses={**GUARDED, **_responses(400, 404, 409, 413)},
)
def decide(
    sandbox: SandboxPath, request_id: IdPath, body: DecisionIn, inbox: InboxDep, who: Who
) -> dict[str, Any]:
    """Approve or deny, as the authenticated approver; 409 when the sha256 is stale."""
    reason = body.reason.strip() if body.reason and body.reason.strip() else None
    if body.verdict == "deny" and reason is None:
        raise ApiError(422, "reason_required", "a denial needs a reason: the agent reads it")
    try:
        outcome = inbox.decide(
            sandbox,
            request_id,
            body.verdict,
            approver=who.approver,
            reason=reason,
            sha256=body.request_sha256,
            surface=who.surface,
        )
        card = inbox.card(sandbox, request_id)
    except RequestNotFound as exc:
        raise ApiError(404, "not_found", str(exc)) from exc
    except Refused as exc:
        raise ApiError(409, exc.code, exc.message) from exc
    return {
        "settled": outcome.settled,
        "approvals": outcome.approvals,
        "needed": outcome.needed,
        "request": card,
    }


@router.get("/changes", response_model=Changes, responses=GUARDED)
def changes(
    inbox: InboxDep, who: Who, since: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0
) -> dict[str, Any]:
    """A cheap poll: whether anything changed since the cursor you hold."""
    cursor = inbox.cursor()
    return {"cursor": cursor, "changed": cursor != since}


@router.get("/stats", response_model=Stats, responses=GUARDED)
def stats(
    inbox: InboxDep,
    who: Who,
    since: Annotated[
        str | None, Query(max_length=32, description="a window such as 24h or 7d")
    ] = None,
) -> dict[str, Any]:
    """Outcomes per effect, approval rate and time to decision (as `broker stats`)."""
    return inbox.stats(window(since))


def window(since: str | None) -> datetime | None:
    """The start of a `since` window like 7d, or None for all time."""
    if not since:
        return None
    try:
        return now() - timedelta(seconds=parse_duration(since))
    except (ValueError, OverflowError) as exc:
        raise ApiError(
            422, "invalid_since", f"since {since!r}: expected a duration like 24h or 7d"
        ) from exc
