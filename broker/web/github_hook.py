"""POST /github/webhook: GitHub's deliveries of comments and reviews on the broker's
pull request threads (broker.integrations.github_decisions).

The body's `X-Hub-Signature-256` (HMAC-SHA256 with `webhook_secret`) is checked before
anything is parsed; a delivery id (`X-GitHub-Delivery`) is taken once, so a replayed
delivery decides nothing. Only `issue_comment` and `pull_request_review` events are read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from broker.integrations.github_decisions import Event, PrDecider

router = APIRouter(include_in_schema=False)


def signature(secret: str, body: bytes) -> str:
    """The X-Hub-Signature-256 GitHub sends for `body`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def event_of(kind: str, payload: dict[str, Any]) -> Event | None:
    """The comment or review a delivery carries, or None for anything else."""
    repo = str((payload.get("repository") or {}).get("full_name") or "")
    if kind == "issue_comment":
        comment, issue = payload.get("comment") or {}, payload.get("issue") or {}
        user = comment.get("user") or {}
        return Event(
            "comment",
            repo,
            int(issue.get("number") or 0),
            str(user.get("login") or ""),
            str(user.get("type") or "User"),
            str(comment.get("body") or ""),
            int(comment.get("id") or 0),
            str(payload.get("action") or ""),
        )
    if kind == "pull_request_review" and payload.get("action") == "submitted":
        review, pull = payload.get("review") or {}, payload.get("pull_request") or {}
        user = review.get("user") or {}
        return Event(
            "review",
            repo,
            int(pull.get("number") or 0),
            str(user.get("login") or ""),
            str(user.get("type") or "User"),
            str(review.get("body") or ""),
            int(review.get("id") or 0) or None,
            "submitted",
            review_state=str(review.get("state") or "").upper(),
            commit_id=str(review.get("commit_id") or ""),
        )
    return None


def _refused(code: str, message: str, status: int) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def receive(decider: PrDecider, headers: dict[str, str], body: bytes) -> Response:
    """One delivery: signature, then replay, then the event."""
    secret = decider.threads.settings.webhook_secret
    if not secret:
        return _refused("not_configured", "no webhook_secret is configured", 404)
    given = headers.get("x-hub-signature-256") or ""
    if not hmac.compare_digest(given.encode(), signature(secret, body).encode()):
        return _refused("bad_signature", "X-Hub-Signature-256 does not match this body", 401)
    delivery = headers.get("x-github-delivery") or ""
    if not delivery or not decider.threads.store.first_delivery(delivery):
        return _refused("replayed", "this delivery was already taken: a replay", 409)
    try:
        payload = json.loads(body)
        event = event_of(headers.get("x-github-event") or "", payload)
    except (ValueError, TypeError, AttributeError):
        return _refused("bad_payload", "expected GitHub's JSON payload", 400)
    answer = decider.handle(event) if event is not None else None
    return JSONResponse({"answered": answer is not None})


@router.post("/github/webhook")
async def webhook(request: Request) -> Response:
    """GitHub's webhook: signed comment and review deliveries."""
    decider: PrDecider | None = request.app.state.github
    if decider is None:
        return _refused("not_configured", "approve_in_pr is not configured on this broker", 404)
    body = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    return await run_in_threadpool(receive, decider, headers, body)
