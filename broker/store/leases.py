"""Each broker's lease on its host id in the shared store: one row per host in
`brokers`, renewed while the broker lives. A second broker claiming a host id whose
lease is live is refused with one line naming the holder; the same state dir on the
same machine takes its lease back at once after a crash (its flock on the state dir,
taken first, proves the old process is gone). Times are the server's, so brokers'
clocks need not agree."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from broker.errors import StateBusy
from broker.store.pg_session import hold, let_go

log = logging.getLogger("broker.lease")
TTL_S = 15.0
RENEW_EVERY_S = 3.0

_CLAIM = """
INSERT INTO brokers (host, holder, token, command, pid, machine, since, renewed, expires)
VALUES (%(host)s, %(holder)s, %(token)s, %(command)s, %(pid)s, %(machine)s,
        now(), now(), now() + make_interval(secs => %(ttl)s))
ON CONFLICT (host) DO UPDATE SET
    holder = EXCLUDED.holder, token = EXCLUDED.token, command = EXCLUDED.command,
    pid = EXCLUDED.pid, machine = EXCLUDED.machine, since = now(), renewed = now(),
    expires = EXCLUDED.expires
WHERE brokers.expires < now() OR brokers.holder = EXCLUDED.holder
RETURNING token
"""
_HOLDER = """
SELECT command, pid, machine, since,
       round(extract(epoch FROM now() - renewed)::numeric, 1) AS ago
FROM brokers WHERE host = %s
"""


class PgLease:
    """The lease of one host id, held by this process while it serves."""

    def __init__(
        self,
        fence: Callable[[str | None], None],
        pool: ConnectionPool[psycopg.Connection[Any]],
        host: str,
        state_dir_key: str,
        ttl_s: float = TTL_S,
    ) -> None:
        self._fence = fence  # the store's commits must still hold the token
        self._pool = pool
        self.host = host
        self.holder = f"{socket.gethostname()}:{state_dir_key}"
        self.token = secrets.token_hex(16)
        self.ttl_s = ttl_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, command: str) -> None:
        args = {
            "host": self.host,
            "holder": self.holder,
            "token": self.token,
            "command": command,
            "pid": os.getpid(),
            "machine": socket.gethostname(),
            "ttl": self.ttl_s,
        }
        with self._pool.connection() as conn:
            if conn.execute(_CLAIM, args).fetchone() is None:
                raise StateBusy(self._refusal(conn))
        hold(self._pool)  # open until given back, whenever the store closes
        self._fence(self.token)
        self._thread = threading.Thread(target=self._renew, name="broker-lease", daemon=True)
        self._thread.start()

    def _refusal(self, conn: psycopg.Connection[Any]) -> str:
        row = conn.execute(_HOLDER, (self.host,)).fetchone()
        who = ""
        if row is not None:
            command, pid, machine, since, ago = row
            who = (
                f" (`{command}`, pid {pid} on {machine}, since {since:%Y-%m-%d %H:%M:%S}, "
                f"renewed {ago}s ago)"
            )
        return (
            f"host id {self.host} is held by another broker{who}; stop it first, or give "
            "this broker a host_id of its own under [broker]"
        )

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S):
            try:
                with self._pool.connection(timeout=RENEW_EVERY_S) as conn:
                    row = conn.execute(
                        "UPDATE brokers SET renewed = now(), "
                        "expires = now() + make_interval(secs => %s) "
                        "WHERE host = %s AND token = %s RETURNING 1",
                        (self.ttl_s, self.host, self.token),
                    ).fetchone()
            except (psycopg.Error, PoolTimeout):
                continue  # the store is away: the broker waits it out (outage.py)
            if row is None:
                log.error("host %s: another broker took this host's lease", self.host)
                self.lost.set()
                return

    def release(self) -> None:
        self._stop.set()
        if self._thread is None:
            return  # never acquired
        self._thread.join(RENEW_EVERY_S + 1)
        self._thread = None
        self._fence(None)
        try:
            with self._pool.connection(timeout=2) as conn:
                conn.execute(
                    "DELETE FROM brokers WHERE host = %s AND token = %s", (self.host, self.token)
                )
        except (psycopg.Error, PoolTimeout):
            pass  # it expires by itself
        let_go(self._pool)
