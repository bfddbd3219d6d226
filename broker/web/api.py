"""The HTTP API under /api/v1: the inbox's powers for integrations, JSON in and out.

Every endpoint but `health` (and the OpenAPI document) needs an approver: a bearer
token, or the inbox's session cookie, with which a POST also needs the session's
`X-CSRF-Token` header. Errors are `{"error": {"code": …, "message": …}}`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request

from broker.approval.card import Narrowing
from broker.approval.decisions import Ballot
from broker.clock import now, parse_duration
from broker.errors import BrokerError, RequestNotFound
from broker.models import Record
from broker.web.auth import Gate, Identity, same_secret
from broker.web.inbox import Filters, Inbox, Pick, Picked, Refused, State
from broker.web.shapes import (
    REQUEST_ID,
    SANDBOX,
    BatchIn,
    BatchOut,
    Card,
    Changes,
    DecisionIn,
    DecisionOut,
    ErrorBody,
    Health,
    Me,
    PendingList,
    RequestList,
    Stats,
)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
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
def pending(
    inbox: InboxDep,
    who: Who,
    effect: Annotated[str | None, Query(max_length=200)] = None,
    sandbox: Annotated[str | None, Query(max_length=128)] = None,
    q: Annotated[
        str | None,
        Query(max_length=200, description="text in the ref, what, where, why or agent's words"),
    ] = None,
) -> dict[str, Any]:
    """The cards of every request waiting for a person, oldest first, narrowed by effect,
    sandbox and text."""
    cursor = inbox.cursor()
    return {"cursor": cursor, "requests": inbox.pending(Narrowing(effect, sandbox, q))}


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
        ref = f"{sandbox}/{request_id}"
        tally = inbox.decide(
            Ballot(
                ref, body.verdict, who.approver, reason, who.surface, body.request_sha256, who.proof
            )
        )
        card = inbox.card(sandbox, request_id)
    except RequestNotFound as exc:
        raise ApiError(404, "not_found", str(exc)) from exc
    except Refused as exc:
        status = {"step_up_required": 401, "not_an_approver": 403}.get(exc.code, 409)
        raise ApiError(status, exc.code, exc.message) from exc
    return {
        "settled": tally.settled,
        "approvals": tally.approvals,
        "needed": tally.needed,
        "request": card,
    }


@router.post("/decisions", response_model=BatchOut, responses={**GUARDED, **_responses(400, 413)})
def decide_batch(body: BatchIn, inbox: InboxDep, who: Who) -> dict[str, Any]:
    """One verdict over a selection of requests, as the authenticated approver.

    Each request is decided on its own, bound to its own sha256, and recorded as its own
    decision; one refused (stale, already decided, or its rule says `batch = false`) does
    not stop the others. The answer is 200 with one result per request."""
    reason = body.reason.strip() if body.reason and body.reason.strip() else None
    if body.verdict == "deny" and reason is None:
        raise ApiError(422, "reason_required", "a denial needs a reason: the agents read it")
    picks = [Pick(r.sandbox, r.id, r.request_sha256) for r in body.requests]
    done = inbox.decide_many(
        picks,
        body.verdict,
        approver=who.approver,
        reason=reason,
        surface=who.surface,
        proof=who.proof,
    )
    results = [batch_item(p) for p in done]
    recorded = sum(1 for p in done if p.recorded)
    return {"recorded": recorded, "refused": len(done) - recorded, "results": results}


def batch_item(picked: Picked) -> dict[str, Any]:
    return {
        "sandbox": picked.pick.sandbox,
        "id": picked.pick.id,
        "ref": picked.pick.ref,
        "recorded": picked.recorded,
        "settled": picked.settled,
        "status": picked.status,
        "code": picked.code,
        "message": picked.message,
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
