"""broker.client as a host-side integration uses it: wait for a decision (async and
sync), and decide through the API, against a running broker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker import client
from broker.audit import verify as audit
from broker.errors import DecisionError, RequestNotFound
from broker.testing import BrokerHarness, FakeClock, FakeHandler
from tests.support import PATIENCE, SETTLE_S, barrier

POLICY = (
    '[[rules]]\neffect = "test.record"\naction = "approve"\ntimeout = "1h"\nreason = "look"\n'
    '[[rules]]\neffect = "test.brief"\naction = "approve"\ntimeout = "300ms"\nreason = "quick"\n'
)


@pytest.fixture
def h(tmp_path: Path, fake: FakeHandler) -> Iterator[BrokerHarness]:
    """A running broker: test.record waits an hour for people, test.brief 300 ms (on a
    FakeClock: its deadline passes when a test moves the clock)."""
    harness = BrokerHarness(
        tmp_path / "h",
        handlers=[fake, FakeHandler("test.brief")],
        policy=POLICY,
        builtins=False,
        clock=FakeClock(),
    )
    with harness:
        time.sleep(SETTLE_S)
        yield harness


def waiting(h: BrokerHarness, effect: str = "test.record", value: Any = "v") -> str:
    result = h.submit(h.request(effect, {"value": value}), terminal=False)
    assert result["status"] == "pending", result
    return str(result["id"])


def later(seconds: float, fn: Any, *args: Any, **kwargs: Any) -> threading.Thread:
    """Run fn(*args, **kwargs) on another thread after `seconds`."""

    def run() -> None:
        time.sleep(seconds)
        fn(*args, **kwargs)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_decision_returns_when_someone_approves(h: BrokerHarness) -> None:
    """`await client.decision` returns soon after another thread approves, naming who."""
    rid = waiting(h)
    approver = later(
        0.3, client.decide_sync, rid, "approve", approver="alice", reason="ok", state_dir=h.state
    )
    started = time.monotonic()
    info = asyncio.run(client.decision(rid, timeout=5, state_dir=h.state))
    elapsed = time.monotonic() - started
    approver.join(5)
    assert 0.25 < elapsed < 2
    assert info.ref == f"default/{rid}"
    assert info.status in ("approved", "applying", "applied")
    assert info.approved
    assert info.decided_by == "alice"
    assert info.reason == "approved by alice: ok"


def test_decision_times_out(h: BrokerHarness) -> None:
    """With nobody deciding, `decision` raises TimeoutError after `timeout`."""
    rid = waiting(h)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(client.decision(rid, timeout=0.3, state_dir=h.state))
    assert time.monotonic() - started < 2
    with pytest.raises(TimeoutError):
        client.decision_sync(rid, timeout=0.2, state_dir=h.state)
    assert h.wait(rid, terminal=False)["status"] == "pending"


def test_decision_of_a_settled_request_returns_at_once(h: BrokerHarness) -> None:
    """A request already denied answers at once, with the denier and the reason."""
    rid = waiting(h)
    client.decide_sync(rid, "deny", approver="bob", reason="wrong table", state_dir=h.state)
    info = client.decision_sync(rid, timeout=1, state_dir=h.state)
    assert info.status == "denied"
    assert not info.approved
    assert info.decided_by == "bob"
    assert info.reason is not None and "wrong table" in info.reason


def test_decision_reports_an_expiry(h: BrokerHarness, fake: FakeHandler) -> None:
    """When nobody answers in time, `decision` returns the expiry, not an approval."""
    rid = waiting(h, "test.brief")
    assert isinstance(h.clock, FakeClock)
    h.clock.advance(0.3)
    info = asyncio.run(client.decision(rid, timeout=5, state_dir=h.state))
    assert info.status == "expired"
    assert info.decided_by == "policy (on_timeout)"
    assert not info.approved


def test_decision_of_an_unknown_request_is_an_error(h: BrokerHarness) -> None:
    """Waiting on an id the ledger does not know raises RequestNotFound."""
    with pytest.raises(RequestNotFound):
        client.decision_sync("no-such-request", timeout=1, state_dir=h.state)


def test_decide_sync_applies_like_the_cli(h: BrokerHarness, fake: FakeHandler) -> None:
    """`decide_sync` applies at once (it nudges the broker), audited with surface api."""
    rid = waiting(h, value="via api")
    info = client.decide_sync(
        rid, "approve", approver="chatbot:alice", reason="ok in chat", state_dir=h.state
    )
    assert info.status == "approved"
    result = h.wait(rid, timeout=PATIENCE)  # on a FakeClock, no rescan: the nudge
    assert result["status"] == "applied"
    assert result["decided_by"] == "chatbot:alice"
    assert result["reason"] == "approved by chatbot:alice: ok in chat"
    assert fake.applied == [{"value": "via api"}]
    barrier(h)  # the audit log is written after the results
    found = [e for _, e, _ in audit.read_events(h.config.audit_path) if e is not None]
    [decision] = [e for e in found if e["event"] == "decision"]
    assert (decision["by"], decision["verdict"], decision["surface"]) == (
        "chatbot:alice",
        "approve",
        "api",
    )


def test_decide_sync_refuses_stale_sha256_and_a_second_vote(h: BrokerHarness) -> None:
    """The API keeps the same rules: the sha256 seen must match; one decision per person."""
    rid = waiting(h)
    with pytest.raises(DecisionError):
        client.decide_sync(rid, "approve", approver="alice", sha256="0" * 64, state_dir=h.state)
    client.decide_sync(rid, "deny", approver="alice", reason="no", state_dir=h.state)
    with pytest.raises(DecisionError):
        client.decide_sync(rid, "approve", approver="bob", state_dir=h.state)
    assert h.wait(rid)["status"] == "denied"


def test_async_decide_and_decision_together(h: BrokerHarness, fake: FakeHandler) -> None:
    """In one event loop, one task waits on `decision` while another `decide`s."""
    rid = waiting(h)
    sha = h.wait(rid, terminal=False)["request_sha256"]

    async def both() -> tuple[client.DecisionInfo, client.DecisionInfo]:
        waiter = asyncio.create_task(client.decision(rid, timeout=5, state_dir=h.state))
        await asyncio.sleep(0.2)
        decided = await client.decide(
            rid, "approve", approver="carol", sha256=sha[:12], state_dir=h.state
        )
        return decided, await waiter

    decided, seen = asyncio.run(both())
    assert decided.decided_by == seen.decided_by == "carol"
    assert seen.approved
    assert h.wait(rid)["status"] == "applied"
