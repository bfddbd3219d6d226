"""`broker ledger migrate --to postgresql://…`: a SQLite ledger copied into a new, empty
PostgreSQL ledger, for a host that joins a fleet.

Requests and decisions are copied with their sandboxes qualified by the host id (what
the host's broker will call them there); the audit chain is copied line for line, its
hashes untouched, as this host's chain, with its head. The state dir must not be
served meanwhile, its audit log must verify, and the target must hold nothing yet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg

from broker import codec
from broker.audit import log as audit
from broker.audit import verify as audit_verify
from broker.config import Config
from broker.errors import LedgerError, StateBusy
from broker.fleet import qualify
from broker.loop.ownership import StateLock
from broker.store.base import record_values
from broker.store.pg_schema import error
from broker.store.pg_session import pool
from broker.store.sqlite import SQLiteStore

TABLES = ("requests", "decisions", "audit_lines", "brokers", "controls")
CONTROL_KINDS = ("switch", "rule", "proposal")  # broker.policy.controls, broker.review.proposals


@dataclass(frozen=True)
class Migrated:
    """What was copied."""

    host: str
    requests: int
    decisions: int
    events: int
    head: tuple[int, str] | None


def migrate(config: Config, url: str, password: str | None) -> Migrated:
    """Copy `config`'s SQLite ledger and audit chain into the PostgreSQL at `url`."""
    if not config.ledger_path.exists():
        raise LedgerError(f"no ledger at {config.ledger_path}: nothing to migrate")
    lock = StateLock(config.state_dir)
    try:
        lock.acquire("broker ledger migrate")
    except StateBusy as exc:
        raise StateBusy(f"{exc}; the ledger cannot move while it is served") from None
    try:
        return _copy(config, url, password)
    finally:
        lock.release()


def _copy(config: Config, url: str, password: str | None) -> Migrated:
    source = SQLiteStore(config.ledger_path)
    try:
        log = audit.AuditLog(config.audit_path)
        audit.flush(source, log)  # every queued event into the chain first
        head = source.audit_head()
        count, fault = audit_verify.verify(config.audit_path, head)
        if fault is not None:
            raise LedgerError(
                f"{config.audit_path}: line {fault.line}: {fault.problem}; "
                "not migrated (a broken chain would not verify there either)"
            )
        records, decisions = source.all(), source.all_decisions()
        controls = {kind: source.controls(kind) for kind in CONTROL_KINDS}
        unsynced = {r.key for r in source.unsynced()}
    finally:
        source.close()
    lines = [raw for _, _, raw in audit_verify.read_events(config.audit_path)]
    host = config.host_id()
    with pool(url, password).connection() as conn:
        try:
            with conn.transaction():
                _refuse_unless_empty(conn, url)
                _copy_requests(conn, host, records, unsynced)
                _copy_decisions(conn, host, decisions)
                _copy_controls(conn, controls)
                chain_head = _copy_chain(conn, host, lines)
        except psycopg.Error as exc:
            raise error(f"ledger {url}", exc) from exc
    return Migrated(host, len(records), len(decisions), count, chain_head)


def _refuse_unless_empty(conn: psycopg.Connection[Any], url: str) -> None:
    conn.execute("LOCK TABLE requests, decisions, audit_lines, brokers, controls IN EXCLUSIVE MODE")
    held = {}
    for table in TABLES:
        row = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
        held[table] = int(row[0]) if row else 0
    if any(held.values()):
        what = ", ".join(f"{n} row(s) in {t}" for t, n in held.items() if n)
        raise LedgerError(
            f"{url} is not empty ({what}); migrate into a new database, or join the fleet "
            "without migrating"
        )


def _copy_requests(
    conn: psycopg.Connection[Any], host: str, records: list[Any], unsynced: set[Any]
) -> None:
    for record in records:
        data = record_values(record.evolve(sandbox=qualify(host, record.sandbox)))
        data["host"] = host
        data["synced"] = record.key not in unsynced  # written results stay written
        cols = ", ".join(data)
        conn.execute(
            f"INSERT INTO requests ({cols}) VALUES ({', '.join('%s' for _ in data)})",
            tuple(data.values()),
        )


def _copy_controls(conn: psycopg.Connection[Any], controls: dict[str, Any]) -> None:
    """Kill switches, proposals and accepted rules hold for the fleet from now on."""
    for kind, entries in controls.items():
        for key, value in entries.items():
            conn.execute(
                "INSERT INTO controls (kind, key, value) VALUES (%s, %s, %s)",
                (kind, key, codec.dumps(value)),
            )
    if any(controls.values()):
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('policy_generation', '1') "
            "ON CONFLICT (key) DO UPDATE SET value = (meta.value::bigint + 1)::text"
        )


def _copy_decisions(conn: psycopg.Connection[Any], host: str, decisions: list[Any]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO decisions (sandbox, id, approver, verdict, reason, surface, sha256, at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    qualify(host, d.sandbox),
                    d.id,
                    d.approver,
                    d.verdict,
                    d.reason,
                    d.surface,
                    d.sha256,
                    d.at,
                )
                for d in decisions
            ],
        )


def _copy_chain(
    conn: psycopg.Connection[Any], host: str, lines: list[str]
) -> tuple[int, str] | None:
    """The chain's lines as they are; its head is the last one's."""
    if not lines:
        return None
    last = json.loads(lines[-1])
    with conn.cursor().copy("COPY audit_lines (host, seq, line) FROM STDIN") as copy:
        for line in lines:
            copy.write_row((host, int(json.loads(line)["seq"]), line))
    head = (int(last["seq"]), str(last["hash"]))
    conn.execute("INSERT INTO audit_heads (host, seq, hash) VALUES (%s, %s, %s)", (host, *head))
    return head
