"""The inbox pages: server-rendered HTML for reviewers in a browser; the renderer, sign-in
and history here, the waiting list and request pages in broker.web.waiting.

Every value printed by a template goes through `render.shown` (Jinja's `finalize`):
escaped, with control, bidi and zero-width characters made visible. Regions marked
`data-live` are swapped in place by static/inbox.js when the ledger changes.
"""

from __future__ import annotations

import html
import secrets
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from broker.models import Record
from broker.outcomes import service_warning
from broker.untrusted import neutralize
from broker.web import html as render
from broker.web.auth import LOGIN_COOKIE, SESSION_COOKIE, Gate, Identity, same_secret
from broker.web.inbox import Inbox

TEMPLATES = Path(__file__).parent / "templates"
FormText = Annotated[str, Form(max_length=4000)]


def _finalize(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and not isinstance(value, Markup):
        return render.shown(value)
    return value


def attribute(value: Any) -> Markup:
    """A value for inside an HTML attribute: neutralised to plain text and escaped, never
    the marked-up form (a tag inside an attribute would be garbage, or worse)."""
    return Markup(html.escape(neutralize(str(value or "")), quote=True))


def warned(record: Record) -> str | None:
    return service_warning(record.state, record.output)


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        finalize=_finalize,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["multiline"] = lambda text: render.shown(str(text or ""), keep_newlines=True)
    env.filters["duration"] = render.duration
    env.filters["attr"] = attribute
    env.globals.update(
        warned=warned,
        body_lines=render.body_lines,
        then=render.then,
        request_url=render.request_url,
        yn=lambda flag: "?" if flag is None else ("yes" if flag else "no"),
    )
    return env


def safe_next(target: str | None) -> str:
    """Only a path on this site: never another origin after signing in."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


class Pages:
    """Renders pages with what every page shows: who is signed in, what waits."""

    def __init__(
        self,
        inbox: Inbox,
        gate: Gate,
        *,
        secure_cookie: bool,
        oidc: bool = False,
        inbox_url: str | None = None,
    ) -> None:
        self.inbox = inbox
        self.gate = gate
        self.secure_cookie = secure_cookie
        self.oidc = oidc  # [web.oidc]: the sign-in page offers the identity provider
        self.inbox_url = inbox_url
        self.env = environment()

    def html(
        self,
        name: str,
        request: Request,
        who: Identity | None,
        status: int = 200,
        *,
        live_url: str | None = None,
        cursor: int | None = None,
        **context: Any,
    ) -> HTMLResponse:
        """Render `name`; `live_url` is where the page's script fetches fresh copies.

        `cursor` is the change mark read before the page's data (else it is read now): a
        mark read after would hide a change made in between from the page's live updates.
        """
        if cursor is None:
            cursor = self.inbox.cursor() if who else 0
        waiting = self.inbox.waiting() if who else 0
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        text = self.env.get_template(name).render(
            who=who,
            csrf=who.session.csrf if who and who.session else "",
            cursor=cursor,
            waiting=waiting,
            path=request.url.path,
            live_url=live_url or here,
            **context,
        )
        return HTMLResponse(text, status_code=status)

    def error(self, request: Request, status: int, title: str, message: str) -> HTMLResponse:
        who = self.signed_in(request)
        return self.html("error.html", request, who, status, title=title, message=message)

    def signed_in(self, request: Request) -> Identity | None:
        who = self.gate.identity(request)
        return who if who is not None and who.session is not None else None

    def form_poster(
        self, request: Request, csrf: str, title: str, expired: str
    ) -> Identity | Response:
        """The signed-in person behind a form post carrying their own CSRF token; else the
        answer to give instead: to sign in, or a 403 page saying `title` and `expired`."""
        who = self.signed_in(request)
        if who is None or who.session is None:
            return self.to_login(request)
        if not same_secret(who.session.csrf, csrf):
            return self.error(request, 403, title, expired)
        return who

    def to_login(self, request: Request) -> RedirectResponse:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)

    def cookie(self, response: Response, name: str, value: str, max_age: int) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path="/",
            httponly=True,
            samesite="strict",
            secure=self.secure_cookie,
        )


def the_pages(request: Request) -> Pages:
    """The app's page renderer (set by create_app)."""
    pages: Pages = request.app.state.pages
    return pages


PagesDep = Annotated[Pages, Depends(the_pages)]
router = APIRouter(include_in_schema=False)


def login_page(
    pages: Pages, request: Request, target: str, problem: str | None, status: int
) -> Response:
    """The sign-in page (the token form, and the identity provider's button)."""
    nonce = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(32)
    response = pages.html(
        "login.html",
        request,
        None,
        status,
        nonce=nonce,
        next=safe_next(target),
        problem=problem,
        nobody=not pages.gate.approvers and not pages.oidc,
        oidc=pages.oidc,
    )
    pages.cookie(response, LOGIN_COOKIE, nonce, 3600)
    return response


@router.get("/login")
def login_form(request: Request, pages: PagesDep, next: str = "/") -> Response:
    if pages.signed_in(request):
        return RedirectResponse(safe_next(next), status_code=303)
    return login_page(pages, request, next, None, 200)


@router.post("/login")
def login(
    request: Request,
    pages: PagesDep,
    token: FormText = "",
    csrf: FormText = "",
    next: FormText = "/",
) -> Response:
    if not same_secret(request.cookies.get(LOGIN_COOKIE) or "", csrf):
        return login_page(pages, request, next, "This sign-in form expired; sign in again.", 403)
    name = pages.gate.identify(token.strip()) if token.strip() else None
    if name is None:
        return login_page(pages, request, next, "That is not an approver's token.", 401)
    sid, _ = pages.gate.sessions.open(name)
    response = RedirectResponse(safe_next(next), status_code=303)
    pages.cookie(response, SESSION_COOKIE, sid, int(pages.gate.sessions.ttl_s))
    response.delete_cookie(LOGIN_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.post("/logout")
def logout(request: Request, pages: PagesDep, csrf: FormText = "") -> Response:
    who = pages.signed_in(request)
    if who is not None and who.session is not None:
        if not same_secret(who.session.csrf, csrf):
            return pages.error(request, 403, "Not signed out", "The form expired; try again.")
        pages.gate.sessions.close(request.cookies.get(SESSION_COOKIE, ""))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response
