"""Every Store operation on both back ends, as its callers see it: what each returns, in
which order and how many; what an owner's store of a fleet lists (its own host's rows)
beside a surface's (the whole fleet). SQLite's unordered reads come back reversed here
(tests/stores.py), so an order no statement asks for shows."""

from __future__ import annotations

import json
import threading

import pytest

from broker.errors import AmbiguousRequest, LedgerError, RequestNotFound, StateBusy
from broker.models import Decision, Record
from broker.store.base import Store
from tests.stores import OpenStore


def row(sandbox: str, rid: str, state: str = "pending", **extra: object) -> Record:
    return Record(sandbox, rid, rid, state, "2026-12-01T00:00:00.000Z", **extra)  # type: ignore[arg-type]


def add(store: Store, *records: Record) -> list[Record]:
    with store.transaction():
        return [store.insert(r) for r in records]


def ids(records: list[Record]) -> list[str]:
    return [r.id for r in records]


def decision(rid: str, approver: str, verdict: str = "approve") -> Decision:
    return Decision("sb", rid, approver, verdict, "ok", "cli", "0" * 64, "2026-12-01T00:00:01Z")


def test_replays_come_back_in_arrival_order(store: Store) -> None:
    """The replays waiting on a first request come back as they arrived (the order their
    results are written and audited), without settled ones or another sandbox's."""
    first, *waiting = add(
        store,
        row("sb", "first", "applying", idempotency_key="k"),
        *(row("sb", f"again{n}", "received", replay_of="first") for n in range(1, 5)),
    )
    add(store, row("sb", "settled", "applied", replay_of="first"))
    add(store, row("other", "again9", "received", replay_of="first"))
    store.update(waiting[0], reason="still waiting")  # a row written again keeps its place
    assert ids(store.replays_of(first)) == ["again1", "again2", "again3", "again4"]
    assert store.replays_of(waiting[1]) == []


def test_in_states_lists_in_arrival_order_and_an_owner_only_its_host(
    open_store: OpenStore,
) -> None:
    """Recovery's lists: the states asked for, oldest first; a fleet's owner store sees
    its own host's requests only, a surface's store every host's."""
    owner, beta = open_store(owner=True), open_store(host="beta")
    p1, *_ = add(
        owner,
        row("alpha.sb", "p1"),
        row("alpha.sb", "a1", "approved"),
        row("alpha.sb", "p2"),
        row("alpha.sb", "done", "applied"),
    )
    add(beta, row("beta.sb", "p3"))
    owner.update(p1, reason="reminded")
    theirs = [] if owner.shared else ["p3"]
    assert ids(owner.in_states(["pending"])) == ["p1", "p2", *theirs]
    assert ids(owner.in_states(["pending", "approved"])) == ["p1", "a1", "p2", *theirs]
    assert owner.in_states([]) == [] and owner.in_states(["failed"]) == []
    assert ids(open_store().in_states(["pending"])) == ["p1", "p2", "p3"]


def test_unsynced_lists_unwritten_results_in_order_and_an_owner_only_its_host(
    open_store: OpenStore,
) -> None:
    """Results to write again after a crash, oldest first; written ones drop out; an
    owner's store lists only its host's."""
    owner, beta = open_store(owner=True), open_store(host="beta")
    add(owner, row("alpha.sb", "r1"), row("alpha.sb", "r2"), row("alpha.sb", "r3"))
    add(beta, row("beta.sb", "b1"))
    with owner.transaction():
        owner.mark_synced([("alpha.sb", "r2", "pending"), ("alpha.sb", "r9", "pending")])
    theirs = [] if owner.shared else ["b1"]
    assert ids(owner.unsynced()) == ["r1", "r3", *theirs]
    assert ids(open_store().unsynced()) == ["r1", "r3", "b1"]
    owner.mark_synced([("alpha.sb", "r1", "pending"), ("alpha.sb", "r3", "pending")])
    assert ids(owner.unsynced()) == theirs


def test_counts_waiting_and_answered_ids_per_sandbox(store: Store) -> None:
    """Per sandbox: how many wait for people, how many are in each state, and which have
    a result file (pending or terminal), oldest first."""
    add(
        store,
        row("sb", "w1"),
        row("sb", "in", "received"),
        row("sb", "ok", "applied"),
        row("sb", "w2"),
        row("sb", "no", "denied"),
        row("sb", "go", "approved"),
        row("other", "w3"),
    )
    assert store.count_waiting("sb") == 2 and store.count_waiting("nobody") == 0
    assert store.counts("sb") == {
        "pending": 2,
        "received": 1,
        "applied": 1,
        "denied": 1,
        "approved": 1,
    }
    assert store.counts("nobody") == {}
    assert store.answered_ids("sb") == ["w1", "ok", "w2", "no"]
    assert store.answered_ids("other") == ["w3"]


def test_recent_and_search_list_newest_first(store: Store) -> None:
    """The inbox's lists: newest first, at most `limit`, every filter given applied."""
    add(
        store,
        row("sb", "r1", effect="files.write"),
        row("sb", "r2", "applied", effect="email.send"),
        row("other", "r3", effect="files.write"),
        row("sb", "r4", "denied", effect="files.write"),
        row("sb", "r5", effect="files.write"),
    )
    assert ids(store.recent()) == ["r5", "r4", "r3", "r2", "r1"]
    assert ids(store.recent(2)) == ["r5", "r4"]
    assert ids(store.search()) == ["r5", "r4", "r3", "r2", "r1"]
    assert ids(store.search(effect="files.write")) == ["r5", "r4", "r3", "r1"]
    assert ids(store.search(effect="files.write", sandbox="sb")) == ["r5", "r4", "r1"]
    assert ids(store.search(sandbox="sb", states=["pending", "applied"])) == ["r5", "r2", "r1"]
    assert ids(store.search(effect="files.write", limit=2)) == ["r5", "r4"]
    assert store.search(states=[]) == [] and store.search(effect="s3.put") == []


def test_all_and_decisions_come_back_in_the_order_written(store: Store) -> None:
    """Every request and every decision, each in the order written, contents intact."""
    r1, _ = add(store, row("sb", "r1"), row("sb", "r2"))
    store.update(r1, state="approved")
    made = [
        decision("r1", "alice"),
        decision("r2", "bob", "deny"),
        decision("r1", "carol"),
        decision("r2", "dave"),
    ]
    for d in made:
        store.add_decision(d)
    assert [(r.id, r.state) for r in store.all()] == [("r1", "approved"), ("r2", "pending")]
    assert store.all_decisions() == made
    assert store.decisions("sb", "r1") == [made[0], made[2]]
    assert store.decisions("sb", "r2") == [made[1], made[3]]
    assert store.decisions("sb", "none") == []


def test_change_mark_grows_with_each_committed_change_only(store: Store) -> None:
    """The inbox polls this mark: a committed change moves it, a rolled-back one not."""
    before = store.change_mark()
    with store.transaction():
        store.insert(row("sb", "r1"))
        store.queue_audit({"event": "received", "id": "r1"})
    moved = store.change_mark()
    assert moved > before
    with pytest.raises(RuntimeError), store.transaction():
        store.insert(row("sb", "r2"))
        store.queue_audit({"event": "received", "id": "r2"})
        raise RuntimeError("rolled back")
    assert store.change_mark() == moved
    with store.transaction():
        store.queue_audit({"event": "decided", "id": "r1"})
    assert store.change_mark() > moved


def test_prefetched_rows_read_as_get_reads_them(store: Store) -> None:
    """Rows read ahead in a transaction are what `get` returns, a row the transaction
    then writes is read back as written, and a missing one is missing until inserted."""
    r1, r2 = add(store, row("sb", "r1"), row("sb", "r2"))
    with store.transaction():
        store.prefetch([("sb", "r1"), ("sb", "r2"), ("sb", "new"), ("sb", "r1")])
        assert (store.get("sb", "r1"), store.get("sb", "r2")) == (r1, r2)
        assert store.get("sb", "new") is None
        store.update(r1, state="approved", decided_by="alice")
        got = store.get("sb", "r1")
        assert got is not None and (got.state, got.decided_by) == ("approved", "alice")
        store.insert(row("sb", "new"))
        assert store.get("sb", "new") is not None
    assert [(r.id, r.state) for r in store.all()] == [
        ("r1", "approved"),
        ("r2", "pending"),
        ("new", "pending"),
    ]


def test_a_careful_savepoint_holds_a_failed_write(store: Store) -> None:
    """Within `careful`, a write that fails (a duplicate id) fails its savepoint alone:
    the writes around it commit."""
    add(store, row("sb", "dup"))
    with store.transaction(), store.careful():
        store.insert(row("sb", "kept"))
        with pytest.raises(LedgerError), store.savepoint():
            store.insert(row("sb", "dup", "applied"))
        store.insert(row("sb", "after"))
    assert [(r.id, r.state) for r in store.all()] == [
        ("dup", "pending"),
        ("kept", "pending"),
        ("after", "pending"),
    ]
    assert store.ping() is True


def test_controls_count_each_change_and_number_keys_as_numbers(store: Store) -> None:
    """Each set or removal moves the generation once; the next key follows the largest
    number (10 after 9), not the last in text order."""
    assert store.policy_generation() == 0 and store.controls("rule") == {}
    with store.transaction():
        assert store.next_control_key("rule") == "1"
        for key in ("1", "2", "9", "10"):
            store.put_control("rule", key, {"n": key})
        store.put_control("switch", "s3.*", {"by": "alice"})
    store.put_control("rule", "2", {"n": "two"})
    store.put_control("rule", "9", None)
    assert store.policy_generation() == 7
    assert store.next_control_key("rule") == "11"
    assert store.controls("rule") == {"1": {"n": "1"}, "2": {"n": "two"}, "10": {"n": "10"}}
    assert list(store.controls("rule")) == ["1", "10", "2"]  # by key, as text
    assert store.controls("switch") == {"s3.*": {"by": "alice"}}


def test_history_is_what_reached_the_policy_oldest_first(store: Store) -> None:
    """What quotas count: a sandbox's requests in arrival order, without invalid ones or
    replays."""
    first, *_ = add(
        store,
        row("sb", "h1", "applied"),
        row("sb", "bad", "invalid"),
        row("sb", "h2"),
        row("sb", "again", "applied", replay_of="h1"),
        row("other", "o1", "applied"),
        row("sb", "h3", "denied"),
    )
    store.update(first, reason="applied late")
    assert ids(store.history("sb")) == ["h1", "h2", "h3"]


def test_audit_chains_and_lines_per_host(open_store: OpenStore) -> None:
    """A shared store holds each host's chain, in order, with its head; the embedded one
    holds none (its events wait in the queue for the local log)."""
    alpha, beta = open_store(), open_store(host="beta")
    for store, name in ((alpha, "a"), (beta, "b")):
        with store.transaction():
            store.queue_audit({"event": f"{name}1"})
            store.queue_audit({"event": f"{name}2"})
    if not alpha.shared:
        assert alpha.audit_chains() == {} and list(alpha.audit_lines()) == []
        assert [e["event"] for _, e in alpha.audit_backlog()] == ["a1", "a2", "b1", "b2"]
        return
    chains = alpha.audit_chains()
    assert sorted(chains) == ["alpha", "beta"] and chains["alpha"] == alpha.audit_head()
    assert (chains["alpha"][0], chains["beta"][0]) == (2, 2)
    assert [json.loads(line)["event"] for line in alpha.audit_lines("beta")] == ["b1", "b2"]
    assert [json.loads(line)["event"] for line in beta.audit_lines()] == ["a1", "a2", "b1", "b2"]
    assert alpha.audit_backlog() == []  # chained at commit: nothing waits
    alpha.drop_audit(2, chains["alpha"][1])
    assert len(list(alpha.audit_lines())) == 4


def test_a_hosts_lease_is_held_once_and_its_broker_is_told_of_others_changes(
    open_store: OpenStore,
) -> None:
    """A shared store: a second broker for a host id is refused while the first holds
    its lease, and takes it once released; the owner hears of another host's change to
    its request. The embedded store has neither."""
    owner, beta = open_store(owner=True), open_store(host="beta")
    heard = threading.Event()
    if not owner.shared:
        assert owner.lease("state") is None and owner.listen(heard.set) is None
        return
    first, second = owner.lease("state-1"), open_store(owner=True).lease("state-2")
    assert first is not None and second is not None
    first.acquire("broker serve")
    with pytest.raises(StateBusy):
        second.acquire("broker serve")
    first.release()
    second.acquire("broker serve")
    second.release()
    (pending,) = add(owner, row("alpha.sb", "p1"))
    listener = owner.listen(heard.set)
    assert listener is not None
    try:
        beta.update(pending, state="approved", decided_by="bob")
        assert heard.wait(30)
    finally:
        listener.close()


def test_find_takes_a_unique_prefix_and_names_the_candidates_of_an_ambiguous_one(
    store: Store,
) -> None:
    """`e4b6d00f` names the one request whose id begins so; a prefix two ids share is
    refused with both refs; a prefix under four characters is never a guess."""
    add(store, row("a", "e4b6d00f-1111"), row("b", "e4b6d00f-2222"), row("a", "9c01aa"))
    assert store.find("e4b6d00f-2").key == ("b", "e4b6d00f-2222")
    assert store.find("a/e4b6").key == ("a", "e4b6d00f-1111")
    assert store.find("9c01").key == ("a", "9c01aa")
    with pytest.raises(AmbiguousRequest) as ambiguous:
        store.find("e4b6d00f")
    assert "a/e4b6d00f-1111" in str(ambiguous.value) and "b/e4b6d00f-2222" in str(ambiguous.value)
    with pytest.raises(RequestNotFound):
        store.find("9c0")
