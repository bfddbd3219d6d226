"""Stopping and starting the broker with requests in every state: each still gets
exactly one terminal result, nothing is applied twice that must not be, and the audit
chain holds with one `received` per request."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.audit import verify as audit
from broker.clock import iso, now, parse_iso
from broker.lifecycle.marks import StartMarks
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeClock, FakeHandler
from tests.support import SETTLE_S, barrier, checked


def gate(effect: str, timeout: str = "1h", **when: str) -> dict[str, Any]:
    """A policy with one approve rule for `effect` (when params match `when`)."""
    rule = {"effect": effect, "action": "approve", "timeout": timeout, "when": when}
    return {"rules": [{**rule, "reason": "a person looks first"}]}


def restart(h: BrokerHarness) -> None:
    h.restart()
    time.sleep(SETTLE_S)


def set_state(h: BrokerHarness, request_id: str, *, started: bool = True, **changes: Any) -> None:
    """Edit a request's ledger row while the broker is stopped (a simulated crash);
    `applying` comes with the mark that its handler was called, unless `started=False`."""
    ledger = Ledger(h.config.ledger_path)
    try:
        record = ledger.get(h.sandbox, request_id)
        assert record is not None
        record = ledger.update(record, **changes)
    finally:
        ledger.close()
    if changes.get("state") == "applying" and started:
        StartMarks(h.state / "started").mark(record)


def claim_dir_empties(h: BrokerHarness, within: float = 5.0) -> bool:
    """The broker removes consumed files from its claim dir once idle."""
    deadline = time.monotonic() + within
    while list(claim_dir(h).iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not list(claim_dir(h).iterdir())


def claim_dir(h: BrokerHarness) -> Path:
    return h.state / "claimed" / h.sandbox


def assert_audit_sound(h: BrokerHarness, ids: set[str]) -> None:
    """The chain verifies up to the ledger's head; each request was received once."""
    ledger = Ledger(h.config.ledger_path)
    try:
        head = ledger.audit_head()
    finally:
        ledger.close()
    count, fault = audit.verify(h.config.audit_path, head)
    assert fault is None, fault
    assert count > 0
    received = Counter(
        e["id"]
        for _, e, _ in audit.read_events(h.config.audit_path)
        if e is not None and e["event"] == "received"
    )
    assert {i: n for i, n in received.items() if n != 1} == {}
    assert ids <= set(received)


@pytest.fixture
def fake() -> FakeHandler:
    """test.record: reversible and idempotent, so safe to apply again after a crash."""
    return FakeHandler("test.record")


@pytest.fixture
def once() -> FakeHandler:
    """test.once: irreversible and not idempotent (say, sending an email)."""
    return FakeHandler("test.once", reversible=False, idempotent=False)


@pytest.fixture
def broker(tmp_path: Path, fake: FakeHandler, once: FakeHandler) -> Iterator[BrokerHarness]:
    """A running broker: test.once and test.record with value gated* wait for a person."""
    policy = {"rules": [*gate("test.once")["rules"], *gate("test.record", value="gated*")["rules"]]}
    h = BrokerHarness(tmp_path / "b", handlers=[fake, once], policy=policy)
    h.start()
    time.sleep(SETTLE_S)
    try:
        yield h
    finally:
        h.stop()


def test_pending_deadline_survives_a_restart(tmp_path: Path, fake: FakeHandler) -> None:
    """A request pending when the broker stops expires at its original deadline."""
    clock = FakeClock()
    h = BrokerHarness(
        tmp_path / "b", handlers=[fake], policy=gate("test.record", "2s"), clock=clock
    )
    h.start()
    time.sleep(SETTLE_S)
    try:
        doc = h.request("test.record", {"value": 1})
        pending = checked(h.submit(doc, terminal=False))
        assert pending["status"] == "pending"
        deadline = parse_iso(pending["expires_at"])
        assert deadline is not None
        h.stop()
        clock.advance(max(0.0, (deadline - clock.now()).total_seconds()) + 0.1)
        assert h.wait(doc["id"], timeout=0.1, terminal=False)["status"] == "pending"

        h.start()
        began = clock.monotonic()  # expired with no more time passing: not reset
        result = checked(h.wait(doc["id"], timeout=5))
        took = clock.monotonic() - began
        assert result["status"] == "expired"
        assert "nobody decided" in result["reason"]
        assert took < 1.0, f"expired {took:.2f}s after the start: was the deadline reset?"
        assert fake.applied == []
        assert_audit_sound(h, {doc["id"]})
    finally:
        h.stop()


def test_result_lost_while_down_is_rewritten(tmp_path: Path, fake: FakeHandler) -> None:
    """A request that finished as the broker stopped, whose result file is then lost,
    has its result written again on the next start, from the ledger."""
    h = BrokerHarness(tmp_path / "b", handlers=[fake])
    h.start()
    time.sleep(SETTLE_S)
    try:
        fake.release.clear()
        doc = h.request("test.record", {"value": "in flight"})
        h.write(f"{doc['id']}.json", doc)
        assert fake.started.wait(5)
        threading.Timer(0.5, fake.release.set).start()
        h.stop()  # waits for the apply in flight, and answers it
        path = h.results / f"{doc['id']}.json"
        shown = checked(h.wait(doc["id"], timeout=1))
        assert shown["status"] == "applied"
        path.unlink()

        restart(h)
        again = checked(h.wait(doc["id"], timeout=5))
        assert again == shown
        assert fake.applied == [{"value": "in flight"}]
        assert_audit_sound(h, {doc["id"]})
    finally:
        h.stop()


def test_request_written_while_down_is_processed_on_start(
    tmp_path: Path, fake: FakeHandler
) -> None:
    """A request left in the outbox while no broker runs is answered when one starts."""
    h = BrokerHarness(tmp_path / "b", handlers=[fake])
    h.start()
    time.sleep(SETTLE_S)
    try:
        h.stop()
        doc = h.request("test.record", {"value": "offline"})
        h.write(f"{doc['id']}.json", doc)
        h.start()
        result = checked(h.wait(doc["id"], timeout=5))
        assert result["status"] == "applied"
        assert fake.applied == [{"value": "offline"}]
        assert not list(h.outbox.iterdir())
        assert_audit_sound(h, {doc["id"]})
    finally:
        h.stop()


def test_applying_idempotent_effect_is_applied_again(
    broker: BrokerHarness, fake: FakeHandler
) -> None:
    """An idempotent effect caught mid-apply by a stop is applied on the next start."""
    h = broker
    doc = h.request("test.record", {"value": "gated: retry me"})
    assert h.submit(doc, terminal=False)["status"] == "pending"
    h.stop()
    set_state(h, doc["id"], state="applying", decided_by="ops", decided_at=iso(now()))

    restart(h)
    result = checked(h.wait(doc["id"], timeout=5))
    assert result["status"] == "applied"
    assert result["output"] == {"recorded": 1, "value": "gated: retry me"}
    assert fake.applied == [{"value": "gated: retry me"}]
    assert_audit_sound(h, {doc["id"]})


def test_applying_non_idempotent_effect_becomes_unknown(
    broker: BrokerHarness, once: FakeHandler
) -> None:
    """A non-idempotent effect caught mid-apply is not repeated: `unknown`, reconcile."""
    h = broker
    doc = h.request("test.once", {"value": "mail"})
    assert h.submit(doc, terminal=False)["status"] == "pending"
    h.stop()
    set_state(h, doc["id"], state="applying", decided_by="ops", decided_at=iso(now()))

    restart(h)
    result = checked(h.wait(doc["id"], timeout=5))
    assert result["status"] == "unknown"
    assert "reconcile" in result["reason"]
    restart(h)
    barrier(h)
    assert checked(h.wait(doc["id"], timeout=1)) == result
    assert once.applied == []
    assert_audit_sound(h, {doc["id"]})


def test_claimed_file_is_processed_on_start(tmp_path: Path, fake: FakeHandler) -> None:
    """A request the broker had claimed but not recorded when it stopped is processed."""
    h = BrokerHarness(tmp_path / "b", handlers=[fake])
    h.start()
    time.sleep(SETTLE_S)
    try:
        h.stop()
        doc = h.request("test.record", {"value": "claimed"})
        h.write("req.json", doc)
        os.rename(h.outbox / "req.json", claim_dir(h) / "req.json~1-1")
        h.start()
        result = checked(h.wait(doc["id"], timeout=5))
        assert result["status"] == "applied"
        assert fake.applied == [{"value": "claimed"}]
        assert claim_dir_empties(h)
        assert_audit_sound(h, {doc["id"]})
    finally:
        h.stop()


def test_claimed_file_already_recorded_is_not_applied_again(
    tmp_path: Path, fake: FakeHandler
) -> None:
    """A claimed file whose request was recorded before the stop is only cleaned up."""
    h = BrokerHarness(tmp_path / "b", handlers=[fake])
    h.start()
    time.sleep(SETTLE_S)
    try:
        doc = h.request("test.record", {"value": "once"})
        first = checked(h.submit(doc))
        h.stop()
        h.write("again.json", doc)
        os.rename(h.outbox / "again.json", claim_dir(h) / "again.json~1-7")
        restart(h)
        barrier(h)
        assert checked(h.wait(doc["id"], timeout=1)) == first
        assert fake.applied == [{"value": "once"}]
        assert claim_dir_empties(h)
        assert_audit_sound(h, {doc["id"]})
    finally:
        h.stop()


def test_replay_waiting_on_a_pending_request_survives_a_restart(
    tmp_path: Path, fake: FakeHandler
) -> None:
    """A replay recorded while its first request waits ends as the first ends, even
    when the broker restarts in between."""
    h = BrokerHarness(tmp_path / "b", handlers=[fake], policy=gate("test.record", "1s"))
    h.start()
    time.sleep(SETTLE_S)
    try:
        first = h.request("test.record", {"value": 1}, idempotency_key="k")
        assert h.submit(first, terminal=False)["status"] == "pending"
        second = h.request("test.record", {"value": 1}, idempotency_key="k")
        h.write(f"{second['id']}.json", second)
        ledger = Ledger(h.config.ledger_path)
        try:
            deadline = time.monotonic() + 5
            while ledger.get(h.sandbox, second["id"]) is None:
                assert time.monotonic() < deadline, "the replay was never recorded"
                time.sleep(0.01)
        finally:
            ledger.close()
        restart(h)
        replay = checked(h.wait(second["id"], timeout=5))
        assert replay["status"] == "expired"
        assert replay["replayed"] is True
        assert checked(h.wait(first["id"], timeout=1))["status"] == "expired"
        assert fake.applied == []
        assert_audit_sound(h, {first["id"], second["id"]})
    finally:
        h.stop()


def test_applying_non_idempotent_effect_never_started_is_applied_once(
    broker: BrokerHarness, once: FakeHandler
) -> None:
    """A crash after `applying` was committed but before the handler was called: no start
    mark, so the effect is applied (once) instead of ending `unknown`."""
    h = broker
    doc = h.request("test.once", {"value": "mail"})
    assert h.submit(doc, terminal=False)["status"] == "pending"
    h.stop()
    set_state(
        h, doc["id"], started=False, state="applying", decided_by="ops", decided_at=iso(now())
    )

    restart(h)
    result = checked(h.wait(doc["id"], timeout=5))
    assert result["status"] == "applied"
    assert once.applied == [{"value": "mail"}]
    assert not any((h.state / "started").iterdir())
    assert_audit_sound(h, {doc["id"]})


def test_every_request_ends_once_across_restarts(
    broker: BrokerHarness, fake: FakeHandler, once: FakeHandler
) -> None:
    """Requests in every state across two restarts: one terminal result each, no
    effect applied twice, a sound audit chain with one `received` per id."""
    h = broker
    pending = h.request("test.record", {"value": "gated: approve me"})
    mailed = h.request("test.once", {"value": "mail"})
    for doc in (pending, mailed):
        assert h.submit(doc, terminal=False)["status"] == "pending"
    h.stop()

    set_state(h, pending["id"], state="applying", decided_by="ops", decided_at=iso(now()))
    set_state(h, mailed["id"], state="applying", decided_by="ops", decided_at=iso(now()))
    offline = h.request("test.record", {"value": "offline"})
    h.write(f"{offline['id']}.json", offline)
    claimed = h.request("test.record", {"value": "claimed"})
    h.write("claimed.json", claimed)
    os.rename(h.outbox / "claimed.json", claim_dir(h) / "claimed.json~9-1")
    broken_claim = claim_dir(h) / "broken.json~9-2"
    broken_claim.write_bytes(b"{not json")

    restart(h)
    ids = [pending["id"], mailed["id"], offline["id"], claimed["id"], "broken"]
    results = {i: checked(h.wait(i, timeout=5)) for i in ids}
    restart(h)
    barrier(h)
    h.stop()
    assert {i: r["status"] for i, r in results.items()} == {
        pending["id"]: "applied",
        mailed["id"]: "unknown",
        offline["id"]: "applied",
        claimed["id"]: "applied",
        "broken": "invalid",
    }
    for i, r in results.items():
        assert checked(h.wait(i, timeout=0.1)) == r, f"{i}: a terminal result was rewritten"
    assert sorted(a["value"] for a in fake.applied) == ["claimed", "gated: approve me", "offline"]
    assert once.applied == []
    assert not list(claim_dir(h).iterdir())
    assert not list(h.outbox.iterdir())
    assert_audit_sound(h, set(ids))
