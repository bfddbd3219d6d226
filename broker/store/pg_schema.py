"""The PostgreSQL store's tables, made once per database (under an advisory lock, so two
brokers starting together do not race), and how its errors read."""

from __future__ import annotations

from typing import Any

import psycopg

from broker.errors import LedgerError, StoreUnavailable

SCHEMA_VERSION = 2
SCHEMA_LOCK = 0x62726F6B  # pg_advisory_xact_lock key: "brok"
SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    seq BIGSERIAL PRIMARY KEY,
    host TEXT NOT NULL,
    sandbox TEXT NOT NULL,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    effect TEXT,
    payload TEXT,
    sha256 TEXT,
    idempotency_key TEXT,
    state TEXT NOT NULL,
    reason TEXT,
    errors TEXT,
    output TEXT,
    verdict TEXT,
    preview TEXT,
    reversible BOOLEAN,
    decided_by TEXT,
    replay_of TEXT,
    received_at TEXT NOT NULL,
    decided_at TEXT,
    completed_at TEXT,
    expires_at TEXT,
    on_timeout TEXT,
    seen TEXT,
    facts TEXT,
    synced BOOLEAN NOT NULL DEFAULT FALSE,
    UNIQUE (sandbox, id)
);
CREATE INDEX IF NOT EXISTS requests_idem ON requests (sandbox, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS requests_host_state ON requests (host, state);
CREATE INDEX IF NOT EXISTS requests_unsynced ON requests (host) WHERE NOT synced;
CREATE INDEX IF NOT EXISTS requests_id ON requests (id);
CREATE INDEX IF NOT EXISTS requests_replays ON requests (sandbox, replay_of)
    WHERE replay_of IS NOT NULL;
CREATE TABLE IF NOT EXISTS decisions (
    seq BIGSERIAL PRIMARY KEY,
    sandbox TEXT NOT NULL,
    id TEXT NOT NULL,
    approver TEXT NOT NULL,
    verdict TEXT NOT NULL,
    reason TEXT,
    surface TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_request ON decisions (sandbox, id);
CREATE TABLE IF NOT EXISTS audit_lines (
    gseq BIGSERIAL PRIMARY KEY,
    host TEXT NOT NULL,
    seq BIGINT NOT NULL,
    line TEXT NOT NULL,
    UNIQUE (host, seq)
);
CREATE TABLE IF NOT EXISTS audit_heads (
    host TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS brokers (
    host TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    token TEXT NOT NULL,
    command TEXT NOT NULL,
    pid INTEGER NOT NULL,
    machine TEXT NOT NULL,
    since TIMESTAMPTZ NOT NULL,
    renewed TIMESTAMPTZ NOT NULL,
    expires TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS controls (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""
UPGRADES = {
    2: "ALTER TABLE requests ADD COLUMN IF NOT EXISTS facts TEXT",  # for policy replay
}
"""What takes a database made at the version before each one to it."""
CHANNEL = "broker_changes"
"""NOTIFY channel; the payload is the host id whose requests changed, or EVERY_HOST."""
EVERY_HOST = "*"
"""The payload of a change every broker must see (a kill switch, an accepted rule)."""


def ensure(conn: psycopg.Connection[Any]) -> None:
    """Create what is missing and check the schema's version (one transaction)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        conn.execute(SCHEMA)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema', %s)", (str(SCHEMA_VERSION),)
            )
        elif int(row[0]) > SCHEMA_VERSION:
            raise LedgerError(
                f"the PostgreSQL ledger is at schema {row[0]}, newer than this broker "
                f"knows ({SCHEMA_VERSION}); upgrade the broker"
            )
        elif int(row[0]) < SCHEMA_VERSION:
            for version in range(int(row[0]) + 1, SCHEMA_VERSION + 1):
                conn.execute(UPGRADES[version])
            conn.execute("UPDATE meta SET value = %s WHERE key = 'schema'", (str(SCHEMA_VERSION),))


def error(where: str, exc: psycopg.Error) -> LedgerError:
    """A psycopg error as the broker's: StoreUnavailable when the server is out of reach
    (no answer at all, a connection error, a server shutting down or starting)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    state = exc.sqlstate or ""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and (
        not state or state.startswith(("08", "57P"))
    ):
        return StoreUnavailable(f"{where}: PostgreSQL does not answer: {text}")
    return LedgerError(f"{where}: {text}")
