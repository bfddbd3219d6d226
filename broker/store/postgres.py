"""The shared store: PostgreSQL through psycopg 3 and its pool, for a fleet of brokers.

Same contract as the SQLite ledger (base.py), with what sharing needs:

- Sandbox ids are `HOST.SANDBOX`; each row also names its host, and a broker's store
  (`owner`) lists only its host's rows for recovery and answers.
- Reads of a request inside a transaction take its row lock (`SELECT … FOR UPDATE`):
  a decision from another host and the owner's expiry of the same request queue up,
  and the second sees what the first committed (READ COMMITTED re-reads the row).
- Audit events are chained at commit, per host, under that host's head row lock
  (`audit_heads … FOR UPDATE`, the last lock a transaction takes): each host's chain
  is in commit order, and an event is in the chain exactly when its change committed.
- A change to another host's request NOTIFYs that host (delivered at commit), so its
  broker applies a decision at once (listen.py).
- A broker's commit checks its lease (leases.py) first: a broker that lost its host id
  to another commits nothing more.

Round trips are what a wake-up on PostgreSQL costs, so: the rows a wake-up will touch
are read (and locked) in one statement (`prefetch`); a savepoint is sent with the
statement after it, and one that saw no statement is never sent.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from broker import codec
from broker.errors import AmbiguousRequest, LeaseLost, LedgerError, RequestNotFound
from broker.fleet import host_of
from broker.models import Decision, Record
from broker.store import pg_schema
from broker.store.base import (
    ANSWERED_SQL,
    JSON_COLUMNS,
    TERMINAL_SQL,
    AuditSink,
    Chain,
    Lease,
    Listener,
    record_from,
    record_values,
)
from broker.store.pg_schema import CHANNEL, error

GENESIS = "0" * 64
CONNECT_TIMEOUT_S = 5.0
_pools: dict[tuple[str, str | None], ConnectionPool[psycopg.Connection[Any]]] = {}
_pools_lock = threading.Lock()
_DECISION_COLS = "sandbox, id, approver, verdict, reason, surface, sha256, at"
# the pool retries its connections in the background and logs each failure; while the
# server is away the broker says so itself, once a minute (outage.py)
logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)


def pool(url: str, password: str | None) -> ConnectionPool[psycopg.Connection[Any]]:
    """The process's pool for `url`, opened (and the schema made) on first use."""
    key = (url, password)
    with _pools_lock:
        found = _pools.get(key)
        if found is not None:
            return found
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": int(CONNECT_TIMEOUT_S)}
        if password is not None:
            kwargs["password"] = password
        try:  # first alone: a server that is not there is one clear line at once
            with psycopg.connect(url, **kwargs) as conn:
                pg_schema.ensure(conn)
        except psycopg.Error as exc:
            raise error(f"ledger {url}", exc) from exc
        made: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url, kwargs=kwargs, min_size=1, max_size=16, open=False, name="broker"
        )
        try:
            made.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout as exc:
            made.close()
            raise _unreachable(url, password) from exc
        _pools[key] = made
        return made


def _unreachable(url: str, password: str | None) -> LedgerError:
    """Why the first connection failed, in one line (the pool only says it timed out)."""
    try:
        psycopg.connect(url, password=password, connect_timeout=int(CONNECT_TIMEOUT_S)).close()
    except psycopg.Error as exc:
        return error(f"ledger {url}", exc)
    return error(f"ledger {url}", psycopg.OperationalError("no connection within 5 s"))


class PostgresStore:
    """One thread's view of the shared store: a connection borrowed from the pool per
    transaction (or per read outside one)."""

    shared = True

    def __init__(
        self, url: str, *, password: str | None, host: str, owner: bool, chain: Chain
    ) -> None:
        self.url = url
        self.host: str | None = host
        self.owner = owner
        self._password = password
        self._pool = pool(url, password)
        self._chain = chain
        self._conn: psycopg.Connection[Any] | None = None
        self._depth = 0
        self._audit_rows: list[dict[str, Any]] = []
        self._touched: set[str] = set()  # hosts whose requests this transaction changed
        self._saved = 0
        self.fence: str | None = None  # the lease token a broker's commits must still hold
        self.committed_lines: list[tuple[int, str]] = []  # chained by this store, for the copy
        self._lines: list[tuple[int, str]] = []
        self._pending: list[str] = []  # savepoint statements to send with the next one
        self._cache: dict[tuple[str, str], Record | None] = {}  # prefetched, this transaction

    def close(self) -> None:
        """Nothing of its own to close: connections go back to the process's pool."""

    def ping(self) -> bool:
        try:
            self._exec("SELECT 1")
        except LedgerError:
            return False
        return True

    # -- connections and transactions ---------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        with self._borrowed() as conn:
            self._run(conn, "BEGIN")
            self._conn, self._depth = conn, 1
            try:
                yield
                self._depth = 0
                self._before_commit(conn)
                self._run(conn, "COMMIT")
            except BaseException:
                self._rollback(conn)
                raise
            finally:
                self._conn, self._depth = None, 0
                self._audit_rows.clear()
                self._touched.clear()
                self._pending.clear()
                self._cache.clear()
            self.committed_lines.extend(self._lines)

    @contextmanager
    def _borrowed(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            conn = self._pool.getconn(timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout as exc:
            raise _unreachable(self.url, self._password) from exc
        try:
            yield conn
        finally:
            self._pool.putconn(conn)  # a broken one is discarded, a new one made

    @staticmethod
    def _rollback(conn: psycopg.Connection[Any]) -> None:
        if not conn.broken:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                pass

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        self._saved += 1
        mark = f"SAVEPOINT s{self._saved}"
        queued, touched, cache = len(self._audit_rows), set(self._touched), dict(self._cache)
        self._pending.append(mark)
        try:
            yield
        except BaseException:
            del self._audit_rows[queued:]
            self._touched, self._cache = touched, cache
            if not self._unsent(mark):  # else nothing of it reached the server
                self._exec(f"ROLLBACK TO {mark}")
                self._exec(f"RELEASE {mark}")
            raise
        if not self._unsent(mark):
            self._pending.append(f"RELEASE {mark}")

    def _unsent(self, mark: str) -> bool:
        """Drop `mark` if it is still waiting to be sent (nothing ran since)."""
        if self._pending and self._pending[-1] == mark:
            self._pending.pop()
            return True
        return False

    def _before_commit(self, conn: psycopg.Connection[Any]) -> None:
        """The fence, the audit chain, the notifications: last in every transaction."""
        self._pending.clear()  # releases only: the commit releases every savepoint
        self._lines = []
        if self.fence is not None:
            row = self._run(
                conn,
                "SELECT 1 FROM brokers WHERE host = %s AND token = %s",
                (self.host, self.fence),
            ).fetchone()
            if row is None:
                raise LeaseLost(
                    f"host {self.host}: another broker holds this host's lease now; "
                    "this one stops serving"
                )
        for host in sorted(self._touched):
            self._run(conn, "SELECT pg_notify(%s, %s)", (CHANNEL, host))
        if self._audit_rows:
            self._lines = self._append_chain(conn)

    def _append_chain(self, conn: psycopg.Connection[Any]) -> list[tuple[int, str]]:
        self._run(
            conn,
            "INSERT INTO audit_heads (host, seq, hash) VALUES (%s, 0, %s) ON CONFLICT DO NOTHING",
            (self.host, GENESIS),
        )
        found = self._run(
            conn, "SELECT seq, hash FROM audit_heads WHERE host = %s FOR UPDATE", (self.host,)
        ).fetchone()
        assert found is not None  # made just above, and never removed
        seq, head = found
        events = [(seq + n, e) for n, e in enumerate(self._audit_rows, 1)]
        lines, head = self._chain(events, head)
        rows = [(s, line.decode("utf-8")) for (s, _), line in zip(events, lines, strict=True)]
        try:
            with conn.cursor().copy("COPY audit_lines (host, seq, line) FROM STDIN") as copy:
                for s, line in rows:
                    copy.write_row((self.host, s, line))
        except psycopg.Error as exc:
            raise error("ledger", exc) from exc
        self._run(
            conn,
            "UPDATE audit_heads SET seq = %s, hash = %s WHERE host = %s",
            (events[-1][0], head, self.host),
        )
        return rows

    def _run(
        self, conn: psycopg.Connection[Any], sql: str, args: Iterable[Any] = ()
    ) -> psycopg.Cursor[Any]:
        try:
            return conn.execute(sql, tuple(args))
        except psycopg.Error as exc:
            raise error("ledger", exc) from exc

    def _exec(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """Rows of one statement, in the open transaction or on a borrowed connection."""
        if self._conn is not None:
            return self._rows(self._conn, sql, args)
        with self._borrowed() as conn:
            return self._rows(conn, sql, args)

    def _rows(
        self, conn: psycopg.Connection[Any], sql: str, args: Iterable[Any]
    ) -> list[dict[str, Any]]:
        try:
            if not self._pending or conn is not self._conn:
                with conn.cursor(row_factory=dict_row) as cur:
                    cur.execute(sql, tuple(args))
                    return cur.fetchall() if cur.description else []
            # the savepoints waiting to be sent go first, in the same round trip
            prefix, self._pending = "; ".join(self._pending), []
            with psycopg.ClientCursor(conn, row_factory=dict_row) as client:
                client.execute(f"{prefix}; {sql}", tuple(args))
                while client.nextset():
                    pass
                return client.fetchall() if client.description else []
        except psycopg.Error as exc:
            raise error("ledger", exc) from exc

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        with self.transaction():
            assert self._conn is not None
            if self._pending:
                self._exec("SELECT 1")  # sends the savepoints first
            try:
                with self._conn.cursor() as cur:
                    cur.executemany(sql, rows)
            except psycopg.Error as exc:
                raise error("ledger", exc) from exc

    @property
    def _lock(self) -> str:
        """Reads inside a transaction lock the rows they return (see the module doc)."""
        return " FOR UPDATE" if self._conn is not None else ""

    def _touch(self, sandbox: str) -> None:
        host = host_of(sandbox)
        if host and not (self.owner and host == self.host):
            self._touched.add(host)

    # -- requests -------------------------------------------------------------------

    def insert(self, record: Record) -> Record:
        data = record_values(record)
        data["host"] = host_of(record.sandbox) or self.host
        cols = ", ".join(data)
        marks = ", ".join("%s" for _ in data)
        with self.transaction():
            rows = self._exec(
                f"INSERT INTO requests ({cols}) VALUES ({marks}) RETURNING seq", data.values()
            )
            self._touch(record.sandbox)
            self._cache.pop(record.key, None)
        return record.evolve(seq=int(rows[0]["seq"]))

    def update(self, record: Record, **changes: Any) -> Record:
        new = record.evolve(**changes)
        values = [
            codec.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in changes.items()
        ]
        sets = ", ".join(f"{k} = %s" for k in changes)
        with self.transaction():
            self._exec(
                f"UPDATE requests SET {sets}, synced = FALSE WHERE sandbox = %s AND id = %s",
                [*values, record.sandbox, record.id],
            )
            self._touch(record.sandbox)
            self._cache.pop(record.key, None)
        return new

    def prefetch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Read (and lock) in one statement the rows this transaction will `get`."""
        wanted = [k for k in dict.fromkeys(keys) if k not in self._cache]
        if self._conn is None or not wanted:
            return
        rows = self._exec(
            "SELECT r.* FROM requests r JOIN unnest(%s::text[], %s::text[]) AS k(sandbox, id) "
            "ON r.sandbox = k.sandbox AND r.id = k.id FOR UPDATE OF r",
            ([k[0] for k in wanted], [k[1] for k in wanted]),
        )
        self._cache.update(dict.fromkeys(wanted))
        for row in rows:
            record = record_from(row)
            self._cache[record.key] = record

    def get(self, sandbox: str, request_id: str) -> Record | None:
        if self._conn is not None and (sandbox, request_id) in self._cache:
            return self._cache[(sandbox, request_id)]
        rows = self._exec(
            f"SELECT * FROM requests WHERE sandbox = %s AND id = %s{self._lock}",
            (sandbox, request_id),
        )
        return record_from(rows[0]) if rows else None

    def find(self, ref: str) -> Record:
        if "/" in ref:
            sandbox, _, request_id = ref.partition("/")
            record = self.get(sandbox, request_id)
            if record is None:
                raise RequestNotFound(f"no request {request_id!r} in sandbox {sandbox!r}")
            return record
        rows = self._exec(f"SELECT * FROM requests WHERE id = %s ORDER BY seq{self._lock}", (ref,))
        if not rows:
            raise RequestNotFound(f"no request with id {ref!r}")
        if len(rows) > 1:
            where = ", ".join(f"{r['sandbox']}/{ref}" for r in rows)
            raise AmbiguousRequest(f"id {ref!r} exists in several sandboxes: use one of {where}")
        return record_from(rows[0])

    def by_idempotency_key(self, sandbox: str, key: str) -> Record | None:
        rows = self._exec(
            "SELECT * FROM requests WHERE sandbox = %s AND idempotency_key = %s "
            "AND replay_of IS NULL ORDER BY seq LIMIT 1",
            (sandbox, key),
        )
        return record_from(rows[0]) if rows else None

    def replays_of(self, record: Record) -> list[Record]:
        rows = self._exec(
            "SELECT * FROM requests WHERE sandbox = %s AND replay_of = %s "
            f"AND state NOT IN {TERMINAL_SQL} ORDER BY seq",
            (record.sandbox, record.id),
        )
        return [record_from(r) for r in rows]

    def _mine(self) -> tuple[str, list[Any]]:
        return ("host = %s AND ", [self.host]) if self.owner else ("", [])

    def in_states(self, states: Iterable[str]) -> list[Record]:
        where, args = self._mine()
        rows = self._exec(
            f"SELECT * FROM requests WHERE {where}state = ANY(%s) ORDER BY seq",
            [*args, list(states)],
        )
        return [record_from(r) for r in rows]

    def count_waiting(self, sandbox: str) -> int:
        rows = self._exec(
            "SELECT COUNT(*) AS n FROM requests WHERE sandbox = %s AND state = 'pending'",
            (sandbox,),
        )
        return int(rows[0]["n"])

    def answered_ids(self, sandbox: str) -> list[str]:
        rows = self._exec(
            f"SELECT id FROM requests WHERE sandbox = %s AND state IN {ANSWERED_SQL}", (sandbox,)
        )
        return [str(r["id"]) for r in rows]

    def counts(self, sandbox: str) -> dict[str, int]:
        rows = self._exec(
            "SELECT state, COUNT(*) AS n FROM requests WHERE sandbox = %s GROUP BY state",
            (sandbox,),
        )
        return {str(r["state"]): int(r["n"]) for r in rows}

    def recent(self, limit: int = 50) -> list[Record]:
        rows = self._exec("SELECT * FROM requests ORDER BY seq DESC LIMIT %s", (limit,))
        return [record_from(r) for r in rows]

    def search(
        self,
        *,
        effect: str | None = None,
        sandbox: str | None = None,
        states: Iterable[str] | None = None,
        limit: int = 50,
    ) -> list[Record]:
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("effect", effect), ("sandbox", sandbox)):
            if value is not None:
                where.append(f"{column} = %s")
                args.append(value)
        if states is not None:
            where.append("state = ANY(%s)")
            args.append(list(states))
        sql = "SELECT * FROM requests" + (" WHERE " + " AND ".join(where) if where else "")
        rows = self._exec(f"{sql} ORDER BY seq DESC LIMIT %s", [*args, limit])
        return [record_from(r) for r in rows]

    def change_mark(self) -> int:
        rows = self._exec("SELECT COALESCE(MAX(gseq), 0) AS n FROM audit_lines")
        return int(rows[0]["n"])

    def all(self) -> list[Record]:
        return [record_from(r) for r in self._exec("SELECT * FROM requests ORDER BY seq")]

    def unsynced(self) -> list[Record]:
        where, args = self._mine()
        rows = self._exec(f"SELECT * FROM requests WHERE {where}NOT synced ORDER BY seq", args)
        return [record_from(r) for r in rows]

    def mark_synced(self, written: Iterable[tuple[str, str, str]]) -> None:
        self._many(
            "UPDATE requests SET synced = TRUE WHERE sandbox = %s AND id = %s AND state = %s",
            list(written),
        )

    # -- decisions --------------------------------------------------------------------

    def add_decision(self, decision: Decision) -> None:
        with self.transaction():
            self._exec(
                f"INSERT INTO decisions ({_DECISION_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
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
            self._touch(decision.sandbox)

    def decisions(self, sandbox: str, request_id: str) -> list[Decision]:
        rows = self._exec(
            f"SELECT {_DECISION_COLS} FROM decisions WHERE sandbox = %s AND id = %s ORDER BY seq",
            (sandbox, request_id),
        )
        return [Decision(**r) for r in rows]

    def all_decisions(self) -> list[Decision]:
        rows = self._exec(f"SELECT {_DECISION_COLS} FROM decisions ORDER BY seq")
        return [Decision(**r) for r in rows]

    # -- the audit chain (chained at commit: nothing waits in a queue) ----------------

    def queue_audit(self, event: dict[str, Any]) -> None:
        with self.transaction():
            self._audit_rows.append(event)

    def audit_backlog(self, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        return []

    def drop_audit(self, upto: int, head: str) -> None:
        """Nothing to drop: the chain is in the store from its commit on."""

    def audit_head(self) -> tuple[int, str] | None:
        rows = self._exec("SELECT seq, hash FROM audit_heads WHERE host = %s", (self.host,))
        return (int(rows[0]["seq"]), str(rows[0]["hash"])) if rows else None

    def audit_sink(self, log: Any) -> AuditSink:
        from broker.store.audit_copy import AuditCopy

        return AuditCopy(self, log)

    def audit_chains(self) -> dict[str, tuple[int, str]]:
        rows = self._exec("SELECT host, seq, hash FROM audit_heads ORDER BY host")
        return {str(r["host"]): (int(r["seq"]), str(r["hash"])) for r in rows}

    def audit_lines(self, host: str | None = None) -> Iterator[str]:
        """Streamed through a server-side cursor: a chain may be long."""
        sql = "SELECT line FROM audit_lines"
        args: tuple[Any, ...] = ()
        if host is not None:
            sql, args = sql + " WHERE host = %s", (host,)
        with self._borrowed() as conn, conn.transaction():
            try:
                with conn.cursor(name="audit_lines") as cur:
                    cur.execute(sql + " ORDER BY host, seq", args)
                    for (line,) in cur:
                        yield str(line)
            except psycopg.Error as exc:
                raise error("ledger", exc) from exc

    def audit_lines_after(self, seq: int) -> list[tuple[int, str]]:
        """This host's lines after `seq`, in order (what its local copy lacks)."""
        rows = self._exec(
            "SELECT seq, line FROM audit_lines WHERE host = %s AND seq > %s ORDER BY seq",
            (self.host, seq),
        )
        return [(int(r["seq"]), str(r["line"])) for r in rows]

    # -- the fleet ----------------------------------------------------------------------

    def lease(self, state_dir_key: str) -> Lease | None:
        from broker.store.leases import PgLease

        assert self.host is not None

        def fence(token: str | None) -> None:
            self.fence = token

        return PgLease(fence, self._pool, self.host, state_dir_key)

    def listen(self, on_change: Callable[[], None]) -> Listener | None:
        from broker.store.listen import PgListener

        assert self.host is not None
        return PgListener(self.url, self._password, self.host, on_change)
