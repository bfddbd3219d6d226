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
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from broker import codec
from broker.errors import LedgerError
from broker.models import Decision, Record
from broker.store import queries
from broker.store.base import IN_FLIGHT, WAITING, AuditSink, Lease, Listener
from broker.store.operations import SqlOperations
from broker.store.sqlite_schema import SCHEMA, migrate

__all__ = ["IN_FLIGHT", "SCHEMA", "WAITING", "Decision", "Ledger", "Record", "SQLiteStore"]


class SQLiteStore(SqlOperations):
    """SQLite ledger. One connection per Ledger; use one Ledger per thread. Its queries
    are the shared ones (operations.py); here are its connection, its transactions and
    its audit queue."""

    shared = False
    dialect = queries.SQLITE
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

    # -- what the shared operations ask of a back end (operations.py) -------------------

    def _fetch(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return [dict(r) for r in self._exec(sql, args).fetchall()]

    def _write(self, sql: str, args: Sequence[Any] = ()) -> None:
        self._exec(sql, args)

    def _insert_row(self, record: Record, data: dict[str, Any]) -> int:
        cur = self._exec(self.dialect.sql(queries.insert(data)), list(data.values()))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def prefetch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Nothing to save: SQLite reads are in-process."""

    def change_mark(self) -> int:
        """A number that grows with every committed change (each queues an audit event)."""
        row = self._exec("SELECT seq FROM sqlite_sequence WHERE name = 'audit_queue'").fetchone()
        return int(row[0]) if row else 0

    # -- the audit queue --------------------------------------------------------

    def queue_audit(self, event: dict[str, Any]) -> None:
        """Queue an event for the log, in the current transaction (written in one
        statement when it commits)."""
        row = (codec.dumps(event),)
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
                (codec.dumps([upto, head]),),
            )

    def audit_head(self) -> tuple[int, str] | None:
        row = self._exec("SELECT value FROM meta WHERE key = 'audit_head'").fetchone()
        if row is None:
            return None
        seq, head = codec.loads(row[0])
        return int(seq), str(head)

    def audit_keyed_from(self) -> tuple[int, str] | None:
        row = self._exec("SELECT value FROM meta WHERE key = 'audit_keyed_from'").fetchone()
        if row is None:
            return None
        seq, mac = codec.loads(row[0])
        return int(seq), str(mac)

    def mark_audit_keyed(self, seq: int, mac: str) -> None:
        self._exec(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('audit_keyed_from', ?)",
            (codec.dumps([seq, mac]),),
        )

    def audit_sink(self, log: Any, checkpoints: Any = None, clock: Any = None) -> AuditSink:
        from broker.audit.log import AuditWriter
        from broker.clock import REAL

        return AuditWriter(self, log, checkpoints=checkpoints, clock=clock or REAL)

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
