"""Signing in to the inbox with a real OpenID Connect provider on 127.0.0.1
(oidc-provider-mock), deciding with groups as approver roles, step-up for what cannot be
undone; and every forged, stale or replayed sign-in refused.

The flow is driven over HTTP here (the provider's own login form, the inbox's callback);
tests/web/test_browser_oidc.py drives it once in Chromium.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc import jwk, jwt

from broker.errors import SignInError
from broker.testing import BrokerHarness, FakeClock, FakeHandler
from broker.web.app import create_app
from broker.web.auth import hash_token
from broker.web.oidc import Provider
from broker.web.server import WebServer
from tests.web.conftest import Switch, Web, csrf_of
from tests.web.oidc_provider import Issuer, code_of, running_provider

CLIENT_ID = "broker-inbox"
ALICE_TOKEN = "bkr_alice-oidc-test-token"
OLD_TOKEN = "bkr_expired-token-of-olga"
POLICY = """
[[rules]]
effect = "test.record"
action = "approve"
approvals = 2
approvers = ["group:platform", "alice"]
reason = "two of the platform group"

[[rules]]
effect = "test.gone"
action = "approve"
approvers = ["group:platform"]
reason = "it cannot be undone"

[[rules]]
effect = "test.strong"
action = "approve"
step_up = { max_age = "10m", amr = ["otp"] }
reason = "a second factor, recently"
"""
APPROVERS = {
    "alice": {"token_sha256": hash_token(ALICE_TOKEN), "oidc_sub": "alice-sub"},
    "pr-bot": {"oidc_sub": "bot-sub", "acts_for": ["default"]},
    "olga": {"token_sha256": hash_token(OLD_TOKEN), "token_expires": "2020-01-01T00:00:00Z"},
}


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    with running_provider() as running:
        running.person("alice-sub", name="Alice A.", groups=[])
        running.person("dave", name="Dave", groups=["platform"])
        running.person("erin", name="Dave", groups=["platform"])  # the same display name
        running.person("bot-sub", name="PR bot", groups=["platform"])
        running.person("mallory", name="Mallory", groups=["elsewhere"])
        yield running


def oidc_table(issuer: Issuer) -> dict[str, Any]:
    return {
        "issuer": issuer.url,
        "client_id": CLIENT_ID,
        "client_secret_env": "BROKER_TEST_OIDC_SECRET",
        "scopes": ["openid", "profile"],
        "sign_in_groups": ["platform", "staff"],
    }


@dataclass
class OidcWeb(Web):
    app: Any = None


@pytest.fixture
def web(
    tmp_path: Path,
    served: tuple[Switch, WebServer],
    issuer: Issuer,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[OidcWeb]:
    monkeypatch.setenv("BROKER_TEST_OIDC_SECRET", "the-client-secret")
    handlers = [
        FakeHandler("test.record"),
        FakeHandler("test.gone", reversible=False),
        FakeHandler("test.strong"),
    ]
    with BrokerHarness(tmp_path / "h", handlers=handlers, policy=POLICY) as h:
        config = h.config._replace(approvers=APPROVERS, web={"oidc": oidc_table(issuer)})
        app = create_app(config, h.registry)
        switch, server = served
        switch.app = app
        running = OidcWeb(h, server.url, app=app)
        try:
            yield running
        finally:
            for client in running.clients:
                client.close()
            switch.app = None
            app.state.inbox.close()
            app.state.sign_in.provider.close()


def begin(web: Web, **params: Any) -> tuple[httpx.Client, str]:
    """A browser-like client that asked the inbox to sign in; the provider's URL."""
    client = httpx.Client(base_url=web.url, timeout=10)
    web.clients.append(client)
    response = client.get("/login/oidc", params={"next": "/", **params})
    assert response.status_code == 303, response.text
    return client, response.headers["location"]


def sign_in(web: Web, issuer: Issuer, sub: str, **params: Any) -> httpx.Client:
    client, authorize = begin(web, **params)
    response = client.get(issuer.log_in(authorize, sub))
    assert response.status_code == 200, response.text
    assert 'http-equiv="refresh"' in response.text
    return client


def decide(client: httpx.Client, rid: str, verdict: str = "approve") -> httpx.Response:
    """Decide on the request's page, as a person does: its form, its CSRF token."""
    page = client.get(f"/requests/default/{rid}")
    assert page.status_code == 200, page.text
    sha = client.get(f"/api/v1/requests/default/{rid}").json()["request_sha256"]
    form = {"verdict": verdict, "request_sha256": sha, "csrf": csrf_of(page.text)}
    if verdict == "deny":
        form["reason"] = "not now"
    return client.post(f"/requests/default/{rid}/decision", data=form)


def decisions(web: Web) -> list[dict[str, Any]]:
    lines = (web.harness.config.state_dir / "audit.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "decision"]


# -- the flow and the session -----------------------------------------------------------


def test_sign_in_records_issuer_subject_and_auth_time(web: Web, issuer: Issuer) -> None:
    """Signed in with the provider, a person of the group decides; the audit log names
    the issuer, the subject, the display name beside it, and when they signed in."""
    client, authorize = begin(web)
    sent = httpx.URL(authorize).params
    assert sent["code_challenge_method"] == "S256" and len(sent["code_challenge"]) == 43
    assert sent["state"] and sent["nonce"] and sent["client_id"] == CLIENT_ID
    assert client.get(issuer.log_in(authorize, "dave")).status_code == 200
    me = client.get("/api/v1/me").json()["approver"]
    assert me.startswith("oidc:")
    assert "Dave" in client.get("/").text
    gone = web.gated("test.gone")
    assert decide(client, gone["id"]).status_code == 303
    assert web.harness.wait(gone["id"])["status"] == "applied"
    [event] = decisions(web)
    assert event["by"] == me
    who = event["identity"]
    assert (who["issuer"], who["sub"], who["name"]) == (issuer.url, "dave", "Dave")
    assert isinstance(who["auth_time"], int | float) and who["groups"] == ["platform"]


def test_sign_out_ends_the_session(web: Web, issuer: Issuer) -> None:
    client = sign_in(web, issuer, "dave")
    page = client.get("/")
    assert client.post("/logout", data={"csrf": csrf_of(page.text)}).status_code == 303
    assert client.get("/api/v1/me").status_code == 401
    assert client.get("/").status_code == 303  # back to the sign-in page


def test_session_ends_with_the_id_token(web: Web, issuer: Issuer) -> None:
    """The session's life is the token's (an hour at this provider), not session_ttl's."""
    client = sign_in(web, issuer, "dave")
    sid = client.cookies["broker_session"]
    sessions = web_app(web).state.gate.sessions
    session = sessions.get(sid)
    assert session is not None and session.proof is not None
    left = session.expires - sessions.clock.monotonic()
    assert left <= 3600 < sessions.ttl_s


def web_app(web: Web) -> Any:
    assert isinstance(web, OidcWeb)
    return web.app


def test_outsider_and_unknown_flow_refused(web: Web, issuer: Issuer) -> None:
    """Someone of no allowed group is not signed in; a callback with another browser's
    state, or one replayed, signs nobody in."""
    client, authorize = begin(web)
    refused = client.get(issuer.log_in(authorize, "mallory"))
    assert refused.status_code == 403 and "not an approver" in refused.text
    assert client.get("/api/v1/me").status_code == 401

    client, authorize = begin(web)
    back = issuer.log_in(authorize, "dave")
    other = httpx.Client(base_url=web.url, timeout=10)  # no flow cookie: wrong state
    web.clients.append(other)
    assert other.get(back).status_code == 400
    code, state = code_of(back)
    forged = client.get("/oidc/callback", params={"code": code, "state": state + "x"})
    assert forged.status_code == 400
    assert client.get("/api/v1/me").status_code == 401


def test_replayed_callback_and_code_refused(web: Web, issuer: Issuer) -> None:
    client, authorize = begin(web)
    back = issuer.log_in(authorize, "dave")
    assert client.get(back).status_code == 200
    again = client.get(back)  # the same callback: its state was used
    assert again.status_code == 400
    # the code itself, exchanged a second time, is refused by the provider
    provider: Provider = web_app(web).state.sign_in.provider
    started = provider.start(f"{web.url}/oidc/callback")
    code, _ = code_of(back)
    with pytest.raises(SignInError, match="refused the sign-in code"):
        provider.finish(f"{web.url}/oidc/callback", code, started)


# -- forged and unfit ID tokens, checked against the provider's real keys ---------------


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def real_token(
    issuer: Issuer, provider: Provider, *, client_id: str = CLIENT_ID, nonce: bool = True
) -> tuple[str, str]:
    """An ID token the provider really issued (for `client_id`), and the nonce sent."""
    from authlib.integrations.httpx_client import OAuth2Client

    meta = provider.metadata()
    redirect = "http://127.0.0.1:9/cb"
    with OAuth2Client(
        client_id=client_id, client_secret="x", redirect_uri=redirect, scope="openid"
    ) as oauth:
        extra = {"nonce": "n-123"} if nonce else {}
        url, _ = oauth.create_authorization_url(meta["authorization_endpoint"], **extra)
        code, _ = code_of(issuer.log_in(url, "dave"))
        token = oauth.fetch_token(meta["token_endpoint"], code=code)
    return token["id_token"], "n-123"


@pytest.fixture
def provider(web: Web) -> Provider:
    return web_app(web).state.sign_in.provider


def test_genuine_token_verifies(issuer: Issuer, provider: Provider) -> None:
    token, nonce = real_token(issuer, provider)
    assert provider.verify(token, nonce).subject == "dave"


def test_forged_tokens_refused(issuer: Issuer, provider: Provider) -> None:
    """Signed with another key under the provider's kid; alg none; HS256 keyed with the
    provider's public key: none of them verifies."""
    token, nonce = real_token(issuer, provider)
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    claims = jwt.decode(token, provider.keys(header.get("kid"))).claims
    kid = {"kid": header["kid"]} if "kid" in header else {}
    other = jwk.RSAKey.generate_key(2048, parameters=kid or None)
    wrong_key = jwt.encode({"alg": "RS256", **kid}, claims, other)
    with pytest.raises(SignInError, match="signature does not verify"):
        provider.verify(wrong_key, nonce)
    unsigned = f"{_b64({'alg': 'none'})}.{_b64(claims)}."
    with pytest.raises(SignInError, match="'none'"):
        provider.verify(unsigned, nonce)
    public = provider.keys(None).keys[0].as_pem(private=False)  # an attacker has this
    signing = f"{_b64({'alg': 'HS256', 'typ': 'JWT'})}.{_b64(claims)}"
    mac = hmac.new(public, signing.encode(), hashlib.sha256).digest()
    confused = f"{signing}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"
    with pytest.raises(SignInError, match="'HS256'"):
        provider.verify(confused, nonce)


def test_wrong_audience_expired_and_missing_nonce_refused(
    issuer: Issuer, provider: Provider
) -> None:
    foreign, nonce = real_token(issuer, provider, client_id="another-app")
    with pytest.raises(SignInError, match="aud"):
        provider.verify(foreign, nonce)
    token, nonce = real_token(issuer, provider)
    with pytest.raises(SignInError, match="nonce"):
        provider.verify(token, "another-nonce")
    bare, _ = real_token(issuer, provider, nonce=False)
    with pytest.raises(SignInError, match="nonce"):
        provider.verify(bare, nonce)
    for moved, claim in (
        (timedelta(hours=2), "expired|exp"),
        (-timedelta(hours=2), "issued in the future"),
    ):
        elsewhen = Provider(provider.settings, FakeClock(FakeClock().now() + moved))
        try:  # the same genuine token, read two hours later (expired) or earlier
            with pytest.raises(SignInError, match=claim):
                elsewhen.verify(token, nonce)
        finally:
            elsewhen.close()


def test_rotated_keys_fetched_again(issuer: Issuer, provider: Provider) -> None:
    """Keys cached from before a rotation (another kid) are fetched again for a token
    naming a key not yet seen."""
    token, nonce = real_token(issuer, provider)
    old = jwk.KeySet([jwk.RSAKey.generate_key(2048, parameters={"kid": "retired"})])
    provider._keys, provider._keys_at = old, float("-inf")
    assert provider.verify(token, nonce).subject == "dave"
    assert provider._keys is not old


# -- groups, quorum, the requesting bot ---------------------------------------------------


def test_group_quorum_counts_people_not_sign_ins(web: Web, issuer: Issuer) -> None:
    """Two subjects of the group (with one display name) make a quorum of two; one
    subject signed in twice, in two browsers, counts once."""
    first = web.gated("test.record")
    dave, dave_again = sign_in(web, issuer, "dave"), sign_in(web, issuer, "dave")
    assert decide(dave, first["id"]).status_code == 303
    twice = decide(dave_again, first["id"])
    assert twice.status_code == 409 and "already decided" in twice.text
    assert decide(sign_in(web, issuer, "erin"), first["id"]).status_code == 303
    assert web.harness.wait(first["id"])["status"] == "applied"
    people = [e["identity"]["sub"] for e in decisions(web)]
    assert people == ["dave", "erin"]


def test_group_read_from_each_sign_in(web: Web, issuer: Issuer) -> None:
    """Added to the group, a person may decide from their next sign-in; removed, they
    may not from theirs: the group is the token's, never remembered."""
    issuer.person("frank", name="Frank", groups=["staff"])
    one, two = web.gated("test.gone"), web.gated("test.gone")
    refused = decide(sign_in(web, issuer, "frank"), one["id"])
    assert refused.status_code == 409 and "not among the approvers" in refused.text
    issuer.person("frank", name="Frank", groups=["staff", "platform"])
    assert decide(sign_in(web, issuer, "frank"), one["id"]).status_code == 303
    issuer.person("frank", name="Frank", groups=["staff"])
    again = decide(sign_in(web, issuer, "frank"), two["id"])
    assert again.status_code == 409 and "not among the approvers" in again.text
    assert web.harness.wait(one["id"])["status"] == "applied"


def test_the_requesting_bot_cannot_approve(web: Web, issuer: Issuer) -> None:
    """The agent's own account (acts_for its sandbox) is refused, group or not."""
    gone = web.gated("test.gone")
    refused = decide(sign_in(web, issuer, "bot-sub"), gone["id"])
    assert refused.status_code == 409 and "agent that asked" in refused.text
    assert decisions(web) == []


def test_one_person_across_token_and_provider(web: Web, issuer: Issuer) -> None:
    """alice's API token and her OIDC subject are one approver: her second approval is
    refused; a token past its token_expires signs nobody in."""
    first = web.gated("test.record")
    api = web.client(None)
    api.headers["Authorization"] = f"Bearer {ALICE_TOKEN}"
    sha = api.get(f"/api/v1/requests/default/{first['id']}").json()["request_sha256"]
    ok = api.post(
        f"/api/v1/requests/default/{first['id']}/decision",
        json={"verdict": "approve", "request_sha256": sha},
    )
    assert ok.status_code == 200, ok.text
    twice = decide(sign_in(web, issuer, "alice-sub"), first["id"])
    assert twice.status_code == 409 and "already decided" in twice.text
    old = web.client(None)
    old.headers["Authorization"] = f"Bearer {OLD_TOKEN}"
    assert old.get("/api/v1/me").status_code == 401


# -- step-up --------------------------------------------------------------------------


def test_step_up_for_irreversible_not_for_reversible(web: Web, issuer: Issuer) -> None:
    """Signed in an hour ago: a reversible request is decided as it is; an irreversible
    one sends the browser back through the provider (max_age, prompt=login), and the
    decision taken after the fresh sign-in records its auth_time."""
    import time

    issuer.person("gina", name="Gina", groups=["platform"], auth_time=int(time.time()) - 3600)
    client = sign_in(web, issuer, "gina")
    undoable, gone = web.gated("test.record"), web.gated("test.gone")
    assert decide(client, undoable["id"]).status_code == 303
    asked = decide(client, gone["id"])
    assert asked.status_code == 303
    assert asked.headers["location"].startswith("/login/oidc?next=%2Frequests%2Fdefault%2F")
    assert "step_up=900" in asked.headers["location"]
    again = client.get(asked.headers["location"])
    sent = httpx.URL(again.headers["location"]).params
    assert (sent["prompt"], sent["max_age"]) == ("login", "900")
    # still the old auth_time at the provider: not a fresh sign-in, refused
    assert client.get(issuer.log_in(again.headers["location"], "gina")).status_code == 401
    issuer.person("gina", name="Gina", groups=["platform"])  # signs in afresh now
    again = client.get(asked.headers["location"])
    assert client.get(issuer.log_in(again.headers["location"], "gina")).status_code == 200
    assert decide(client, gone["id"]).status_code == 303
    assert web.harness.wait(gone["id"])["status"] == "applied"
    last = decisions(web)[-1]
    assert last["identity"]["sub"] == "gina" and last["identity"]["auth_time"] > time.time() - 60


def test_step_up_method_and_token_surfaces(web: Web, issuer: Issuer) -> None:
    """A rule asking for an `otp` method refuses a sign-in the provider reports without
    it; an API token can never show a fresh sign-in for an irreversible request."""
    issuer.person("hank", name="Hank", groups=["platform"], amr=["pwd"])
    strong = web.gated("test.strong")
    asked = decide(sign_in(web, issuer, "hank"), strong["id"])
    assert asked.status_code == 303 and "step_up=600" in asked.headers["location"]
    issuer.person("hank", name="Hank", groups=["platform"], amr=["pwd", "otp"])
    assert decide(sign_in(web, issuer, "hank"), strong["id"]).status_code == 303
    assert decisions(web)[-1]["identity"]["amr"] == ["pwd", "otp"]

    other = web.gated("test.strong")
    api = web.client(None)
    api.headers["Authorization"] = f"Bearer {ALICE_TOKEN}"
    sha = api.get(f"/api/v1/requests/default/{other['id']}").json()["request_sha256"]
    refused = api.post(
        f"/api/v1/requests/default/{other['id']}/decision",
        json={"verdict": "approve", "request_sha256": sha},
    )
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["code"] == "step_up_required"


# -- the whole flow in Chromium ---------------------------------------------------------


def test_in_chromium_sign_in_decide_sign_out(chromium: Any, web: Web, issuer: Issuer) -> None:
    """A person opens the inbox, signs in on the provider's own page, approves an
    irreversible request (signed in just now: no step-up), and signs out."""
    from playwright.sync_api import expect

    issuer.person("ivy", name="Ivy \u202eevil", groups=["platform"])
    gone = web.gated("test.gone")
    chromium.clear_cookies()
    tab = chromium.new_page()
    try:
        tab.goto(f"{web.url}/requests/default/{gone['id']}")
        tab.click("#sign-in-oidc")
        tab.fill("input[name=sub]", "ivy")  # the provider's login form
        tab.click("button:has-text('Authorize')")
        expect(tab.locator("#approve")).to_be_visible()
        expect(tab.locator(".display-name")).to_contain_text("Ivy <U+202E RLO>evil")
        tab.click("#approve")
        expect(tab.locator(".notice")).to_contain_text("Your approval is recorded")
        assert web.harness.wait(gone["id"])["status"] == "applied"
        assert decisions(web)[-1]["identity"]["sub"] == "ivy"
        tab.click("header form[action='/logout'] button")
        expect(tab.locator("#sign-in-oidc")).to_be_visible()
        tab.goto(f"{web.url}/")
        expect(tab.locator("#sign-in-oidc")).to_be_visible()  # still signed out
    finally:
        tab.close()
