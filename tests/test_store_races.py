"""Transitions that race on one request, on both back ends, each through its own
connection (for PostgreSQL, as two hosts of a fleet would): a decision against an
expiry ends in exactly one outcome; two people approving at once count once each; one
person approving twice at once counts once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from broker.approval import decisions as approval
from broker.approval.decisions import Ballot
from broker.errors import DecisionError
from broker.lifecycle.transitions import Lifecycle
from broker.models import Record, Verdict, canonical_json, sha256_hex
from broker.store.base import Store
from tests.stores import OpenStore, chained_events

ROUNDS = 12


def pending(store: Store, rid: str, approvals: int = 1) -> Record:
    payload = canonical_json({"version": 1, "id": rid, "effect": "t.x", "params": {"v": rid}})
    record = Record(
        sandbox="alpha.sb",
        id=rid,
        name=rid,
        state="received",
        received_at="2026-12-01T00:00:00.000Z",
        effect="t.x",
        payload=payload.decode(),
        sha256=sha256_hex(payload),
        reversible=False,
    )
    verdict = Verdict("approve", "rules[0]", "people look", approvals=approvals, timeout_s=3600)
    with store.transaction():
        return Lifecycle(store).park(record, verdict, {"title": rid, "target": "t"})


def race(*actions: Callable[[], Any]) -> list[Any]:
    """Run the actions at once, one thread each; what each returned or raised."""
    barrier = threading.Barrier(len(actions))
    outcomes: list[Any] = [None] * len(actions)

    def run(n: int) -> None:
        barrier.wait()
        try:
            outcomes[n] = actions[n]()
        except Exception as exc:
            outcomes[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(actions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcomes


def expire_if_pending(store: Store, rid: str) -> str:
    """What the owner's loop does when a deadline is due (pipeline.Broker._expire)."""
    with store.transaction():
        record = store.get("alpha.sb", rid)
        assert record is not None
        if record.state != "pending":
            return "too late"
        return Lifecycle(store).expire(record).state


def decide(store: Store, rid: str, who: str) -> str:
    outcome = approval.decide(
        store,
        Ballot(f"alpha.sb/{rid}", "approve", approver=who, reason="ok", surface="cli", sha256=None),
    )
    return outcome.record.state


def test_a_decision_racing_an_expiry_ends_one_way(open_store: OpenStore) -> None:
    """Approve on one connection, expire on another, at once: each request ends approved
    or expired, never both, with one outcome event in the audit chain."""
    owner, other = open_store(owner=True), open_store(host="beta")
    for n in range(ROUNDS):
        pending(owner, f"r{n}")
    for n in range(ROUNDS):
        decided, expired = race(
            lambda n=n: decide(other, f"r{n}", "ops"), lambda n=n: expire_if_pending(owner, f"r{n}")
        )
        state = (owner.get("alpha.sb", f"r{n}") or pending(owner, "never")).state
        assert state in ("approved", "expired")
        if state == "approved":
            assert decided == "approved" and expired == "too late"
        else:
            assert expired == "expired" and isinstance(decided, DecisionError)
    events = chained_events(owner) + (chained_events(other) if other.shared else [])
    outcomes = Counter(e["id"] for e in events if e["event"] in ("decided", "expired"))
    assert outcomes == {f"r{n}": 1 for n in range(ROUNDS)}
    owner.close()
    other.close()


def test_two_people_approving_at_once_count_once_each(open_store: OpenStore) -> None:
    """A request needing two approvals, approved by two people on two hosts at once:
    approved, by both, each counted once."""
    stores = [open_store(host="alpha"), open_store(host="beta")]
    for n in range(ROUNDS):
        pending(stores[0], f"q{n}", approvals=2)
        race(
            lambda n=n: decide(stores[0], f"q{n}", "alice"),
            lambda n=n: decide(stores[1], f"q{n}", "bob"),
        )
        record = stores[0].get("alpha.sb", f"q{n}")
        assert record is not None and record.state == "approved"
        assert sorted((record.decided_by or "").split(", ")) == ["alice", "bob"]
        assert sorted(approval.approvers(stores[0], record)) == ["alice", "bob"]
    for s in stores:
        s.close()


def test_one_person_approving_twice_at_once_counts_once(open_store: OpenStore) -> None:
    """The same person from two hosts at once: one approval recorded, one refused, and
    the two-person request still waits."""
    stores = [open_store(host="alpha"), open_store(host="beta")]
    for n in range(ROUNDS):
        pending(stores[0], f"d{n}", approvals=2)
        outcomes = race(
            lambda n=n: decide(stores[0], f"d{n}", "alice"),
            lambda n=n: decide(stores[1], f"d{n}", "alice"),
        )
        assert sorted(type(o).__name__ for o in outcomes) == ["DecisionError", "str"]
        record = stores[0].get("alpha.sb", f"d{n}")
        assert record is not None and record.state == "pending"
        assert approval.approvers(stores[0], record) == ["alice"]
    for s in stores:
        s.close()


@pytest.mark.parametrize("fail_at", ["inside", "savepoint"])
def test_a_failed_part_changes_nothing_it_touched(open_store: OpenStore, fail_at: str) -> None:
    """A transaction (or savepoint) that fails after moving a request leaves it as it was,
    with no audit event of the move."""
    store = open_store(owner=True)
    pending(store, "p1")
    before = len(chained_events(store))
    with pytest.raises(RuntimeError), store.transaction():
        if fail_at == "savepoint":
            with store.savepoint():
                expire_if_pending(store, "p1")
                raise RuntimeError("one request's bug")
        expire_if_pending(store, "p1")
        raise RuntimeError("boom")
    assert (store.get("alpha.sb", "p1") or pending(store, "x")).state == "pending"
    assert len(chained_events(store)) == before
    store.close()
