"""Undo from a decided card: for an applied effect whose handler can reverse it, a form
that asks for a reason and a confirmation, then reverts it as `broker undo` does
(broker.lifecycle.undo), recorded with its own audit events (`undo_requested` names the
person, the surface and the reason; then `undone` or `undo_failed`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from broker.audit.checkpoints import audit_log
from broker.audit.log import flush
from broker.errors import BrokerError
from broker.lifecycle import undo as undoing
from broker.web import html as render
from broker.web.inbox import Inbox
from broker.web.pages import FormText, PagesDep

router = APIRouter(include_in_schema=False)


def undoable(inbox: Inbox, card: dict[str, Any]) -> bool:
    """Whether the card's request can be undone from the page now."""
    if card.get("status") != "applied":
        return False
    with inbox.ledger() as ledger:
        try:
            undoing.plan(ledger, inbox.registry, inbox.config, f"{card['sandbox']}/{card['id']}")
        except BrokerError:
            return False
    return True


@router.post("/requests/{sandbox}/{request_id}/undo")
def undo(
    request: Request,
    pages: PagesDep,
    sandbox: str,
    request_id: str,
    reason: FormText = "",
    confirm: FormText = "",
    request_sha256: FormText = "",
    csrf: FormText = "",
) -> Response:
    who = pages.form_poster(request, csrf, "Not undone", "The form expired; reload and try again.")
    if isinstance(who, Response):
        return who
    if confirm != "yes" or not reason.strip():
        return pages.error(
            request, 422, "Not undone", "Give a reason and tick the confirmation to undo it."
        )
    inbox = pages.inbox
    ref = f"{sandbox}/{request_id}"
    with inbox.ledger() as ledger:
        try:
            chosen = undoing.plan(ledger, inbox.registry, inbox.config, ref)
            if chosen.record.sha256 != request_sha256:
                return pages.error(request, 409, "Not undone", "The request is not the one shown.")
            done = undoing.execute(
                ledger, inbox.config, chosen, who.approver, surface="web", reason=reason.strip()
            )
            flush(ledger, audit_log(inbox.config))
        except BrokerError as exc:
            return pages.error(request, 409, "Not undone", str(exc))
    if done.state != "applied":
        return pages.error(request, 502, "Undo failed", str(done.reason or "the undo failed"))
    return RedirectResponse(render.request_url(sandbox, request_id) + "?done=undo", 303)
