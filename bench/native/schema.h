/* The ledger's tables and the row's INSERT, as the broker has them
 * (broker/store/sqlite_schema.py, broker/store/queries.py), for accept.c and
 * commitprobe.c. */
#ifndef NATIVE_SCHEMA_H
#define NATIVE_SCHEMA_H

/* the broker's own schema (broker/store/sqlite_schema.py), so the same indexes are kept */
static const char SCHEMA[] =
    "CREATE TABLE IF NOT EXISTS requests (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " sandbox TEXT NOT NULL, id TEXT NOT NULL, name TEXT NOT NULL, effect TEXT, payload TEXT,"
    " sha256 TEXT, idempotency_key TEXT, state TEXT NOT NULL, reason TEXT, errors TEXT,"
    " output TEXT, verdict TEXT, preview TEXT, reversible INTEGER, decided_by TEXT,"
    " replay_of TEXT, received_at TEXT NOT NULL, decided_at TEXT, completed_at TEXT,"
    " expires_at TEXT, on_timeout TEXT, seen TEXT, facts TEXT,"
    " synced INTEGER NOT NULL DEFAULT 0, UNIQUE (sandbox, id));"
    "CREATE INDEX IF NOT EXISTS requests_idem ON requests (sandbox, idempotency_key)"
    " WHERE idempotency_key IS NOT NULL;"
    "CREATE INDEX IF NOT EXISTS requests_state ON requests (state);"
    "CREATE INDEX IF NOT EXISTS requests_unsynced ON requests (synced) WHERE synced = 0;"
    "CREATE INDEX IF NOT EXISTS requests_id ON requests (id);"
    "CREATE INDEX IF NOT EXISTS requests_replays ON requests (sandbox, replay_of)"
    " WHERE replay_of IS NOT NULL;"
    "CREATE TABLE IF NOT EXISTS decisions (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " sandbox TEXT NOT NULL, id TEXT NOT NULL, approver TEXT NOT NULL, verdict TEXT NOT NULL,"
    " reason TEXT, surface TEXT NOT NULL, sha256 TEXT NOT NULL, at TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS decisions_request ON decisions (sandbox, id);"
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS controls (kind TEXT NOT NULL, key TEXT NOT NULL,"
    " value TEXT NOT NULL, PRIMARY KEY (kind, key));"
    "CREATE TABLE IF NOT EXISTS audit_queue (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " event TEXT NOT NULL);";

#define INSERT_REQUEST                                                                       \
    "INSERT INTO requests (sandbox, id, name, state, received_at, effect, payload, sha256,"   \
    " idempotency_key, reason, errors, output, verdict, preview, reversible, decided_by,"    \
    " replay_of, decided_at, completed_at, expires_at, on_timeout, seen, facts) VALUES"      \
    " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

#endif
