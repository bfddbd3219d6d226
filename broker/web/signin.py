"""Signing in with the identity provider ([web.oidc]): `/login/oidc` sends the browser
to the provider, `/oidc/callback` takes it back. The token form (`/login`) stays for
small teams, and bearer tokens for API clients.

Each flow's `state`, `nonce` and PKCE verifier stay in the inbox's memory (ten minutes,
used once); the browser carries only the state, in a cookie bound to this flow, so a
code from another browser, a replayed callback or a forged state signs nobody in. A
session ends at the ID token's `exp`, or `session_ttl` if sooner. A step-up
(`?step_up=SECONDS`, sent when a decision needs a fresh sign-in) asks the provider for
`max_age` and `prompt=login`, and is refused if the provider's `auth_time` is older.
"""

from __future__ import annotations

import html
import secrets
import threading
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from broker.clock import REAL, Clock
from broker.errors import SignInError
from broker.identity import Proof
from broker.web.auth import SESSION_COOKIE
from broker.web.oidc import LEEWAY_S, OidcSettings, Provider, Started
from broker.web.pages import Pages, PagesDep, login_page, safe_next

FLOW_COOKIE = "broker_oidc"
FLOW_TTL_S = 600.0
MAX_FLOWS = 10_000


@dataclass(frozen=True)
class Flow:
    started: Started
    next: str
    step_up_s: float | None
    at: float


class SignIn:
    """The provider and the flows under way (in memory: a restart ends them)."""

    def __init__(self, settings: OidcSettings, provider: Provider, clock: Clock = REAL) -> None:
        self.settings = settings
        self.provider = provider
        self.clock = clock
        self._flows: dict[str, Flow] = {}
        self._lock = threading.Lock()

    def begin(self, redirect_uri: str, target: str, step_up_s: float | None) -> Flow:
        flow = Flow(
            self.provider.start(redirect_uri, max_age_s=step_up_s),
            target,
            step_up_s,
            self.clock.monotonic(),
        )
        with self._lock:
            moment = self.clock.monotonic()
            for old in [k for k, f in self._flows.items() if moment - f.at > FLOW_TTL_S]:
                del self._flows[old]
            while len(self._flows) >= MAX_FLOWS:
                del self._flows[next(iter(self._flows))]
            self._flows[flow.started.state] = flow
        return flow

    def take(self, state: str) -> Flow | None:
        """The flow this state started, once; None if unknown, used or too old."""
        with self._lock:
            flow = self._flows.pop(state, None)
        if flow is None or self.clock.monotonic() - flow.at > FLOW_TTL_S:
            return None
        return flow

    def admitted(self, pages: Pages, proof: Proof) -> str | None:
        """The approver this sign-in is, if it may sign in: an [approvers] oidc_sub, or a
        member of one of sign_in_groups."""
        people = pages.gate.people
        if proof.subject in people.subjects or proof.groups & self.settings.sign_in_groups:
            return people.of_proof(proof)
        return None


def the_sign_in(request: Request) -> SignIn | None:
    sign_in: SignIn | None = request.app.state.sign_in
    return sign_in


SignInDep = Annotated[SignIn | None, Depends(the_sign_in)]
router = APIRouter(include_in_schema=False)


def callback_url(pages: Pages, request: Request) -> str:
    """Where the provider sends the browser back: [notify] inbox_url's, else this host's."""
    base = pages.inbox_url or str(request.base_url).rstrip("/")
    return f"{base}/oidc/callback"


@router.get("/login/oidc")
def start(
    request: Request,
    pages: PagesDep,
    sign_in: SignInDep,
    next: str = "/",
    step_up: Annotated[float | None, Query(gt=0, le=86400)] = None,
) -> Response:
    if sign_in is None:
        return pages.error(request, 404, "Not here", "This inbox has no [web.oidc] sign-in.")
    try:
        flow = sign_in.begin(callback_url(pages, request), safe_next(next), step_up)
    except SignInError as exc:
        return login_page(pages, request, next, f"The identity provider: {exc}", 502)
    response = RedirectResponse(flow.started.url, status_code=303)
    # Lax: the provider's redirect back is a top-level navigation from its own site
    response.set_cookie(
        FLOW_COOKIE,
        flow.started.state,
        max_age=int(FLOW_TTL_S),
        path="/oidc/",
        httponly=True,
        samesite="lax",
        secure=pages.secure_cookie,
    )
    return response


@router.get("/oidc/callback")
def callback(
    request: Request,
    pages: PagesDep,
    sign_in: SignInDep,
    code: Annotated[str, Query(max_length=4096)] = "",
    state: Annotated[str, Query(max_length=512)] = "",
    error: Annotated[str, Query(max_length=200)] = "",
) -> Response:
    if sign_in is None:
        return pages.error(request, 404, "Not here", "This inbox has no [web.oidc] sign-in.")
    mine = request.cookies.get(FLOW_COOKIE, "")
    flow = sign_in.take(state) if state and secrets.compare_digest(mine, state) else None
    if flow is None:
        problem = (
            "This sign-in was not started in this browser, or was used already; sign in again."
        )
        return _refused(pages, request, "/", problem, 400)
    if error:
        return _refused(pages, request, flow.next, f"The identity provider said: {error}", 401)
    try:
        proof = sign_in.provider.finish(callback_url(pages, request), code, flow.started)
    except SignInError as exc:
        return _refused(pages, request, flow.next, f"Not signed in: {exc}.", 401)
    person = sign_in.admitted(pages, proof)
    if person is None:
        problem = (
            f"{proof.name} signed in with the identity provider, but is not an approver "
            "here (no [approvers] oidc_sub, and in none of web.oidc.sign_in_groups)."
        )
        return _refused(pages, request, flow.next, problem, 403)
    if flow.step_up_s is not None and not _recent(sign_in.clock, proof, flow.step_up_s):
        problem = "The identity provider did not sign you in again; a fresh sign-in is needed."
        return _refused(pages, request, flow.next, problem, 401)
    sid, session = pages.gate.sessions.open(person, proof)
    life = int(session.expires - pages.gate.sessions.clock.monotonic())
    response = _onward(flow.next)
    pages.cookie(response, SESSION_COOKIE, sid, max(life, 1))
    response.delete_cookie(FLOW_COOKIE, path="/oidc/", httponly=True, samesite="lax")
    return response


def _recent(clock: Clock, proof: Proof, max_age_s: float) -> bool:
    if proof.auth_time is None:
        return False
    return clock.now().timestamp() - proof.auth_time <= max_age_s + LEEWAY_S


def _refused(pages: Pages, request: Request, target: str, problem: str, status: int) -> Response:
    response = login_page(pages, request, target, problem, status)
    response.delete_cookie(FLOW_COOKIE, path="/oidc/", httponly=True, samesite="lax")
    return response


def _onward(target: str) -> HTMLResponse:
    """A page that moves on to `target` by itself: a navigation from this site, so the
    new SameSite=Strict session cookie goes with it (a redirect from the provider's
    site would arrive without it)."""
    url = html.escape(safe_next(target), quote=True)
    return HTMLResponse(
        f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={url}">'
        f'<title>Signed in</title><p>Signed in. <a id="onward" href="{url}">Continue</a></p>'
    )


def step_up_url(target: str, max_age_s: float) -> str:
    """Where a decision that needs a fresh sign-in sends the browser first."""
    return f"/login/oidc?next={quote(safe_next(target), safe='')}&step_up={max(1, int(max_age_s))}"
