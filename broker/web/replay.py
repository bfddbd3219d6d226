"""The inbox's "what would change" view (under History) and its API: a reviewer pastes or
uploads a policy file and sees what replaying the ledger through it would change (as
`broker policy replay`; read-only). And "Approve and propose a rule" on a request's
card: the narrowest rule for it, stored as a proposal someone accepts (broker.review.proposals).
"""

from __future__ import annotations

import difflib
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from broker.clock import now, parse_duration
from broker.errors import BrokerError
from broker.review.replay import MAX_POLICY_TEXT, policy_from_text, replay, replay_controls
from broker.web.api import GUARDED, ApiError, InboxDep, Who, _responses
from broker.web.inbox import Inbox
from broker.web.pages import FormText, PagesDep

router = APIRouter(include_in_schema=False)
api = APIRouter()


class ReplayIn(BaseModel):
    """A policy to replay the ledger through."""

    model_config = ConfigDict(extra="forbid")

    policy: str = Field(max_length=MAX_POLICY_TEXT, description="the policy file's TOML text")
    since: str | None = Field(None, max_length=32, description="a window such as 30d")
    sandbox: str | None = Field(None, max_length=128)


def _since(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return now() - timedelta(seconds=parse_duration(text))
    except (ValueError, OverflowError) as exc:
        raise BrokerError(f"since {text!r}: expected a duration like 24h or 30d") from exc


def run_replay(inbox: Inbox, text: str, since: str | None, sandbox: str | None) -> dict[str, Any]:
    """The replay report as `broker policy replay --json` gives it; BrokerError on bad input."""
    policy = policy_from_text(text, inbox.registry)
    start = _since(since)
    with inbox.ledger() as ledger:
        controls = replay_controls(ledger)
        report = replay(policy, ledger.all(), controls=controls, since=start, sandbox=sandbox)
    return report.to_json()


@api.post("/policy/replay", responses={**GUARDED, **_responses(400, 413)})
def replay_api(body: ReplayIn, inbox: InboxDep, who: Who) -> dict[str, Any]:
    """What replaying every past request through this policy would change (read-only);
    `exit_code` is 3 when anything would be loosened."""
    try:
        return run_replay(inbox, body.policy, body.since, body.sandbox or None)
    except BrokerError as exc:
        raise ApiError(422, "invalid_policy", str(exc)) from exc


def current_policy(inbox: Inbox) -> str:
    """The text of the policy file the broker serves with ("" when there is none)."""
    path = inbox.config.policy_path
    try:
        return path.read_text(encoding="utf-8")[:MAX_POLICY_TEXT] if path else ""
    except (OSError, UnicodeDecodeError):
        return ""


def policy_diff(current: str, pasted: str) -> str:
    """The pasted policy against the current one, as a unified diff ("" when the same)."""
    lines = difflib.unified_diff(
        current.splitlines(keepends=True),
        pasted.splitlines(keepends=True),
        "the current policy",
        "the pasted policy",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@router.get("/history/replay")
def replay_form(request: Request, pages: PagesDep) -> Response:
    who = pages.signed_in(request)
    if who is None:
        return pages.to_login(request)
    start = {"since": "", "sandbox": "", "policy": current_policy(pages.inbox)}
    return pages.html("replay.html", request, who, report=None, problem=None, form=start, diff="")


@router.post("/history/replay")
async def replay_page(
    request: Request,
    pages: PagesDep,
    csrf: FormText = "",
    since: FormText = "",
    sandbox: FormText = "",
    policy: Annotated[str, Form(max_length=MAX_POLICY_TEXT)] = "",
    upload: Annotated[UploadFile | None, File()] = None,
) -> Response:
    from starlette.concurrency import run_in_threadpool

    who = pages.form_poster(
        request, csrf, "Not replayed", "The form expired; reload and try again."
    )
    if isinstance(who, Response):
        return who
    text = policy
    if upload is not None and upload.filename:
        raw = await upload.read(MAX_POLICY_TEXT + 1)
        text = raw.decode("utf-8", "replace")
    form = {"since": since, "sandbox": sandbox, "policy": text}
    problem, report = None, None
    if not text.strip():
        problem = "Paste a policy file, or choose one to upload."
    else:
        try:
            report = await run_in_threadpool(
                run_replay, pages.inbox, text, since.strip() or None, sandbox.strip() or None
            )
        except BrokerError as exc:
            problem = str(exc)
    status = 422 if problem else 200
    diff = policy_diff(current_policy(pages.inbox), text) if text.strip() else ""
    return pages.html(
        "replay.html",
        request,
        who,
        status,
        report=report,
        problem=problem,
        form=form,
        diff=diff,
    )


def propose_for(inbox: Inbox, sandbox: str, request_id: str, who: str) -> str:
    """After an approval on the card: the proposal's notice for the next page."""
    from broker.approval.decisions import wake
    from broker.policy.ruleset import load_policy
    from broker.review.drafting import DraftError
    from broker.review.proposals import propose

    registry = inbox.registry
    try:
        policy = load_policy(inbox.config.policy_path, registry.reversibility(), registry.schemas())
        with inbox.ledger() as ledger:
            record = ledger.get(sandbox, request_id)
            if record is None:
                return "No rule was proposed: the request is gone."
            number, value, new = propose(ledger, policy, record, who)
            wake(inbox.config, ledger, "proposal")
    except DraftError as exc:
        return f"No rule was proposed: {exc}"
    except BrokerError as exc:
        return f"No rule was proposed: {exc}"
    r = value.get("replay") or {}
    said = "Proposed" if new else "Already proposed"
    return (
        f"{said} as rule {number} ({value.get('state')}): {value['rule']['effect']} when "
        f"{value['rule']['when']}; it matches {r.get('matches', 0)} past request(s), "
        f"{r.get('would_auto', 0)} of which would have applied without a person. It takes "
        f"effect once someone accepts it (broker policy accept {number})."
    )
