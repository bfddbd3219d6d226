"""Slack, against a local server playing Slack's side on 127.0.0.1: the Web API the
broker calls (chat.postMessage, chat.update, views.open, response_url) and the signed
callbacks Slack would send when someone clicks. Correct and wrong signatures, replays,
stale timestamps, unknown users; decisions reach the ledger and the audit log as the
mapped approver; messages are updated; reminders go out before the deadline."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from broker.approval.notify import attach
from broker.config import Config, load_config
from broker.errors import ConfigError
from broker.registry import Registry
from broker.slack.notifier import SlackNotifier
from broker.slack.settings import SlackSettings, slack_settings
from broker.slack.signing import signature
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeClock, FakeHandler
from broker.web.app import create_app
from broker.web.auth import hash_token
from broker.web.server import WebServer
from tests.support import TLS, eventually
from tests.web.conftest import TOKENS, Switch

BOT_TOKEN = "xoxb-test-bot-token"
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
CHANNEL = "C0BROKER"
ALICE, BOB, STRANGER = "U0ALICE", "U0BOB", "U0NOBODY"
INBOX = "http://127.0.0.1:8700"
SLACKY_REASON = "a click in Slack will do for these"
POLICY = f"""
[[rules]]
effect = "test.slacky"
action = "approve"
slack_buttons = true
reason = "{SLACKY_REASON}"

[[rules]]
effect = "test.record"
action = "approve"
reason = "a person looks at every record first"

[[rules]]
effect = "test.rig*"
action = "approve"
slack_buttons = true
reason = "buttons, but only where reversible"

[[rules]]
effect = "test.bold"
action = "approve"
slack_buttons = true
slack_buttons_irreversible = true
reason = "buttons even though irreversible"

[[rules]]
effect = "test.pair"
action = "approve"
approvals = 2
slack_buttons = true
reason = "two people"
"""


# -- Slack's side ----------------------------------------------------------------------------


@dataclass
class FakeSlack:
    """A local stand-in for Slack: records every call; signs callbacks as Slack would."""

    base: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    answers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stamps: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def of(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.calls if c["path"] == path]

    def api(self, method: str) -> list[dict[str, Any]]:
        return self.of(f"/api/{method}")

    def wait(self, method: str, count: int = 1) -> list[dict[str, Any]]:
        return eventually(lambda: (found := self.api(method)) and len(found) >= count and found)

    def replies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.calls if c["path"].startswith("/hooks/")]

    def message_for(self, request_id: str) -> dict[str, Any]:
        """The chat.postMessage call (and Slack's answer) that shows `request_id`."""
        posted = eventually(
            lambda: [c for c in self.api("chat.postMessage") if request_id in json.dumps(c["body"])]
        )
        return dict(posted[0])

    def payload(self, posted: dict[str, Any], user: str, action_id: str) -> dict[str, Any]:
        """The block_actions payload Slack sends when `user` clicks `action_id`."""
        elements = [
            e for b in posted["body"]["blocks"] if b["type"] == "actions" for e in b["elements"]
        ]
        (button,) = [e for e in elements if e["action_id"] == action_id]
        channel, ts = posted["answer"]["channel"], posted["answer"]["ts"]
        return {
            "type": "block_actions",
            "user": {"id": user, "username": user.lower(), "team_id": "T0TEAM"},
            "api_app_id": "A0APP",
            "team": {"id": "T0TEAM"},
            "container": {"type": "message", "message_ts": ts, "channel_id": channel},
            "trigger_id": "1337.42.trigger",
            "channel": {"id": channel},
            "message": {"ts": ts, "blocks": posted["body"]["blocks"]},
            "response_url": f"{self.base}/hooks/actions/T0TEAM/1/reply",
            "actions": [
                {
                    "action_id": action_id,
                    "block_id": "decide",
                    "value": button.get("value"),
                    "action_ts": f"{time.time():.6f}{next(self.stamps)}",  # each click differs
                }
            ],
        }

    def submission(self, view: dict[str, Any], user: str, reason: str) -> dict[str, Any]:
        """The view_submission payload for the deny dialog, with `reason` typed in."""
        return {
            "type": "view_submission",
            "user": {"id": user},
            "view": {
                "id": "V0VIEW",
                "callback_id": view["callback_id"],
                "private_metadata": view["private_metadata"],
                "state": {
                    "values": {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}
                },
            },
        }

    @staticmethod
    def signed(
        payload: dict[str, Any], *, secret: str = SECRET, at: int | None = None
    ) -> tuple[bytes, dict[str, str]]:
        body = urlencode({"payload": json.dumps(payload)}).encode()
        stamp = str(int(time.time()) if at is None else at)
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": signature(secret, stamp, body),
        }
        return body, headers


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    """The stand-in for Slack, on 127.0.0.1."""
    state = FakeSlack()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = json.loads(raw) if raw else {}
            method = self.path.removeprefix("/api/")
            answer: dict[str, Any] = {"ok": True}
            if self.path.startswith("/api/"):
                if self.headers.get("Authorization") != f"Bearer {BOT_TOKEN}":
                    answer = {"ok": False, "error": "invalid_auth"}
                elif state.answers.get(method):
                    answer = state.answers[method].pop(0)
                elif method == "chat.postMessage":
                    answer = {
                        "ok": True,
                        "channel": CHANNEL,
                        "ts": f"1700000000.{next(state.stamps):06d}",
                    }
                elif method == "chat.update":
                    answer = {"ok": True, "channel": body.get("channel"), "ts": body.get("ts")}
            with state.lock:
                state.calls.append({"path": self.path, "body": body, "answer": answer})
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join(5)


# -- the broker, its inbox and Slack ---------------------------------------------------------


@dataclass
class Stack:
    """A broker posting to the fake Slack, and its web app taking Slack's callbacks."""

    harness: BrokerHarness
    config: Config
    url: str
    slack: FakeSlack

    def gated(self, effect: str = "test.slacky", **fields: Any) -> dict[str, Any]:
        doc = self.harness.request(effect, fields.pop("params", {"value": "hello"}), **fields)
        result = self.harness.submit(doc, terminal=False)
        assert result["status"] == "pending", result
        return result

    def post(self, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(
            f"{self.url}/slack/actions", content=body, headers=headers, timeout=10, verify=TLS
        )

    def click(
        self, result: dict[str, Any], user: str, action_id: str = "approve"
    ) -> httpx.Response:
        posted = self.slack.message_for(result["id"])
        return self.post(*FakeSlack.signed(self.slack.payload(posted, user, action_id)))

    def decisions(self) -> list[Any]:
        ledger = Ledger(self.config.ledger_path)
        try:
            return ledger.all_decisions()
        finally:
            ledger.close()

    def status(self, result: dict[str, Any]) -> str:
        ledger = Ledger(self.config.ledger_path)
        try:
            record = ledger.get("default", result["id"])
            assert record is not None
            return record.state
        finally:
            ledger.close()


def slack_table(slack: FakeSlack, **extra: Any) -> dict[str, Any]:
    return {
        "bot_token_env": "TEST_SLACK_BOT_TOKEN",
        "signing_secret_env": "TEST_SLACK_SIGNING_SECRET",
        "channel": CHANNEL,
        "api_url": f"{slack.base}/api",
        "hooks_url": f"{slack.base}/hooks/",
        **extra,
    }


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bot token and signing secret, in the host's environment only."""
    monkeypatch.setenv("TEST_SLACK_BOT_TOKEN", BOT_TOKEN)
    monkeypatch.setenv("TEST_SLACK_SIGNING_SECRET", SECRET)


@pytest.fixture
def stack(
    tmp_path: Path, slack: FakeSlack, secrets: None, served: tuple[Switch, WebServer]
) -> Iterator[Stack]:
    handlers = [
        FakeHandler("test.slacky"),
        FakeHandler("test.record"),
        FakeHandler("test.rigid", reversible=False),
        FakeHandler("test.bold", reversible=False),
        FakeHandler("test.pair"),
    ]
    with BrokerHarness(tmp_path / "h", handlers=handlers, policy=POLICY, builtins=False) as h:
        config = h.config._replace(
            notify={"inbox_url": INBOX, "slack": slack_table(slack)},
            approvers={
                "alice": {"token_sha256": hash_token(TOKENS["alice"]), "slack_user": ALICE},
                "bob": {"token_sha256": hash_token(TOKENS["bob"]), "slack_user": BOB},
            },
        )
        assert h.broker is not None
        attach(h.broker, config)  # what `broker serve` does with [notify]
        switch, server = served
        app = create_app(config, h.registry)
        switch.app = app
        try:
            yield Stack(h, config, server.url, slack)
        finally:
            switch.app = None
            app.state.inbox.close()
            app.state.slack.close()


def buttons(posted: dict[str, Any]) -> list[str]:
    return [
        e["action_id"]
        for b in posted["body"]["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
    ]


def text_of(call: dict[str, Any]) -> str:
    return json.dumps(call["body"], ensure_ascii=False)


# -- what is posted ----------------------------------------------------------------------------


def test_buttons_only_where_the_rule_allows_them(stack: Stack) -> None:
    """slack_buttons = true gives Approve/Deny; no key, none; an irreversible request
    under a slack_buttons rule gets none unless the rule also says slack_buttons_irreversible."""
    slacky, plain = stack.gated(), stack.gated("test.record")
    rigid, bold = stack.gated("test.rigid"), stack.gated("test.bold")
    shown = {r["id"]: stack.slack.message_for(r["id"]) for r in (slacky, plain, rigid, bold)}
    assert buttons(shown[slacky["id"]]) == ["approve", "deny", "open"]
    assert buttons(shown[plain["id"]]) == ["open"]
    assert buttons(shown[rigid["id"]]) == ["open"]
    assert buttons(shown[bold["id"]]) == ["approve", "deny", "open"]
    first = shown[slacky["id"]]
    assert first["body"]["channel"] == CHANNEL
    assert SLACKY_REASON in text_of(first)
    value = json.loads(next(
        e["value"] for b in first["body"]["blocks"] if b["type"] == "actions"
        for e in b["elements"] if e["action_id"] == "approve"
    ))  # fmt: skip
    assert value == {"ref": f"default/{slacky['id']}", "sha256": slacky["request_sha256"]}
    assert "cannot be undone" in text_of(shown[bold["id"]])  # the confirm dialog says so
    assert "its rule does not allow deciding it in Slack" in text_of(shown[plain["id"]])


def test_sandbox_text_cannot_ping_or_hide_in_the_message(stack: Stack) -> None:
    """The agent's words and the body are neutralised and escaped: no @channel, no link,
    no hidden characters, and the code block holds."""
    hostile = stack.gated(
        params={"value": "<!channel> ```\n<https://evil.test|click> \u202egnp.exe"},
        reason="<@U0BOSS> approve this \u200b now",
    )
    text = text_of(stack.slack.message_for(hostile["id"]))
    for forged in ("<!channel>", "<@U0BOSS>", "<https://evil.test|click>", "\u202e", "\u200b"):
        assert forged not in text
    assert "&lt;!channel&gt;" in text and "&lt;U+202E RLO&gt;" in text
    assert "&lt;U+200B ZWSP&gt;" in text
    assert "(its words, unverified)" in text


# -- clicks ----------------------------------------------------------------------------


def test_signed_approve_click_decides_as_the_mapped_approver(stack: Stack) -> None:
    """Alice's click on Approve applies the request as alice via slack: in the result,
    the ledger and the audit log; the message then says who approved it."""
    waiting = stack.gated()
    response = stack.click(waiting, ALICE)
    assert response.status_code == 200
    result = stack.harness.wait(waiting["id"])
    assert (result["status"], result["decided_by"]) == ("applied", "alice")
    [decision] = stack.decisions()
    assert (decision.approver, decision.surface, decision.sha256) == (
        "alice",
        "slack",
        waiting["request_sha256"],
    )
    audit = [json.loads(line) for line in stack.config.audit_path.read_text().splitlines()]
    logged = [e for e in audit if e["event"] == "decision" and e["id"] == waiting["id"]]
    assert [(e["by"], e["surface"]) for e in logged] == [("alice", "slack")]
    updates = stack.slack.wait("chat.update")
    posted = stack.slack.message_for(waiting["id"])
    assert updates[0]["body"]["ts"] == posted["answer"]["ts"]
    assert updates[0]["body"]["channel"] == CHANNEL
    assert "approved by alice" in text_of(updates[0])
    assert "approve" not in buttons(updates[0])  # the buttons are gone
    eventually(lambda: "Applied" in text_of(stack.slack.api("chat.update")[-1]))
    assert "approved by alice" in text_of(stack.slack.api("chat.update")[-1])


def test_deny_asks_for_a_reason_then_records_it(stack: Stack) -> None:
    """Deny opens a dialog; an empty reason is refused in the dialog; a reason denies
    the request as bob, and the agent reads it."""
    waiting = stack.gated()
    assert stack.click(waiting, BOB, "deny").status_code == 200
    [opened] = stack.slack.wait("views.open")
    assert opened["body"]["trigger_id"] == "1337.42.trigger"
    view = opened["body"]["view"]
    assert stack.status(waiting) == "pending"
    empty = stack.post(*FakeSlack.signed(stack.slack.submission(view, BOB, "  ")))
    assert empty.json()["response_action"] == "errors"
    assert "needs a reason" in empty.json()["errors"]["reason"]
    done = stack.post(
        *FakeSlack.signed(stack.slack.submission(view, BOB, "use the scratch bucket"))
    )
    assert done.status_code == 200
    result = stack.harness.wait(waiting["id"])
    assert (result["status"], result["reason"]) == (
        "denied",
        "denied by bob: use the scratch bucket",
    )
    assert [(d.approver, d.surface) for d in stack.decisions()] == [("bob", "slack")]
    assert "denied by bob: use the scratch bucket" in text_of(stack.slack.wait("chat.update")[0])


def test_a_quorum_click_says_how_many_more(stack: Stack) -> None:
    """On a two-person rule, alice's click keeps the buttons and says 1 of 2; bob's settles."""
    waiting = stack.gated("test.pair")
    stack.click(waiting, ALICE)
    first = stack.slack.wait("chat.update")[0]
    assert "Approved so far by alice (1 of 2)" in text_of(first)
    assert "approve" in buttons(first)
    assert stack.click(waiting, ALICE).status_code == 200  # twice: refused, said back
    assert "already decided" in text_of(eventually(stack.slack.replies)[0])
    stack.click(waiting, BOB)
    assert stack.harness.wait(waiting["id"])["decided_by"] == "alice, bob"


def test_unknown_slack_user_is_refused_with_a_message_back(stack: Stack) -> None:
    """Someone without a slack_user mapping decides nothing and is told why, privately."""
    waiting = stack.gated()
    assert stack.click(waiting, STRANGER).status_code == 200
    [reply] = eventually(stack.slack.replies)
    assert reply["body"]["response_type"] == "ephemeral"
    assert "not an approver" in reply["body"]["text"] and STRANGER in reply["body"]["text"]
    assert stack.status(waiting) == "pending" and stack.decisions() == []
    assert stack.slack.api("chat.update") == []


def test_a_click_on_a_request_decided_elsewhere_is_refused_and_the_message_follows(
    stack: Stack,
) -> None:
    """Bob approves in the inbox; the Slack message is updated to say so; alice's late
    click is refused with the reason, and nothing more is recorded."""
    waiting = stack.gated()
    stack.slack.message_for(waiting["id"])
    httpx.post(
        f"{stack.url}/api/v1/requests/default/{waiting['id']}/decision",
        headers={"Authorization": f"Bearer {TOKENS['bob']}"},
        json={"verdict": "approve", "request_sha256": waiting["request_sha256"]},
        verify=TLS,
    )
    assert stack.harness.wait(waiting["id"])["status"] == "applied"
    update = stack.slack.wait("chat.update")[0]
    assert "approved by bob" in text_of(update) and "Applied" in text_of(update)
    stack.click(waiting, ALICE)
    assert "not waiting for a decision" in text_of(eventually(stack.slack.replies)[0])
    assert [d.approver for d in stack.decisions()] == ["bob"]


def test_a_forged_click_for_a_request_without_buttons_decides_nothing(stack: Stack) -> None:
    """Even a signed click is checked against the rule: no slack_buttons, no decision."""
    plain = stack.gated("test.record")
    payload = {
        "type": "block_actions",
        "user": {"id": ALICE},
        "container": {"channel_id": CHANNEL, "message_ts": "1.2"},
        "response_url": f"{stack.slack.base}/hooks/actions/x",
        "actions": [
            {
                "action_id": "approve",
                "value": json.dumps(
                    {"ref": f"default/{plain['id']}", "sha256": plain["request_sha256"]}
                ),
            }
        ],
    }
    assert stack.post(*FakeSlack.signed(payload)).status_code == 200
    assert "cannot be decided in Slack" in text_of(eventually(stack.slack.replies)[0])
    assert stack.status(plain) == "pending" and stack.decisions() == []


# -- signatures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("wrong secret", "bad_signature"),
        ("tampered body", "bad_signature"),
        ("no signature", "bad_signature"),
        ("no timestamp", "unsigned"),
        ("stale", "stale"),
        ("from the future", "stale"),
    ],
)
def test_unsigned_or_stale_callbacks_are_refused(stack: Stack, case: str, code: str) -> None:
    """A callback not signed with the app's secret, changed after signing, or outside the
    five-minute window is a 401 and decides nothing."""
    waiting = stack.gated()
    payload = stack.slack.payload(stack.slack.message_for(waiting["id"]), ALICE, "approve")
    now = int(time.time())
    body, headers = FakeSlack.signed(payload)
    if case == "wrong secret":
        body, headers = FakeSlack.signed(payload, secret="not-the-secret")
    elif case == "tampered body":
        body = body.replace(b"U0ALICE", b"U0BOB")
    elif case == "no signature":
        del headers["X-Slack-Signature"]
    elif case == "no timestamp":
        del headers["X-Slack-Request-Timestamp"]
    elif case == "stale":
        body, headers = FakeSlack.signed(payload, at=now - 600)
    elif case == "from the future":
        body, headers = FakeSlack.signed(payload, at=now + 600)
    response = stack.post(body, headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == code
    assert stack.status(waiting) == "pending" and stack.decisions() == []
    assert stack.slack.api("chat.update") == [] and stack.slack.replies() == []


def test_a_replayed_callback_is_refused_even_after_a_restart(stack: Stack) -> None:
    """The same signed request sent again is refused, also by a new web app on the same
    state dir; a fresh click still works."""
    quorum = stack.gated("test.pair")
    body, headers = FakeSlack.signed(
        stack.slack.payload(stack.slack.message_for(quorum["id"]), ALICE, "approve")
    )
    assert stack.post(body, headers).status_code == 200
    again = stack.post(body, headers)
    assert (again.status_code, again.json()["error"]["code"]) == (401, "replayed")
    restarted = create_app(stack.config, stack.harness.registry)
    try:
        answer = restarted.state.slack.handle(
            body, headers["X-Slack-Request-Timestamp"], headers["X-Slack-Signature"]
        )
        assert answer.status_code == 401
    finally:
        restarted.state.inbox.close()
        restarted.state.slack.close()
    assert [d.approver for d in stack.decisions()] == ["alice"]
    assert stack.click(quorum, BOB).status_code == 200
    assert stack.harness.wait(quorum["id"])["status"] == "applied"


def test_the_callback_is_absent_without_slack(
    tmp_path: Path, served: tuple[Switch, WebServer]
) -> None:
    """Without [notify.slack] the endpoint answers 404 and takes nothing."""
    switch, server = served
    config = Config(state_dir=tmp_path / "state")
    app = create_app(config, Registry())
    switch.app = app
    try:
        response = httpx.post(f"{server.url}/slack/actions", content=b"payload=%7B%7D", verify=TLS)
        assert response.status_code == 404
    finally:
        switch.app = None
        app.state.inbox.close()


# -- reminders ------------------------------------------------------------------------------


def waiting_card(request_id: str, expires_in: float, clock: FakeClock) -> dict[str, Any]:
    expires = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(clock.time() + expires_in))
    return {
        "sandbox": "default",
        "id": request_id,
        "ref": f"default/{request_id}",
        "effect": "test.slacky",
        "status": "pending",
        "request_sha256": "ab" * 32,
        "what": {"title": "record 'x'", "body": "{}", "body_kind": "json", "facts": []},
        "where": "test: test.slacky",
        "why": {"rule": "rules[0]", "reason": SLACKY_REASON},
        "if_nobody_answers": {
            "expires_at": expires,
            "on_timeout": "deny",
            "seconds_left": expires_in,
        },
        "agent_reason": None,
        "reversible": True,
        "approvals": {"have": [], "needed": 1},
        "slack_buttons": True,
        "reason": None,
    }


def settings_for(slack: FakeSlack, tmp_path: Path) -> SlackSettings:
    return SlackSettings(
        bot_token=BOT_TOKEN,
        signing_secret=SECRET,
        channel=CHANNEL,
        users={ALICE: "alice"},
        store_path=tmp_path / "slack.sqlite3",
        remind_before_s=900.0,
        api_url=f"{slack.base}/api",
        hooks_url=f"{slack.base}/hooks/",
    )


def test_a_reminder_goes_out_once_before_the_deadline(slack: FakeSlack, tmp_path: Path) -> None:
    """An hour's wait with remind_before 15m: nothing at 40 minutes, one threaded reminder
    at 46, none again; a request settled in time gets no reminder."""
    clock = FakeClock()  # reminders depend on it, not on waiting
    notifier = SlackNotifier(settings_for(slack, tmp_path), clock=clock, backoff=0.01)
    try:
        notifier.pending(waiting_card("late", 3600, clock))
        notifier.pending(waiting_card("done", 3600, clock))
        slack.wait("chat.postMessage", 2)
        clock.advance(40 * 60)
        notifier.wake()
        settled = {
            **waiting_card("done", 3600, clock),
            "status": "applied",
            "reason": "approved by alice",
        }
        notifier.settled(settled)
        slack.wait("chat.update")
        assert len(slack.api("chat.postMessage")) == 2
        clock.advance(6 * 60)
        notifier.wake()
        posts = slack.wait("chat.postMessage", 3)
        reminder = posts[2]["body"]
        assert reminder["thread_ts"] == posts[0]["answer"]["ts"]
        assert reminder["reply_broadcast"] is True
        assert "default/late" in reminder["text"] and "denied (fails closed)" in reminder["text"]
        notifier.wake()
        clock.advance(60)
        notifier.wake()
        notifier.pending(waiting_card("late", 3600, clock))  # a restart's second notice
    finally:
        notifier.close()
    assert len(slack.api("chat.postMessage")) == 3
    assert not any(
        "default/done" in json.dumps(c["body"]) for c in slack.api("chat.postMessage")[2:]
    )


def test_slack_refusing_a_call_never_breaks_the_broker(stack: Stack) -> None:
    """Slack answering ok: false is logged and counted; the request still waits and can
    be decided in the inbox."""
    stack.slack.answers["chat.postMessage"] = [{"ok": False, "error": "channel_not_found"}]
    waiting = stack.gated()
    eventually(lambda: stack.slack.api("chat.postMessage"))
    response = httpx.post(
        f"{stack.url}/api/v1/requests/default/{waiting['id']}/decision",
        headers={"Authorization": f"Bearer {TOKENS['alice']}"},
        json={"verdict": "approve", "request_sha256": waiting["request_sha256"]},
        verify=TLS,
    )
    assert response.status_code == 200
    assert stack.harness.wait(waiting["id"])["status"] == "applied"
    assert len(stack.slack.api("chat.postMessage")) == 1  # not retried: Slack said no


# -- configuration --------------------------------------------------------------------------


def test_slack_is_configured_from_broker_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[notify.slack] takes its secrets from the environment or a file, and
    [approvers.NAME] slack_user maps people; an approver may have Slack only."""
    monkeypatch.setenv("TEST_SLACK_BOT_TOKEN", BOT_TOKEN)
    (tmp_path / "signing.secret").write_text(SECRET + "\n", encoding="utf-8")
    (tmp_path / "broker.toml").write_text(
        f"""
[broker]
state_dir = "state"

[notify]
inbox_url = "{INBOX}/"

[notify.slack]
bot_token_env = "TEST_SLACK_BOT_TOKEN"
signing_secret_file = "signing.secret"
channel = "{CHANNEL}"
remind_before = "30m"

[approvers.alice]
token_sha256 = "{hash_token(TOKENS["alice"])}"
slack_user = "{ALICE}"

[approvers.carol]
slack_user = "U0CAROL"
""",
        encoding="utf-8",
    )
    settings = slack_settings(load_config(tmp_path / "broker.toml"))
    assert settings is not None
    assert (settings.bot_token, settings.signing_secret) == (BOT_TOKEN, SECRET)
    assert settings.users == {ALICE: "alice", "U0CAROL": "carol"}
    assert settings.remind_before_s == 1800 and settings.inbox_url == INBOX
    assert settings.store_path == tmp_path / "state" / "slack.sqlite3"
    assert BOT_TOKEN not in repr(settings) and SECRET not in repr(settings)


@pytest.mark.parametrize(
    ("extra", "approvers", "where"),
    [
        ({"bot_token": "xoxb-literal"}, {}, "notify.slack.bot_token: secrets are never written"),
        ({"signing_secret": "literal"}, {}, "notify.slack.signing_secret: secrets are never"),
        ({"signing_secret_env": None}, {}, "notify.slack.signing_secret_env or"),
        ({"bot_token_env": "TEST_NO_SUCH_VARIABLE"}, {}, "TEST_NO_SUCH_VARIABLE is not set"),
        ({"channel": ""}, {}, "notify.slack.channel"),
        ({"api_url": "http://slack.example/api"}, {}, "notify.slack.api_url: https is required"),
        ({"remind_before": "soon"}, {}, "notify.slack.remind_before"),
        ({"colour": "blue"}, {}, "notify.slack.colour: unknown key"),
        ({}, {"alice": {"slack_user": "alice"}}, "approvers.alice.slack_user"),
        (
            {},
            {"alice": {"slack_user": ALICE}, "bob": {"slack_user": ALICE}},
            "approvers.bob.slack_user: U0ALICE is already approvers.alice's",
        ),
    ],
)
def test_bad_slack_config_names_the_key(
    secrets: None, tmp_path: Path, extra: dict[str, Any], approvers: dict[str, Any], where: str
) -> None:
    """A broken [notify.slack] or slack_user stops the start with the key named."""
    table = {
        "bot_token_env": "TEST_SLACK_BOT_TOKEN",
        "signing_secret_env": "TEST_SLACK_SIGNING_SECRET",
        "channel": CHANNEL,
        **extra,
    }
    table = {k: v for k, v in table.items() if v is not None}
    config = Config(state_dir=tmp_path, notify={"slack": table}, approvers=approvers)
    with pytest.raises(ConfigError) as info:
        slack_settings(config)
    assert where in str(info.value)


def test_a_group_routed_request_is_posted_to_its_channel(slack: FakeSlack, tmp_path: Path) -> None:
    """A rule's notify = "platform" posts to [notify.groups.platform]'s channel; other
    requests to [notify.slack]'s."""
    from broker.approval.notify import Notifier, Route

    clock = FakeClock()
    chat = SlackNotifier(settings_for(slack, tmp_path), clock=clock, backoff=0.01)
    notifier = Notifier([], slack=chat, groups={"platform": Route((), "C0PLATFORM")})
    try:
        notifier.pending(waiting_card("routed", 3600, clock), "platform")
        notifier.pending(waiting_card("plain", 3600, clock))
        posts = slack.wait("chat.postMessage", 2)
    finally:
        notifier.close()
    channel = {
        ref: p["body"]["channel"] for p in posts for ref in ("routed", "plain") if ref in str(p)
    }
    assert channel == {"routed": "C0PLATFORM", "plain": CHANNEL}
