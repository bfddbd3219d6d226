"""POST /slack/actions: where Slack sends the clicks on a request's Approve and Deny
buttons (the app's Interactivity Request URL), and the deny dialog's reason.

Nothing is read before Slack's signature is checked (broker.slack.signing), and a
signed request is taken once: a replay is refused. The clicker's Slack user id must be
an approver's `slack_user`; anyone else gets a message back and decides nothing. A
click is checked again against the request as the ledger holds it now: its rule must
still allow Slack buttons, the sha256 on the button must be the request's, and the
decision goes through the one path every surface uses (broker.approval.decisions.decide_and_wake)
as surface `slack`. Then the message is updated to say who decided what.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, get_args
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from broker.approval.decisions import Ballot
from broker.clock import REAL, Clock
from broker.errors import BrokerError, RequestNotFound
from broker.models import State
from broker.slack import messages
from broker.slack.api import SlackApi
from broker.slack.settings import SlackSettings
from broker.slack.signing import Unsigned, verify
from broker.slack.store import SlackStore
from broker.web.inbox import Inbox, Refused

log = logging.getLogger("broker.slack")
REF = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/([A-Za-z0-9_-]{1,128})")
router = APIRouter(include_in_schema=False)


class Unusable(Exception):
    """A signed payload that cannot be acted on; the message goes back to the clicker."""


class SlackCallback:
    """Turns Slack's signed callbacks into decisions, as the mapped approver."""

    def __init__(self, settings: SlackSettings, inbox: Inbox, clock: Clock = REAL) -> None:
        self.settings = settings
        self.clock = clock  # a signature's age, a replay's window
        self.inbox = inbox
        self.store = SlackStore(settings.store_path)
        self.api = SlackApi(settings, timeout=2.5)  # Slack waits three seconds for us

    def close(self) -> None:
        self.api.close()
        self.store.close()

    def handle(self, body: bytes, timestamp: str | None, signature: str | None) -> Response:
        now = self.clock.time()
        try:
            verify(self.settings.signing_secret, timestamp, signature, body, now)
        except Unsigned as exc:
            return _refused(exc.code, exc.message)
        if not self.store.first_use(str(signature), now):
            return _refused("replayed", "this signed request was already taken: a replay")
        try:
            payload = json.loads(parse_qs(body.decode("utf-8"))["payload"][0])
        except (UnicodeDecodeError, KeyError, IndexError, ValueError):
            return _refused("bad_payload", "expected a form with a JSON `payload`", 400)
        if not isinstance(payload, dict):
            return _refused("bad_payload", "the payload is not a JSON object", 400)
        if payload.get("type") == "block_actions":
            self._clicked(payload)
            return Response(status_code=200)
        if payload.get("type") == "view_submission":
            return self._submitted(payload)
        return Response(status_code=200)  # e.g. view_closed: nothing to do

    # -- a button -------------------------------------------------------------------

    def _clicked(self, payload: dict[str, Any]) -> None:
        reply = str(payload.get("response_url") or "")
        try:
            action = (payload.get("actions") or [{}])[0]
            if not isinstance(action, dict) or action.get("action_id") not in ("approve", "deny"):
                return  # the link to the inbox: Slack tells us, nothing to do
            approver = self._approver(payload)
            sandbox, request_id, sha256 = _target(action.get("value"))
            card = self._card(sandbox, request_id)
            container = payload.get("container") or {}
            channel = str(container.get("channel_id") or "")
            ts = str(container.get("message_ts") or "")
            if action["action_id"] == "deny":
                view = messages.deny_view({**card, "request_sha256": sha256}, channel, ts)
                self.api.call("views.open", {"trigger_id": payload.get("trigger_id"), "view": view})
                return
            self._decide(
                card, Ballot(card["ref"], "approve", approver, None, "slack", sha256), channel, ts
            )
        except Unusable as exc:
            self._tell(reply, str(exc))
        except BrokerError as exc:
            log.warning("a Slack click was not completed: %s", exc)
            self._tell(reply, "The broker could not complete this; decide in the inbox.")

    # -- the deny dialog --------------------------------------------------------------

    def _submitted(self, payload: dict[str, Any]) -> Response:
        view = payload.get("view") or {}
        if not isinstance(view, dict) or view.get("callback_id") != messages.DENY_VIEW:
            return Response(status_code=200)
        try:
            meta = json.loads(str(view.get("private_metadata") or "{}"))
            approver = self._approver(payload)
            values = ((view.get("state") or {}).get("values") or {}).get("reason") or {}
            reason = str((values.get("reason") or {}).get("value") or "").strip()
            if not reason:
                raise Unusable("A denial needs a reason: the agent reads it.")
            sandbox, request_id, sha256 = _target(json.dumps(meta))
            card = self._card(sandbox, request_id)
            channel, ts = str(meta.get("channel") or ""), str(meta.get("ts") or "")
            self._decide(
                card, Ballot(card["ref"], "deny", approver, reason, "slack", sha256), channel, ts
            )
        except (Unusable, ValueError, AttributeError) as exc:
            problem = str(exc) if isinstance(exc, Unusable) else "This dialog was not understood."
            return JSONResponse({"response_action": "errors", "errors": {"reason": problem}})
        except BrokerError as exc:
            log.warning("a Slack denial was not completed: %s", exc)
            return JSONResponse(
                {"response_action": "errors", "errors": {"reason": "Not recorded; try the inbox."}}
            )
        return Response(status_code=200)  # closes the dialog

    # -- shared -------------------------------------------------------------------------

    def _approver(self, payload: dict[str, Any]) -> str:
        user = str((payload.get("user") or {}).get("id") or "")
        name = self.settings.users.get(user)
        if name is None:
            raise Unusable(
                f"You ({messages.esc(user, 40)}) are not an approver on this broker, so "
                "nothing was decided. An operator can add `slack_user = "
                f'"{messages.esc(user, 40)}"` under your [approvers.NAME] in broker.toml.'
            )
        return name

    def _card(self, sandbox: str, request_id: str) -> dict[str, Any]:
        try:
            card = self.inbox.card(sandbox, request_id)
        except RequestNotFound as exc:
            raise Unusable(f"No such request: {sandbox}/{request_id}.") from exc
        if not card.get("slack_buttons"):
            raise Unusable(
                f"{card['ref']} cannot be decided in Slack (its rule does not allow it): "
                "decide in the inbox."
            )
        return card

    def _decide(self, card: dict[str, Any], ballot: Ballot, channel: str, ts: str) -> None:
        sandbox, request_id = card["sandbox"], card["id"]
        try:
            self.inbox.decide(ballot)
        except Refused as exc:
            raise Unusable(f"Not recorded: {messages.esc(exc.message)}") from exc
        if channel and ts:
            self._show(sandbox, request_id, channel, ts)

    def _show(self, sandbox: str, request_id: str, channel: str, ts: str) -> None:
        """Update the message to the request as it now stands. The broker updates it too
        when the request settles, and this update may land after the broker's: so read
        the request again after each update and show it again until what was shown is
        what stands (a click races the approval, the apply and the outcome: each state
        is shown at most once, so the loop ends)."""
        shown = None
        for _ in range(len(get_args(State))):
            card = self.inbox.card(sandbox, request_id)
            if card["status"] == shown:
                return
            message = messages.message(card, self.settings.inbox_url)
            try:
                self.api.call("chat.update", {"channel": channel, "ts": ts, **message})
            except BrokerError as exc:  # the decision stands; the broker updates it again
                log.warning("decision recorded; the Slack message was not updated: %s", exc)
                return
            shown = card["status"]

    def _tell(self, response_url: str, text: str) -> None:
        """A message only the clicker sees."""
        body = {"response_type": "ephemeral", "replace_original": False, "text": text}
        try:
            self.api.respond(response_url, body)
        except BrokerError as exc:
            log.warning("could not answer a Slack user: %s", exc)


def _target(value: Any) -> tuple[str, str, str]:
    """(sandbox, id, sha256) from a button's value or the dialog's metadata."""
    try:
        data = json.loads(str(value))
        match = REF.fullmatch(str(data["ref"]))
        sha256 = str(data["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise Unusable("This button was not understood; decide in the inbox.") from exc
    if match is None or not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise Unusable("This button was not understood; decide in the inbox.")
    return match.group(1), match.group(2), sha256


def _refused(code: str, message: str, status: int = 401) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


@router.post("/slack/actions")
async def actions(request: Request) -> Response:
    """Slack's interactivity callback: signed clicks and dialog submissions."""
    slack: SlackCallback | None = request.app.state.slack
    if slack is None:
        return _refused("not_configured", "Slack is not configured on this broker", 404)
    body = await request.body()
    stamp = request.headers.get("x-slack-request-timestamp")
    signature = request.headers.get("x-slack-signature")
    return await run_in_threadpool(slack.handle, body, stamp, signature)
