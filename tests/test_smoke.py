"""The whole path once: a request in, an applied result and an audit trail out."""

from __future__ import annotations

from pathlib import Path

from broker.audit import verify as audit
from broker.testing import BrokerHarness


def test_files_write_applies_and_answers(harness: BrokerHarness, exports: Path) -> None:
    """A reversible files.write is applied at once and the agent reads `applied`."""
    doc = harness.request("files.write", {"path": "notes/a.txt", "content": "hi\n"})
    result = harness.submit(doc)
    assert result["status"] == "applied"
    assert (exports / "default" / "notes" / "a.txt").read_text() == "hi\n"
    assert result["output"]["path"] == "notes/a.txt"
    assert not list(harness.outbox.iterdir())
    count, fault = audit.verify(harness.config.audit_path)
    assert fault is None and count >= 3
