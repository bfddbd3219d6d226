"""Decisions and deadlines that meet a broker while it is starting up."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.approval import decisions as approval
from broker.approval.decisions import Ballot
from broker.audit.log import AuditLog, flush
from broker.loop.pipeline import Broker
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeHandler

GATE = {"rules": [{"effect": "test.record", "action": "approve", "reason": "a person looks"}]}


def test_decision_taken_while_the_broker_starts_is_applied_promptly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approval recorded between the broker's recovery and its first watch applies at once."""
    h = BrokerHarness(
        tmp_path / "h", handlers=[FakeHandler("test.record")], policy=GATE, builtins=False
    )
    h.config = h.config._replace(rescan_interval_s=3600.0)
    with h:
        doc = h.request("test.record", {"value": "approve me"})
        assert h.submit(doc, terminal=False)["status"] == "pending"
    recover = Broker.recover

    def recover_then_someone_approves(self: Broker) -> None:
        recover(self)
        ledger = Ledger(h.config.ledger_path)
        try:
            approval.decide(
                ledger,
                Ballot(
                    doc["id"],
                    "approve",
                    approver="ops",
                    reason="looked at it",
                    surface="cli",
                    sha256=None,
                ),
            )
            flush(ledger, AuditLog(h.config.audit_path))
        finally:
            ledger.close()
        approval.nudge(h.state)

    monkeypatch.setattr(Broker, "recover", recover_then_someone_approves)
    with h:
        try:
            status = h.wait(doc["id"], timeout=5)["status"]
        except TimeoutError:
            status = "still pending after 5 s (the next periodic rescan is an hour away)"

    assert status == "applied"
