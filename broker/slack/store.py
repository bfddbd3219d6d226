"""What Slack needs remembered across restarts, in <state>/slack.sqlite3 (beside the
ledger, never in it): which message shows which request, whether its reminder went out,
and the signatures of callbacks already taken (a replay inside the window is refused).
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from broker.errors import LedgerError
from broker.slack.signing import WINDOW_S

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    sandbox TEXT NOT NULL,
    id TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    channel TEXT NOT NULL,
    ts TEXT NOT NULL,
    expires_at REAL,
    on_timeout TEXT,
    remind_at REAL,
    reminded INTEGER NOT NULL DEFAULT 0,
    settled INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sandbox, id)
);
CREATE TABLE IF NOT EXISTS seen (
    signature TEXT PRIMARY KEY,
    at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class Posted:
    """The Slack message that shows one request."""

    sandbox: str
    id: str
    sha256: str
    channel: str
    ts: str
    expires_at: float | None  # epoch seconds
    on_timeout: str | None
    remind_at: float | None
    reminded: bool = False
    settled: bool = False

    @property
    def ref(self) -> str:
        return f"{self.sandbox}/{self.id}"


class SlackStore:
    """One SQLite connection, safe to share between threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise LedgerError(f"{path}: cannot open Slack's store: {exc}") from exc
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def _run(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        with self._lock:
            try:
                return self._db.execute(sql, args)
            except sqlite3.Error as exc:
                raise LedgerError(f"Slack's store: {exc}") from exc

    def remember(self, posted: Posted) -> None:
        self._run(
            "INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                posted.sandbox,
                posted.id,
                posted.sha256,
                posted.channel,
                posted.ts,
                posted.expires_at,
                posted.on_timeout,
                posted.remind_at,
                int(posted.reminded),
                int(posted.settled),
            ),
        )

    def get(self, sandbox: str, request_id: str) -> Posted | None:
        row = self._run(
            "SELECT * FROM messages WHERE sandbox = ? AND id = ?", (sandbox, request_id)
        ).fetchone()
        return _posted(row) if row else None

    def due(self, now: float) -> list[Posted]:
        """Messages whose reminder is due: still open, not yet reminded."""
        rows = self._run(
            "SELECT * FROM messages WHERE settled = 0 AND reminded = 0 AND remind_at <= ? "
            "ORDER BY remind_at",
            (now,),
        ).fetchall()
        return [_posted(r) for r in rows]

    def next_reminder(self) -> float | None:
        row = self._run(
            "SELECT MIN(remind_at) FROM messages WHERE settled = 0 AND reminded = 0"
        ).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def mark(self, posted: Posted, *, reminded: bool = False, settled: bool = False) -> None:
        self._run(
            "UPDATE messages SET reminded = MAX(reminded, ?), settled = MAX(settled, ?) "
            "WHERE sandbox = ? AND id = ?",
            (int(reminded), int(settled), posted.sandbox, posted.id),
        )

    def first_use(self, signature: str, now: float) -> bool:
        """True the first time a callback's signature is seen; False for a replay."""
        self._run("DELETE FROM seen WHERE at < ?", (now - 2 * WINDOW_S,))
        cursor = self._run(
            "INSERT OR IGNORE INTO seen (signature, at) VALUES (?, ?)", (signature, now)
        )
        return cursor.rowcount == 1


def _posted(row: tuple[object, ...]) -> Posted:
    sandbox, rid, sha, channel, ts, expires_at, on_timeout, remind_at, reminded, settled = row
    return Posted(
        str(sandbox),
        str(rid),
        str(sha),
        str(channel),
        str(ts),
        _number(expires_at),
        None if on_timeout is None else str(on_timeout),
        _number(remind_at),
        bool(reminded),
        bool(settled),
    )


def _number(value: object) -> float | None:
    return None if value is None else float(str(value))
