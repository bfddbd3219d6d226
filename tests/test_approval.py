"""Decisions by people through broker.approval.decisions, as the agent (/results) and the operator
(ledger, audit log) see them: approve, deny, sha256 binding, quorum, restarts, deadlines."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from broker.approval.decisions import Ballot, Tally, card, decide, nudge
from broker.audit import verify as audit
from broker.clock import REAL, Clock, parse_iso
from broker.errors import DecisionError
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeClock, FakeHandler
from tests.support import SETTLE_S, Start, barrier

REASON = "a person looks at every record first"


def gate(approvals: int = 1, timeout: str = "1h", on_timeout: str = "deny") -> str:
    """A policy file that sends test.record to people."""
    return (
        "[[rules]]\n"
        'effect = "test.record"\n'
        'action = "approve"\n'
        f"approvals = {approvals}\n"
        f'timeout = "{timeout}"\n'
        f'on_timeout = "{on_timeout}"\n'
        f'reason = "{REASON}"\n'
    )


@pytest.fixture
def start(start: Start, fake: FakeHandler) -> Start:
    """Start a broker gating test.record (gate() kwargs, and its clock); stopped after."""

    def make(clock: Clock = REAL, **terms: Any) -> BrokerHarness:
        return start(handlers=[fake], policy=gate(**terms), builtins=False, clock=clock)

    return make


def waiting(h: BrokerHarness, value: Any = "v", **fields: Any) -> dict[str, Any]:
    """Submit a gated request and return its `pending` result."""
    doc = h.request("test.record", {"value": value}, **fields)
    result = h.submit(doc, terminal=False)
    assert result["status"] == "pending", result
    return result


def decide_as(
    h: BrokerHarness,
    ref: str,
    verdict: str,
    who: str,
    reason: str | None = None,
    sha256: str | None = None,
) -> Tally:
    """Decide as a host-side surface does: write to the ledger, then nudge the broker."""
    ledger = Ledger(h.config.ledger_path)
    try:
        return decide(
            ledger,
            Ballot(ref, verdict, approver=who, reason=reason, surface="web", sha256=sha256),
            now=h.clock,  # the broker's: a FakeClock's deadlines pass when it is moved
        )
    finally:
        ledger.close()
        nudge(h.state)


def state_of(h: BrokerHarness, ref: str) -> str:
    ledger = Ledger(h.config.ledger_path)
    try:
        return ledger.find(ref).state
    finally:
        ledger.close()


def events(h: BrokerHarness, kind: str) -> list[dict[str, Any]]:
    found = audit.read_events(h.config.audit_path)
    return [e for _, e, _ in found if e is not None and e.get("event") == kind]


# -- one person ----------------------------------------------------------------------


def test_approval_applies_and_names_the_approver(start: Start, fake: FakeHandler) -> None:
    """An approval applies the effect; the agent reads who approved it and why."""
    h = start()
    pending = waiting(h, "hello")
    outcome = decide_as(h, pending["id"], "approve", "alice", "looks right")
    assert outcome.settled
    result = h.wait(pending["id"])
    assert result["status"] == "applied"
    assert result["decided_by"] == "alice"
    assert result["reason"].startswith("approved by alice")
    assert "looks right" in result["reason"]
    assert result["output"] == {"recorded": 1, "value": "hello"}
    assert result["request_sha256"] == pending["request_sha256"]
    assert parse_iso(result["received_at"]) <= parse_iso(result["decided_at"])  # type: ignore[operator]
    assert fake.applied == [{"value": "hello"}]


def test_denial_goes_back_to_the_agent_with_the_reason(start: Start, fake: FakeHandler) -> None:
    """A denial ends the request; the agent reads the person's reason."""
    h = start()
    pending = waiting(h)
    decide_as(h, pending["id"], "deny", "bob", "write to the staging table instead")
    result = h.wait(pending["id"])
    assert result["status"] == "denied"
    assert result["decided_by"] == "bob"
    assert "write to the staging table instead" in result["reason"]
    assert result["output"] is None
    assert fake.applied == []


@pytest.mark.parametrize("reason", [None, "", "   \n"])
def test_denial_without_a_reason_is_refused(start: Start, reason: str | None) -> None:
    """A denial needs a reason: without one nothing is recorded and the request waits."""
    h = start()
    pending = waiting(h)
    with pytest.raises(DecisionError, match="reason"):
        decide_as(h, pending["id"], "deny", "bob", reason)
    assert state_of(h, pending["id"]) == "pending"
    assert events(h, "decision") == []


@pytest.mark.parametrize(
    ("verdict", "who", "words"),
    [("maybe", "alice", "approve or deny"), ("approve", "  ", "name")],
)
def test_decision_needs_a_verdict_and_a_name(
    start: Start, verdict: str, who: str, words: str
) -> None:
    """Only approve or deny count, and only from someone with a name."""
    h = start()
    pending = waiting(h)
    with pytest.raises(DecisionError, match=words):
        decide_as(h, pending["id"], verdict, who)
    assert state_of(h, pending["id"]) == "pending"


# -- what the decider saw -------------------------------------------------------------


def test_decision_for_another_sha256_is_refused(start: Start, fake: FakeHandler) -> None:
    """An approval for other bytes than the recorded request is refused, not applied."""
    h = start()
    pending = waiting(h)
    other = "f" * 64 if not pending["request_sha256"].startswith("f") else "0" * 64
    with pytest.raises(DecisionError, match="look at it again"):
        decide_as(h, pending["id"], "approve", "alice", sha256=other)
    barrier(h)
    assert state_of(h, pending["id"]) == "pending"
    assert fake.applied == []


def test_sha256_prefix_needs_twelve_digits(start: Start, fake: FakeHandler) -> None:
    """A prefix of 11 hex digits is refused; 12 (any case) is accepted."""
    h = start()
    pending = waiting(h)
    sha = pending["request_sha256"]
    with pytest.raises(DecisionError):
        decide_as(h, pending["id"], "approve", "alice", sha256=sha[:11])
    assert state_of(h, pending["id"]) == "pending"
    decide_as(h, pending["id"], "approve", "alice", sha256=sha[:12].upper())
    assert h.wait(pending["id"])["status"] == "applied"
    assert len(fake.applied) == 1


# -- quorum -------------------------------------------------------------------------


def test_quorum_needs_distinct_people(start: Start, fake: FakeHandler) -> None:
    """approvals = 2: one approval waits, the same person cannot count twice, a second applies."""
    h = start(approvals=2)
    pending = waiting(h)
    first = decide_as(h, pending["id"], "approve", "alice", "fine by me")
    assert (first.settled, first.approvals, first.needed) == (False, 1, 2)
    barrier(h)
    assert h.wait(pending["id"], terminal=False)["status"] == "pending"
    assert fake.applied == []
    with pytest.raises(DecisionError, match="already decided"):
        decide_as(h, pending["id"], "approve", "alice")
    second = decide_as(h, pending["id"], "approve", "bob")
    assert (second.settled, second.approvals, second.needed) == (True, 2, 2)
    result = h.wait(pending["id"])
    assert result["status"] == "applied"
    assert result["decided_by"] == "alice, bob"
    assert "alice: fine by me" in result["reason"] and "bob" in result["reason"]
    assert len(fake.applied) == 1


def test_one_denial_ends_a_quorum(start: Start, fake: FakeHandler) -> None:
    """Under approvals = 2, a denial after one approval denies it with the denier's words."""
    h = start(approvals=2)
    pending = waiting(h)
    decide_as(h, pending["id"], "approve", "alice")
    outcome = decide_as(h, pending["id"], "deny", "bob", "not during the freeze")
    assert outcome.settled
    result = h.wait(pending["id"])
    assert result["status"] == "denied"
    assert result["decided_by"] == "bob"
    assert "not during the freeze" in result["reason"]
    assert fake.applied == []


def test_same_person_cannot_deny_after_approving(start: Start) -> None:
    """Whoever already approved cannot change their mind into a denial: one voice each."""
    h = start(approvals=2)
    pending = waiting(h)
    decide_as(h, pending["id"], "approve", "alice")
    with pytest.raises(DecisionError, match="already decided"):
        decide_as(h, pending["id"], "deny", "alice", "second thoughts")
    assert state_of(h, pending["id"]) == "pending"


def test_two_people_approving_at_once_apply_it_once(start: Start, fake: FakeHandler) -> None:
    """Two simultaneous approvals of a one-approval request: one counts, one is refused."""
    h = start()
    pending = waiting(h)
    go = threading.Barrier(2)
    outcomes: list[str] = []

    def approve(who: str) -> None:
        go.wait()
        try:
            decide_as(h, pending["id"], "approve", who)
            outcomes.append("ok")
        except DecisionError:
            outcomes.append("refused")

    threads = [threading.Thread(target=approve, args=(who,)) for who in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["ok", "refused"]
    assert h.wait(pending["id"])["status"] == "applied"
    barrier(h)
    assert len(fake.applied) == 1


# -- settled requests, records and audit ---------------------------------------------


def test_deciding_a_settled_request_is_refused(start: Start, fake: FakeHandler) -> None:
    """Once applied or denied, further approvals and denials are refused."""
    h = start()
    applied, denied = waiting(h, 1), waiting(h, 2)
    decide_as(h, applied["id"], "approve", "alice")
    decide_as(h, denied["id"], "deny", "alice", "no")
    assert h.wait(applied["id"])["status"] == "applied"
    assert h.wait(denied["id"])["status"] == "denied"
    for ref in (applied["id"], denied["id"]):
        with pytest.raises(DecisionError, match="not waiting"):
            decide_as(h, ref, "approve", "carol")
        with pytest.raises(DecisionError, match="not waiting"):
            decide_as(h, ref, "deny", "carol", "too late")
    assert fake.applied == [{"value": 1}]


def test_deciding_an_expired_request_is_refused(start: Start, fake: FakeHandler) -> None:
    """After the deadline the request is expired and an approval is refused."""
    clock = FakeClock()
    h = start(timeout="300ms", clock=clock)
    pending = waiting(h)
    clock.advance(0.3)
    assert h.wait(pending["id"], timeout=5)["status"] == "expired"
    with pytest.raises(DecisionError, match="not waiting"):
        decide_as(h, pending["id"], "approve", "alice")
    assert fake.applied == []


def test_decisions_are_recorded_with_who_when_how_and_sha(start: Start) -> None:
    """Each decision is a ledger row: approver, verdict, reason, surface, time and sha256."""
    h = start(approvals=2)
    pending = waiting(h)
    decide_as(h, pending["id"], "approve", "alice", "ok")
    decide_as(h, pending["id"], "deny", "bob", "not now")
    ledger = Ledger(h.config.ledger_path)
    try:
        rows = ledger.decisions("default", pending["id"])
    finally:
        ledger.close()
    assert [(d.approver, d.verdict, d.reason, d.surface) for d in rows] == [
        ("alice", "approve", "ok", "web"),
        ("bob", "deny", "not now", "web"),
    ]
    assert {d.sha256 for d in rows} == {pending["request_sha256"]}
    received = parse_iso(pending["received_at"])
    stamps = [parse_iso(d.at) for d in rows]
    assert received is not None and None not in stamps
    assert [received, *stamps] == sorted([received, *stamps])  # type: ignore[type-var]


def test_each_decision_is_an_audit_event(start: Start) -> None:
    """The audit log holds one `decision` event per person, with by, verdict and surface."""
    h = start(approvals=2)
    pending = waiting(h)
    decide_as(h, pending["id"], "approve", "alice", "ok")
    decide_as(h, pending["id"], "approve", "bob")
    assert h.wait(pending["id"])["status"] == "applied"
    barrier(h)
    decisions = [e for e in events(h, "decision") if e["id"] == pending["id"]]
    assert [(e["by"], e["verdict"], e["surface"]) for e in decisions] == [
        ("alice", "approve", "web"),
        ("bob", "approve", "web"),
    ]
    assert {e["sha256"] for e in decisions} == {pending["request_sha256"]}
    assert decisions[0]["reason"] == "ok"
    ledger = Ledger(h.config.ledger_path)
    try:
        head = ledger.audit_head()
    finally:
        ledger.close()
    assert audit.verify(h.config.audit_path, head)[1] is None


def test_card_shows_what_a_person_needs(start: Start, fake: FakeHandler) -> None:
    """The card has the literal preview, the rule, the deadline, the agent's words, flags."""
    h = start(approvals=2, timeout="2h")
    pending = waiting(h, "exact words", reason="the user asked for it")
    ledger = Ledger(h.config.ledger_path)
    try:
        decide_as(h, pending["id"], "approve", "alice")
        c = card(ledger, ledger.find(pending["id"]), h.registry)
    finally:
        ledger.close()
    assert c["ref"] == f"default/{pending['id']}"
    assert '"value": "exact words"' in c["what"]["body"]
    assert c["where"] == "test: test.record"
    assert c["why"]["reason"] == REASON and c["why"]["rule"]
    assert c["if_nobody_answers"]["expires_at"] == pending["expires_at"]
    assert c["if_nobody_answers"]["on_timeout"] == "deny"
    assert 7000 < c["if_nobody_answers"]["seconds_left"] <= 7200
    assert c["agent_reason"] == "the user asked for it"
    assert (c["reversible"], c["idempotent"], c["undo"]) == (True, True, fake.undo)
    assert c["approvals"] == {"have": ["alice"], "needed": 2}
    assert c["request_sha256"] == pending["request_sha256"]


# -- restarts and deadlines ------------------------------------------------------------


def test_approval_while_the_broker_is_down_is_applied_on_start(
    start: Start, fake: FakeHandler
) -> None:
    """An approval recorded while no broker runs is applied when one starts."""
    h = start()
    pending = waiting(h, "later")
    h.stop()
    decide_as(h, pending["id"], "approve", "alice", "go ahead")
    h.start()
    result = h.wait(pending["id"])
    assert result["status"] == "applied"
    assert result["decided_by"] == "alice"
    assert fake.applied == [{"value": "later"}]


def test_partial_quorum_survives_a_restart(start: Start, fake: FakeHandler) -> None:
    """One of two approvals before a restart still counts after it."""
    h = start(approvals=2)
    pending = waiting(h)
    decide_as(h, pending["id"], "approve", "alice")
    h.restart()
    time.sleep(SETTLE_S)
    barrier(h)
    assert h.wait(pending["id"], terminal=False)["status"] == "pending"
    with pytest.raises(DecisionError, match="already decided"):
        decide_as(h, pending["id"], "approve", "alice")
    decide_as(h, pending["id"], "approve", "bob")
    assert h.wait(pending["id"])["decided_by"] == "alice, bob"
    assert len(fake.applied) == 1


@pytest.mark.parametrize(
    ("on_timeout", "status", "applies"), [("deny", "expired", 0), ("approve", "applied", 1)]
)
def test_deadline_survives_a_restart(
    start: Start, fake: FakeHandler, on_timeout: str, status: str, applies: int
) -> None:
    """A deadline that passes while the broker is down takes effect when it starts."""
    clock = FakeClock()
    h = start(timeout="500ms", on_timeout=on_timeout, clock=clock)
    pending = waiting(h)
    assert pending["on_timeout"] == on_timeout
    h.stop()
    clock.advance(0.6)
    h.start()
    result = h.wait(pending["id"], timeout=3)
    assert result["status"] == status
    assert result["decided_by"] == "policy (on_timeout)"
    assert len(fake.applied) == applies


def test_deadline_still_runs_after_a_restart_before_it(start: Start, fake: FakeHandler) -> None:
    """A restart before the deadline keeps it: the request expires on time, not never."""
    clock = FakeClock()
    h = start(timeout="600ms", clock=clock)
    pending = waiting(h)
    h.restart()
    assert h.wait(pending["id"], terminal=False)["status"] == "pending"
    clock.advance(0.6)
    result = h.wait(pending["id"], timeout=3)
    assert result["status"] == "expired"
    assert "expired" in result["reason"]
    assert fake.applied == []


def test_approval_after_the_deadline_does_not_apply(start: Start, fake: FakeHandler) -> None:
    """An approval given after the deadline (broker down) does not apply: it was to be denied."""
    clock = FakeClock()
    h = start(timeout="500ms", on_timeout="deny", clock=clock)
    pending = waiting(h)
    h.stop()
    clock.advance(0.6)
    try:
        decide_as(h, pending["id"], "approve", "alice")
    except DecisionError:
        pass  # refusing the late approval is one right answer
    h.start()
    result = h.wait(pending["id"], timeout=3)
    assert result["status"] == "expired"
    assert fake.applied == []
