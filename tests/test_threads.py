"""A stopped broker leaves no thread behind: its pools start threads when work first
needs them, and everything it started is joined when it stops (reverse data-flow order)."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from pathlib import Path

import pytest

from broker.config import Config
from broker.intake.outbox import attach
from broker.loop.pipeline import Broker
from broker.policy.ruleset import Policy
from broker.registry import Registry
from broker.testing import BrokerHarness, FakeClock, FakeHandler
from tests.pgserver import PASSWORD
from tests.support import eventually

GATED = (
    '[[rules]]\neffect = "test.record"\nwhen = { value = "gated" }\naction = "approve"\n'
    'timeout = "1h"\nreason = "a person looks"\n'
)


def alive() -> Counter[str]:
    """The threads of this process by name (numbers folded: `broker-worker-N`)."""
    return Counter(re.sub(r"\d+", "N", t.name) for t in threading.enumerate())


def test_a_broker_that_never_served_started_no_thread(tmp_path: Path) -> None:
    """Making a Broker starts none of its pools' threads: they wait for work."""
    before = alive()
    broker = Broker(Config(state_dir=tmp_path / "state"), Registry(), Policy())
    try:
        assert alive() == before
    finally:
        broker.ledger.close()


def test_a_stopped_harness_leaves_no_thread_behind(tmp_path: Path, fake: FakeHandler) -> None:
    """A BrokerHarness that applied one request, parked one, let it expire and was
    restarted leaves exactly the threads it found, by name and count."""
    before = alive()
    clock = FakeClock()
    with BrokerHarness(tmp_path / "h", handlers=[fake], policy=GATED, clock=clock) as h:
        assert h.submit(h.request("test.record", {"value": 1}))["status"] == "applied"
        waiting = h.submit(h.request("test.record", {"value": "gated"}), terminal=False)
        assert waiting["status"] == "pending"
        assert alive() != before  # it did start threads
        h.restart()
        clock.advance(3600)
        assert h.wait(waiting["id"])["status"] == "expired"
    assert alive() == before


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_broker_served_and_stopped_leaves_no_thread_behind(
    tmp_path: Path,
    fake: FakeHandler,
    store: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Broker.serve` until its stop event is set: once it returns, every thread it
    started (workers, watcher, control socket; on PostgreSQL its pool, lease and
    listener) has ended."""
    url = str(request.getfixturevalue("pg_url")) if store == "postgresql" else None
    monkeypatch.setenv("THREADS_TEST_PG_PASSWORD", PASSWORD)
    refs = {"ledger_password_env": "THREADS_TEST_PG_PASSWORD"}
    before = alive()
    registry = Registry()
    registry.register(fake, "tests")
    outbox, results, state = tmp_path / "outbox", tmp_path / "results", tmp_path / "state"
    for d in (outbox, results, state):
        d.mkdir()
    broker = Broker(Config(state_dir=state, ledger_url=url, ledger_refs=refs), registry, Policy())
    broker.add(attach("default", outbox, results, state))
    stop, ready = threading.Event(), threading.Event()
    serving = threading.Thread(target=broker.serve, args=(stop,), kwargs={"ready": ready.set})
    serving.start()
    try:
        assert ready.wait(30)
        (outbox / "r1.json").write_text(
            '{"version": 1, "id": "r1", "effect": "test.record", "params": {"value": 1}}'
        )

        def answered() -> bool:
            """r1's result says applied"""
            path = results / "r1.json"
            return path.exists() and json.loads(path.read_text())["status"] == "applied"

        eventually(answered)
    finally:
        stop.set()
        broker.wake()
        serving.join(30)
    assert not serving.is_alive()
    assert alive() == before
