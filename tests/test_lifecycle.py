"""The request's state machine, on both stores: every legal transition writes its row and
its audit event in one transaction; every other move is refused, and terminal states
never change."""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import IllegalTransition, Rejected
from broker.lifecycle.transitions import ALLOWED, Lifecycle
from broker.masking import Redactor
from broker.models import STATUSES, TERMINAL, Record, State, Verdict, canonical_json, sha256_hex
from broker.store.base import Store
from tests.stores import chained_events

VERDICT = Verdict(action="approve", rule="rules[0]", reason="people look", timeout_s=60)


def new(rid: str = "r1", key: str | None = None) -> Record:
    payload = canonical_json({"version": 1, "id": rid, "effect": "t.x", "params": {"v": rid}})
    return Record(
        sandbox="sb",
        id=rid,
        name=rid,
        state="received",
        received_at="2026-12-01T00:00:00.000Z",
        effect="t.x",
        payload=payload.decode(),
        sha256=sha256_hex(payload),
        idempotency_key=key,
        reversible=True,
    )


@pytest.fixture
def life(store: Store) -> Lifecycle:
    return Lifecycle(store, Redactor(["hunter2"]))


def events(life: Lifecycle) -> list[str]:
    return [e["event"] for e in chained_events(life.ledger)]


def stored(life: Lifecycle, record: Record) -> Record:
    found = life.ledger.get(*record.key)
    assert found is not None
    return found


class TestLegalMoves:
    """Each transition leaves the row and the audit queue as the request's life says."""

    def test_auto_then_finish(self, life: Lifecycle) -> None:
        """new → applying (auto) → applied: two rows written, the events in order."""
        with life.ledger.transaction():
            life.receive(new())
            record = life.auto(new(), Verdict("auto", "default", "reversible"))
            done = life.finish(record, "applied", None, {"ok": "hunter2"}, [])
        assert stored(life, done).state == "applied"
        assert stored(life, done).output == {"ok": "•••"}, "outputs are redacted"
        assert events(life) == ["received", "decided", "applying", "applied"]

    def test_hold_park_approve_start_finish(self, life: Lifecycle) -> None:
        """received → pending → approved → applying → failed, what people saw dropped at the end."""
        with life.ledger.transaction():
            held = life.hold(new().evolve(seen={"etag": "1"}))
            parked = life.park(held, VERDICT, {"title": "t", "target": "x"})
            approved = life.approve(parked, "alice", "approved by alice", "2026-12-01T00:00:01Z")
            applying = life.start(approved)
            assert stored(life, applying).seen == {"etag": "1"}
            done = life.finish(applying, "failed", "failed: 501", None, [])
        row = stored(life, done)
        assert (row.state, row.decided_by, row.seen) == ("failed", "alice", None)
        assert row.expires_at is not None and row.on_timeout == "deny"
        assert events(life) == ["pending", "decided", "applying", "failed"]

    def test_refuse_and_expire(self, life: Lifecycle) -> None:
        """pending → denied by a person; pending → expired by its deadline."""
        with life.ledger.transaction():
            one = life.park(new("a"), VERDICT, {"title": "t", "target": "x"})
            two = life.park(new("b"), VERDICT, {"title": "t", "target": "x"})
            denied = life.refuse(one, "bob", "not now", "2026-12-01T00:00:01Z")
            expired = life.expire(two)
        assert denied.reason == "denied by bob: not now" and denied.state == "denied"
        assert expired.state == "expired" and "nobody decided within 1m" in str(expired.reason)

    def test_timeout_approves_a_reversible_request(self, life: Lifecycle) -> None:
        """on_timeout = approve: a reversible request goes to applying at its deadline."""
        verdict = Verdict("approve", "rules[1]", "r", timeout_s=60, on_timeout="approve")
        with life.ledger.transaction():
            record = life.expire(life.park(new(), verdict, {"title": "t", "target": "x"}))
        assert record.state == "applying" and record.decided_by == "policy (on_timeout)"

    def test_timeout_never_approves_an_irreversible_request(self, life: Lifecycle) -> None:
        """on_timeout = approve is turned into deny for a request that cannot be undone."""
        verdict = Verdict("approve", "rules[1]", "r", timeout_s=60, on_timeout="approve")
        with life.ledger.transaction():
            parked = life.park(
                new().evolve(reversible=False), verdict, {"title": "t", "target": "x"}
            )
            record = life.expire(parked)
        assert parked.on_timeout == "deny" and record.state == "expired"

    def test_reject_and_lose(self, life: Lifecycle) -> None:
        """new → invalid with its issues; applying → unknown after a restart."""
        exc = Rejected("invalid: bad", [])
        with life.ledger.transaction():
            bad = life.reject(new("a"), exc)
            lost = life.lose(life.auto(new("b"), Verdict("auto", "default", "r")))
        assert bad.state == "invalid" and bad.decided_by is None
        assert lost.state == "unknown" and "broker reconcile" in str(lost.reason)

    def test_replay_waits_for_its_first_then_copies_its_outcome(self, life: Lifecycle) -> None:
        """A replay of a request still in flight waits, then gets the first's outcome."""
        with life.ledger.transaction():
            first = life.auto(new("first", key="k"), Verdict("auto", "default", "r"))
            replay = life.replay(new("second", key="k"), first)
            assert replay.state == "received" and replay.replay_of == "first"
            done = life.finish(first, "applied", None, {"n": 1}, [])
            settled = life.settle_replays(done)
        assert [(r.id, r.state, r.output) for r in settled] == [("second", "applied", {"n": 1})]


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_terminal_states_never_change(life: Lifecycle, state: State) -> None:
    """A terminal row refuses every further move, naming the request and both states."""
    with life.ledger.transaction():
        record = life.ledger.insert(new().evolve(state=state))
        with pytest.raises(IllegalTransition, match=rf"sb/r1: cannot go from {state} to"):
            life.start(record)
        with pytest.raises(IllegalTransition):
            life.expire(record)


def test_illegal_moves_are_refused(life: Lifecycle) -> None:
    """approved cannot expire, pending cannot finish, a new request cannot be approved."""
    with life.ledger.transaction():
        pending = life.park(new("a"), VERDICT, {"title": "t", "target": "x"})
        approved = life.approve(
            life.park(new("b"), VERDICT, {"title": "t", "target": "x"}), "a", "ok", "t"
        )
        with pytest.raises(IllegalTransition, match="from pending to applied"):
            life.finish(pending, "applied", None, None, [])
        with pytest.raises(IllegalTransition, match="from approved to expired"):
            life.expire(approved)
        with pytest.raises(IllegalTransition, match="from new to approved"):
            life.approve(new("c"), "a", "ok", "t")


def test_the_table_covers_every_state() -> None:
    """Every state has an entry; only the in-flight ones have anywhere to go."""
    states: set[Any] = set(STATUSES) | {"received", "approved", "applying"}
    assert set(ALLOWED) == states | {None}
    assert {s for s, to in ALLOWED.items() if not to} == set(TERMINAL)
