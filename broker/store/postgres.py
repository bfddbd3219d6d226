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
  broker applies a decision at once (listen.py); a change to the controls NOTIFYs
  every host.
- A broker's commit checks its lease (leases.py) first: a broker that lost its host id
  to another commits nothing more.

Round trips are what a wake-up on PostgreSQL costs: the rows a wake-up will touch are
read (and locked) in one statement (`prefetch`), request seqs are reserved in blocks,
and writes go out together (pg_session.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from broker.errors import LeaseLost, LedgerError
from broker.fleet import host_of
from broker.models import Record
from broker.store import queries
from broker.store.base import AuditSink, Chain, Lease, Listener, record_from
from broker.store.operations import SqlOperations
from broker.store.pg_schema import CHANNEL, EVERY_HOST, error
from broker.store.pg_session import Session

GENESIS = "0" * 64
SEQ_BLOCK = 64  # request seqs reserved per round trip
# the pool retries its connections in the background and logs each failure; while the
# server is away the broker says so itself, once a minute (outage.py)
logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)


def _texts(values: Iterable[Any]) -> list[Any]:
    """PostgreSQL's text holds no NUL (SQLite's does): a service's reason with one in it
    is kept with U+FFFD in its place rather than failing the commit."""
    return [
        v.replace("\x00", "\ufffd") if isinstance(v, str) and "\x00" in v else v for v in values
    ]


class PostgresStore(Session, SqlOperations):
    """One thread's view of the shared store: a connection borrowed from the pool per
    transaction (or per read outside one). Its queries are the shared ones
    (operations.py); here is what sharing adds."""

    shared = True
    dialect = queries.POSTGRES

    def __init__(
        self, url: str, *, password: str | None, host: str, owner: bool, chain: Chain
    ) -> None:
        super().__init__(url, password)
        self.host: str | None = host
        self.owner = owner
        self._chain = chain
        self._audit_rows: list[dict[str, Any]] = []
        self._touched: set[str] = set()  # hosts whose requests this transaction changed
        self.fence: str | None = None  # the lease token a broker's commits must still hold
        self.committed_lines: list[tuple[int, str]] = []  # chained by this store, for the copy
        self._lines: list[tuple[int, str]] = []
        self._cache: dict[tuple[str, str], Record | None] = {}  # prefetched, this transaction
        self._seqs: list[int] = []  # reserved request seqs, used in order

    def close(self) -> None:
        """Connections go back to the process's pool; the last store closes it."""
        super().close()

    def ping(self) -> bool:
        try:
            self.execute("SELECT 1")
        except LedgerError:
            return False
        return True

    # -- what every transaction ends with ---------------------------------------------

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        queued, touched, cache = len(self._audit_rows), set(self._touched), dict(self._cache)
        try:
            with super().savepoint():
                yield
        except BaseException:
            del self._audit_rows[queued:]
            self._touched, self._cache = touched, cache
            raise

    def _before_commit(self) -> None:
        """Notices to other hosts, the fence, the audit chain: last in every transaction."""
        self._lines = []
        for host in sorted(self._touched):
            self.write("SELECT pg_notify(%s, %s)", (CHANNEL, host))
        if self.fence is not None:
            held = self.execute(
                "SELECT 1 AS held FROM brokers WHERE host = %s AND token = %s",
                (self.host, self.fence),
            )
            if not held:
                raise LeaseLost(
                    f"host {self.host}: another broker holds this host's lease now; "
                    "this one stops serving"
                )
        if self._audit_rows:
            self._lines = self._append_chain()

    def _ended(self) -> None:
        self._audit_rows.clear()
        self._touched.clear()
        self._cache.clear()

    def _committed(self) -> None:
        self.committed_lines.extend(self._lines)

    def _append_chain(self) -> list[tuple[int, str]]:
        """This transaction's events after the host's head, under its row lock."""
        self.write(
            "INSERT INTO audit_heads (host, seq, hash) VALUES (%s, 0, %s) ON CONFLICT DO NOTHING",
            (self.host, GENESIS),
        )
        found = self.execute(
            "SELECT seq, hash FROM audit_heads WHERE host = %s FOR UPDATE", (self.host,)
        )
        seq, head = int(found[0]["seq"]), str(found[0]["hash"])
        events = [(seq + n, e) for n, e in enumerate(self._audit_rows, 1)]
        lines, head = self._chain(events, head)
        rows = [(s, line.decode("utf-8")) for (s, _), line in zip(events, lines, strict=True)]
        assert self._conn is not None
        try:
            with self._conn.cursor().copy("COPY audit_lines (host, seq, line) FROM STDIN") as copy:
                for s, line in rows:
                    copy.write_row((self.host, s, line))
        except psycopg.Error as exc:
            raise error("ledger", exc) from exc
        self.write(
            "UPDATE audit_heads SET seq = %s, hash = %s WHERE host = %s",
            (events[-1][0], head, self.host),
        )
        return rows

    def _next_seq(self) -> int:
        if not self._seqs:
            rows = self.execute(
                "SELECT nextval(pg_get_serial_sequence('requests', 'seq')) AS n "
                "FROM generate_series(1, %s)",
                (SEQ_BLOCK,),
            )
            self._seqs = sorted((int(r["n"]) for r in rows), reverse=True)
        return self._seqs.pop()

    # -- what the shared operations ask of a back end (operations.py) -------------------

    def _fetch(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return self.execute(sql, args)

    def _write(self, sql: str, args: Sequence[Any] = ()) -> None:
        self.write(sql, args)

    def _insert_row(self, record: Record, data: dict[str, Any]) -> int:
        data["host"] = host_of(record.sandbox) or self.host
        data["seq"] = seq = self._next_seq()
        self.write(self.dialect.sql(queries.insert(data)), _texts(data.values()))
        return seq

    def _owned_host(self) -> str | None:
        return self.host if self.owner else None

    def _locking(self) -> bool:
        """Reads inside a transaction lock the rows they return (see the module doc)."""
        return self._conn is not None

    def _clean(self, values: Iterable[Any]) -> list[Any]:
        return _texts(values)

    def _changed(self, sandbox: str, key: tuple[str, str] | None = None) -> None:
        """Another host's request: NOTIFY that host at commit."""
        host = host_of(sandbox)
        if host and not (self.owner and host == self.host):
            self._touched.add(host)
        if key is not None:
            self._cache.pop(key, None)

    def _lock_controls(self) -> None:
        """The generation's row lock orders every change to the controls (two hosts
        numbering proposals at once take turns)."""
        self.write(
            "INSERT INTO meta (key, value) VALUES ('policy_generation', '0') ON CONFLICT DO NOTHING"
        )
        self._query(queries.GENERATION, lock=True)

    def _controls_changed(self) -> None:
        """Every broker of the fleet obeys the controls: wake them all at commit."""
        self.write("SELECT pg_notify(%s, %s)", (CHANNEL, EVERY_HOST))

    # -- requests -------------------------------------------------------------------

    def prefetch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Read (and lock) in one statement the rows this transaction will `get`."""
        wanted = [k for k in dict.fromkeys(keys) if k not in self._cache]
        if self._conn is None or not wanted:
            return
        rows = self.execute(
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
        return super().get(sandbox, request_id)

    def change_mark(self) -> int:
        rows = self.execute("SELECT COALESCE(MAX(gseq), 0) AS n FROM audit_lines")
        return int(rows[0]["n"])

    # -- the audit chain (chained at commit: nothing waits in a queue) ----------------

    def queue_audit(self, event: dict[str, Any]) -> None:
        with self.transaction():
            self._audit_rows.append(event)

    def audit_backlog(self, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        return []

    def drop_audit(self, upto: int, head: str) -> None:
        """Nothing to drop: the chain is in the store from its commit on."""

    def audit_head(self) -> tuple[int, str] | None:
        rows = self.execute("SELECT seq, hash FROM audit_heads WHERE host = %s", (self.host,))
        return (int(rows[0]["seq"]), str(rows[0]["hash"])) if rows else None

    def audit_keyed_from(self) -> tuple[int, str] | None:
        return None  # the chains are in the database, out of the state dir's writers' reach

    def mark_audit_keyed(self, seq: int, mac: str) -> None:
        return None

    def audit_sink(self, log: Any, checkpoints: Any = None, clock: Any = None) -> AuditSink:
        from broker.clock import REAL
        from broker.store.audit_copy import AuditCopy

        return AuditCopy(self, log, checkpoints=checkpoints, clock=clock or REAL)

    def audit_chains(self) -> dict[str, tuple[int, str]]:
        rows = self.execute("SELECT host, seq, hash FROM audit_heads ORDER BY host")
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
        rows = self.execute(
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
