"""Connections and transactions of the PostgreSQL store: the process's pool, one
connection per transaction, and as few round trips as the contract allows.

Round trips are what a wake-up on PostgreSQL costs (the server is a network hop away,
even on loopback), so inside a transaction:

- writes are queued and sent, in order, with the next statement that needs an answer
  (psycopg's pipeline mode: one round trip for all of them), or with the COMMIT;
- a savepoint is queued the same way, and one whose block sent nothing is never sent
  at all (rolling it back is then dropping what it queued);
- every read sends what is queued first, so a read sees the transaction's own writes.

A queued write that fails makes the whole transaction fail, where a savepoint would
have caught it alone; `careful()` sends each statement at once, for the retry of a
transaction that failed that way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from broker.errors import LedgerError
from broker.store import pg_schema
from broker.store.pg_schema import error

CONNECT_TIMEOUT_S = 5.0
Statement = tuple[str, tuple[Any, ...] | None]
Pool = ConnectionPool[psycopg.Connection[Any]]
_pools: dict[tuple[str, str | None], Pool] = {}
_users: dict[int, int] = {}  # by id(pool): the stores and leases that hold it open
_pools_lock = threading.Lock()


def pool(url: str, password: str | None, user: bool = False) -> Pool:
    """The process's pool for `url`, opened (and the schema made) on first use; a `user`
    keeps it open until it lets go (`let_go`)."""
    key = (url, password)
    with _pools_lock:
        found = _pools.get(key)
        if found is not None:
            if user:
                _users[id(found)] = _users.get(id(found), 0) + 1
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
            raise unreachable(url, password) from exc
        _pools[key] = made
        if user:
            _users[id(made)] = 1
        return made


def hold(pool: Pool) -> Pool:
    """Count one more user of `pool`: it stays open until the last one lets go."""
    with _pools_lock:
        _users[id(pool)] = _users.get(id(pool), 0) + 1
    return pool


def let_go(pool: Pool) -> None:
    """One user is done with `pool`; the last closes it and joins its threads."""
    with _pools_lock:
        left = _users.get(id(pool), 0) - 1
        if left > 0:
            _users[id(pool)] = left
            return
        _users.pop(id(pool), None)
        for key, found in list(_pools.items()):
            if found is pool:
                del _pools[key]
    pool.close()


def unreachable(url: str, password: str | None) -> LedgerError:
    """Why a connection cannot be had, in one line (the pool only says it timed out)."""
    try:
        psycopg.connect(url, password=password, connect_timeout=int(CONNECT_TIMEOUT_S)).close()
    except psycopg.Error as exc:
        return error(f"ledger {url}", exc)
    return error(f"ledger {url}", psycopg.OperationalError("no connection within 5 s"))


class Session:
    """One thread's connection handling; PostgresStore adds the queries."""

    def __init__(self, url: str, password: str | None) -> None:
        self.url = url
        self._password = password
        self._pool = pool(url, password, user=True)
        self._held = True
        self._conn: psycopg.Connection[Any] | None = None
        self._depth = 0
        self._queued: list[Statement] = []
        self._saved = 0
        self._careful = False

    def close(self) -> None:
        """Let go of the process's pool (closed, its threads joined, with its last user)."""
        if self._held:
            self._held = False
            let_go(self._pool)

    # -- transactions ---------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One committed unit; nested uses join the outer one."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        with self._borrowed() as conn:
            self._conn, self._depth = conn, 1
            self._queued = [("BEGIN", None)]
            try:
                yield
                self._depth = 0
                self._before_commit()
                self._send(conn, ("COMMIT", None))
            except BaseException:
                self._rollback(conn)
                raise
            finally:
                self._conn, self._depth, self._queued = None, 0, []
                self._ended()
            self._committed()

    def _before_commit(self) -> None:
        """Last statements of every transaction (the store's fence, chain, notices)."""

    def _ended(self) -> None:
        """The transaction is over, committed or not: forget what it held."""

    def _committed(self) -> None:
        """The transaction committed."""

    @contextmanager
    def _borrowed(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            conn = self._pool.getconn(timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout as exc:
            raise unreachable(self.url, self._password) from exc
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
        """A part of the current transaction that can fail alone."""
        self._saved += 1
        mark: Statement = (f"SAVEPOINT s{self._saved}", None)
        self._queued.append(mark)
        try:
            yield
        except BaseException:
            if not self._drop_from(mark):  # else nothing of it reached the server
                self._queued.clear()  # all after what was sent: undone by the rollback
                self.execute(f"ROLLBACK TO {mark[0]}")
                self.execute(f"RELEASE {mark[0]}")
            raise
        if self._queued and self._queued[-1] is mark:
            self._queued.pop()  # nothing happened inside: nothing to send
        else:
            self._queued.append((f"RELEASE {mark[0]}", None))

    def _drop_from(self, mark: Statement) -> bool:
        """Forget `mark` and what was queued after it, if it was never sent."""
        for n in range(len(self._queued) - 1, -1, -1):
            if self._queued[n] is mark:
                del self._queued[n:]
                return True
        return False

    @contextmanager
    def careful(self) -> Iterator[None]:
        """Send each statement at once, so a savepoint holds its own failure."""
        before, self._careful = self._careful, True
        try:
            yield
        finally:
            self._careful = before

    # -- statements -----------------------------------------------------------------

    def execute(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """Rows of one statement, in the open transaction or on a borrowed connection."""
        if self._conn is not None:
            return self._send(self._conn, (sql, tuple(args)))
        with self._borrowed() as conn:
            return self._rows(conn, sql, tuple(args))

    def write(self, sql: str, args: Iterable[Any] = ()) -> None:
        """A statement whose answer nobody waits for: queued inside a transaction."""
        if self._conn is None:
            with self.transaction():
                self.write(sql, args)
            return
        self._queued.append((sql, tuple(args)))
        if self._careful:
            self._send(self._conn, None)

    def _send(self, conn: psycopg.Connection[Any], last: Statement | None) -> list[dict[str, Any]]:
        """What is queued, then `last`, in one round trip; `last`'s rows."""
        queued, self._queued = self._queued, []
        if not queued and last is not None:
            return self._rows(conn, last[0], last[1])
        try:
            with conn.cursor(row_factory=dict_row) as cur:
                with conn.pipeline():
                    for sql, args in queued:
                        conn.execute(sql, args)
                    if last is not None:
                        cur.execute(last[0], last[1])
                if last is None or cur.description is None:
                    return []
                return cur.fetchall()
        except psycopg.Error as exc:
            raise error("ledger", exc) from exc

    @staticmethod
    def _rows(
        conn: psycopg.Connection[Any], sql: str, args: tuple[Any, ...] | None
    ) -> list[dict[str, Any]]:
        try:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise error("ledger", exc) from exc
