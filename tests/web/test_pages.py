"""The inbox pages as a browser without JavaScript sees them: sign-in, cards, forms."""

from __future__ import annotations

import re
from typing import Any

import httpx

from tests.web.conftest import FILES_REASON, TOKENS, Web, csrf_of

HOSTILE_CONTENT = "line one\n<script>window.pwned = 1</script> \u202eevil\x1b[31m red\u200d\n"
HOSTILE_REASON = "trust me \u202e\x1b[2J <b>really</b>"


def form_post(
    web: Web, browser: httpx.Client, result: dict[str, Any], **fields: str
) -> httpx.Response:
    """Post the decision form of `result` with the session's CSRF token unless given."""
    page = browser.get(f"/requests/default/{result['id']}")
    data = {
        "csrf": csrf_of(page.text),
        "request_sha256": str(result["request_sha256"]),
        "verdict": "approve",
        "reason": "",
    }
    data.update(fields)
    return browser.post(f"/requests/default/{result['id']}/decision", data=data)


def test_pages_send_a_stranger_to_sign_in(idle: Web) -> None:
    """Without a session, every page redirects to /login, keeping where it was going."""
    for path in ("/", "/history", "/requests/default/abc"):
        response = idle.client(None).get(path)
        assert response.status_code == 303
        assert response.headers["location"].startswith("/login?next=")


def test_sign_in_sets_a_strict_httponly_cookie(idle: Web) -> None:
    """A right token gives a session cookie the page's scripts cannot read, sent same-site only."""
    client = idle.client(None)
    form = client.get("/login")
    response = client.post(
        "/login", data={"token": TOKENS["alice"], "csrf": csrf_of(form.text), "next": "/history"}
    )
    assert response.status_code == 303 and response.headers["location"] == "/history"
    cookie = next(
        c for c in response.headers.get_list("set-cookie") if c.startswith("broker_session=")
    )
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "signed in as <strong>alice</strong>" in client.get("/").text


def test_sign_in_with_a_wrong_token_says_so(idle: Web) -> None:
    """A token that is no approver's leaves the browser signed out, with a message."""
    client = idle.client(None)
    form = client.get("/login")
    response = client.post("/login", data={"token": "bkr_wrong", "csrf": csrf_of(form.text)})
    assert response.status_code == 401
    assert "not an approver&#x27;s token" in response.text
    assert client.get("/").status_code == 303


def test_sign_in_without_the_form_nonce_is_refused(idle: Web) -> None:
    """A sign-in posted from elsewhere (no nonce matching the cookie) does not sign in."""
    client = idle.client(None)
    response = client.post("/login", data={"token": TOKENS["alice"], "csrf": "forged"})
    assert response.status_code == 403
    assert client.get("/").status_code == 303


def test_sign_in_never_redirects_off_site(idle: Web) -> None:
    """`next` pointing at another origin lands on the inbox instead."""
    client = idle.client(None)
    form = client.get("/login")
    response = client.post(
        "/login",
        data={"token": TOKENS["bob"], "csrf": csrf_of(form.text), "next": "//evil.example/x"},
    )
    assert response.headers["location"] == "/"


def test_inbox_lists_what_waits(web: Web) -> None:
    """The inbox shows each waiting request's ref, title, destination and deadline."""
    waiting = web.gated()
    page = web.browser().get("/").text
    assert f"default/{waiting['id']}" in page
    assert "record &#x27;hello&#x27;" in page
    assert "test: test.record" in page
    assert "it is denied (fails closed)" in page
    assert "<title>(1) Waiting" in page


def test_request_page_shows_the_card(web: Web) -> None:
    """A request's page shows the coloured diff, the rule, the deadline, the agent's words."""
    params = {"path": "notes.txt", "content": "line one\nline 2\nline three\n", "overwrite": True}
    waiting = web.gated("files.write", params=params, reason="fix the typo")
    page = web.browser().get(f"/requests/default/{waiting['id']}").text
    assert '<span class="line del">-line two</span>' in page
    assert '<span class="line add">+line 2</span>' in page
    assert FILES_REASON in page
    assert 'class="countdown" data-left="' in page
    assert "it is denied (fails closed)" in page
    assert re.search(r'<blockquote class="agent-words">fix the typo</blockquote>', page)
    assert "its own words, not verified" in page
    assert waiting["request_sha256"] in page


def test_hostile_text_is_escaped_and_made_visible(web: Web) -> None:
    """Markup, bidi overrides, ANSI and zero-width characters arrive as visible, inert text."""
    params = {"path": "new.txt", "content": HOSTILE_CONTENT}
    waiting = web.gated("files.write", params=params, reason=HOSTILE_REASON)
    page = web.browser().get(f"/requests/default/{waiting['id']}").text
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in page
    assert "<script>window" not in page
    assert '<span class="ctl">&lt;U+202E RLO&gt;</span>' in page
    assert '<span class="ctl">\\x1b</span>' in page
    assert '<span class="ctl">&lt;U+200D ZWJ&gt;</span>' in page
    assert "&lt;b&gt;really&lt;/b&gt;" in page
    for raw in ("\u202e", "\x1b", "\u200d"):
        assert raw not in page


def test_pages_have_no_inline_script(web: Web) -> None:
    """Every script is a static file: the CSP can forbid inline ones."""
    web.gated()
    browser = web.browser()
    pages = [browser.get("/"), browser.get("/history"), web.client(None).get("/login")]
    for page in pages:
        scripts = re.findall(r"<script[^>]*>", page.text)
        assert scripts == ['<script src="/static/inbox.js" defer>']


def test_approve_form_applies_the_request(web: Web) -> None:
    """Approving on the page applies the effect, recorded as the signed-in approver via web."""
    waiting = web.gated()
    browser = web.browser("bob")
    response = form_post(web, browser, waiting, reason="looks right")
    assert response.status_code == 303
    result = web.harness.wait(waiting["id"])
    assert (result["status"], result["reason"]) == ("applied", "approved by bob: looks right")
    page = browser.get(response.headers["location"]).text
    assert "Your approval is recorded." in page


def test_deny_form_needs_a_reason(web: Web) -> None:
    """Deny without a reason is refused on the page; with one, the agent reads it."""
    waiting = web.gated()
    browser = web.browser()
    refused = form_post(web, browser, waiting, verdict="deny", reason=" ")
    assert refused.status_code == 422
    assert "A denial needs a reason" in refused.text
    form_post(web, browser, waiting, verdict="deny", reason="write to scratch/ instead")
    result = web.harness.wait(waiting["id"])
    assert result["reason"] == "denied by alice: write to scratch/ instead"


def test_form_post_without_the_csrf_token_is_refused(web: Web) -> None:
    """A decision form posted with a missing or wrong CSRF token records nothing (403)."""
    waiting = web.gated()
    browser = web.browser()
    for token in ("", "forged"):
        response = form_post(web, browser, waiting, csrf=token)
        assert response.status_code == 403
        assert "CSRF" in response.text
    assert web.client().get("/api/v1/pending").json()["requests"][0]["status"] == "pending"


def test_stale_form_shows_why_it_was_refused(web: Web) -> None:
    """A form for other bytes than the request's is refused with the reason on the page."""
    waiting = web.gated()
    response = form_post(web, web.browser(), waiting, request_sha256="f" * 64)
    assert response.status_code == 409
    assert "look at it again" in response.text


def test_quorum_page_says_who_approved_and_hides_the_forms(web: Web) -> None:
    """After alice approves a two-person request, her page shows 1 of 2 and no buttons."""
    waiting = web.gated("test.quorum")
    browser = web.browser("alice")
    form_post(web, browser, waiting)
    page = browser.get(f"/requests/default/{waiting['id']}").text
    assert "1 of 2: alice" in page
    assert 'id="approve"' not in page
    assert "waits for 1 more approval(s)" in page
    assert 'id="approve"' in web.browser("bob").get(f"/requests/default/{waiting['id']}").text


def test_history_filters_by_effect_sandbox_and_outcome(web: Web) -> None:
    """The history page lists decided requests and narrows them by the filters."""
    approved, denied = web.gated(), web.gated()
    browser = web.browser()
    form_post(web, browser, approved)
    form_post(web, browser, denied, verdict="deny", reason="not today")
    web.harness.wait(approved["id"])
    everything = browser.get("/history").text
    assert approved["id"] in everything and denied["id"] in everything
    only_denied = browser.get("/history", params={"outcome": "denied"}).text
    assert denied["id"] in only_denied and approved["id"] not in only_denied
    assert "denied by alice: not today" in only_denied
    by_effect = browser.get("/history", params={"effect": "files.write"}).text
    assert "No decisions match." in by_effect
    by_sandbox = browser.get("/history", params={"sandbox": "default"}).text
    assert approved["id"] in by_sandbox


def test_unknown_request_page_is_404(idle: Web) -> None:
    """A request that does not exist gets a readable 404 page."""
    response = idle.browser().get("/requests/default/nope")
    assert response.status_code == 404
    assert "No such request" in response.text


def test_sign_out_ends_the_session(idle: Web) -> None:
    """After signing out, the same cookie no longer opens the inbox or the API."""
    browser = idle.browser()
    csrf = csrf_of(browser.get("/").text)
    cookie = browser.cookies["broker_session"]
    assert browser.post("/logout", data={"csrf": csrf}).status_code == 303
    stale = idle.client(None)
    stale.cookies.set("broker_session", cookie)
    assert stale.get("/").status_code == 303
    assert stale.get("/api/v1/pending").status_code == 401
