"""http.request, webhook.post and email.send read their secrets per apply from OpenBao
(`<key>_kv = "PATH#FIELD"`, effects/kv.py): the service gets the secret, the result
names the read's scope and lease, the child token is revoked; a sealed OpenBao or a
missing field fails the apply and sends nothing.

Stand-ins, all on 127.0.0.1: a real OpenBao (`bao server -dev`, tests/credentials/bao.py),
a real HTTP server (pytest-httpserver), a real SMTP server with STARTTLS and a login
(aiosmtpd); a real broker (BrokerHarness) between them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from broker import grants
from broker.errors import ConfigError
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness
from effects.email import EmailSend
from tests.credentials import bao as bao_server
from tests.effects.netfixtures import (  # noqa: F401  (fixtures, used by their names)
    SMTP,
    SMTP_PASSWORD,
    fixture_ca,
    fixture_ca_file,
    fixture_smtp_starttls,
    fixture_web,
    fixture_web_server,
)

LOOPBACK = ["127.0.0.0/8"]
HTTP_SECRET = "kv-http-bearer-5d1f8e2a9c"
HOOK_KEY = "kv-hook-signing-key-77b3e1"
POLICY = "\n".join(
    f'[[rules]]\neffect = "{e}"\naction = "auto"\nreason = "test"\n'
    for e in ("http.request", "webhook.post", "email.send")
)


def broker(tmp_path: Path, url: str, **integrations: dict[str, Any]) -> BrokerHarness:
    with_provider = {name: {"credential": "bao", **t} for name, t in integrations.items()}
    return BrokerHarness(
        tmp_path / "broker",
        integrations=with_provider,
        credentials={"bao": bao_server.table(url)},
        policy=POLICY,
    )


def http_settings(web: HTTPServer) -> dict[str, Any]:
    header = {"value_kv": "http/ci#token", "prefix": "Bearer "}
    destination = {"base_url": web.url_for("/"), "secret_headers": {"Authorization": header}}
    return {"allow_networks": LOOPBACK, "destinations": {"ci": destination}}


def nowhere_holds(h: BrokerHarness, secret: str) -> None:
    """The secret is in no result, ledger row, audit line or state file."""
    for path in [*h.results.glob("*.json"), *h.state.rglob("*"), h.config.audit_path]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_an_http_destination_header_is_read_per_apply_and_its_token_revoked(
    tmp_path: Path, bao: str, bao_token: str, web: HTTPServer
) -> None:
    """OpenBao + HTTP server: the header arrives; the result names the read; revoked."""
    bao_server.put(bao, "http/ci", {"token": HTTP_SECRET})
    web.expect_request(
        "/builds", headers={"Authorization": f"Bearer {HTTP_SECRET}"}
    ).respond_with_data("queued")
    with broker(tmp_path, bao, http=http_settings(web)) as h:
        params = {"method": "GET", "destination": "ci", "path": "/builds"}
        result = h.submit(h.request("http.request", params), timeout=30)
    assert result["status"] == "applied", result
    assert result["output"]["status"] == 200
    (used,) = result["output"]["credential"]
    assert used["scope"] == "kv: http/ci only; read" and used["provider"] == "openbao:bao"
    assert used["revoked"] is True and not bao_server.accessor_alive(bao, used["id"])
    nowhere_holds(h, HTTP_SECRET)


def test_a_webhook_url_and_key_are_read_per_delivery(
    tmp_path: Path, bao: str, bao_token: str, web: HTTPServer
) -> None:
    """OpenBao + HTTP server: delivered to the KV URL, signed with the KV key."""
    bao_server.put(bao, "hooks/deploy", {"url": web.url_for("/hook"), "key": HOOK_KEY})
    got: list[Request] = []

    def receive(request: Request) -> Response:
        got.append(request)
        return Response("ok")

    web.expect_request("/hook", method="POST").respond_with_handler(receive)
    target = {"url_kv": "hooks/deploy#url", "secret_kv": "hooks/deploy#key", "retries": 0}
    webhook = {"allow_networks": LOOPBACK, "targets": {"deploy": target}}
    with broker(tmp_path, bao, webhook=webhook) as h:
        params = {"target": "deploy", "payload": {"version": "1.2.3"}}
        result = h.submit(h.request("webhook.post", params), timeout=30)
    assert result["status"] == "applied", result
    (request,) = got
    expected = hmac.new(HOOK_KEY.encode(), request.get_data(), hashlib.sha256).hexdigest()
    assert request.headers["X-Broker-Signature"] == f"sha256={expected}"
    assert json.loads(request.get_data()) == {"version": "1.2.3"}
    (used,) = result["output"]["credential"]  # one read of the one path, for both
    assert used["scope"] == "kv: hooks/deploy only; read" and used["revoked"] is True
    nowhere_holds(h, HOOK_KEY)


def test_an_smtp_password_is_read_per_send(
    tmp_path: Path, bao: str, bao_token: str, smtp_starttls: SMTP, ca_file: str
) -> None:
    """OpenBao + aiosmtpd (STARTTLS, login required): logged in with the KV password."""
    controller, inbox = smtp_starttls
    bao_server.put(bao, "smtp/relay", {"password": SMTP_PASSWORD})
    email = {
        "host": "127.0.0.1",
        "port": controller.port,
        "security": "starttls",
        "ca_file": ca_file,
        "username": "agent",
        "password_kv": "smtp/relay#password",
        "from": "agent@example.com",
        "allow_domains": ["example.com"],
    }
    with broker(tmp_path, bao, email=email) as h:
        params = {"to": ["dev@example.com"], "subject": "built", "text": "green"}
        result = h.submit(h.request("email.send", params), timeout=30)
    assert result["status"] == "applied", result
    assert inbox.logins == [("agent", SMTP_PASSWORD)] and len(inbox.messages) == 1
    (used,) = result["output"]["credential"]
    assert used["scope"] == "kv: smtp/relay only; read" and used["revoked"] is True
    nowhere_holds(h, SMTP_PASSWORD)


def test_a_sealed_openbao_fails_the_apply_and_nothing_is_sent(
    tmp_path: Path, bao_token: str, web: HTTPServer
) -> None:
    """OpenBao (its own, sealed) + HTTP server: failed, saying so; no request went out."""
    server, url = bao_server.start(tmp_path)
    try:
        bao_server.put(url, "http/ci", {"token": HTTP_SECRET})
        bao_server.seal(url)
        with broker(tmp_path, url, http=http_settings(web)) as h:
            params = {"method": "GET", "destination": "ci", "path": "/builds"}
            result = h.submit(h.request("http.request", params), timeout=30)
    finally:
        bao_server.stop(server)
    assert result["status"] == "failed", result
    assert "sealed" in result["reason"] and "nothing was applied" in result["reason"]
    assert web.log == []


def test_a_missing_field_fails_the_delivery_and_revokes_the_read(
    tmp_path: Path, bao: str, bao_token: str, web: HTTPServer
) -> None:
    """OpenBao + HTTP server: the path has no `key`: failed, nothing delivered, revoked."""
    bao_server.put(bao, "hooks/nokey", {"url": web.url_for("/hook")})
    target = {"url_kv": "hooks/nokey#url", "secret_kv": "hooks/nokey#key", "retries": 0}
    webhook = {"allow_networks": LOOPBACK, "targets": {"deploy": target}}
    with broker(tmp_path, bao, webhook=webhook) as h:
        params = {"target": "deploy", "payload": {}}
        result = h.submit(h.request("webhook.post", params), timeout=30)
    assert result["status"] == "failed", result
    assert "has no field 'key'" in result["reason"], result
    assert web.log == []
    (used,) = result["output"]["credential"]  # what was read, recorded for the failure too
    assert used["revoked"] is True and not bao_server.accessor_alive(bao, used["id"])


def test_a_read_the_child_token_may_not_make_fails_the_send_before_any_login(
    tmp_path: Path, bao: str, bao_token: str, smtp_starttls: SMTP, ca_file: str
) -> None:
    """OpenBao refuses the read (the child token's policy reaches no KV path): failed,
    saying so; the SMTP server saw no login and no message."""
    controller, inbox = smtp_starttls
    bao_server.put(bao, "smtp/relay", {"password": SMTP_PASSWORD})
    email = {
        "host": "127.0.0.1",
        "port": controller.port,
        "security": "starttls",
        "ca_file": ca_file,
        "username": "agent",
        "password_kv": "smtp/relay#password",
        "from": "agent@example.com",
        "allow_domains": ["example.com"],
    }
    h = BrokerHarness(
        tmp_path / "broker",
        integrations={"email": {"credential": "bao", **email}},
        credentials={"bao": bao_server.table(bao, policies=["default"])},
        policy=POLICY,
    )
    with h:
        params = {"to": ["dev@example.com"], "subject": "built", "text": "green"}
        result = h.submit(h.request("email.send", params), timeout=30)
    assert result["status"] == "failed", result
    assert "OpenBao refused smtp/relay (403)" in result["reason"]
    assert "ask the operator" in result["reason"] and "nothing was applied" in result["reason"]
    assert inbox.logins == [] and inbox.messages == []


def test_a_kv_reference_names_its_provider_or_the_start_stops() -> None:
    """No server: `password_kv` without `credential` is refused naming the key."""
    table = {
        "host": "smtp.example.com",
        "username": "agent",
        "password_kv": "smtp/relay#password",
        "from": "agent@example.com",
        "allow_domains": ["example.com"],
    }
    with pytest.raises(ConfigError, match=r"integrations\.email\.password_kv: name the provider"):
        EmailSend().check_config(table)
    with pytest.raises(ConfigError, match=r"password_kv: expected \"PATH#FIELD\""):
        EmailSend().check_config({**table, "credential": "bao", "password_kv": "no-field"})


def test_a_webhook_preview_reads_its_url_and_the_card_never_shows_it(
    tmp_path: Path, bao: str, bao_token: str, web: HTTPServer
) -> None:
    """OpenBao + a real broker, approval required: the preview reads the KV URL (to check
    its address) and the card masks it, as it masks a standing secret URL; the read is
    revoked; nothing is delivered yet."""
    bao_server.put(bao, "hooks/card", {"url": web.url_for("/hook/s3cr3t-path-9f2c")})
    target = {"url_kv": "hooks/card#url", "retries": 0}
    webhook = {"credential": "bao", "allow_networks": LOOPBACK, "targets": {"deploy": target}}
    before = grants.counted().get(("openbao:bao", "revoked"), 0)
    h = BrokerHarness(
        tmp_path / "broker",
        integrations={"webhook": webhook},
        credentials={"bao": bao_server.table(bao)},
        policy='[[rules]]\neffect = "webhook.post"\naction = "approve"\nreason = "look"\n',
    )
    with h:
        doc = h.request("webhook.post", {"target": "deploy", "payload": {"a": 1}})
        assert h.submit(doc, terminal=False, timeout=30)["status"] == "pending"
        record = Ledger(h.config.ledger_path).get("default", doc["id"])
    assert record is not None and record.preview is not None
    assert record.preview["target"].startswith("webhook: deploy (")
    assert "s3cr3t-path-9f2c" not in json.dumps(record.preview)
    assert web.url_for("/") not in json.dumps(record.preview)
    facts = dict(record.preview["facts"])
    assert facts["credential"].startswith("minted per apply (openbao:bao)")
    assert grants.counted()[("openbao:bao", "revoked")] > before
    assert web.log == []
