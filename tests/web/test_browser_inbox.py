"""Working through the inbox in a real headless Chromium: keys, decide-then-next, batch
over a selection, search, the sticky decision bar, layouts at 1280 and 390 px without
horizontal overflow (screenshots checked too), dark mode, local times.

Needs Debian's chromium (`bash scripts/chromium-up.sh`), like tests/web/test_browser.py.
With BROKER_DOCS_SCREENSHOTS=1 the inbox's screenshots are also written to docs/.
"""

from __future__ import annotations

import os
import re
import struct
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.web.conftest import BROWSER_TZ, Web

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
DOCS = ROOT / "docs"
LIVE_S = 15_000  # ms: the page polls every second; a loaded CI machine needs the slack
OVERWRITE = {
    "path": "notes.txt",
    "content": "line one\nline 2\nline three\n",
    "overwrite": True,
}
WIDE = "x" * 180  # one unbroken word wider than a phone
OVERFLOW = """() => {
    // what sticks out past the window's right edge, unless an ancestor clips it (ellipsis)
    const width = document.documentElement.clientWidth;
    const clipped = (el) => {
        for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
            if (getComputedStyle(up).overflowX !== "visible"
                && up.getBoundingClientRect().right <= width + 0.5) return true;
        }
        return false;
    };
    const wide = [];
    for (const el of document.querySelectorAll("body *")) {
        const box = el.getBoundingClientRect();
        if (box.width && box.right > width + 0.5 && !clipped(el)) {
            wide.push(el.tagName + "." + el.className);
        }
    }
    return {scroll: document.documentElement.scrollWidth, width, wide: wide.slice(0, 5)};
}"""


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def status_of(web: Web, result: dict[str, Any]) -> str:
    card = web.client().get(f"/api/v1/requests/default/{result['id']}").json()
    return str(card["status"])


def active(page: Any) -> str:
    return str(page.evaluate("document.activeElement && document.activeElement.id"))


def png_width(path: Path) -> int:
    """The width of a PNG file, from its IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int(struct.unpack(">I", data[16:20])[0])


def shoot(page: Any, name: str, width: int) -> None:
    """A full-page screenshot into test-artifacts/ (and docs/ when asked), checked to be
    exactly as wide as the window: a wider one means something overflows."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"inbox-{name}-{width}.png"
    page.screenshot(path=str(path), full_page=True)
    assert png_width(path) == width, f"{name} at {width}px is wider than the window"


# -- keys and decide-then-next ----------------------------------------------------------


def test_keys_decide_and_the_next_waiting_request_opens(page: Any, web: Web) -> None:
    """On a request, `a` then Enter approves and opens the next one waiting; `d`, a reason
    and Ctrl+Enter denies it; each is recorded as alice with what she typed."""
    expect = _expect()
    first, second, third = (web.gated(reason=w) for w in ("one", "two", "three"))
    page.goto(f"{web.url}/requests/default/{first['id']}")
    page.keyboard.press("a")
    assert active(page) == "approve"
    page.keyboard.press("Enter")
    expect(page.locator(".notice")).to_contain_text("Here is the next request waiting for you.")
    expect(page.locator(".agent-words")).to_have_text("two")
    assert second["id"] in page.url
    page.wait_for_load_state()  # its script listens for keys
    page.keyboard.press("d")
    assert active(page) == "reason"
    page.keyboard.type("use the scratch sandbox")
    page.keyboard.press("Control+Enter")
    expect(page.locator(".notice")).to_contain_text("Your denial is recorded")
    expect(page.locator(".agent-words")).to_have_text("three")
    assert web.harness.wait(first["id"])["decided_by"] == "alice"
    denied = web.harness.wait(second["id"])
    assert (denied["status"], denied["reason"]) == (
        "denied",
        "denied by alice: use the scratch sandbox",
    )
    assert status_of(web, third) == "pending"


def test_j_and_k_move_between_waiting_requests(page: Any, web: Web) -> None:
    """j opens the next waiting request, k the previous one; neither decides anything."""
    expect = _expect()
    first, second = web.gated(reason="one"), web.gated(reason="two")
    page.goto(f"{web.url}/requests/default/{first['id']}")
    page.keyboard.press("j")
    expect(page.locator(".agent-words")).to_have_text("two")
    page.wait_for_load_state()
    page.keyboard.press("k")
    expect(page.locator(".agent-words")).to_have_text("one")
    assert (status_of(web, first), status_of(web, second)) == ("pending", "pending")


def test_list_keys_select_and_batch_approve(page: Any, web: Web) -> None:
    """In the list, j and x select two requests, a and Enter approve exactly those two; a
    request whose rule says batch = false cannot be selected."""
    expect = _expect()
    first, second, third = (web.gated(reason=f"r{n}") for n in range(3))
    careful = web.gated("test.careful", reason="careful")
    page.goto(f"{web.url}/")
    expect(page.locator("#items > .item")).to_have_count(4)
    expect(page.locator("#batch-approve")).to_be_disabled()  # no 'all' without a selection
    for key in ("j", "x", "j", "x"):
        page.keyboard.press(key)
    expect(page.locator("#selected-count")).to_contain_text("2 selected")
    expect(page.locator("#batch-approve")).to_have_text("Approve 2 selected")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("x")  # the careful one: nothing to select
    expect(page.locator("#selected-count")).to_contain_text("2 selected")
    careful_row = page.locator(f"#items > .item[data-ref='default/{careful['id']}']")
    expect(careful_row.locator(".alone")).to_be_visible()
    expect(careful_row.locator("input[name=pick]")).to_have_count(0)
    page.keyboard.press("a")
    assert active(page) == "batch-approve"
    page.keyboard.press("Enter")
    expect(page.locator("#batch-outcome")).to_contain_text("2 recorded, 0 not recorded")
    page.wait_for_url(f"{web.url}/")  # a reload shows the list; it does not post again
    for done in (first, second):
        assert web.harness.wait(done["id"])["status"] == "applied"
    assert (status_of(web, third), status_of(web, careful)) == ("pending", "pending")


def test_batch_deny_asks_for_the_reason_first(page: Any, web: Web) -> None:
    """Deny selected with an empty reason posts nothing and puts the focus on the reason."""
    expect = _expect()
    waiting = web.gated()
    page.goto(f"{web.url}/")
    page.locator("input[name=pick]").check()
    page.click("#batch-deny")
    assert active(page) == "batch-reason"
    assert status_of(web, waiting) == "pending"
    page.fill("#batch-reason", "not this week")
    page.click("#batch-deny")
    expect(page.locator("#batch-outcome")).to_contain_text("1 recorded")
    assert web.harness.wait(waiting["id"])["reason"] == "denied by alice: not this week"


def test_search_narrows_the_list_at_once_and_leaves_hidden_ones_out(page: Any, web: Web) -> None:
    """Typing in the search hides what does not match, keeps the URL in step, and a
    selected request that is hidden is not part of the batch."""
    expect = _expect()
    alpha = web.gated(reason="alpha release notes")
    beta = web.gated(reason="beta dashboard")
    page.goto(f"{web.url}/")
    page.locator(f".item[data-ref='default/{beta['id']}'] input[name=pick]").check()
    page.keyboard.press("/")
    assert active(page) == "q"
    page.keyboard.type("ALPHA")
    expect(page.locator("#items > .item:visible")).to_have_count(1)
    expect(page.locator(f".item[data-ref='default/{alpha['id']}']")).to_be_visible()
    assert page.url.endswith("/?q=ALPHA")
    expect(page.locator("#batch-approve")).to_be_disabled()  # beta is hidden: not selected
    page.select_option("select[name=effect]", "test.record")  # submits the filters
    expect(page.locator("select[name=effect]")).to_have_value("test.record")
    assert "effect=test.record" in page.url


def test_help_lists_the_shortcuts(page: Any, web: Web) -> None:
    """? opens the list of shortcuts; Escape closes it."""
    expect = _expect()
    page.keyboard.press("?")
    dialog = page.locator("#help")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Keyboard shortcuts")
    for key in ("j", "k", "a", "d", "x"):
        expect(dialog.locator("kbd", has_text=key).first).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()


# -- the card ---------------------------------------------------------------------------------


def test_decision_bar_stays_in_view_over_a_long_body(page: Any, web: Web) -> None:
    """Halfway down a 400-line body the Approve button and the sha256 it binds to are on
    screen; the line count is shown and 'jump to the end' reaches the end."""
    content = "".join(f"row {n}\n" for n in range(1, 401))
    waiting = web.gated("files.write", params={"path": "long.txt", "content": content})
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{web.url}/requests/default/{waiting['id']}")
    _expect()(page.locator(".line-count")).to_have_text("400 lines")
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight / 2)")
    assert page.evaluate("window.scrollY") > 2000
    for selector in ("#approve", "#deny", "#bar-sha"):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 800, selector
    assert page.locator("#bar-sha").inner_text() == waiting["request_sha256"]
    assert (
        page.evaluate(
            "getComputedStyle(document.querySelector('#preview .line'), '::before').content"
        )
        == "counter(line)"
    )
    page.click("#jump-end")
    end = page.locator("#preview-end").bounding_box()
    assert end is not None and 0 <= end["y"] <= 800
    assert page.evaluate("window.scrollY") > 5000


def test_output_appears_on_the_card_after_apply(page: Any, web: Web) -> None:
    """Approving a write shows, without a reload, what the handler returned."""
    expect = _expect()
    waiting = web.gated("files.write", params={"path": "fresh.txt", "content": "hello\n"})
    page.goto(f"{web.url}/requests/default/{waiting['id']}")
    page.click("#approve")
    expect(page.locator("h1 .status")).to_have_text("applied", timeout=LIVE_S)
    expect(page.locator("#output")).to_contain_text('"bytes": 6', timeout=LIVE_S)
    expect(page.locator(".outcome-applied")).to_be_visible()


def test_a_refresh_that_fails_is_fetched_again(page: Any, web: Web) -> None:
    """A page fetch the server answers with an error (here: every one until the request
    is applied, and one more) leaves the card as it is and is tried again; the card
    catches up once the server answers, rather than staying stale."""
    expect = _expect()
    waiting = web.gated("files.write", params={"path": "retry.txt", "content": "hello\n"})
    page.goto(f"{web.url}/requests/default/{waiting['id']}")
    result = web.harness.results / f"{waiting['id']}.json"
    refused: list[str] = []

    def answer(route: Any) -> None:
        done = result.exists() and '"applied"' in result.read_text()
        if route.request.headers.get("accept") == "text/html" and (not done or len(refused) < 2):
            refused.append(route.request.url)
            route.fulfill(status=503, body="busy")
        else:
            route.continue_()

    page.route(lambda url: "/requests/default/" in url, answer)
    web.client().post(
        f"/api/v1/requests/default/{waiting['id']}/decision",
        json={"verdict": "approve", "reason": "ok", "request_sha256": waiting["request_sha256"]},
    )
    expect(page.locator("h1 .status")).to_have_text("applied", timeout=LIVE_S)
    assert refused, "the page's refresh was never refused: the test did not test anything"


# -- layout, colours, time ----------------------------------------------------------------------


@pytest.mark.parametrize("width", [1280, 390])
def test_no_horizontal_overflow_at_desktop_and_phone_width(page: Any, web: Web, width: int) -> None:
    """The list, a long card and the history fit the window at 1280 and 390 px, even with
    an unbroken 180-character word; the full-page screenshots are exactly that wide."""
    long_path = f"{WIDE}/notes.txt"
    web.gated("files.write", params=OVERWRITE, reason="fix the typo in line two")
    wide = web.gated(
        "files.write",
        params={"path": long_path, "content": f"{WIDE}\n" * 30},
        reason=f"a long word: {WIDE}",
    )
    web.gated("test.careful", reason="rotate the staging credentials")
    decided = web.gated(reason="tidy up")
    web.client().post(
        f"/api/v1/requests/default/{decided['id']}/decision",
        json={"verdict": "deny", "reason": WIDE, "request_sha256": decided["request_sha256"]},
    )
    page.set_viewport_size({"width": width, "height": 900})
    for name, path in (
        ("list", "/"),
        ("request", f"/requests/default/{wide['id']}"),
        ("history", "/history"),
    ):
        page.goto(f"{web.url}{path}")
        page.wait_for_selector("main h1")
        found = page.evaluate(OVERFLOW)
        assert found["width"] == width
        assert found["scroll"] <= width, (name, found)
        assert found["wide"] == [], (name, found)
        shoot(page, name, width)


def test_dark_mode_follows_the_system_setting(page: Any, web: Web) -> None:
    """With the system in dark mode the page is dark; in light mode it is light."""
    web.gated("files.write", params=OVERWRITE)
    colour = "getComputedStyle(document.body).backgroundColor"
    page.emulate_media(color_scheme="dark")
    page.goto(f"{web.url}/")
    assert page.evaluate(colour) == "rgb(13, 17, 23)"
    assert page.evaluate("getComputedStyle(document.body).color") == "rgb(230, 237, 243)"
    shoot(page, "list-dark", 1200)
    page.emulate_media(color_scheme="light")
    assert page.evaluate(colour) == "rgb(255, 255, 255)"


def test_times_show_in_local_time_and_relative(page: Any, web: Web) -> None:
    """A request's arrival shows in the browser's time zone with how long ago, and its UTC
    instant on hover."""
    expect = _expect()
    waiting = web.gated()
    received = datetime.fromisoformat(waiting["received_at"].replace("Z", "+00:00"))
    local = received.astimezone(ZoneInfo(BROWSER_TZ)).strftime("%Y-%m-%d %H:%M:%S")
    page.goto(f"{web.url}/")
    shown = page.locator(f".item[data-ref='default/{waiting['id']}'] time.t")
    expect(shown).to_have_text(re.compile(rf"^{local} \((just now|\d+ min ago)\)$"))
    expect(shown).to_have_attribute("title", f"{waiting['received_at']} (UTC)")


def test_screenshots_for_the_docs(page: Any, web: Web) -> None:
    """The inbox as the docs show it: a list with a selection, and a card with its diff;
    both exactly as wide as the window. BROKER_DOCS_SCREENSHOTS=1 writes them to docs/."""
    expect = _expect()
    web.gated("files.write", params=OVERWRITE, reason="fix the typo in line two")
    notes = "".join(f"- change {n}\n" for n in range(1, 13))
    web.gated(
        "files.write",
        params={"path": "release-notes.md", "content": notes},
        reason="draft the release notes for 0.2",
    )
    web.gated(
        "http.request",
        params={"method": "PUT", "url": "http://127.0.0.1:9/items/7", "json": {"state": "done"}},
        reason="mark item 7 as done in the tracker",
    )
    web.gated("test.careful", reason="rotate the staging credentials")
    page.set_viewport_size({"width": 1280, "height": 760})
    page.goto(f"{web.url}/")
    page.locator("input[name=pick]").nth(1).check()
    expect(page.locator("#selected-count")).to_contain_text("1 selected")
    shoot(page, "docs-list", 1280)
    wanted = os.environ.get("BROKER_DOCS_SCREENSHOTS")
    if wanted:
        page.screenshot(path=str(DOCS / "inbox-list.png"))
    page.locator("a.ref").first.click()
    expect(page.locator("pre#preview .line.add")).to_have_text("+line 2")
    page.wait_for_load_state()  # its stylesheet too
    page.set_viewport_size({"width": 1280, "height": 1000})
    shoot(page, "docs-request", 1280)
    if wanted:
        page.screenshot(path=str(DOCS / "inbox-request.png"))
