"""Outbox protocol version 2, against a real broker in a thread: withdrawals
(`<id>.withdraw` takes back a request that waits for a person; one already approved,
applying or decided is left as it is), and pending results that count approvals."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.audit import verify as audit
from broker.config import Limits
from broker.testing import BrokerHarness, FakeHandler
from tests.support import Start, checked, eventually
from tests.test_approval import decide_as, gate, waiting


@pytest.fixture
def start(start: Start, fake: FakeHandler) -> Start:
    """A broker gating test.record (gate() kwargs), with a short grace for withdrawals."""

    def make(**terms: Any) -> Start:
        limits = Limits(attachment_grace_s=terms.pop("grace", 300.0))
        return start(handlers=[fake], policy=gate(**terms), builtins=False, limits=limits)

    return make  # type: ignore[return-value]


def withdraw(h: BrokerHarness, request_id: str, **doc: Any) -> None:
    h.write(f"{request_id}.withdraw", {"version": 2, "id": request_id, **doc})


def events(h: BrokerHarness, kind: str | None = None) -> list[dict[str, Any]]:
    found = [e for _, e, _ in audit.read_events(h.config.audit_path) if e is not None]
    return [e for e in found if kind is None or e.get("event") == kind]


def outbox_empty(h: BrokerHarness) -> bool:
    """the outbox holds nothing (the withdrawal was consumed)"""
    return not any(h.outbox.iterdir())


def test_a_waiting_request_is_denied_as_withdrawn(start: Start, fake: FakeHandler) -> None:
    """Pending: denied, 'withdrawn by the agent' with its reason, decided by the agent,
    one terminal result and one terminal audit event; the file is consumed."""
    h = start()
    pending = waiting(h)
    withdraw(h, pending["id"], reason="the call was cancelled")
    result = checked(h.wait(pending["id"]))
    assert result["status"] == "denied"
    assert result["reason"] == "withdrawn by the agent: the call was cancelled"
    assert result["decided_by"] == "agent"
    [denied] = eventually(lambda: events(h, "denied"))  # the audit log follows the result
    assert denied["by"] == "agent" and denied["withdrawn"] is True
    eventually(lambda: outbox_empty(h))
    assert fake.applied == []
    decided = decide_as_refused(h, pending["id"])
    assert "not waiting for a decision (it is denied)" in decided


def decide_as_refused(h: BrokerHarness, ref: str) -> str:
    from broker.errors import DecisionError

    with pytest.raises(DecisionError) as caught:
        decide_as(h, ref, "approve", "alice", "too late")
    return str(caught.value)


def test_partly_approved_is_still_withdrawn(start: Start) -> None:
    """One approval of two: it still waits, so the withdrawal denies it (no reason given)."""
    h = start(approvals=2)
    pending = waiting(h)
    decide_as(h, pending["id"], "approve", "alice", "fine")
    withdraw(h, pending["id"])
    result = h.wait(pending["id"])
    assert (result["status"], result["reason"]) == ("denied", "withdrawn by the agent")


def test_a_withdrawal_before_its_request_waits_for_it(start: Start) -> None:
    """Written before the request (both in the outbox at once): the request is recorded,
    then withdrawn."""
    h = start()
    doc = h.request("test.record", {"value": "v"})
    withdraw(h, doc["id"])
    result = h.submit(doc)
    assert result["status"] == "denied" and result["reason"] == "withdrawn by the agent"
    eventually(lambda: outbox_empty(h))


def test_an_applied_or_applying_request_is_not_withdrawn(start: Start, fake: FakeHandler) -> None:
    """Approved and applying (the handler blocked): the withdrawal comes too late, the
    audit log says so, and the request is applied."""
    h = start()
    pending = waiting(h)
    fake.release.clear()
    decide_as(h, pending["id"], "approve", "alice", "go")
    assert fake.started.wait(30)
    withdraw(h, pending["id"], reason="changed my mind")
    [refused] = eventually(lambda: events(h, "withdraw_refused"))
    assert refused["state"] == "applying" and refused["said"] == "changed my mind"
    fake.release.set()
    assert h.wait(pending["id"])["status"] == "applied"
    eventually(lambda: outbox_empty(h))


def test_a_bad_withdrawal_changes_nothing(start: Start) -> None:
    """Version 1, or an id that is not its name's: ignored and removed; still pending."""
    h = start()
    pending = waiting(h)
    rid = pending["id"]
    h.write(f"{rid}.withdraw", {"version": 1, "id": rid})
    eventually(lambda: outbox_empty(h))
    h.write(f"{rid}.withdraw", {"version": 2, "id": "someone-else"})
    eventually(lambda: outbox_empty(h))
    h.write(f"{rid}.withdraw", b"not json")
    eventually(lambda: outbox_empty(h))
    assert json.loads((h.results / f"{rid}.json").read_text())["status"] == "pending"
    assert events(h, "denied") == []


def test_a_withdrawal_of_nothing_is_dropped_after_the_grace(start: Start) -> None:
    """No such request: the file stays for the grace period, then is removed."""
    h = start(grace=0.3)
    withdraw(h, "never-sent")
    eventually(lambda: outbox_empty(h))
    assert not (h.results / "never-sent.json").exists()


@pytest.mark.parametrize("version", [1, 2])
def test_requests_of_either_version_are_answered_in_their_own(start: Start, version: int) -> None:
    """Version 1 and 2 requests are the same request; each result carries its version."""
    h = start()
    doc = h.request("test.record", {"value": "v"}, version=version)
    result = h.submit(doc, terminal=False)
    assert (checked(result)["status"], result["version"]) == ("pending", version)


def test_version_3_is_invalid(start: Start) -> None:
    h = start()
    result = h.submit(h.request("test.record", {"value": "v"}, version=3))
    assert result["status"] == "invalid"
    assert [e["path"] for e in result["errors"]] == ["/version"]


def test_the_client_withdraws_through_the_broker(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """outbox.withdraw: "asked" for a request the broker holds (then denied), "unfiled"
    for one still in the outbox (removed)."""
    outbox = _client()
    h = start()
    monkeypatch.setenv("OUTBOX_DIR", str(h.outbox))
    monkeypatch.setenv("RESULTS_DIR", str(h.results))
    pending = waiting(h)
    assert outbox.withdraw(pending["id"], "not needed any more") == "asked"
    assert h.wait(pending["id"])["reason"] == "withdrawn by the agent: not needed any more"
    h.stop()
    unread = outbox.request("test.record", {"value": "v"}, wait=False)
    assert outbox.withdraw(unread["id"]) == "unfiled"
    assert outbox_empty(h)


def test_outbox_withdraw_from_a_shell(start: Start) -> None:
    """`outbox withdraw ID --reason …`: exit 0, the request ends denied with the reason."""
    import subprocess

    h = start()
    pending = waiting(h)
    env = {**os.environ, "OUTBOX_DIR": str(h.outbox), "RESULTS_DIR": str(h.results)}
    command = [sys.executable, str(CLIENT / "outbox.py"), "withdraw", pending["id"]]
    done = subprocess.run(
        [*command, "--reason", "done by hand"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "asked the broker to withdraw" in done.stderr
    assert h.wait(pending["id"])["reason"] == "withdrawn by the agent: done by hand"


def test_the_client_writes_no_withdrawal_for_a_version_1_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalogue without protocol_versions (an older broker): "unsupported", no file."""
    outbox = _client()
    (tmp_path / "o").mkdir()
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / ".effects.json").write_text('{"version": 1, "effects": []}')
    monkeypatch.setenv("OUTBOX_DIR", str(tmp_path / "o"))
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path / "r"))
    assert outbox.withdraw("abc") == "unsupported"
    assert list((tmp_path / "o").iterdir()) == []


CLIENT = Path(__file__).resolve().parents[1] / "sandbox_images" / "client"


def _client() -> Any:
    if str(CLIENT) not in sys.path:
        sys.path.insert(0, str(CLIENT))
    import outbox

    return outbox


def test_a_version_2_pending_result_counts_the_approvals(start: Start) -> None:
    """0 of 2, then 1 of 2 once alice approved (the result is written again); a version 1
    request's result has no such field."""
    h = start(approvals=2)
    doc = h.request("test.record", {"value": "v"}, version=2)
    pending = checked(h.submit(doc, terminal=False))
    assert pending["approvals"] == {"given": 0, "needed": 2}
    decide_as(h, pending["id"], "approve", "alice", "fine")

    def counted() -> dict[str, Any] | None:
        """the pending result says one approval is in"""
        found = json.loads((h.results / f"{pending['id']}.json").read_text())
        return found if found.get("approvals", {}).get("given") == 1 else None

    assert checked(eventually(counted))["status"] == "pending"
    old = h.submit(h.request("test.record", {"value": "w"}), terminal=False)
    assert "approvals" not in old
