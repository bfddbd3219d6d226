"""The store on its own, on both back ends (SQLite and PostgreSQL): transactions,
savepoints, lookups, the synced flag, the audit events; and SQLite ledgers written by
an earlier release."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from broker.audit.log import AuditLog
from broker.audit.verify import verify
from broker.errors import AmbiguousRequest, RequestNotFound
from broker.models import Record
from broker.store.base import Store
from broker.store.sqlite import Ledger
from tests.stores import chained_events


def row(sandbox: str, rid: str, state: str = "pending", **extra: object) -> Record:
    return Record(sandbox, rid, rid, state, "2026-12-01T00:00:00.000Z", **extra)  # type: ignore[arg-type]


@pytest.fixture
def ledger(store: Store) -> Store:
    return store


def test_a_failed_transaction_leaves_nothing(ledger: Store) -> None:
    """An exception inside a transaction rolls every write of it back."""
    with pytest.raises(RuntimeError), ledger.transaction():
        ledger.insert(row("sb", "r1"))
        raise RuntimeError("boom")
    assert ledger.get("sb", "r1") is None


def test_a_savepoint_fails_alone(ledger: Store) -> None:
    """A failing part of a transaction is undone; the rest commits."""
    with ledger.transaction():
        ledger.insert(row("sb", "kept"))
        with pytest.raises(ValueError), ledger.savepoint():
            ledger.insert(row("sb", "dropped"))
            raise ValueError("one request's bug")
    assert ledger.get("sb", "kept") is not None and ledger.get("sb", "dropped") is None


def test_find_by_id_or_sandbox_and_id(ledger: Store) -> None:
    """An id in one sandbox is found alone; in two it must be named SANDBOX/ID."""
    with ledger.transaction():
        ledger.insert(row("a", "same"))
        ledger.insert(row("b", "same"))
        ledger.insert(row("a", "only"))
    assert ledger.find("only").sandbox == "a"
    assert ledger.find("b/same").sandbox == "b"
    with pytest.raises(AmbiguousRequest, match="a/same, b/same"):
        ledger.find("same")
    with pytest.raises(RequestNotFound):
        ledger.find("c/same")


def test_json_columns_and_flags_read_back(ledger: Store) -> None:
    """Outputs, verdicts, previews, what handlers remembered and flags survive a round trip."""
    record = row(
        "sb",
        "r1",
        "applied",
        output={"n": [1, "é"]},
        verdict={"action": "auto"},
        seen={"etag": "x"},
        reversible=False,
        errors=[{"path": "/p", "code": "c", "message": "m"}],
    )
    with ledger.transaction():
        ledger.insert(record)
    again = ledger.get("sb", "r1")
    assert again is not None
    assert (again.output, again.seen, again.reversible) == ({"n": [1, "é"]}, {"etag": "x"}, False)
    assert again.errors == record.errors and again.seq is not None


def test_a_result_marked_synced_for_an_older_state_stays_unsynced(ledger: Store) -> None:
    """mark_synced names the state written: a row that moved on meanwhile is written again."""
    with ledger.transaction():
        record = ledger.insert(row("sb", "r1", "pending"))
        ledger.update(record, state="approved")
        ledger.mark_synced([("sb", "r1", "pending")])
    assert [r.id for r in ledger.unsynced()] == ["r1"]
    with ledger.transaction():
        ledger.mark_synced([("sb", "r1", "approved")])
    assert ledger.unsynced() == []


def test_audit_events_reach_the_log_once_in_order(ledger: Store, tmp_path: Path) -> None:
    """Events of a committed transaction reach the log in order, once each; those of a
    rolled-back one never do."""
    with ledger.transaction():
        ledger.queue_audit({"event": "a"})
        ledger.queue_audit({"event": "b"})
    with pytest.raises(RuntimeError), ledger.transaction():
        ledger.queue_audit({"event": "lost"})
        raise RuntimeError("rolled back")
    with ledger.transaction():
        ledger.queue_audit({"event": "c"})
    assert [e["event"] for e in chained_events(ledger)] == ["a", "b", "c"]
    log = AuditLog(tmp_path / "audit.jsonl")
    for _ in range(2):  # a second flush adds nothing
        sink = ledger.audit_sink(log)
        sink.flush()
        sink.sync()
        durable = sink.take_durable()
        if durable is not None:
            with ledger.transaction():
                ledger.drop_audit(*durable)
        log = AuditLog(log.path)
    lines = log.path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["a", "b", "c"]
    assert verify(log.path, ledger.audit_head()) == (3, None)


def test_sqlite_queue_keeps_events_until_the_log_holds_them(tmp_path: Path) -> None:
    """Queued events are read back in order; dropping them records the log's head."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    with ledger.transaction():
        ledger.queue_audit({"event": "a"})
        ledger.queue_audit({"event": "b"})
    backlog = ledger.audit_backlog()
    assert [e["event"] for _, e in backlog] == ["a", "b"]
    with ledger.transaction():
        ledger.drop_audit(backlog[0][0], "h1")
    assert [e["event"] for _, e in ledger.audit_backlog()] == ["b"]
    assert ledger.audit_head() == (backlog[0][0], "h1")
    ledger.close()


def test_a_ledger_from_before_the_seen_column_is_upgraded(tmp_path: Path) -> None:
    """Opening a ledger made without the `seen` column adds it; its rows stay readable."""
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE requests (seq INTEGER PRIMARY KEY AUTOINCREMENT, sandbox TEXT NOT NULL, "
        "id TEXT NOT NULL, name TEXT NOT NULL, effect TEXT, payload TEXT, sha256 TEXT, "
        "idempotency_key TEXT, state TEXT NOT NULL, reason TEXT, errors TEXT, output TEXT, "
        "verdict TEXT, preview TEXT, reversible INTEGER, decided_by TEXT, replay_of TEXT, "
        "received_at TEXT NOT NULL, decided_at TEXT, completed_at TEXT, expires_at TEXT, "
        "on_timeout TEXT, synced INTEGER NOT NULL DEFAULT 0, UNIQUE (sandbox, id))"
    )
    db.execute(
        "INSERT INTO requests (sandbox, id, name, state, received_at) "
        "VALUES ('sb', 'old', 'old', 'applied', 't')"
    )
    db.commit()
    db.close()
    ledger = Ledger(path)
    try:
        old = ledger.get("sb", "old")
        assert old is not None and old.state == "applied" and old.seen is None
        with ledger.transaction():
            ledger.insert(row("sb", "new", seen={"k": 1}))
        assert (ledger.get("sb", "new") or row("", "")).seen == {"k": 1}
    finally:
        ledger.close()


def test_text_with_a_nul_character_is_kept(ledger: Store) -> None:
    """A reason holding NUL (a service's reply) is written, not a failed commit; on
    PostgreSQL, whose text cannot hold it, U+FFFD stands in its place."""
    with ledger.transaction():
        record = ledger.insert(row("sb", "nul", "applying"))
        ledger.update(record, state="failed", reason="failed: the service said \x00oops")
    again = ledger.get("sb", "nul")
    assert again is not None and again.state == "failed"
    assert again.reason in (
        "failed: the service said \x00oops",
        "failed: the service said \ufffdoops",
    )


def test_an_idempotency_key_finds_a_real_first_request_before_a_staged_one(
    ledger: Store,
) -> None:
    """A staged request applied nothing: the key's first is the earliest request that was
    not staged, and a staged one only when no other has the key."""
    with ledger.transaction():
        ledger.insert(row("sb", "s1", "staged", idempotency_key="k"))
    found = ledger.by_idempotency_key("sb", "k")
    assert found is not None and found.id == "s1"
    with ledger.transaction():
        ledger.insert(row("sb", "r1", "applied", idempotency_key="k"))
        ledger.insert(row("sb", "r2", "applied", idempotency_key="k", replay_of="r1"))
    found = ledger.by_idempotency_key("sb", "k")
    assert found is not None and found.id == "r1"
    assert ledger.by_idempotency_key("other", "k") is None
