"""The SQLite ledger's tables, and the columns added since the first release."""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
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
    reversible INTEGER,
    decided_by TEXT,
    replay_of TEXT,
    received_at TEXT NOT NULL,
    decided_at TEXT,
    completed_at TEXT,
    expires_at TEXT,
    on_timeout TEXT,
    seen TEXT,
    facts TEXT,
    synced INTEGER NOT NULL DEFAULT 0,
    UNIQUE (sandbox, id)
);
CREATE INDEX IF NOT EXISTS requests_idem ON requests (sandbox, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS requests_state ON requests (state);
CREATE INDEX IF NOT EXISTS requests_unsynced ON requests (synced) WHERE synced = 0;
CREATE INDEX IF NOT EXISTS requests_id ON requests (id);
CREATE INDEX IF NOT EXISTS requests_replays ON requests (sandbox, replay_of)
    WHERE replay_of IS NOT NULL;
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
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
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS controls (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS audit_queue (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event TEXT NOT NULL
);
"""


def migrate(db: sqlite3.Connection) -> None:
    """Columns added since the first release, for ledgers made before them."""
    have = {row[1] for row in db.execute("PRAGMA table_info(requests)")}
    if "seen" not in have:
        db.execute("ALTER TABLE requests ADD COLUMN seen TEXT")
    if "facts" not in have:  # the policy's facts per request, for `broker policy replay`
        db.execute("ALTER TABLE requests ADD COLUMN facts TEXT")
