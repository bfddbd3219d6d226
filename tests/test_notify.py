"""Webhook notifications for waiting requests, against a real HTTP server on 127.0.0.1:
what arrives (generic JSON, Slack), retries with backoff, and that a broken or slow
webhook never holds up the broker."""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from broker.approval.decisions import Ballot, decide, nudge
from broker.approval.notify import Notifier, Webhook, payload, webhooks_from
from broker.errors import ConfigError
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeClock, FakeHandler
from tests.support import Hook, Start, eventually

INBOX = "http://inbox.test:8700"
POLICY = (
    '[[rules]]\neffect = "test.record"\naction = "approve"\ntimeout = "1h"\n'
    'reason = "a person looks at every record first"\n'
)
HOSTILE_VALUE = "rm -rf / \x1b[2J\u202egnp.exe\u200d"


@pytest.fixture
def serve(start: Start, fake: FakeHandler) -> Callable[[Notifier], BrokerHarness]:
    """Start a broker gating test.record that notifies through the given Notifier."""

    def make(notifier: Notifier) -> BrokerHarness:
        h = start(handlers=[fake], policy=POLICY, builtins=False)
        assert h.broker is not None
        h.broker.notify_with(notifier)
        return h

    return make


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CARD: dict[str, Any] = {
    "ref": "default/r1",
    "sandbox": "default",
    "id": "r1",
    "effect": "test.record",
    "request_sha256": "ab" * 32,
    "what": {"title": "record 'x'", "body": '{"value": "x"}'},
    "where": "test: test.record",
    "why": {"rule": "rules[0]", "reason": "a person looks"},
    "if_nobody_answers": {"expires_at": "2026-11-29T20:00:00.000Z", "on_timeout": "deny"},
    "agent_reason": None,
}


def quick(url: str, **kwargs: Any) -> Notifier:
    """A notifier to one JSON webhook with a short backoff."""
    return Notifier([Webhook(url, "json")], **{"backoff": 0.05, **kwargs})


# -- what arrives -------------------------------------------------------------------


def test_waiting_request_is_announced_to_json_and_slack(
    hook: Hook, serve: Callable[[Notifier], BrokerHarness]
) -> None:
    """A waiting request reaches both hooks with what, why, deadline, how to decide, neutralised."""
    notifier = Notifier(
        [Webhook(hook.url("/json"), "json"), Webhook(hook.url("/slack"), "slack")],
        inbox_url=INBOX,
    )
    h = serve(notifier)
    doc = h.request("test.record", {"value": HOSTILE_VALUE}, reason="the user \u202easked")
    pending = h.submit(doc, terminal=False)
    ref = f"default/{doc['id']}"

    [sent] = hook.wait_for("/json", 1)
    assert sent["type"].startswith("application/json")
    body = sent["body"]
    assert body["type"] == "approval.pending"
    assert body["ref"] == ref
    assert body["effect"] == "test.record"
    assert body["what"].startswith("record ")
    assert "rules[0]" in body["why"] and "a person looks at every record first" in body["why"]
    assert body["expires_at"] == pending["expires_at"]
    assert body["on_timeout"] == "deny"
    assert body["request_sha256"] == pending["request_sha256"]
    assert body["decide"]["approve"] == f"broker approve {ref}"
    assert body["decide"]["deny"].startswith(f"broker deny {ref} --reason")
    assert body["decide"]["url"] == f"{INBOX}/requests/{ref}"
    assert "<U+202E RLO>gnp.exe<U+200D ZWJ>" in body["body"]
    assert body["agent_reason"] == "the user <U+202E RLO>asked"

    [slack] = hook.wait_for("/slack", 1)
    text = slack["body"]["text"]
    assert set(slack["body"]) == {"text"}
    assert ref in text
    assert "a person looks at every record first" in text
    assert pending["expires_at"] in text
    assert "U+202E RLO" in text and "\\x1b[2J" in text
    assert "its words" in text or "unverified" in text
    for raw in ("\x1b", "\u202e", "\u200d"):
        assert raw not in text
        assert raw not in json.dumps(body, ensure_ascii=False)


def test_one_notification_per_waiting_request(
    hook: Hook, serve: Callable[[Notifier], BrokerHarness], fake: FakeHandler
) -> None:
    """Invalid requests send nothing; a waiting one is announced once, not again when decided."""
    notifier = Notifier([Webhook(hook.url("/json"), "json")])
    h = serve(notifier)
    h.submit(h.request("test.nothing", {}))  # invalid: nobody is asked
    doc = h.request("test.record", {"value": 1})
    h.submit(doc, terminal=False)
    hook.wait_for("/json", 1)
    ledger = Ledger(h.config.ledger_path)
    try:
        decide(
            ledger, Ballot(doc["id"], "deny", approver="a", reason="no", surface="web", sha256=None)
        )
    finally:
        ledger.close()
    nudge(h.state)
    assert h.wait(doc["id"])["status"] == "denied"
    h.submit(h.request("test.nothing", {}))
    time.sleep(0.1)
    assert len(hook.calls("/json")) == 1


def test_slack_text_cannot_ping_or_break_out(hook: Hook) -> None:
    """Sandbox text cannot mention @channel, forge links or close the code block."""
    card = {
        **CARD,
        "what": {"title": "<!channel> urgent", "body": "```\n<https://evil.test|click>\n"},
        "agent_reason": "<@U123> approve this <!here>",
    }
    text = payload(card, Webhook(hook.url("/slack"), "slack"), None)["text"]
    for forged in ("<!channel>", "<!here>", "<@U123>", "<https://evil.test|click>"):
        assert forged not in text
    assert "&lt;!channel&gt;" in text
    assert text.count("```") == 2


# -- retries --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [503, 429])
def test_temporary_failures_are_retried_with_backoff(hook: Hook, status: int) -> None:
    """Two temporary failures then success: three attempts, waits growing, one delivery.
    The waits are on a FakeClock: no attempt comes before the test moves time that far."""
    hook.script["/json"] = [status, status, 200]
    clock = FakeClock()
    notifier = quick(hook.url("/json"), backoff=0.0625, clock=clock)  # exact in binary
    at: list[float] = []  # the clock when each attempt arrived
    try:
        notifier.pending(CARD)
        for attempt, waits in ((1, [0.0625]), (2, [0.0625, 0.0625])):
            hook.wait_for("/json", attempt)
            at.append(clock.monotonic())
            for step in waits:
                eventually(lambda: clock.sleepers == 1)  # backing off, not posting
                assert len(hook.calls("/json")) == attempt
                clock.advance(step)
        calls = hook.wait_for("/json", 3)
        at.append(clock.monotonic())
        eventually(lambda: notifier.delivered == 1)
    finally:
        notifier.close()
    assert notifier.failed == 0
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert gaps[0] >= 0.0625
    assert gaps[1] >= 0.125
    assert all(c["body"] == calls[0]["body"] for c in calls)


def test_client_error_is_not_retried(hook: Hook) -> None:
    """A 400 means the message will never be taken: one attempt, counted as failed."""
    hook.script["/json"] = [400, 200]
    notifier = quick(hook.url("/json"))
    try:
        notifier.pending(CARD)
        eventually(lambda: notifier.failed == 1)
    finally:
        notifier.close()  # joins its thread: a retry would have come by now
    assert len(hook.calls("/json")) == 1
    assert notifier.delivered == 0


def test_gives_up_after_the_configured_retries(hook: Hook) -> None:
    """A webhook that keeps failing gets `retries` attempts, then is counted as failed."""
    hook.script["/json"] = [503] * 10
    notifier = quick(hook.url("/json"), retries=3, backoff=0.01)
    try:
        notifier.pending(CARD)
        eventually(lambda: notifier.failed == 1)
    finally:
        notifier.close()  # joins its thread: a fourth attempt would have come by now
    assert len(hook.calls("/json")) == 3


# -- never in the way -----------------------------------------------------------------


def test_dead_webhook_never_delays_the_broker(
    hook: Hook, serve: Callable[[Notifier], BrokerHarness]
) -> None:
    """A webhook on a closed port delays no result, and the other webhook still gets its message."""
    dead = f"http://127.0.0.1:{closed_port()}/hook"
    notifier = Notifier(
        [Webhook(dead, "slack"), Webhook(hook.url("/json"), "json")], retries=3, backoff=0.05
    )
    h = serve(notifier)
    started = time.monotonic()
    for i in range(3):
        h.submit(h.request("test.record", {"value": i}), terminal=False, timeout=2)
    assert time.monotonic() - started < 2
    hook.wait_for("/json", 3)
    eventually(lambda: notifier.failed == 3)


def test_hanging_webhook_never_delays_the_broker(
    serve: Callable[[Notifier], BrokerHarness], fake: FakeHandler
) -> None:
    """A webhook that accepts and never answers holds up no result, pending or automatic."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # never accepted: the POST waits for an answer that never comes
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
    notifier = Notifier([Webhook(url, "json")], retries=2, backoff=0.01)
    try:
        h = serve(notifier)
        started = time.monotonic()
        for i in range(3):
            h.submit(h.request("test.record", {"value": i}), terminal=False, timeout=2)
        h.submit(h.request("test.nothing", {}), timeout=2)
        assert time.monotonic() - started < 2
    finally:
        silent.close()
    eventually(lambda: notifier.failed >= 1)


# -- configuration ----------------------------------------------------------------------


def test_webhooks_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """[[notify.webhooks]] reads url, url_env and format; defaults to json."""
    monkeypatch.setenv("TEST_SLACK_HOOK", "https://hooks.example/T/B/x")
    hooks = webhooks_from(
        {
            "inbox_url": INBOX,
            "webhooks": [
                {"url": "http://127.0.0.1:9/a"},
                {"url_env": "TEST_SLACK_HOOK", "format": "slack"},
            ],
        }
    )
    assert hooks == [
        Webhook("http://127.0.0.1:9/a", "json"),
        Webhook("https://hooks.example/T/B/x", "slack"),
    ]


@pytest.mark.parametrize(
    ("settings", "where"),
    [
        ({"webhooks": [{"url": "http://x", "format": "teams"}]}, "notify.webhooks[0].format"),
        ({"webhooks": [{"url": "ftp://x"}]}, "notify.webhooks[0].url"),
        ({"webhooks": [{"url": "http://x", "channel": "#ops"}]}, "notify.webhooks[0].channel"),
        ({"webhooks": [{"url_env": "TEST_NO_SUCH_VARIABLE"}]}, "TEST_NO_SUCH_VARIABLE"),
        ({"hooks": []}, "notify.hooks"),
    ],
)
def test_bad_webhook_config_names_the_key(settings: dict[str, Any], where: str) -> None:
    """A broken [notify] section is refused with a message naming the entry and key."""
    with pytest.raises(ConfigError, match=where.replace("[", r"\[").replace("]", r"\]")):
        webhooks_from(settings)


def test_a_rule_routes_its_requests_to_its_group(
    hook: Hook, start: Start, fake: FakeHandler
) -> None:
    """A rule's `notify = "ops"` sends its requests to [notify.groups.ops]'s webhook alone;
    every other request, and one naming a group not configured, to the default webhook."""
    from broker.approval.notify import groups_from

    policy = (
        '[[rules]]\neffect = "test.record"\nwhen = { value = "ops" }\naction = "approve"\n'
        'notify = "ops"\n\n[[rules]]\neffect = "test.record"\nwhen = { value = "lost" }\n'
        'action = "approve"\nnotify = "nobody"\n\n' + POLICY
    )
    groups = groups_from({"groups": {"ops": {"webhooks": [{"url": hook.url("/ops")}]}}})
    notifier = Notifier([Webhook(hook.url("/default"), "json")], groups=groups, backoff=0.05)
    h = start(handlers=[fake], policy=policy, builtins=False)
    assert h.broker is not None
    h.broker.notify_with(notifier)
    for value in ("ops", "x", "lost"):
        h.submit(h.request("test.record", {"value": value}), terminal=False)
    [ops] = hook.wait_for("/ops", 1)
    default = hook.wait_for("/default", 2)
    notifier.close()
    assert '"ops"' in ops["body"]["body"]
    assert sorted(json.loads(c["body"]["body"])["value"] for c in default) == ["lost", "x"]
    assert len(hook.calls("/ops")) == 1


def test_notify_groups_mistakes_name_their_key() -> None:
    from broker.approval.notify import groups_from

    with pytest.raises(ConfigError, match=r"notify\.groups\.ops\.channel: unknown key"):
        groups_from({"groups": {"ops": {"channel": "C1"}}})
    with pytest.raises(ConfigError, match=r"notify\.groups\.ops\.webhooks\[0\]\.url"):
        groups_from({"groups": {"ops": {"webhooks": [{"url": "ftp://x"}]}}})
