"""The SQL both store back ends run, written once, so the twins cannot drift.

Statements (and the builders of those whose columns vary) are written with `?` marks and
named fragments (`{lock}`, `{true}`, `{false}`, `{binary}`); a `Dialect` renders them
for SQLite or PostgreSQL. What differs between the two is named there and only there:

    param     a statement's placeholder: `?` (sqlite3) or `%s` (psycopg)
    true      how a flag is written: 1/0 (SQLite's INTEGER) or TRUE/FALSE (BOOLEAN)
    row_lock  what a read inside a transaction adds to lock its rows: nothing for
              SQLite (BEGIN IMMEDIATE holds the whole database) or ` FOR UPDATE`
    binary    text ordered byte by byte: SQLite's default, PostgreSQL's `COLLATE "C"`
    arrays    a list of values is one parameter (`= ANY(%s)`) or one mark per value

Every list a caller reads has an ORDER BY: requests and decisions by `seq` (arrival),
controls by key. Upserts are `INSERT … ON CONFLICT … DO UPDATE` on both (SQLite 3.24+).
What only one back end has (SQLite's audit queue, PostgreSQL's chain, seq blocks, row
prefetch, leases, NOTIFY) stays with it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from broker.models import STATUSES, TERMINAL

__all__ = ["POSTGRES", "SQLITE", "Dialect"]


def _listed(states: Iterable[str]) -> str:
    return "(" + ", ".join(f"'{s}'" for s in sorted(states)) + ")"


@dataclass(frozen=True)
class Dialect:
    """What differs between SQLite and PostgreSQL in the statements both run."""

    name: str
    param: str
    true: str
    false: str
    row_lock: str
    binary: str
    arrays: bool

    def sql(self, template: str, lock: bool = False) -> str:
        """`template` with this dialect's marks and fragments (`lock`: the row lock)."""
        return _render(self, template, lock)

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """`column` is one of `values`: the condition (marks unrendered) and its parameters."""
        if self.arrays:
            return f"{column} = ANY(?)", [list(values)]
        if not values:
            return "{false}", []
        return f"{column} IN ({', '.join('?' for _ in values)})", list(values)


SQLITE = Dialect("sqlite", "?", "1", "0", row_lock="", binary="", arrays=False)
POSTGRES = Dialect(
    "postgresql", "%s", "TRUE", "FALSE", row_lock=" FOR UPDATE", binary=' COLLATE "C"', arrays=True
)


@functools.lru_cache(maxsize=1024)
@functools.lru_cache(maxsize=512)  # a few dozen statements, run several times a request
def _render(dialect: Dialect, template: str, lock: bool) -> str:
    assert "%" not in template  # psycopg would read it as a placeholder
    return template.replace("?", dialect.param).format(
        true=dialect.true,
        false=dialect.false,
        binary=dialect.binary,
        lock=dialect.row_lock if lock else "",
    )


# -- requests ----------------------------------------------------------------------------

GET = "SELECT * FROM requests WHERE sandbox = ? AND id = ?{lock}"
BY_ID = "SELECT * FROM requests WHERE id = ? ORDER BY seq{lock}"
BY_PREFIX = (  # a unique prefix names a request, as git's short hashes do
    "SELECT * FROM requests WHERE substr(id, 1, length(?)) = ? ORDER BY seq LIMIT 11"
)
BY_KEY = (  # a real first wins over a staged one
    "SELECT * FROM requests WHERE sandbox = ? AND idempotency_key = ? "
    "AND replay_of IS NULL ORDER BY state = 'staged', seq LIMIT 1"
)
REPLAYS = (
    "SELECT * FROM requests WHERE sandbox = ? AND replay_of = ? "
    f"AND state NOT IN {_listed(TERMINAL)} ORDER BY seq"
)
COUNT_WAITING = "SELECT COUNT(*) AS n FROM requests WHERE sandbox = ? AND state = 'pending'"
ANSWERED = (  # the states that have a result file
    f"SELECT id FROM requests WHERE sandbox = ? AND state IN {_listed(STATUSES)} ORDER BY seq"
)
COUNTS = "SELECT state, COUNT(*) AS n FROM requests WHERE sandbox = ? GROUP BY state"
RECENT = "SELECT * FROM requests ORDER BY seq DESC LIMIT ?"
ALL = "SELECT * FROM requests ORDER BY seq"
HISTORY = (
    "SELECT * FROM requests WHERE sandbox = ? AND replay_of IS NULL "
    "AND state <> 'invalid' ORDER BY seq"
)
MARK_SYNCED = "UPDATE requests SET synced = {true} WHERE sandbox = ? AND id = ? AND state = ?"


def insert(columns: Iterable[str]) -> str:
    """One request's row, its columns named."""
    return _insert(tuple(columns))


@functools.lru_cache(maxsize=64)  # the same columns for every row
def _insert(names: tuple[str, ...]) -> str:
    return f"INSERT INTO requests ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"


def update(columns: Iterable[str]) -> str:
    """Some columns of one request; its result is unsynced (to be written again)."""
    return _update(tuple(columns))


@functools.lru_cache(maxsize=256)  # one set of columns per kind of transition
def _update(columns: tuple[str, ...]) -> str:
    sets = "".join(f"{c} = ?, " for c in columns)
    return f"UPDATE requests SET {sets}synced = {{false}} WHERE sandbox = ? AND id = ?"


def mine(host: str | None) -> tuple[str, list[Any]]:
    """A fleet owner's filter (its host's rows only), or none."""
    return ("host = ? AND ", [host]) if host is not None else ("", [])


def in_states(d: Dialect, host: str | None, states: Sequence[str]) -> tuple[str, list[Any]]:
    where, args = mine(host)
    wanted, more = d.any_of("state", states)
    return f"SELECT * FROM requests WHERE {where}{wanted} ORDER BY seq", args + more


def unsynced(host: str | None) -> tuple[str, list[Any]]:
    where, args = mine(host)
    return f"SELECT * FROM requests WHERE {where}synced = {{false}} ORDER BY seq", args


def search(
    d: Dialect,
    effect: str | None,
    sandbox: str | None,
    states: Sequence[str] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """The newest requests matching every filter given."""
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("effect", effect), ("sandbox", sandbox)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if states is not None:
        wanted, more = d.any_of("state", states)
        where.append(wanted)
        args.extend(more)
    sql = "SELECT * FROM requests" + (" WHERE " + " AND ".join(where) if where else "")
    return f"{sql} ORDER BY seq DESC LIMIT ?", [*args, limit]


# -- decisions ---------------------------------------------------------------------------

_DECISION = "sandbox, id, approver, verdict, reason, surface, sha256, at"
ADD_DECISION = f"INSERT INTO decisions ({_DECISION}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
DECISIONS = f"SELECT {_DECISION} FROM decisions WHERE sandbox = ? AND id = ? ORDER BY seq"
ALL_DECISIONS = f"SELECT {_DECISION} FROM decisions ORDER BY seq"

# -- controls ----------------------------------------------------------------------------

CONTROLS = "SELECT key, value FROM controls WHERE kind = ? ORDER BY key{binary}"
PUT_CONTROL = (
    "INSERT INTO controls (kind, key, value) VALUES (?, ?, ?) "
    "ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value"
)
DROP_CONTROL = "DELETE FROM controls WHERE kind = ? AND key = ?"
NEXT_CONTROL = "SELECT MAX(CAST(key AS BIGINT)) AS n FROM controls WHERE kind = ?"
GENERATION = "SELECT value FROM meta WHERE key = 'policy_generation'{lock}"
BUMP_GENERATION = (
    "INSERT INTO meta (key, value) VALUES ('policy_generation', '1') "
    "ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT)"
)
