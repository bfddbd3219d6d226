"""The pages a reviewer decides on: the waiting list (filters, batch decisions over a
selection), a request's page, and its decision form, which then opens the next request
waiting. Rendered by broker.web.pages; decisions go through broker.web.inbox.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from broker.approval.card import Narrowing, output_text
from broker.approval.decisions import Ballot
from broker.errors import RequestNotFound
from broker.web import html as render
from broker.web.auth import Identity
from broker.web.inbox import Inbox, Pick, Refused
from broker.web.pages import FormText, Pages, PagesDep
from broker.web.shapes import MAX_BATCH
from broker.web.signin import step_up_url
from broker.web.undo import undoable

DONE = {
    "undo": "Undone: the reversal is recorded in the audit log.",
    "approve": "Your approval is recorded.",
    "deny": "Your denial is recorded; the agent reads your reason.",
}
BATCH_DONE = {"approve": "approval recorded", "deny": "denial recorded"}
REF = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/([A-Za-z0-9_-]{1,128})")
PICK = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/([A-Za-z0-9_-]{1,128})/([0-9a-f]{64})")
router = APIRouter(include_in_schema=False)


@router.get("/")
def waiting(
    request: Request, pages: PagesDep, effect: str = "", sandbox: str = "", q: str = ""
) -> Response:
    who = pages.signed_in(request)
    if who is None:
        return pages.to_login(request)
    return _inbox_page(pages, request, who, Narrowing(effect or None, sandbox or None, q[:200]))


def _inbox_page(
    pages: Pages,
    request: Request,
    who: Identity,
    narrowing: Narrowing,
    status: int = 200,
    **context: Any,
) -> Response:
    cursor = pages.inbox.cursor()  # before the cards: the page is at least this new
    everything = pages.inbox.pending()
    cards = [c for c in everything if narrowing.keeps(c)]
    facets = {
        "effects": sorted({str(c["effect"]) for c in everything if c.get("effect")}),
        "sandboxes": sorted({str(c["sandbox"]) for c in everything}),
    }
    query = {
        k: v
        for k, v in (
            ("effect", narrowing.effect),
            ("sandbox", narrowing.sandbox),
            ("q", narrowing.text),
        )
        if v
    }
    context.setdefault("outcome", None)
    context.setdefault("problem", None)
    return pages.html(
        "inbox.html",
        request,
        who,
        status,
        live_url="/" + (f"?{urlencode(query)}" if query else ""),
        cursor=cursor,
        cards=cards,
        facets=facets,
        narrowing=narrowing,
        narrowed=bool(query),
        **context,
    )


@router.post("/batch")
def batch(
    request: Request,
    pages: PagesDep,
    pick: Annotated[list[str], Form(max_length=MAX_BATCH)] = [],  # noqa: B006
    verdict: FormText = "",
    reason: FormText = "",
    csrf: FormText = "",
) -> Response:
    """One verdict over the selected requests: each its own decision on its own sha256."""
    who = pages.form_poster(
        request, csrf, "Not recorded", "The form expired (CSRF check); reload and decide again."
    )
    if isinstance(who, Response):
        return who
    said = reason.strip() or None
    picks = [Pick(*m.groups()) for m in (PICK.fullmatch(p) for p in pick) if m]
    problem = None
    if verdict not in ("approve", "deny"):
        problem = "Choose Approve selected or Deny selected."
    elif not pick:
        problem = "Select the requests to decide first: nothing is decided without a selection."
    elif len(picks) != len(pick):
        problem = "The selection was not understood; reload the page and select again."
    elif verdict == "deny" and said is None:
        problem = "A denial needs a reason: every agent in the selection reads it."
    elif len(said or "") > 2000:
        problem = "The reason is longer than 2,000 characters."
    if problem is not None:
        return _inbox_page(pages, request, who, Narrowing(), 422, problem=problem)
    done = pages.inbox.decide_many(
        picks, verdict, approver=who.approver, reason=said, surface="web", proof=who.proof
    )
    recorded = sum(1 for p in done if p.recorded)
    outcome = {
        "verdict": verdict,
        "done": BATCH_DONE[verdict],
        "recorded": recorded,
        "refused": len(done) - recorded,
        "picked": done,
    }
    return _inbox_page(pages, request, who, Narrowing(), outcome=outcome)


@router.get("/requests/{sandbox}/{request_id}")
def request_page(
    request: Request,
    pages: PagesDep,
    sandbox: str,
    request_id: str,
    done: str = "",
    of: str = "",
) -> Response:
    who = pages.signed_in(request)
    if who is None:
        return pages.to_login(request)
    notice = DONE.get(done)
    decided = REF.fullmatch(of) if notice else None
    if notice and decided and decided.groups() != (sandbox, request_id):
        notice += " Here is the next request waiting for you."
    elif notice and decided:
        notice += " Nothing else waits for you."
        decided = None
    return _request_page(
        pages, request, who, sandbox, request_id, notice, None, 200, decided=decided
    )


def _request_page(
    pages: Pages,
    request: Request,
    who: Identity,
    sandbox: str,
    request_id: str,
    notice: str | None,
    problem: str | None,
    status: int,
    *,
    decided: re.Match[str] | None = None,
) -> Response:
    cursor = pages.inbox.cursor()  # before the card: the page is at least this new
    try:
        card = pages.inbox.card(sandbox, request_id)
    except RequestNotFound as exc:
        return pages.error(request, 404, "No such request", str(exc))
    prev_key, next_key = pages.inbox.neighbours((sandbox, request_id))
    output = output_text(card.get("output"))
    return pages.html(
        "request.html",
        request,
        who,
        status,
        live_url=render.request_url(sandbox, request_id),
        cursor=cursor,
        card=card,
        notice=notice,
        problem=problem,
        decided_ref=decided.group(0) if decided else None,
        decided_url=render.request_url(*decided.groups()) if decided else None,
        prev_url=render.request_url(*prev_key) if prev_key else None,
        next_url=render.request_url(*next_key) if next_key else None,
        output_lines=render.body_lines(output, "json") if output else [],
        decided_by_me=who.approver in _deciders(pages.inbox, sandbox, request_id),
        undoable=undoable(pages.inbox, card),
    )


@router.post("/requests/{sandbox}/{request_id}/decision")
def decide(
    request: Request,
    pages: PagesDep,
    sandbox: str,
    request_id: str,
    verdict: FormText = "",
    reason: FormText = "",
    request_sha256: FormText = "",
    csrf: FormText = "",
) -> Response:
    who = pages.form_poster(
        request, csrf, "Not recorded", "The form expired (CSRF check); reload and decide again."
    )
    if isinstance(who, Response):
        return who
    said = reason.strip() or None
    problem = None
    proposing = verdict == "approve-propose"  # and draft a rule (broker.web.replay)
    verdict = "approve" if proposing else verdict
    if verdict not in ("approve", "deny"):
        problem = "Choose Approve or Deny."
    elif verdict == "deny" and said is None:
        problem = "A denial needs a reason: the agent reads it and should know what to do."
    elif len(said or "") > 2000:
        problem = "The reason is longer than 2,000 characters."
    if problem is not None:
        return _request_page(pages, request, who, sandbox, request_id, None, problem, 422)
    try:
        ref = f"{sandbox}/{request_id}"
        ballot = Ballot(ref, verdict, who.approver, said, "web", request_sha256, who.proof)
        pages.inbox.decide(ballot)
    except RequestNotFound as exc:
        return pages.error(request, 404, "No such request", str(exc))
    except Refused as exc:
        if exc.step_up_s is not None and request.app.state.sign_in is not None:
            # back through the provider for a fresh sign-in; then decide again
            again = step_up_url(render.request_url(sandbox, request_id), exc.step_up_s)
            return RedirectResponse(again, status_code=303)
        return _request_page(pages, request, who, sandbox, request_id, None, exc.message, 409)
    if proposing:
        from broker.web.replay import propose_for

        notice = f"{DONE['approve']} {propose_for(pages.inbox, sandbox, request_id, who.approver)}"
        return _request_page(pages, request, who, sandbox, request_id, notice, None, 200)
    following = pages.inbox.next_waiting(who.approver, (sandbox, request_id))
    target = following.key if following is not None else (sandbox, request_id)
    query = urlencode({"done": verdict, "of": f"{sandbox}/{request_id}"})
    return RedirectResponse(f"{render.request_url(*target)}?{query}", status_code=303)


def _deciders(inbox: Inbox, sandbox: str, request_id: str) -> list[str]:
    with inbox.ledger() as ledger:
        return [d.approver for d in ledger.decisions(sandbox, request_id)]
