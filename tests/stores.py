"""The two store back ends for the store suite: every ledger test runs on both.

`pg_server` (session) is one real PostgreSQL started by tests/pgserver.py; each test
gets a database of its own. Where PostgreSQL's binaries are missing the PostgreSQL
variants skip and say why, except in CI, where they fail. SQLite connections return
the rows of a query without ORDER BY in reverse (`PRAGMA reverse_unordered_selects`),
so an order a caller relies on but no statement asks for fails here, not by chance.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.audit import log as audit
from broker.store.base import Store
from tests.pgserver import PASSWORD, PgServer, bin_dir

BACKENDS = ["sqlite", "postgresql"]
HOST = "alpha"
_names = itertools.count(1)

OpenStore = Callable[..., Store]
"""open_store(host=HOST, owner=False) → a new connection to the test's one store."""


def start_server() -> Iterator[PgServer]:
    if bin_dir() is None:
        message = "PostgreSQL's binaries are missing (make postgres installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


def new_database(server: PgServer) -> str:
    return server.create_database(f"t{os.getpid()}_{next(_names)}")


def opener(backend: str, tmp_path: Path, pg_url: Callable[[], str]) -> OpenStore:
    if backend == "sqlite":
        from broker.store.sqlite import SQLiteStore

        path = tmp_path / "ledger.sqlite3"

        def embedded(host: str = HOST, owner: bool = False) -> Store:
            opened = SQLiteStore(path)
            opened._db.execute("PRAGMA reverse_unordered_selects = ON")
            return opened

        return embedded
    from broker.store.postgres import PostgresStore

    url = pg_url()

    def make(host: str = HOST, owner: bool = False) -> Store:
        return PostgresStore(url, password=PASSWORD, host=host, owner=owner, chain=audit.chain)

    return make


def chained_events(store: Store) -> list[dict[str, Any]]:
    """The audit events a store holds for its log, in order, on either back end."""
    if store.shared:
        return [json.loads(line) for line in store.audit_lines(store.host)]
    return [e for _, e in store.audit_backlog()]
