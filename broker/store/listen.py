"""LISTEN/NOTIFY: a change another process commits to this host's requests (a decision
taken on any host), or to the controls every host obeys, wakes this host's broker at
once, not at its next rescan. A dedicated connection, in a thread; after a lost
connection it reconnects and calls `on_change` once, for what it may have missed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from broker.store.pg_schema import CHANNEL, EVERY_HOST

log = logging.getLogger("broker.listen")
RETRY_S = 1.0


class PgListener:
    """Calls `on_change` (from its own thread) when `host`'s requests changed."""

    def __init__(
        self, url: str, password: str | None, host: str, on_change: Callable[[], None]
    ) -> None:
        self._url = url
        self._password = password
        self.host = host
        self._on_change = on_change
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-listen", daemon=True)
        self._thread.start()
        self._ready.wait(5)  # listening before the broker's first reload, in normal times

    def _run(self) -> None:
        missed = False
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self._url, password=self._password, autocommit=True, connect_timeout=5
                ) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._ready.set()
                    if missed:
                        self._on_change()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload in (self.host, EVERY_HOST):
                                self._on_change()
            except psycopg.Error:
                self._ready.set()
                missed = True
                self._stop.wait(RETRY_S)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
