"""The HTTP API under /api/v1, over a real broker: every endpoint, its rules and errors."""

from __future__ import annotations

import json
from typing import Any

from broker.approval.decisions import card
from broker.store.sqlite import Ledger
from tests.web.conftest import FILES_REASON, RECORD_REASON, TOKENS, Web

GUARDED = [
    ("GET", "/api/v1/me"),
    ("GET", "/api/v1/pending"),
    ("GET", "/api/v1/requests"),
    ("GET", "/api/v1/requests/default/x"),
    ("POST", "/api/v1/requests/default/x/decision"),
    ("POST", "/api/v1/decisions"),
    ("GET", "/api/v1/changes"),
    ("GET", "/api/v1/stats"),
    ("POST", "/api/v1/policy/replay"),
]


def decide(web: Web, result: dict[str, Any], who: str = "alice", **body: Any) -> Any:
    """POST a decision on `result` with `who`'s token (sha256 from the result unless given)."""
    body.setdefault("verdict", "approve")
    body.setdefault("request_sha256", result["request_sha256"])
    return web.client(who).post(f"/api/v1/requests/default/{result['id']}/decision", json=body)


def test_health_answers_without_a_token(idle: Web) -> None:
    """GET /health says ok to anyone: monitors need no credentials."""
    response = idle.client(None).get("/api/v1/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_no_token_is_401_with_an_error_body(idle: Web) -> None:
    """Every other endpoint refuses a caller without a token, as a JSON error."""
    stranger = idle.client(None)
    for method, path in GUARDED:
        response = stranger.request(method, path, json={})
        assert response.status_code == 401, path
        assert response.json()["error"]["code"] == "unauthenticated"
        assert response.headers["www-authenticate"] == "Bearer"


def test_wrong_token_is_401(idle: Web) -> None:
    """A token that is no approver's, or a non-bearer scheme, is refused."""
    for header in ("Bearer bkr_not-a-real-token", f"Basic {TOKENS['alice']}", "Bearer"):
        response = idle.client(None).get("/api/v1/pending", headers={"Authorization": header})
        assert response.status_code == 401, header
        assert response.json()["error"]["code"] == "unauthenticated"


def test_me_names_the_tokens_approver(idle: Web) -> None:
    """GET /me says whose token it is."""
    assert idle.client("bob").get("/api/v1/me").json() == {"approver": "bob"}


def test_pending_lists_the_same_card_as_broker_show(web: Web) -> None:
    """GET /pending returns approval.card(): literal preview, flags, rule, deadline, on-timeout."""
    waiting = web.gated(reason="the agent's own words")
    body = web.client().get("/api/v1/pending").json()
    assert body["cursor"] > 0
    (got,) = body["requests"]
    ledger = Ledger(web.harness.config.ledger_path)
    record = ledger.get("default", waiting["id"])
    assert record is not None
    expected = card(ledger, record, web.harness.registry)
    ledger.close()
    for key in ("ref", "effect", "status", "request_sha256", "what", "where", "why"):
        assert got[key] == expected[key], key
    assert got["what"]["body"] == json.dumps({"value": "hello"}, indent=2)
    assert got["why"] == {"rule": "rules[0]", "reason": RECORD_REASON}
    assert got["if_nobody_answers"]["on_timeout"] == "deny"
    assert got["if_nobody_answers"]["expires_at"] == waiting["expires_at"]
    assert 3590 < got["if_nobody_answers"]["seconds_left"] <= 3600
    assert got["agent_reason"] == "the agent's own words"
    assert (got["reversible"], got["idempotent"]) == (True, True)
    assert got["approvals"] == {"have": [], "needed": 1}


def test_show_returns_one_card_with_a_diff(web: Web) -> None:
    """GET /requests/SANDBOX/ID shows files.write's exact diff and its destination."""
    params = {"path": "notes.txt", "content": "line one\nline 2\nline three\n", "overwrite": True}
    waiting = web.gated("files.write", params=params)
    got = web.client().get(f"/api/v1/requests/default/{waiting['id']}").json()
    assert got["what"]["body_kind"] == "diff"
    assert "-line two\n+line 2\n" in got["what"]["body"]
    assert got["where"].endswith("exports/default/notes.txt")
    assert got["why"]["reason"] == FILES_REASON
    assert got["reversible"] is False


def test_unknown_request_is_404(idle: Web) -> None:
    """A request that does not exist is a 404 with code not_found."""
    response = idle.client().get("/api/v1/requests/default/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_approve_applies_and_records_the_authenticated_approver(web: Web) -> None:
    """An approval by bob's token is recorded as bob, and the agent reads `applied`."""
    waiting = web.gated()
    response = decide(web, waiting, "bob", reason="fine by me")
    assert response.status_code == 200
    body = response.json()
    assert (body["settled"], body["approvals"], body["needed"]) == (True, 1, 1)
    result = web.harness.wait(waiting["id"])
    assert result["status"] == "applied"
    assert result["decided_by"] == "bob"
    assert result["reason"] == "approved by bob: fine by me"


def test_a_name_sent_by_the_client_is_refused(web: Web) -> None:
    """A body that names an approver is rejected (422), never recorded as that name."""
    waiting = web.gated()
    response = decide(web, waiting, "bob", approver="alice")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert web.client().get(f"/api/v1/requests/default/{waiting['id']}").json()["status"] == (
        "pending"
    )


def test_deny_sends_the_reason_to_the_agent(web: Web) -> None:
    """A denial's reason reaches the agent's result, prefixed with who denied."""
    waiting = web.gated()
    response = decide(web, waiting, verdict="deny", reason="use the staging bucket instead")
    assert response.status_code == 200
    result = web.harness.wait(waiting["id"])
    assert result["status"] == "denied"
    assert result["reason"] == "denied by alice: use the staging bucket instead"


def test_deny_without_reason_is_422(web: Web) -> None:
    """A denial needs a reason (blank does not count); the request keeps waiting."""
    waiting = web.gated()
    response = decide(web, waiting, verdict="deny", reason="   ")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "reason_required"
    assert web.client().get("/api/v1/pending").json()["requests"][0]["status"] == "pending"


def test_stale_sha256_is_409(web: Web) -> None:
    """A decision for other bytes than the request's is refused with 409 stale."""
    waiting = web.gated()
    response = decide(web, waiting, request_sha256="0" * 64)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale"
    assert "look at it again" in response.json()["error"]["message"]
    assert web.client().get("/api/v1/pending").json()["requests"][0]["id"] == waiting["id"]


def test_deciding_twice_on_a_quorum_request_is_409(web: Web) -> None:
    """On a two-person rule alice cannot approve twice; bob's approval settles it."""
    waiting = web.gated("test.quorum")
    first = decide(web, waiting, "alice").json()
    assert (first["settled"], first["approvals"], first["needed"]) == (False, 1, 2)
    again = decide(web, waiting, "alice")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "already_decided"
    assert decide(web, waiting, "bob").json()["settled"] is True
    result = web.harness.wait(waiting["id"])
    assert (result["status"], result["decided_by"]) == ("applied", "alice, bob")


def test_deciding_a_settled_request_is_409(web: Web) -> None:
    """Once decided, a request takes no further decision: 409 not_pending."""
    waiting = web.gated()
    assert decide(web, waiting, "alice").status_code == 200
    response = decide(web, waiting, "bob", verdict="deny", reason="too late")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_pending"
    assert web.harness.wait(waiting["id"])["status"] == "applied"


def test_decision_reaches_the_audit_log_at_once(web: Web) -> None:
    """The API flushes its decision to the audit log with the surface and the person."""
    waiting = web.gated()
    decide(web, waiting, "bob")
    lines = web.harness.config.audit_path.read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]
    decision = [e for e in events if e["event"] == "decision" and e["id"] == waiting["id"]]
    assert decision and decision[0]["by"] == "bob" and decision[0]["surface"] == "api"


def test_cookie_post_to_the_api_needs_the_csrf_header(web: Web) -> None:
    """A browser session may not POST to the API without X-CSRF-Token (403 csrf)."""
    waiting = web.gated()
    browser = web.browser("alice")
    path = f"/api/v1/requests/default/{waiting['id']}/decision"
    body = {"verdict": "approve", "request_sha256": waiting["request_sha256"]}
    response = browser.post(path, json=body)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "csrf"
    assert browser.get("/api/v1/pending").json()["requests"][0]["status"] == "pending"


def test_changes_moves_when_a_request_arrives(web: Web) -> None:
    """GET /changes reports a new cursor after a request arrives, and nothing before."""
    client = web.client()
    before = client.get("/api/v1/changes").json()["cursor"]
    assert client.get(f"/api/v1/changes?since={before}").json() == {
        "cursor": before,
        "changed": False,
    }
    web.gated()
    after = client.get(f"/api/v1/changes?since={before}").json()
    assert after["changed"] is True and after["cursor"] > before


def test_requests_lists_history_with_filters(web: Web) -> None:
    """GET /requests filters by status, effect and sandbox, newest first."""
    first = web.gated()
    second = web.gated()
    decide(web, first, verdict="deny", reason="no")
    web.harness.wait(first["id"])
    client = web.client()
    everything = client.get("/api/v1/requests").json()["requests"]
    assert [r["id"] for r in everything][:2] == [second["id"], first["id"]]
    denied = client.get("/api/v1/requests", params={"status": "denied"}).json()["requests"]
    assert [(r["id"], r["reason"]) for r in denied] == [(first["id"], "denied by alice: no")]
    other = client.get("/api/v1/requests", params={"effect": "files.write"}).json()
    assert other["requests"] == []
    assert client.get("/api/v1/requests", params={"sandbox": "elsewhere"}).json()["requests"] == []
    bad = client.get("/api/v1/requests", params={"status": "bogus"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"


def test_stats_counts_decisions(web: Web) -> None:
    """GET /stats counts people's approvals and denials per effect."""
    approved, denied = web.gated(), web.gated()
    decide(web, approved)
    decide(web, denied, verdict="deny", reason="no")
    web.harness.wait(approved["id"])
    counts = web.client().get("/api/v1/stats").json()["effects"]["test.record"]["counts"]
    assert (counts["approved"], counts["denied"]) == (1, 1)
    bad = web.client().get("/api/v1/stats", params={"since": "soon"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_since"


def test_openapi_document_describes_every_endpoint(idle: Web) -> None:
    """/api/v1/openapi.json is public and lists each endpoint with the error shape."""
    doc = idle.client(None).get("/api/v1/openapi.json").json()
    paths = set(doc["paths"])
    assert {
        "/api/v1/health",
        "/api/v1/me",
        "/api/v1/pending",
        "/api/v1/requests",
        "/api/v1/requests/{sandbox}/{request_id}",
        "/api/v1/requests/{sandbox}/{request_id}/decision",
        "/api/v1/decisions",
        "/api/v1/changes",
        "/api/v1/stats",
        "/api/v1/policy/replay",
    } == paths
    decision = doc["paths"]["/api/v1/requests/{sandbox}/{request_id}/decision"]["post"]
    assert {"200", "401", "404", "409", "422"} <= set(decision["responses"])
    assert "ErrorBody" in doc["components"]["schemas"]


def test_unknown_api_path_is_a_json_404(idle: Web) -> None:
    """A path the API does not have answers 404 in the API's error shape."""
    response = idle.client().get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_every_response_carries_the_csp(idle: Web) -> None:
    """API, pages, static files and errors all forbid inline scripts and framing."""
    for path in ("/api/v1/health", "/login", "/static/inbox.js", "/nowhere", "/api/v1/pending"):
        response = idle.client(None).get(path)
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp, path
        assert "frame-ancestors 'none'" in csp
        assert response.headers["x-content-type-options"] == "nosniff"


def test_oversized_body_is_413_before_anything_is_read(idle: Web) -> None:
    """A body over 64 KiB is refused at once, even from a stranger, as a JSON error."""
    path = "/api/v1/requests/default/x/decision"
    response = idle.client(None).post(path, content=b"{" + b" " * 70_000 + b"}")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert "content-security-policy" in response.headers
