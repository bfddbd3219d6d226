"""Secrets reach handlers only through ctx.secret (or Settings.secret at start): a
relative `*_file` is read beside broker.toml, never from the directory the broker runs in.

Each test puts a decoy file of the same name in the current directory, so reading the
wrong one shows as the wrong value arriving at a real local server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from broker.errors import ConfigError
from broker.settings import Settings
from broker.testing import make_context
from effects.email import EmailSend
from effects.git import GitPush
from effects.http import HttpRequest
from effects.webhook import WebhookPost
from tests.effects.netfixtures import (  # noqa: F401  (fixtures, used by their names)
    SMTP,
    SMTP_PASSWORD,
    fixture_ca,
    fixture_ca_file,
    fixture_loopback_only,
    fixture_smtp_starttls,
    fixture_web,
    fixture_web_server,
    run,
)

BROKER = Path(sys.executable).with_name("broker")
KEY = "key-beside-broker-toml"


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    """The folder broker.toml lives in."""
    path = tmp_path / "etc"
    path.mkdir()
    return path


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory: somewhere else, holding decoys of every secret file."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    for name in ("hook-url", "hook-key", "smtp-password", "crm-token", "git-token"):
        (path / name).write_text("decoy-from-the-current-directory\n")
    monkeypatch.chdir(path)
    return path


def _wait_for_result(results: Path, request_id: str, broker: subprocess.Popen[bytes]) -> Any:
    path = results / f"{request_id}.json"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if path.exists():
            result = json.loads(path.read_bytes())
            if result.get("status") not in ("received", "pending", "applying"):
                return result
        assert broker.poll() is None, "the broker exited early"
        time.sleep(0.05)
    raise AssertionError(f"no result for {request_id} within 60 s")


def test_a_real_broker_reads_relative_secret_files_beside_its_config(
    web: HTTPServer, etc: Path, elsewhere: Path, tmp_path: Path
) -> None:
    """`broker serve --config etc/broker.toml`, run elsewhere: url_file and secret_file come
    from etc/, so the webhook reaches the right URL signed with the right key."""
    web.expect_request("/hook", method="POST").respond_with_data("ok")
    (etc / "hook-url").write_text(f"http://127.0.0.1:{web.port}/hook\n")
    (etc / "hook-key").write_text(f"{KEY}\n")
    (etc / "policy.toml").write_text(
        '[[rules]]\neffect = "webhook.post"\naction = "auto"\nreason = "test target"\n'
    )
    (etc / "broker.toml").write_text(
        '[broker]\nstate_dir = "state"\npolicy = "policy.toml"\n\n'
        '[integrations.webhook]\nallow_networks = ["127.0.0.0/8"]\n\n'
        "[integrations.webhook.targets.hook]\n"
        'url_file = "hook-url"\nsecret_file = "hook-key"\nretries = 0\ntimeout = "5s"\n'
    )
    outbox, results = tmp_path / "box" / "outbox", tmp_path / "box" / "results"
    outbox.mkdir(parents=True)
    results.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_", "PYTEST_"))}
    env["HOME"] = str(tmp_path)
    args = ["serve", "--config", str(etc / "broker.toml"), "--outbox", str(outbox)]
    log = (tmp_path / "broker.log").open("wb")
    broker = subprocess.Popen(
        [str(BROKER), *args, "--results", str(results)],
        cwd=elsewhere,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    try:
        request_id = uuid.uuid4().hex
        doc = {"version": 1, "id": request_id, "effect": "webhook.post"}
        doc["params"] = {"target": "hook", "payload": {"text": "deployed"}}
        (outbox / ".tmp").write_text(json.dumps(doc))
        os.rename(outbox / ".tmp", outbox / f"{request_id}.json")
        result = _wait_for_result(results, request_id, broker)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(30)
        log.close()
    assert result["status"] == "applied", (result, (tmp_path / "broker.log").read_text())
    (request, _), *_ = web.log
    assert request.path == "/hook"
    body = request.get_data()
    expected = "sha256=" + hmac.new(KEY.encode(), body, hashlib.sha256).hexdigest()
    assert request.headers["X-Broker-Signature"] == expected
    assert (etc / "state" / "ledger.sqlite3").exists()
    assert KEY not in (results / f"{request_id}.json").read_text()


def test_webhook_check_config_reads_secret_files_beside_broker_toml(
    etc: Path, elsewhere: Path
) -> None:
    """At start, with the Settings the broker passes, url_file resolves in etc/; a plain
    table (no broker.toml) reads the current directory and finds the decoy URL unusable."""
    (etc / "hook-url").write_text("https://hooks.example/services/x\n")
    table = {"targets": {"hook": {"url_file": "hook-url"}}}
    WebhookPost().check_config(Settings(table, "integrations.webhook", etc))
    with pytest.raises(ConfigError, match=r"integrations\.webhook\.targets\.hook\.url"):
        WebhookPost().check_config(table)


def test_email_password_file_beside_broker_toml_logs_in(
    smtp_starttls: SMTP, ca_file: str, etc: Path, elsewhere: Path
) -> None:
    """password_file = "smtp-password" is read from etc/: the SMTP server sees that password."""
    controller, inbox = smtp_starttls
    (etc / "smtp-password").write_text(f"{SMTP_PASSWORD}\n")
    settings = {
        "host": "127.0.0.1",
        "port": controller.port,
        "security": "starttls",
        "ca_file": ca_file,
        "username": "agent",
        "password_file": "smtp-password",
        "from": "agent@example.com",
        "allow_domains": ["example.com"],
        "helo": "broker.test",
        "timeout": "5s",
    }
    EmailSend().check_config(Settings(settings, "integrations.email", etc))
    ctx = make_context(settings, integration="email", config_dir=etc)
    run(EmailSend(), {"to": ["jane@example.com"], "subject": "s", "text": "t"}, ctx)
    assert inbox.logins == [("agent", SMTP_PASSWORD)]
    assert len(inbox.messages) == 1


def test_http_secret_header_file_beside_broker_toml_is_sent(
    web: HTTPServer, etc: Path, elsewhere: Path
) -> None:
    """A secret header's value_file is read from etc/ and sent to its own destination."""
    web.expect_request("/api/contacts").respond_with_json({"ok": True})
    (etc / "crm-token").write_text("crm-token-from-etc\n")
    settings = {
        "allow_networks": ["127.0.0.0/8"],
        "destinations": {
            "crm": {
                "base_url": f"http://127.0.0.1:{web.port}/api",
                "secret_headers": {
                    "X.Api-Key": {"value_file": "crm-token", "prefix": "Token "},
                },
                "response": "body",
            }
        },
    }
    HttpRequest().check_config(Settings(settings, "integrations.http", etc))
    ctx = make_context(settings, integration="http", config_dir=etc)
    out = run(HttpRequest(), {"method": "GET", "destination": "crm", "path": "/contacts"}, ctx)
    assert out["status"] == 200
    (request, _), *_ = web.log
    assert request.headers["X.Api-Key"] == "Token crm-token-from-etc"


def test_git_remote_token_file_beside_broker_toml_even_for_a_dotted_remote_name(
    etc: Path, elsewhere: Path
) -> None:
    """A remote named github.com is one table: its token_file is read from etc/."""
    (etc / "git-token").write_text("ghp_from_etc\n")
    settings = {"remotes": {"github.com": {"url": "/srv/x.git", "token_file": "git-token"}}}
    GitPush().check_config(Settings(settings, "integrations.git", etc))
    ctx = make_context(settings, integration="git", config_dir=etc)
    params = {"remote": "github.com", "branch": "agent/x", "bundle": "b", "expected_old": None}
    GitPush().check(params, ctx)
    assert GitPush()._remote(params, ctx).token == "ghp_from_etc"
