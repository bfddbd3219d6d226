"""A request's card as a Slack message (Block Kit), and the deny dialog.

Every string from a sandbox (title, body, where, the agent's words) and every reason is
neutralised (control, bidi and zero-width characters shown as tags) and escaped for
mrkdwn (`&`, `<`, `>`), so it can neither ping a channel, forge a link, nor leave its
code block. `message(card)` is a pure function of the card: posting it, or updating the
message with it after any change, always shows the request as it now stands.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from broker.untrusted import neutralize

MAX_BODY = 2500
MAX_FIELD = 1900
DENY_VIEW = "broker_deny"
THEN = {"deny": "it is denied (fails closed)", "approve": "it is applied"}
HEADLINE = {
    "pending": "Approval needed",
    "approved": "Approved",
    "applying": "Approved",
    "applied": "Applied",
    "denied": "Denied",
    "expired": "Expired",
    "failed": "Failed",
    "unknown": "Outcome unknown",
    "staged": "Staged (nothing applied)",
}
ICON = {"applied": "✅", "approved": "✅", "applying": "✅", "denied": "❌", "failed": "❌"}


def esc(text: Any, limit: int = MAX_FIELD) -> str:
    """Untrusted text for mrkdwn: neutralised, escaped, cut to `limit` characters."""
    shown = neutralize(str(text if text is not None else ""))
    if len(shown) > limit:
        shown = shown[:limit] + "…"
    return shown.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    """A body as a code block it cannot close early."""
    body = neutralize(text, keep_newlines=True)
    if len(body) > MAX_BODY:
        body = body[:MAX_BODY] + "\n… (cut here: read the whole content before deciding)"
    body = body.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "```" + body.replace("```", "ʼʼʼ") + "```"


def when(iso: str | None) -> str:
    """A deadline every reader sees in their own time zone (Slack's date token)."""
    if not iso:
        return "no deadline"
    moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return f"<!date^{int(moment.timestamp())}^{{date_short_pretty}} at {{time}}|{esc(iso)}>"


def link(inbox_url: str | None, card: Mapping[str, Any]) -> str | None:
    if not inbox_url:
        return None
    return f"{inbox_url}/requests/{quote(card['sandbox'], safe='')}/{quote(card['id'], safe='')}"


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}}


def context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:3000]}]}


def plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text}


def message(card: Mapping[str, Any], inbox_url: str | None) -> dict[str, Any]:
    """The Slack message for `card`: Approve/Deny buttons only while it waits and only if
    the card says `slack_buttons` (its rule's choice); otherwise where to decide."""
    ref, status = str(card["ref"]), str(card["status"])
    what, why = card.get("what") or {}, card.get("why") or {}
    headline = HEADLINE.get(status, status)
    if card.get("warning"):
        headline += ", with a warning"
    marks = "".join(f"  `{m.upper()}`" for m in card.get("markers") or () if m != "reversible")
    blocks = [
        section(f"*{headline}*  `{esc(ref)}` ({esc(card.get('effect'))}){marks}"),
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*What:*\n{esc(what.get('title'))}"},
                {"type": "mrkdwn", "text": f"*Where:*\n{esc(card.get('where'))}"},
                {
                    "type": "mrkdwn",
                    "text": f"*Why it stopped:*\n{esc(why.get('rule'))}: {esc(why.get('reason'))}",
                },
                {"type": "mrkdwn", "text": _deadline(card)},
            ],
        },
    ]
    if card.get("agent_reason"):
        blocks.append(
            section(f"*The agent says (its words, unverified):*\n{esc(card['agent_reason'])}")
        )
    if what.get("body"):
        blocks.append(section(code(str(what["body"]))))
    sha = str(card.get("request_sha256") or "")
    blocks.append(context(f"request sha256 `{esc(sha[:16])}…` · {esc(card.get('summary', ''))}"))
    blocks.extend(_decide(card, inbox_url) if status == "pending" else [_outcome(card)])
    return {"text": f"{headline}: {esc(ref)} ({esc(what.get('title'), 200)})", "blocks": blocks}


def _deadline(card: Mapping[str, Any]) -> str:
    deadline = card.get("if_nobody_answers") or {}
    if card.get("status") != "pending":
        return f"*Outcome:*\n{esc(card.get('status'))}"
    then = THEN.get(str(deadline.get("on_timeout")), "nothing is decided automatically")
    return f"*If nobody answers* by {when(deadline.get('expires_at'))}:\n{then}"


def _decide(card: Mapping[str, Any], inbox_url: str | None) -> list[dict[str, Any]]:
    approvals = card.get("approvals") or {}
    have, needed = list(approvals.get("have") or []), int(approvals.get("needed") or 1)
    blocks = []
    if have:
        who = ", ".join(esc(name) for name in have)
        blocks.append(context(f"Approved so far by {who} ({len(have)} of {needed})"))
    url = link(inbox_url, card)
    elements: list[dict[str, Any]] = []
    if card.get("slack_buttons"):
        value = json.dumps({"ref": card["ref"], "sha256": card["request_sha256"]})
        elements += [
            {
                "type": "button",
                "action_id": "approve",
                "text": plain("Approve"),
                "style": "primary",
                "value": value,
                "confirm": {
                    "title": plain("Approve this request?"),
                    "text": {"type": "mrkdwn", "text": _confirm(card)},
                    "confirm": plain("Approve"),
                    "deny": plain("Cancel"),
                },
            },
            {
                "type": "button",
                "action_id": "deny",
                "text": plain("Deny…"),
                "style": "danger",
                "value": value,
            },
        ]
    else:
        ref = esc(card["ref"])
        blocks.append(
            context(
                "No buttons for this request (its rule does not allow deciding it in Slack): "
                f"decide in the inbox, or `broker approve {ref}` / `broker deny {ref} --reason …`"
            )
        )
    if url:
        elements.append(
            {"type": "button", "action_id": "open", "text": plain("Open in the inbox"), "url": url}
        )
    if elements:
        blocks.append({"type": "actions", "block_id": "decide", "elements": elements})
    return blocks


def _confirm(card: Mapping[str, Any]) -> str:
    sha = str(card.get("request_sha256") or "")[:12]
    warn = " It cannot be undone." if card.get("reversible") is False else ""
    return f"Approve `{esc(card['ref'])}` (sha256 `{esc(sha)}…`) as you see it here?{warn}"


def _outcome(card: Mapping[str, Any]) -> dict[str, Any]:
    status = str(card.get("status"))
    icon = "⚠️" if card.get("warning") else ICON.get(status, "⌛" if status == "expired" else "•")
    said = esc(card.get("reason"))
    if card.get("warning"):
        said = f"{esc(card['warning'])} · {said}"
    elif status in ("approved", "applying"):
        said += " · applying…"
    for item in card.get("links") or ():  # what came back, one click away
        said += f" · <{esc(item['url'], 2000)}|{esc(item['key'], 80)}>"
    return context(f"{icon} {said}")


def deny_view(card: Mapping[str, Any], channel: str, ts: str) -> dict[str, Any]:
    """The dialog that asks for the reason of a denial (the agent reads it)."""
    meta = {"ref": card["ref"], "sha256": card["request_sha256"], "channel": channel, "ts": ts}
    title = esc((card.get("what") or {}).get("title"), 300)
    return {
        "type": "modal",
        "callback_id": DENY_VIEW,
        "title": plain("Deny the request"),
        "submit": plain("Deny"),
        "close": plain("Cancel"),
        "private_metadata": json.dumps(meta),
        "blocks": [
            section(f"Deny `{esc(card['ref'])}`: {title}"),
            {
                "type": "input",
                "block_id": "reason",
                "label": plain("Reason: the agent reads it, so say what to do instead"),
                "element": {
                    "type": "plain_text_input",
                    "action_id": "reason",
                    "multiline": True,
                    "max_length": 2000,
                },
            },
        ],
    }


def reminder(ref: str, expires_at: float | None, on_timeout: str | None) -> str:
    """The threaded reminder before a deadline."""
    then = THEN.get(str(on_timeout), "nothing is decided automatically")
    if expires_at is None:
        return f"⏰ Reminder: `{esc(ref)}` still waits for a decision."
    stamp = f"<!date^{int(expires_at)}^{{date_short_pretty}} at {{time}}|soon>"
    return f"⏰ Reminder: `{esc(ref)}` still waits for a decision; at {stamp} {then}."
