"""The embedded store: one row per request, every change a committed transaction.

SQLite in WAL mode with synchronous=FULL under the state dir. The ledger is the
durability point: a result file or an audit line is written only after the state it
shows is committed, and both are rebuilt from here after a crash. Audit events are
queued in the same transaction as the change they describe, then appended to the
log; so no commit can lose its audit line.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from broker import codec
from broker.errors import AmbiguousRequest, LedgerError, RequestNotFound
from broker.models import Decision, Record
from broker.store.base import (
    ANSWERED_SQL,
    IN_FLIGHT,
    JSON_COLUMNS,
    TERMINAL_SQL,
    WAITING,
    AuditSink,
    Lease,
    Listener,
    record_from,
    record_values,
)
from broker.store.sqlite_schema import SCHEMA, migrate

__all__ = ["IN_FLIGHT", "SCHEMA", "WAITING", "Decision", "Ledger", "Record", "SQLiteStore"]


def _row_to_record(row: sqlite3.Row) -> Record:
    return record_from(dict(row))


def _dump(value: Any) -> Any:
    return codec.dumps(value)


class SQLiteStore:
    """SQLite ledger. One connection per Ledger; use one Ledger per thread."""

    shared = False
    host: str | None = None

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            self._db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(SCHEMA)
            migrate(self._db)
        except sqlite3.Error as exc:
            raise LedgerError(f"{path}: cannot open the ledger: {exc}") from exc
        self._lock = threading.RLock()
        self._depth = 0
        self._audit_rows: list[tuple[str]] = []  # queued in this transaction

    def close(self) -> None:
        self._db.close()

    def ping(self) -> bool:
        return True

    def careful(self) -> AbstractContextManager[None]:
        return nullcontext()  # every statement runs at once already

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One committed unit; nested uses join the outer one."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise LedgerError(f"{self.path}: cannot start a transaction: {exc}") from exc
            self._depth = 1
            try:
                yield
            except BaseException:
                self._depth = 0
                self._rollback()
                raise
            self._depth = 0
            try:
                self._write_audit()
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise LedgerError(f"{self.path}: cannot commit: {exc}") from exc

    def _rollback(self) -> None:
        """Undo the open transaction, if SQLite has not already (it has, on a full disk)."""
        self._audit_rows.clear()
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A part of the current transaction that can fail alone."""
        self._exec("SAVEPOINT one")
        queued = len(self._audit_rows)
        try:
            yield
        except BaseException:
            del self._audit_rows[queued:]
            self._exec("ROLLBACK TO one")
            self._exec("RELEASE one")
            raise
        self._exec("RELEASE one")

    def _exec(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger: {exc}") from exc

    # -- requests ---------------------------------------------------------------

    def insert(self, record: Record) -> Record:
        data = record_values(record)
        cols = ", ".join(data)
        marks = ", ".join("?" for _ in data)
        cur = self._exec(f"INSERT INTO requests ({cols}) VALUES ({marks})", list(data.values()))
        return record.evolve(seq=cur.lastrowid)

    def update(self, record: Record, **changes: Any) -> Record:
        """Write `changes` to the row and return the new record; unsynces its result."""
        new = record.evolve(**changes)
        values = []
        for key in changes:
            value = changes[key]
            values.append(_dump(value) if key in JSON_COLUMNS and value is not None else value)
        sets = ", ".join(f"{k} = ?" for k in changes)
        self._exec(
            f"UPDATE requests SET {sets}, synced = 0 WHERE sandbox = ? AND id = ?",
            [*values, record.sandbox, record.id],
        )
        return new

    def prefetch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Nothing to save: SQLite reads are in-process."""

    def get(self, sandbox: str, request_id: str) -> Record | None:
        row = self._exec(
            "SELECT * FROM requests WHERE sandbox = ? AND id = ?", (sandbox, request_id)
        ).fetchone()
        return _row_to_record(row) if row else None

    def find(self, ref: str) -> Record:
        """A request by `ID` (unambiguous across sandboxes) or `SANDBOX/ID`."""
        if "/" in ref:
            sandbox, _, request_id = ref.partition("/")
            record = self.get(sandbox, request_id)
            if record is None:
                raise RequestNotFound(f"no request {request_id!r} in sandbox {sandbox!r}")
            return record
        rows = self._exec("SELECT * FROM requests WHERE id = ?", (ref,)).fetchall()
        if not rows:
            raise RequestNotFound(f"no request with id {ref!r}")
        if len(rows) > 1:
            where = ", ".join(f"{r['sandbox']}/{ref}" for r in rows)
            raise AmbiguousRequest(f"id {ref!r} exists in several sandboxes: use one of {where}")
        return _row_to_record(rows[0])

    def by_idempotency_key(self, sandbox: str, key: str) -> Record | None:
        row = self._exec(
            "SELECT * FROM requests WHERE sandbox = ? AND idempotency_key = ? "
            "AND replay_of IS NULL ORDER BY state = 'staged', seq LIMIT 1",  # a real first wins
            (sandbox, key),
        ).fetchone()
        return _row_to_record(row) if row else None

    def replays_of(self, record: Record) -> list[Record]:
        rows = self._exec(
            "SELECT * FROM requests WHERE sandbox = ? AND replay_of = ? "
            f"AND state NOT IN {TERMINAL_SQL}",
            (record.sandbox, record.id),
        ).fetchall()
        return [_row_to_record(r) for r in rows]

    def in_states(self, states: Iterable[str]) -> list[Record]:
        wanted = list(states)
        marks = ", ".join("?" for _ in wanted)
        rows = self._exec(
            f"SELECT * FROM requests WHERE state IN ({marks}) ORDER BY seq", wanted
        ).fetchall()
        return [_row_to_record(r) for r in rows]

    def count_waiting(self, sandbox: str) -> int:
        row = self._exec(
            "SELECT COUNT(*) FROM requests WHERE sandbox = ? AND state = 'pending'", (sandbox,)
        ).fetchone()
        return int(row[0])

    def answered_ids(self, sandbox: str) -> list[str]:
        """Ids of a sandbox's requests that have a result file to show."""
        rows = self._exec(
            f"SELECT id FROM requests WHERE sandbox = ? AND state IN {ANSWERED_SQL}",
            (sandbox,),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def counts(self, sandbox: str) -> dict[str, int]:
        """Requests of one sandbox by state."""
        rows = self._exec(
            "SELECT state, COUNT(*) FROM requests WHERE sandbox = ? GROUP BY state", (sandbox,)
        ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def recent(self, limit: int = 50) -> list[Record]:
        rows = self._exec("SELECT * FROM requests ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
        return [_row_to_record(r) for r in rows]

    def search(
        self,
        *,
        effect: str | None = None,
        sandbox: str | None = None,
        states: Iterable[str] | None = None,
        limit: int = 50,
    ) -> list[Record]:
        """The newest requests matching every filter given (read-only; the web inbox)."""
        where: list[str] = []
        args: list[Any] = []
        if effect is not None:
            where.append("effect = ?")
            args.append(effect)
        if sandbox is not None:
            where.append("sandbox = ?")
            args.append(sandbox)
        if states is not None:
            wanted = list(states)
            where.append(f"state IN ({', '.join('?' for _ in wanted)})")
            args.extend(wanted)
        sql = "SELECT * FROM requests"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._exec(f"{sql} ORDER BY seq DESC LIMIT ?", [*args, limit]).fetchall()
        return [_row_to_record(r) for r in rows]

    def change_mark(self) -> int:
        """A number that grows with every committed change (each queues an audit event)."""
        row = self._exec("SELECT seq FROM sqlite_sequence WHERE name = 'audit_queue'").fetchone()
        return int(row[0]) if row else 0

    def all(self) -> list[Record]:
        return [_row_to_record(r) for r in self._exec("SELECT * FROM requests ORDER BY seq")]

    def unsynced(self) -> list[Record]:
        rows = self._exec("SELECT * FROM requests WHERE synced = 0 ORDER BY seq").fetchall()
        return [_row_to_record(r) for r in rows]

    def mark_synced(self, written: Iterable[tuple[str, str, str]]) -> None:
        """Note results written as (sandbox, id, state); a newer state stays unsynced."""
        self._db.executemany(
            "UPDATE requests SET synced = 1 WHERE sandbox = ? AND id = ? AND state = ?",
            list(written),
        )

    # -- decisions --------------------------------------------------------------

    def add_decision(self, decision: Decision) -> None:
        self._exec(
            "INSERT INTO decisions (sandbox, id, approver, verdict, reason, surface, sha256, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                decision.sandbox,
                decision.id,
                decision.approver,
                decision.verdict,
                decision.reason,
                decision.surface,
                decision.sha256,
                decision.at,
            ),
        )

    def decisions(self, sandbox: str, request_id: str) -> list[Decision]:
        rows = self._exec(
            "SELECT sandbox, id, approver, verdict, reason, surface, sha256, at FROM decisions "
            "WHERE sandbox = ? AND id = ? ORDER BY seq",
            (sandbox, request_id),
        ).fetchall()
        return [Decision(*tuple(r)) for r in rows]

    def all_decisions(self) -> list[Decision]:
        rows = self._exec(
            "SELECT sandbox, id, approver, verdict, reason, surface, sha256, at FROM decisions "
            "ORDER BY seq"
        ).fetchall()
        return [Decision(*tuple(r)) for r in rows]

    # -- the audit queue --------------------------------------------------------

    def queue_audit(self, event: dict[str, Any]) -> None:
        """Queue an event for the log, in the current transaction (written in one
        statement when it commits)."""
        row = (_dump(event),)
        if self._depth:
            self._audit_rows.append(row)
        else:
            self._exec("INSERT INTO audit_queue (event) VALUES (?)", row)

    def _write_audit(self) -> None:
        if self._audit_rows:
            self._db.executemany("INSERT INTO audit_queue (event) VALUES (?)", self._audit_rows)
            self._audit_rows.clear()

    def audit_backlog(self, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        rows = self._exec(
            "SELECT seq, event FROM audit_queue WHERE seq > ? ORDER BY seq", (after,)
        ).fetchall()
        return [(int(r[0]), codec.loads(r[1])) for r in rows]

    def drop_audit(self, upto: int, head: str) -> None:
        """Forget events the log holds, and remember the log's head for `verify`."""
        self._exec("DELETE FROM audit_queue WHERE seq <= ?", (upto,))
        known = self.audit_head()
        if known is None or known[0] < upto:
            self._exec(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('audit_head', ?)",
                (_dump([upto, head]),),
            )

    def audit_head(self) -> tuple[int, str] | None:
        row = self._exec("SELECT value FROM meta WHERE key = 'audit_head'").fetchone()
        if row is None:
            return None
        seq, head = codec.loads(row[0])
        return int(seq), str(head)

    def audit_sink(self, log: Any, checkpoints: Any = None, clock: Any = None) -> AuditSink:
        from broker.audit.log import AuditWriter
        from broker.clock import REAL

        return AuditWriter(self, log, checkpoints=checkpoints, clock=clock or REAL)

    # -- controls -------------------------------------------------------------------

    def controls(self, kind: str) -> dict[str, dict[str, Any]]:
        rows = self._exec("SELECT key, value FROM controls WHERE kind = ?", (kind,)).fetchall()
        return {str(r[0]): codec.loads(r[1]) for r in rows}

    def put_control(self, kind: str, key: str, value: Mapping[str, Any] | None) -> None:
        with self.transaction():
            if value is None:
                self._exec("DELETE FROM controls WHERE kind = ? AND key = ?", (kind, key))
            else:
                self._exec(
                    "INSERT OR REPLACE INTO controls (kind, key, value) VALUES (?, ?, ?)",
                    (kind, key, _dump(dict(value))),
                )
            self._exec(
                "INSERT INTO meta (key, value) VALUES ('policy_generation', '1') "
                "ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1"
            )

    def next_control_key(self, kind: str) -> str:
        row = self._exec(
            "SELECT MAX(CAST(key AS INTEGER)) FROM controls WHERE kind = ?", (kind,)
        ).fetchone()
        return str((row[0] or 0) + 1)

    def policy_generation(self) -> int:
        row = self._exec("SELECT value FROM meta WHERE key = 'policy_generation'").fetchone()
        return int(row[0]) if row else 0

    def history(self, sandbox: str) -> list[Record]:
        rows = self._exec(
            "SELECT * FROM requests WHERE sandbox = ? AND replay_of IS NULL "
            "AND state != 'invalid' ORDER BY seq",
            (sandbox,),
        ).fetchall()
        return [_row_to_record(r) for r in rows]

    # -- the fleet: nothing to share ---------------------------------------------

    def lease(self, state_dir_key: str) -> Lease | None:
        return None

    def listen(self, on_change: Callable[[], None]) -> Listener | None:
        return None

    def audit_chains(self) -> dict[str, tuple[int, str]]:
        return {}

    def audit_lines(self, host: str | None = None) -> Iterator[str]:
        return iter(())


Ledger = SQLiteStore
"""The name the embedded store has always had."""
