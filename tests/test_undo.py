"""`broker undo` and `broker reconcile`: reversing what was applied, settling `unknown`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from broker.audit import log as audit
from broker.audit import verify as audit_verify
from broker.lifecycle.marks import StartMarks
from broker.models import Preview
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeHandler
from effects.base import Context

BROKER = str(Path(sys.executable).parent / "broker")


class UndoableHandler(FakeHandler):
    """A fake effect that can be reversed: revert removes what apply recorded."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.reverted: list[dict[str, Any]] = []

    def revert_preview(self, output: dict[str, Any], ctx: Context) -> Preview:
        return Preview(title=f"forget record {output['recorded']}", target="test: memory")

    def revert(self, output: dict[str, Any], ctx: Context) -> dict[str, Any]:
        self.reverted.append(output)
        return {"forgotten": output["recorded"]}


def _cli(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BROKER, *args, "--state", str(state)], capture_output=True, text=True, timeout=60
    )


def test_undo_reverses_an_applied_effect_and_audits_it(tmp_path: Path) -> None:
    """`broker undo ID --yes` calls the handler's revert and records it in the audit log."""
    handler = UndoableHandler("test.undoable")
    h = BrokerHarness(tmp_path / "h", handlers=[handler], builtins=False)
    with h:
        result = h.submit(h.request("test.undoable", {"value": "x"}), timeout=10)
        assert result["status"] == "applied"
    # the CLI process cannot see this test's in-memory handler: drive the module
    from broker.lifecycle import undo

    ledger = Ledger(h.config.ledger_path)
    chosen = undo.plan(ledger, h.registry, h.config, result["id"])
    assert chosen.preview.title == "forget record 1"
    record = undo.execute(ledger, h.config, chosen, "alice")
    audit.flush(ledger, audit.AuditLog(h.config.audit_path))
    assert record.state == "applied"
    assert handler.reverted == [result["output"]]
    events = [e for _, e, _ in audit_verify.read_events(h.config.audit_path) if e]
    assert any(e["event"] == "undone" and e["by"] == "alice" for e in events)
    assert audit_verify.verify(h.config.audit_path)[1] is None
    # the agent's result is terminal and stays as it read it
    assert (h.results / f"{result['id']}.json").read_text().count('"applied"') == 1


def test_undo_refuses_an_effect_that_cannot_be_undone(tmp_path: Path, exports: Path) -> None:
    """files.write has no revert: `broker undo` refuses with one clear line."""
    h = BrokerHarness(tmp_path / "h", integrations={"files": {"root": str(exports)}})
    with h:
        result = h.submit(h.request("files.write", {"path": "a.txt", "content": "x"}))
    done = _cli("undo", result["id"], "--yes", state=h.state)
    assert done.returncode == 2
    assert "cannot be undone by the broker" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_undo_refuses_what_was_not_applied(tmp_path: Path, fake: FakeHandler) -> None:
    """Undoing a denied request is refused: nothing was applied."""
    policy = '[[rules]]\neffect = "test.*"\naction = "deny"\nreason = "no"\n'
    h = BrokerHarness(tmp_path / "h", handlers=[fake], policy=policy)
    with h:
        result = h.submit(h.request("test.record", {"value": 1}))
    done = _cli("undo", result["id"], "--yes", state=h.state)
    assert done.returncode == 2 and "was not applied" in done.stderr


def _unknown_request(tmp_path: Path) -> tuple[BrokerHarness, str]:
    """A non-idempotent request caught mid-apply by a stop ends `unknown` on restart."""
    fake = FakeHandler("test.once", idempotent=False)
    h = BrokerHarness(tmp_path / "h", handlers=[fake])
    with h:
        result = h.submit(h.request("test.once", {"value": 1}))
    ledger = Ledger(h.config.ledger_path)
    with ledger.transaction():
        record = ledger.get("default", result["id"])
        assert record is not None
        record = ledger.update(record, state="applying", completed_at=None, reason=None)
    ledger.close()
    StartMarks(h.state / "started").mark(record)  # its handler had been called
    (h.results / f"{result['id']}.json").unlink()
    with h:
        after = h.wait(result["id"])
    assert after["status"] == "unknown"
    assert "reconcile" in after["reason"]
    return h, result["id"]


def test_reconcile_records_what_a_person_found(tmp_path: Path) -> None:
    """`broker reconcile ID --applied` is recorded and audited; a second time is refused."""
    h, rid = _unknown_request(tmp_path)
    done = _cli("reconcile", rid, "--applied", "--reason", "saw it in the CRM", state=h.state)
    assert done.returncode == 0, done.stderr
    assert "recorded as applied" in done.stdout
    again = _cli("reconcile", rid, "--not-applied", state=h.state)
    assert again.returncode == 2 and "already reconciled" in again.stderr
    events = [e for _, e, _ in audit_verify.read_events(h.config.audit_path) if e]
    assert any(e["event"] == "reconciled" and e["applied"] is True for e in events)
    assert _cli("audit", "verify", state=h.state).returncode == 0
    shown = _cli("show", rid, state=h.state)
    assert "reconciled:applied" in shown.stdout


def test_reconcile_refuses_a_request_that_is_not_unknown(tmp_path: Path, fake: FakeHandler) -> None:
    """Only `unknown` requests can be reconciled."""
    h = BrokerHarness(tmp_path / "h", handlers=[fake])
    with h:
        result = h.submit(h.request("test.record", {"value": 1}))
    done = _cli("reconcile", result["id"], "--not-applied", state=h.state)
    assert done.returncode == 2 and "not unknown" in done.stderr
