"""The inbox in a real headless Chromium: an agent asks, a person decides in the browser.

Needs Debian's chromium (`bash scripts/chromium-up.sh`); skips with that advice when it is
absent, and fails instead when $CI is set. Chromium resolves no name but 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.web.conftest import Web

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LIVE_S = 5_000  # ms: the page polls every second
HOSTILE = "<script>window.pwned = 1</script> \u202egnp.exe\x1b[31m red"


def _stays(tab: Any) -> None:
    """Mark the document, to tell later whether it was reloaded."""
    tab.evaluate("window.sameDocument = 'yes'")


def _not_reloaded(tab: Any) -> bool:
    return bool(tab.evaluate("window.sameDocument === 'yes'"))


def test_approve_and_deny_in_the_browser(page: Any, web: Web) -> None:
    """A request appears without reload, shows its diff, is approved; another is denied."""
    from playwright.sync_api import expect

    _stays(page)
    params = {"path": "notes.txt", "content": "line one\nline 2\nline three\n", "overwrite": True}
    first = web.gated("files.write", params=params, reason="fix the typo in line two")
    row = page.locator(f"a.ref:has-text('{first['id']}')")
    expect(row).to_be_visible(timeout=LIVE_S)
    assert _not_reloaded(page)
    expect(page.locator("[data-live=count]")).to_have_text("1")

    row.click()
    expect(page.locator("pre#preview .line.del")).to_have_text("-line two")
    expect(page.locator("pre#preview .line.add")).to_have_text("+line 2")
    expect(page.locator(".agent-words")).to_have_text("fix the typo in line two")
    expect(page.locator(".deadline")).to_contain_text("it is denied (fails closed)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "inbox-request.png"), full_page=True)
    page.click("#approve")
    expect(page.locator(".notice")).to_have_text(
        "Your approval is recorded. Nothing else waits for you."
    )
    assert web.harness.wait(first["id"])["status"] == "applied"
    written = web.harness.base.parent / "exports" / "default" / "notes.txt"
    assert written.read_text(encoding="utf-8") == params["content"]

    page.goto(f"{web.url}/")
    _stays(page)
    second = web.gated(reason="please")
    page.locator(f"a.ref:has-text('{second['id']}')").click(timeout=LIVE_S)
    page.click("#deny")  # an empty reason: the page asks for one and posts nothing
    assert page.evaluate("document.querySelector('#reason').validity.customError")
    assert page.evaluate("document.activeElement.id") == "reason"
    assert web.client().get(f"/api/v1/requests/default/{second['id']}").json()["status"] == (
        "pending"
    )
    page.fill("#reason", "record it in the scratch sandbox instead")
    page.click("#deny")
    expect(page.locator("h1 .status")).to_have_text("denied")
    result = web.harness.wait(second["id"])
    assert (result["status"], result["reason"]) == (
        "denied",
        "denied by alice: record it in the scratch sandbox instead",
    )


def test_hostile_preview_renders_inert_and_visible(page: Any, web: Web) -> None:
    """A <script>, a bidi override and an ANSI escape in a preview show as text, and never run."""
    from playwright.sync_api import expect

    hostile = web.gated("files.write", params={"path": "new.txt", "content": HOSTILE})
    page.goto(f"{web.url}/requests/default/{hostile['id']}")
    preview = page.locator("pre#preview")
    expect(preview).to_contain_text("<script>window.pwned = 1</script>")
    expect(preview).to_contain_text("<U+202E RLO>gnp.exe\\x1b[31m red")
    expect(page.locator("pre#preview .ctl")).to_have_count(2)
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.locator("pre#preview script").count() == 0


def test_request_page_follows_a_decision_taken_elsewhere(page: Any, web: Web) -> None:
    """While alice reads a request, bob denies it over the API; her page says so unreloaded."""
    from playwright.sync_api import expect

    waiting = web.gated()
    page.goto(f"{web.url}/requests/default/{waiting['id']}")
    _stays(page)
    expect(page.locator("#approve")).to_be_visible()
    response = web.client("bob").post(
        f"/api/v1/requests/default/{waiting['id']}/decision",
        json={"verdict": "deny", "reason": "not now", "request_sha256": waiting["request_sha256"]},
    )
    assert response.status_code == 200
    expect(page.locator(".outcome-reason")).to_have_text("denied by bob: not now", timeout=LIVE_S)
    expect(page.locator("#approve")).to_have_count(0)
    expect(page.locator(".countdown")).to_have_count(0)
    assert _not_reloaded(page)
