"""What the broker remembers about its GitHub approval threads (`<state>/github.sqlite`):
per request, the thread (repository, pull request or issue number, the head the broker
pushed, the card's comment id, the check run, the staging branch); every comment id
taken with the sha256 of its first body; the webhook delivery ids seen; the events
looked at; the threads closed; and the receipts still to send (broker.integrations.
github_receipts), so a receipt queued before a crash is sent after it, once.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.clock import REAL

__all__ = ["Receipt", "Thread", "ThreadStore"]


@dataclass(frozen=True)
class Thread:
    """Where one request is approved: its pull request (or issue), the head shown, its card."""

    sandbox: str
    request_id: str
    sha256: str
    repo: str
    number: int
    head: str  # "" for an issue thread: there is no commit to bind to
    card_comment: int
    check_run: int | None = None
    branch: str | None = None
    kind: str = "pull"  # pull | issue

    @property
    def ref(self) -> str:
        return f"{self.sandbox}/{self.request_id}"


@dataclass(frozen=True)
class Receipt:
    """One call the thread is owed (a reply, the card edited, the check completed, the
    draft closed, the branch deleted), under a key that makes it one."""

    key: str
    repo: str
    call: str  # a ThreadApi method: reply, edit_comment, complete_check, close, delete_branch
    args: dict[str, Any]
    tries: int = 0


_SCHEMA = """
CREATE TABLE IF NOT EXISTS threads (
  sandbox TEXT, request_id TEXT, sha256 TEXT, repo TEXT, number INTEGER, head TEXT,
  card_comment INTEGER, check_run INTEGER, branch TEXT, PRIMARY KEY (sandbox, request_id));
CREATE UNIQUE INDEX IF NOT EXISTS threads_pr ON threads (repo, number);
CREATE TABLE IF NOT EXISTS taken (comment_id INTEGER PRIMARY KEY, body_sha256 TEXT, at REAL);
CREATE TABLE IF NOT EXISTS deliveries (id TEXT PRIMARY KEY, at REAL);
CREATE TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY, at REAL);
CREATE TABLE IF NOT EXISTS closed (
  sandbox TEXT, request_id TEXT, PRIMARY KEY (sandbox, request_id));
CREATE TABLE IF NOT EXISTS receipts (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT UNIQUE, repo TEXT, call TEXT, args TEXT,
  tries INTEGER DEFAULT 0, done INTEGER DEFAULT 0, at REAL);
"""
_COLUMNS = "sandbox, request_id, sha256, repo, number, head, card_comment, check_run, branch, kind"


class ThreadStore:
    """The threads, comments, deliveries and receipts of one state dir (SQLite)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 10000")  # the web server's and the broker's
        self._lock = threading.Lock()
        with self._lock:
            self._db.executescript(_SCHEMA)
            columns = [row[1] for row in self._db.execute("PRAGMA table_info(threads)")]
            if "kind" not in columns:  # a store from before issue threads
                self._db.execute("ALTER TABLE threads ADD COLUMN kind TEXT DEFAULT 'pull'")

    def close(self) -> None:
        with self._lock:  # never under another thread's statement
            self._db.close()

    # -- threads

    def add(self, thread: Thread) -> None:
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO threads ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    thread.sandbox,
                    thread.request_id,
                    thread.sha256,
                    thread.repo.lower(),
                    thread.number,
                    thread.head,
                    thread.card_comment,
                    thread.check_run,
                    thread.branch,
                    thread.kind,
                ),
            )

    def by_pull(self, repo: str, number: int) -> Thread | None:
        """The thread of a pull request or issue number in `repo`."""
        return self._one("repo = ? AND number = ?", (repo.lower(), number))

    def by_request(self, sandbox: str, request_id: str) -> Thread | None:
        return self._one("sandbox = ? AND request_id = ?", (sandbox, request_id))

    def all(self) -> list[Thread]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM threads").fetchall()
        return [Thread(*row) for row in rows]

    def _one(self, where: str, args: tuple[Any, ...]) -> Thread | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM threads WHERE {where}", args).fetchone()
        return Thread(*row) if row else None

    def close_thread(self, sandbox: str, request_id: str) -> bool:
        """Mark the thread closed; True the first time (whoever closes it sends its receipts)."""
        with self._lock:
            done = self._db.execute(
                "INSERT OR IGNORE INTO closed VALUES (?,?)", (sandbox, request_id)
            )
        return done.rowcount == 1

    def closed(self, sandbox: str, request_id: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM closed WHERE sandbox = ? AND request_id = ?", (sandbox, request_id)
            ).fetchone()
        return row is not None

    # -- comments, events, deliveries

    def take_comment(self, comment_id: int, body: str) -> str | None:
        """Remember a comment's first body; None the first time, else that first body's sha256."""
        digest = hashlib.sha256(body.encode()).hexdigest()
        with self._lock:
            row = self._db.execute(
                "SELECT body_sha256 FROM taken WHERE comment_id = ?", (comment_id,)
            ).fetchone()
            if row is not None:
                return str(row[0])
            self._db.execute("INSERT INTO taken VALUES (?,?,?)", (comment_id, digest, REAL.time()))
        return None

    def first_look(self, key: str) -> bool:
        """True the first time a comment or review (`comment:ID:ACTION`) is looked at."""
        return self._first("seen", key)

    def looked(self, key: str) -> bool:
        with self._lock:
            return (
                self._db.execute("SELECT 1 FROM seen WHERE key = ?", (key,)).fetchone() is not None
            )

    def first_delivery(self, delivery: str) -> bool:
        """True the first time a webhook delivery id is seen; a replay is False."""
        return self._first("deliveries", delivery)

    def _first(self, table: str, key: str) -> bool:
        with self._lock:
            try:
                self._db.execute(f"INSERT INTO {table} VALUES (?,?)", (key, REAL.time()))
            except sqlite3.IntegrityError:
                return False
        return True

    # -- receipts

    def owe(self, receipts: list[Receipt]) -> None:
        """Queue receipts, in order; one already queued under its key is not queued again.
        A key is `<sandbox>/<id>|<what>`: a thread's receipts are sent in their order."""
        now = REAL.time()
        with self._lock:
            self._db.executemany(
                "INSERT OR IGNORE INTO receipts (key, repo, call, args, at) VALUES (?,?,?,?,?)",
                [(r.key, r.repo, r.call, json.dumps(r.args), now) for r in receipts],
            )

    def fill(self, key: str, args: dict[str, Any]) -> None:
        """Give a receipt queued ahead of its words (an answer being decided) its words."""
        with self._lock:
            self._db.execute(
                "UPDATE receipts SET args = ? WHERE key = ? AND done = 0", (json.dumps(args), key)
            )

    def forget(self, key: str) -> None:
        """Drop a receipt queued ahead that turned out to be owed nothing (not a command)."""
        with self._lock:
            self._db.execute("DELETE FROM receipts WHERE key = ? AND done = 0", (key,))

    def owed(self, ref: str | None = None, older_than: float | None = None) -> list[Receipt]:
        """The receipts not sent yet (of thread `ref`, or all; queued before `older_than`),
        oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT key, repo, call, args, tries FROM receipts WHERE done = 0 "
                "AND (? IS NULL OR at < ?) ORDER BY seq",
                (older_than, older_than),
            ).fetchall()
        return [
            Receipt(key, repo, call, json.loads(args), tries)
            for key, repo, call, args, tries in rows
            if ref is None or key.startswith(f"{ref}|")
        ]

    def trying(self, key: str) -> None:
        """Before a send: a receipt tried before may have reached GitHub (sent_check)."""
        with self._lock:
            self._db.execute("UPDATE receipts SET tries = tries + 1 WHERE key = ?", (key,))

    def sent(self, key: str) -> None:
        with self._lock:
            self._db.execute("UPDATE receipts SET done = 1 WHERE key = ?", (key,))
