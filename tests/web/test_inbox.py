"""Working through the inbox fast: the list's markers and filters, batch decisions over a
selection (each its own decision on its own sha256), decide-then-next, the result's
output with service errors as warnings, long bodies; over the API and as pages."""

from __future__ import annotations

import json
import re
from typing import Any

from pytest_httpserver import HTTPServer

from broker.store.sqlite import Ledger
from tests.web.conftest import CAREFUL_REASON, RECORD_REASON, Web, csrf_of
from tests.web.test_pages import form_post

OVERWRITE = {"path": "notes.txt", "content": "line one\nline 2\nline three\n", "overwrite": True}


def pick(result: dict[str, Any], sha256: str | None = None) -> dict[str, str]:
    return {
        "sandbox": "default",
        "id": result["id"],
        "request_sha256": sha256 or result["request_sha256"],
    }


def batch(web: Web, picks: list[dict[str, str]], who: str = "alice", **body: Any) -> Any:
    body.setdefault("verdict", "approve")
    return web.client(who).post("/api/v1/decisions", json={"requests": picks, **body})


def decisions(web: Web) -> list[Any]:
    ledger = Ledger(web.harness.config.ledger_path)
    try:
        return ledger.all_decisions()
    finally:
        ledger.close()


def audit_events(web: Web, kind: str) -> list[dict[str, Any]]:
    lines = web.harness.config.audit_path.read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


# -- the API ---------------------------------------------------------------------------


def test_batch_records_one_decision_per_request_on_its_own_sha256(web: Web) -> None:
    """Approving two of three selected requests applies exactly those two, each with a
    decision and an audit line of its own bound to its own sha256; the third still waits."""
    first, second, third = web.gated(), web.gated(), web.gated()
    response = batch(web, [pick(first), pick(second)], "bob", reason="both fine")
    assert response.status_code == 200
    body = response.json()
    assert (body["recorded"], body["refused"]) == (2, 0)
    assert [r["ref"] for r in body["results"]] == [
        f"default/{first['id']}",
        f"default/{second['id']}",
    ]
    for done in (first, second):
        result = web.harness.wait(done["id"])
        assert (result["status"], result["decided_by"]) == ("applied", "bob")
    bound = {(d.id, d.sha256, d.approver, d.surface) for d in decisions(web)}
    assert bound == {
        (first["id"], first["request_sha256"], "bob", "api"),
        (second["id"], second["request_sha256"], "bob", "api"),
    }
    logged = {(e["id"], e["by"]) for e in audit_events(web, "decision")}
    assert logged == {(first["id"], "bob"), (second["id"], "bob")}
    assert web.client().get(f"/api/v1/requests/default/{third['id']}").json()["status"] == "pending"


def test_batch_never_decides_a_request_whose_rule_says_batch_false(web: Web) -> None:
    """A test.careful request (batch = false) in a selection is refused and keeps waiting;
    the rest of the selection is decided."""
    careful, plain = web.gated("test.careful"), web.gated()
    body = batch(web, [pick(careful), pick(plain)]).json()
    refused, recorded = body["results"]
    assert (refused["recorded"], refused["code"]) == (False, "batch_forbidden")
    assert "rules[3]" in refused["message"] and "alone" in refused["message"]
    assert recorded["recorded"] is True
    assert web.harness.wait(plain["id"])["status"] == "applied"
    card = web.client().get(f"/api/v1/requests/default/{careful['id']}").json()
    assert (card["status"], card["batch"]) == ("pending", False)
    assert card["why"]["reason"] == CAREFUL_REASON
    assert [d.id for d in decisions(web)] == [plain["id"]]


def test_a_stale_item_is_refused_alone(web: Web) -> None:
    """One request in the batch bound to other bytes is refused as stale; the others go."""
    stale, fresh = web.gated(), web.gated()
    body = batch(web, [pick(stale, "f" * 64), pick(fresh)]).json()
    assert [(r["recorded"], r["code"]) for r in body["results"]] == [(False, "stale"), (True, None)]
    assert web.client().get(f"/api/v1/requests/default/{stale['id']}").json()["status"] == "pending"


def test_batch_needs_a_selection_and_a_reason_to_deny(web: Web) -> None:
    """No 'all': an empty list or an `all` flag is refused; a batch denial needs a reason;
    a request listed twice is decided once."""
    waiting = web.gated()
    assert batch(web, []).status_code == 422
    everything = web.client().post("/api/v1/decisions", json={"verdict": "approve", "all": True})
    assert everything.status_code == 422
    no_reason = batch(web, [pick(waiting)], verdict="deny")
    assert (no_reason.status_code, no_reason.json()["error"]["code"]) == (422, "reason_required")
    assert (
        web.client().get(f"/api/v1/requests/default/{waiting['id']}").json()["status"] == "pending"
    )
    twice = batch(web, [pick(waiting), pick(waiting)], verdict="deny", reason="not now").json()
    assert [r["code"] for r in twice["results"]] == [None, "duplicate"]
    assert len(decisions(web)) == 1


def test_pending_is_filtered_by_effect_sandbox_and_text(web: Web) -> None:
    """/pending?effect=, ?sandbox= and ?q= narrow the cards; q reads the agent's words too."""
    record = web.gated(reason="tidy up the release notes")
    write = web.gated("files.write", params=OVERWRITE)
    api = web.client()

    def ids(**query: str) -> set[str]:
        return {c["id"] for c in api.get("/api/v1/pending", params=query).json()["requests"]}

    assert ids() == {record["id"], write["id"]}
    assert ids(effect="files.write") == {write["id"]}
    assert ids(q="RELEASE notes") == {record["id"]}
    assert ids(q="line 2") == {write["id"]}  # the diff
    assert ids(sandbox="elsewhere") == set()


def test_card_carries_the_lists_summary_and_markers(web: Web) -> None:
    """An overwrite is marked irreversible and overwrite, with its diff's size and lines."""
    write = web.gated("files.write", params=OVERWRITE)
    plain = web.gated()
    cards = {c["id"]: c for c in web.client().get("/api/v1/pending").json()["requests"]}
    assert cards[write["id"]]["markers"] == ["irreversible", "overwrite"]
    assert cards[write["id"]]["summary"] == "+1 −1 lines"
    assert cards[write["id"]]["lines"] == cards[write["id"]]["what"]["body"].count("\n")
    assert cards[plain["id"]]["markers"] == ["reversible"]
    assert cards[plain["id"]]["summary"] == "3 lines"
    assert (cards[plain["id"]]["output"], cards[plain["id"]]["warning"]) == (None, None)


def test_a_service_error_after_apply_is_a_warning_not_success(
    web: Web, httpserver: HTTPServer
) -> None:
    """A PUT that got HTTP 501 is `applied` for the protocol, but its card says the service
    refused, shows the output, and the page marks it as a warning, not as a green success."""
    httpserver.expect_request("/items/7", method="PUT").respond_with_data(
        "not here", status=501, content_type="text/plain"
    )
    url = f"http://127.0.0.1:{httpserver.port}/items/7"
    waiting = web.gated("http.request", params={"method": "PUT", "url": url, "body": "x"})
    web.client().post(
        f"/api/v1/requests/default/{waiting['id']}/decision",
        json={"verdict": "approve", "request_sha256": waiting["request_sha256"]},
    )
    assert web.harness.wait(waiting["id"])["status"] == "applied"
    card = web.client().get(f"/api/v1/requests/default/{waiting['id']}").json()
    assert card["output"]["status"] == 501
    assert card["warning"].startswith("applied, but the service answered HTTP 501")
    page = web.browser().get(f"/requests/default/{waiting['id']}").text
    assert 'class="outcome outcome-warning"' in page
    assert "outcome-applied" not in page
    assert "applied, but the service answered HTTP 501" in page
    (output,) = re.findall(r'<pre class="body numbered" id="output">(.*?)</pre>', page, re.S)
    assert '<span class="line">  &quot;status&quot;: 501,</span>' in output
    history = web.browser().get("/history").text
    assert "status-warning" in history and "the service answered HTTP 501" in history


# -- the pages, as a browser without JavaScript sees them ------------------------------------


def test_list_shows_why_markers_change_and_the_agents_words(web: Web) -> None:
    """Each waiting request's row says which rule stopped it and why, its markers, the size
    of the change, and the agent's words labelled as unverified."""
    web.gated("files.write", params=OVERWRITE, reason="fix the typo in line two")
    web.gated()
    page = web.browser().get("/").text
    assert 'stopped by <span class="rule">rules[2]</span>' in page
    assert f"rules[0]</span>: {RECORD_REASON}" in page
    assert '<span class="marker marker-irreversible">irreversible</span>' in page
    assert '<span class="marker marker-overwrite">overwrite</span>' in page
    assert '<span class="change">+1 −1 lines</span>' in page
    assert re.search(
        r'the agent says \(unverified\):</span> <span class="agent-said">fix the typo', page
    )


def test_list_filters_on_the_server_too(web: Web) -> None:
    """?effect= and ?q= narrow the page itself (links can be shared; no script needed)."""
    record = web.gated(reason="alpha")
    write = web.gated("files.write", params=OVERWRITE, reason="beta")
    browser = web.browser()
    by_effect = browser.get("/", params={"effect": "files.write"}).text
    assert write["id"] in by_effect and record["id"] not in by_effect
    assert "1 waiting (of 2)" in by_effect
    by_text = browser.get("/", params={"q": "ALPHA"}).text
    assert record["id"] in by_text and write["id"] not in by_text
    nothing = browser.get("/", params={"q": "no such words"}).text
    assert "Nothing waiting matches these filters." in nothing


def test_hostile_search_text_stays_plain_inside_attributes(web: Web) -> None:
    """Text echoed into an attribute is escaped and neutralised, never marked up."""
    hostile = '\u202ex"><script>alert(1)</script>'
    page = web.browser().get("/", params={"q": hostile}).text
    (value,) = re.findall(r'<input type="search" name="q" id="q" value="([^"]*)"', page)
    assert value == "&lt;U+202E RLO&gt;x&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"
    assert "<script>alert" not in page and "\u202e" not in page


def test_batch_form_decides_the_selection_and_skips_what_must_go_alone(web: Web) -> None:
    """The list offers a checkbox per request except batch = false ones; posting the
    selection records each decision and says what was and was not recorded."""
    first, second = web.gated(), web.gated()
    careful = web.gated("test.careful")
    browser = web.browser()
    page = browser.get("/").text
    values = re.findall(r'name="pick" value="([^"]+)"', page)
    assert f"default/{first['id']}/{first['request_sha256']}" in values
    assert not any(careful["id"] in v for v in values)
    assert "its rule says batch = false" in page
    forged = f"default/{careful['id']}/{careful['request_sha256']}"
    chosen = [values[0], values[1], forged]
    response = browser.post(
        "/batch",
        data={"csrf": csrf_of(page), "verdict": "approve", "reason": "", "pick": chosen},
    )
    assert response.status_code == 200
    assert "2 recorded, 1 not recorded" in response.text
    assert "asks for a decision on this request alone" in response.text
    for done in (first, second):
        assert web.harness.wait(done["id"])["status"] == "applied"
    card = web.client().get(f"/api/v1/requests/default/{careful['id']}").json()
    assert card["status"] == "pending"


def test_batch_form_without_a_selection_decides_nothing(web: Web) -> None:
    """Approve selected with nothing selected is refused with a sentence; nothing changes."""
    waiting = web.gated()
    browser = web.browser()
    page = browser.get("/").text
    response = browser.post("/batch", data={"csrf": csrf_of(page), "verdict": "approve"})
    assert response.status_code == 422
    assert "nothing is decided without a selection" in response.text
    forged = browser.post("/batch", data={"csrf": "forged", "verdict": "approve", "pick": "x"})
    assert forged.status_code == 403
    assert (
        web.client().get(f"/api/v1/requests/default/{waiting['id']}").json()["status"] == "pending"
    )


def test_after_a_decision_the_next_waiting_request_opens(web: Web) -> None:
    """Approving one request lands on the next one waiting, saying the approval is recorded
    and linking back; after the last, the decided request shows, nothing else waits."""
    first, second = web.gated(), web.gated()
    browser = web.browser()
    response = form_post(web, browser, first)
    assert response.status_code == 303
    assert response.headers["location"].startswith(f"/requests/default/{second['id']}?")
    page = browser.get(response.headers["location"]).text
    assert "Your approval is recorded. Here is the next request waiting for you." in page
    assert f'href="/requests/default/{first["id"]}">See default/{first["id"]}</a>' in page
    last = form_post(web, browser, second, verdict="deny", reason="not this one")
    assert last.headers["location"].startswith(f"/requests/default/{second['id']}?")
    assert "Nothing else waits for you." in browser.get(last.headers["location"]).text


def test_the_decision_bar_binds_to_the_sha256_and_long_bodies_are_numbered(web: Web) -> None:
    """The bar names the sha256 it posts; a long body has numbered lines, its line count
    and a jump to its end."""
    content = "".join(f"row {n}\n" for n in range(1, 301))
    waiting = web.gated("files.write", params={"path": "long.txt", "content": content})
    page = web.browser().get(f"/requests/default/{waiting['id']}").text
    (bar,) = re.findall(
        r'<form method="post" action="[^"]+/decision" class="decide-bar".*?</form>', page, re.S
    )
    assert f'name="request_sha256" value="{waiting["request_sha256"]}"' in bar
    assert f'<code class="sha" id="bar-sha">{waiting["request_sha256"]}</code>' in bar
    assert '<pre class="body numbered body-text" id="preview">' in page
    assert page.count('<span class="line ctx">row ') == 300
    assert '300 lines</span> <a class="jump" href="#preview-end"' in page
    assert 'id="preview-end">end of the content: 300 lines' in page


def test_list_and_history_use_local_time_elements(web: Web) -> None:
    """Times carry their UTC instant in `datetime` for the page to show locally."""
    waiting = web.gated()
    page = web.browser().get("/").text
    assert f'<time class="t" datetime="{waiting["received_at"]}">' in page
