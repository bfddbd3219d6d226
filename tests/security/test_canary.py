"""Findings 5 and 8: a canary secret held by each effect appears in no result, ledger
row, audit line or log line, whatever form a hostile service echoes it back in.

Every service here is a stand-in on 127.0.0.1 that echoes the credential it was sent
(raw, base64, URL-encoded, in Basic form, cut off by a size limit). The detector is
independent of the broker's masking: it looks for any 8-character piece of the canary
in the text, in the text with %-escapes decoded, and inside every base64 run decoded.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import socketserver
import sqlite3
import ssl
import subprocess
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
import trustme

from broker.approval.notify import Notifier, Webhook
from broker.testing import BrokerHarness
from tests.security.conftest import Echo
from tests.support import eventually

CANARY = "cnry-7f3a9c1e5b2d4f6a8e0c1b3d5f7a9c2e"
ACCESS_KEY = "AKIACANARY7F3A9C1E5B"
B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")


def pieces(secret: str) -> set[str]:
    return {secret[i : i + 8] for i in range(len(secret) - 7)}


def leaks(text: str, secret: str = CANARY) -> list[str]:
    """Where `secret` (any 8 characters of it) hides in `text`, raw or encoded."""
    found = []
    candidates = {"raw": text, "url-decoded": unquote(unquote(text))}
    for run in B64_RUN.findall(text):
        for start in range(4):
            chunk = run[start:]
            chunk = chunk[: len(chunk) - len(chunk) % 4] if "=" not in chunk else chunk
            for n, decode in enumerate((base64.b64decode, base64.urlsafe_b64decode)):
                try:
                    candidates[f"base64 {run[:12]}… +{start}/{n}"] = decode(chunk).decode("latin-1")
                except (binascii.Error, ValueError):
                    continue
    for how, candidate in candidates.items():
        if any(p in candidate for p in pieces(secret)):
            found.append(how.split(" +")[0])
    return sorted(set(found))


def every_echo(secret_header: str) -> str:
    """The credential in every form a careless service may send it back in."""
    value = secret_header.split(" ", 1)[-1]
    doc = json.dumps({"auth": secret_header, "note": "debug"})
    return "\n".join(
        [
            f"raw: {secret_header}",
            f"json-b64: {base64.b64encode(doc.encode()).decode()}",
            f"url: {quote(secret_header, safe='')}",
            f"basic: Basic {base64.b64encode(f'x-access-token:{value}'.encode()).decode()}",
            f"urlsafe: {base64.urlsafe_b64encode(value.encode()).decode()}",
        ]
    )


def written(h: BrokerHarness, logs: str) -> dict[str, str]:
    """Everything the broker wrote: results, every ledger row, the audit log, its log."""
    ledger = sqlite3.connect(h.config.ledger_path)
    try:
        rows = "\n".join(ledger.iterdump())
    finally:
        ledger.close()
    results = "\n".join(p.read_text() for p in h.results.glob("*.json"))
    audit = h.config.audit_path.read_text() if h.config.audit_path.exists() else ""
    return {"results": results, "ledger": rows, "audit": audit, "log": logs}


def assert_no_canary(h: BrokerHarness, caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    text = written(h, caplog.text)
    for secret in secrets or (CANARY,):
        found = {where: leaks(t, secret) for where, t in text.items() if leaks(t, secret)}
        assert found == {}, f"{secret[:6]}… leaked: {found}"


def run_one(h: BrokerHarness, effect: str, params: dict[str, Any], **kw: Any) -> dict[str, Any]:
    result = h.submit(h.request(effect, params, **kw), timeout=30)
    assert result["status"] in ("applied", "failed"), result
    return result


# -- http.request --------------------------------------------------------------------


def test_http_request_echo_in_every_form_and_cut_at_the_cap(
    tmp_path: Path,
    echo: Callable[..., Echo],
    verbose: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A destination's bearer token echoed raw, base64 (in JSON, at any offset), URL-
    encoded, as Basic and URL-safe base64, in headers, and cut by max_response_bytes
    one character before its end."""
    monkeypatch.setenv("CANARY_HTTP", CANARY)

    def answer(req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, bytes]:
        auth = req.headers.get("Authorization", "")
        if req.path.startswith("/cut"):
            pad = "x" * (int(req.path.rsplit("/", 1)[1]))
            return 200, "text/plain", (pad + auth).encode()
        return 200, "text/plain", every_echo(auth).encode()

    server = echo(answer)
    settings = {
        "max_response_bytes": 200,
        "destinations": {
            "crm": {
                "base_url": server.url,
                "allow_networks": ["127.0.0.0/8"],
                "secret_headers": {
                    "Authorization": {"value_env": "CANARY_HTTP", "prefix": "Bearer "}
                },
                "response": "body",  # masking alone, as defence in depth
            }
        },
    }
    with BrokerHarness(tmp_path / "h", integrations={"http": settings}) as h:
        out = run_one(h, "http.request", {"method": "GET", "destination": "crm", "path": "/echo"})
        assert out["status"] == "applied" and "debug" not in out["output"]["body"]
        for cut in (200 - len("Bearer ") - len(CANARY) + k for k in (1, 5, 20)):
            cut_out = run_one(
                h, "http.request", {"method": "GET", "destination": "crm", "path": f"/cut/{cut}"}
            )
            assert cut_out["output"]["truncated"] is True
        assert len(server.seen) == 4
        assert all(s["headers"]["Authorization"] == f"Bearer {CANARY}" for s in server.seen)
        assert_no_canary(h, verbose)


# -- webhook.post and the notifier ---------------------------------------------------


def test_webhook_secret_url_is_never_written_or_logged(
    tmp_path: Path,
    echo: Callable[..., Echo],
    verbose: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A target whose URL is a secret: a receiver echoing its path (base64 too, and in a
    404), and httpx's own `HTTP Request: POST …` log line, leave no trace of it."""

    def answer(req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, bytes]:
        echoed = f"no hook at {req.path}; b64 {base64.b64encode(req.path.encode()).decode()}"
        return (404 if "gone" in req.path else 200), "text/plain", echoed.encode()

    server = echo(answer)
    monkeypatch.setenv("CANARY_HOOK", f"{server.url}/hook/{CANARY}")
    monkeypatch.setenv("CANARY_GONE", f"{server.url}/gone/{CANARY}")
    targets = {
        "deploy": {"url_env": "CANARY_HOOK", "retries": 0},
        "gone": {"url_env": "CANARY_GONE", "retries": 0},
    }
    with BrokerHarness(
        tmp_path / "h",
        integrations={"webhook": {"allow_networks": ["127.0.0.0/8"], "targets": targets}},
        policy='[[rules]]\neffect = "webhook.post"\naction = "auto"\nreason = "test"\n',
    ) as h:
        ok = run_one(h, "webhook.post", {"target": "deploy", "payload": {"a": 1}})
        gone = run_one(h, "webhook.post", {"target": "gone", "payload": {"a": 1}})
        assert ok["status"] == "applied" and gone["status"] == "failed"
        assert len(server.seen) == 2
        assert_no_canary(h, verbose)


def test_notifier_webhook_url_is_not_logged(
    echo: Callable[..., Echo], verbose: pytest.LogCaptureFixture
) -> None:
    """The notifier posting to a secret URL leaves no `HTTP Request: POST …/<secret>` line."""
    server = echo(lambda req, body: (500, "text/plain", req.path.encode()))
    notifier = Notifier([Webhook(f"{server.url}/n/{CANARY}", "json")])
    card = {
        "ref": "s/r",
        "sandbox": "s",
        "id": "r",
        "effect": "x.y",
        "what": {"title": "t", "body": ""},
        "where": "x",
        "why": {"rule": "default", "reason": "r"},
        "if_nobody_answers": {"expires_at": None, "on_timeout": "deny"},
        "agent_reason": None,
        "request_sha256": "0" * 64,
    }
    try:
        notifier.pending(card)
        eventually(lambda: len(server.seen) >= 1, timeout=10)
    finally:
        notifier.close()
    assert leaks(verbose.text) == []


# -- git.push --------------------------------------------------------------------------


def test_git_push_token_echoed_in_basic_form_is_masked(
    tmp_path: Path,
    echo: Callable[..., Echo],
    verbose: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A git server answering `ERR access denied for Basic <base64 of user:token>`: git
    prints it, the broker's reason carries git's words, the token in no form."""
    monkeypatch.setenv("CANARY_GIT", CANARY)

    def answer(req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, bytes]:
        msg = f"ERR access denied for {req.headers.get('Authorization')}"
        return (
            200,
            "application/x-git-upload-pack-advertisement",
            b"%04x%s\n"
            % (
                len(msg) + 5,
                msg.encode(),
            ),
        )

    server = echo(answer)
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    env = {
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@b",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@b",
        "HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
    }
    (work / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "a"], check=True, env=env)
    bundle = tmp_path / "b.bundle"
    subprocess.run(
        ["git", "-C", str(work), "bundle", "create", "-q", str(bundle), "main"], check=True, env=env
    )
    remotes = {"origin": {"url": f"{server.url}/r.git", "token_env": "CANARY_GIT"}}
    policy = '[[rules]]\neffect = "git.push"\naction = "approve"\nreason = "test"\n'
    with BrokerHarness(
        tmp_path / "h", integrations={"git": {"remotes": remotes}}, policy=policy
    ) as h:
        doc = h.request(
            "git.push",
            {"remote": "origin", "branch": "agent/x", "bundle": "b", "expected_old": None},
            attachments=["b"],
        )
        h.write(f"{doc['id']}.b.bin", bundle.read_bytes())
        result = h.submit(doc, timeout=30, terminal=False)
        assert result["status"] in ("pending", "failed"), result
        assert server.seen, "git never reached the stand-in"
        assert_no_canary(h, verbose)


# -- github.* -----------------------------------------------------------------------


def test_github_token_echoed_in_an_error_is_masked(
    tmp_path: Path,
    echo: Callable[..., Echo],
    verbose: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GitHub stand-in answering 422 with the Authorization header in its message."""
    monkeypatch.setenv("CANARY_GH", CANARY)

    def answer(req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, bytes]:
        said = {
            "message": f"Validation Failed for {req.headers.get('Authorization')}",
            "errors": [{"message": every_echo(req.headers.get("Authorization", ""))}],
        }
        return 422, "application/json", json.dumps(said).encode()

    server = echo(answer)
    settings = {"token_env": "CANARY_GH", "base_url": server.url}
    policy = '[[rules]]\neffect = "github.*"\naction = "auto"\nreason = "test"\n'
    with BrokerHarness(tmp_path / "h", integrations={"github": settings}, policy=policy) as h:
        result = run_one(h, "github.issue.comment", {"repo": "acme/api", "number": 1, "body": "hi"})
        assert result["status"] == "failed"
        assert server.seen
        assert_no_canary(h, verbose)


# -- s3.* ------------------------------------------------------------------------------


def test_s3_access_key_echoed_by_the_service_is_masked(
    tmp_path: Path,
    echo: Callable[..., Echo],
    verbose: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An S3 stand-in answering 403 InvalidAccessKeyId with the key id and the whole
    Authorization header, as S3 does, in its XML error."""
    monkeypatch.setenv("CANARY_AK", ACCESS_KEY)
    monkeypatch.setenv("CANARY_SK", CANARY)

    def answer(req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, bytes]:
        auth = req.headers.get("Authorization", "")
        xml = (
            "<?xml version='1.0'?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS "
            f"Access Key Id you provided does not exist: {ACCESS_KEY} ({auth})</Message>"
            f"<AWSAccessKeyId>{ACCESS_KEY}</AWSAccessKeyId></Error>"
        )
        return 403, "application/xml", xml.encode()

    server = echo(answer)
    settings = {
        "allow": ["scratch/*"],
        "endpoint_url": server.url,
        "region": "us-east-1",
        "addressing_style": "path",
        "access_key_id_env": "CANARY_AK",
        "secret_access_key_env": "CANARY_SK",
    }
    policy = '[[rules]]\neffect = "s3.*"\naction = "auto"\nreason = "test"\n'
    with BrokerHarness(tmp_path / "h", integrations={"s3": settings}, policy=policy) as h:
        result = run_one(h, "s3.put_object", {"bucket": "scratch", "key": "a.txt", "body": "x"})
        assert result["status"] == "failed"
        assert server.seen
        assert_no_canary(h, verbose, ACCESS_KEY, CANARY)


# -- email.send ------------------------------------------------------------------------


class _TLSServer(socketserver.ThreadingTCPServer):
    """A TCP server whose connections are TLS from the first byte (SMTPS)."""

    daemon_threads = True

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _EchoSMTP)
        self.context = context

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        return self.context.wrap_socket(sock, server_side=True), address


class _EchoSMTP(socketserver.StreamRequestHandler):
    """Advertises AUTH PLAIN and refuses the login, echoing the credentials it got."""

    def handle(self) -> None:
        self.wfile.write(b"220 echo ESMTP\r\n")
        for raw in self.rfile:
            line = raw.decode("latin-1").rstrip("\r\n")
            verb = line.split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                self.wfile.write(b"250-echo\r\n250 AUTH PLAIN\r\n")
            elif verb == "AUTH":
                self.wfile.write(f"535 5.7.8 no such login: {line[5:]}\r\n".encode("latin-1"))
            elif verb == "QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            else:
                self.wfile.write(b"250 ok\r\n")


def test_email_password_echoed_by_the_server_is_masked(
    tmp_path: Path, verbose: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SMTPS server refusing AUTH PLAIN and echoing its base64 `\\0user\\0password`."""
    monkeypatch.setenv("CANARY_SMTP", CANARY)
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = _TLSServer(context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = {
        "host": "127.0.0.1",
        "port": server.server_address[1],
        "security": "ssl",
        "ca_file": str(ca_file),
        "username": "robot",
        "password_env": "CANARY_SMTP",
        "from": "robot@example.com",
        "allow_domains": ["example.com"],
    }
    policy = '[[rules]]\neffect = "email.send"\naction = "auto"\nreason = "test"\n'
    try:
        with BrokerHarness(tmp_path / "h", integrations={"email": settings}, policy=policy) as h:
            params = {"to": ["a@example.com"], "subject": "s", "text": "t"}
            result = run_one(h, "email.send", params)
            assert result["status"] == "failed" and "535" in result["reason"], result
            assert_no_canary(h, verbose)
    finally:
        server.shutdown()
        server.server_close()
