"""A pull request as an approval thread: `[integrations.github]`'s approval keys, the
few REST calls the thread needs, and what the broker remembers about each thread.

    [integrations.github]
    approve_in_pr = true                 # a waiting github.pull_request.create (false:
                                         # only where a rule says approve_in_pr = true)
    staging_prefix = "broker/pending/"   # the only branches the broker creates
    agent_logins = ["agent-bot[bot]"]    # the agents' own accounts: never decide
    webhook_secret_env = "GITHUB_WEBHOOK_SECRET"

    [approvers.alice]
    github_user = "alice-gh"             # her reviews and /broker comments count as hers

The store (`<state>/github.sqlite`) keeps, per request, the thread (repository, pull
number, the head the broker pushed, the card's comment id, the check run), every
comment id taken with the sha256 of its first body, and the webhook delivery ids seen:
a comment or a delivery is taken once.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from broker.clock import REAL
from broker.config import Config
from broker.errors import ConfigError, EffectFailed
from broker.settings import resolve_secret

__all__ = [
    "CHECK_NAME",
    "THREAD_CALLS",
    "GitHubThreads",
    "Thread",
    "ThreadApi",
    "ThreadSettings",
    "ThreadStore",
]

APPROVAL_EFFECTS = frozenset({"git.push", "github.pull_request.create"})
WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})
CHECK_NAME = "broker/approval"


@dataclass(frozen=True)
class ThreadSettings:
    """What [integrations.github] says about approving in a pull request."""

    base_url: str
    token: str
    staging_prefix: str
    agent_logins: frozenset[str]
    webhook_secret: str | None
    users: Mapping[str, str]  # GitHub login (case-folded) → approver
    state_dir: Path
    default_on: bool = True  # approve_in_pr's value: a rule's own approve_in_pr wins

    @property
    def store_path(self) -> Path:
        return self.state_dir / "github.sqlite"


def thread_settings(config: Config) -> ThreadSettings | None:
    """The settings, or None without an approve_in_pr key; a mistake names its key."""
    table = config.integrations.get("github") or {}
    if "approve_in_pr" not in table:
        return None
    if not isinstance(table["approve_in_pr"], bool):
        raise ConfigError("integrations.github.approve_in_pr: must be true or false")
    where = "integrations.github"
    token = resolve_secret(table, "token", where, config.base_dir)
    if not token:
        raise ConfigError(f"{where}.approve_in_pr: needs token_env or token_file")
    prefix = str(table.get("staging_prefix", "broker/pending/"))
    if not prefix.strip("/") or prefix.startswith(("refs/", "/")):
        raise ConfigError(f"{where}.staging_prefix: a branch prefix such as broker/pending/")
    logins = table.get("agent_logins", [])
    if not isinstance(logins, list) or not all(isinstance(x, str) for x in logins):
        raise ConfigError(f"{where}.agent_logins: expected a list of GitHub logins")
    users: dict[str, str] = {}
    for name, entry in config.approvers.items():
        login = entry.get("github_user") if isinstance(entry, Mapping) else None
        if login is not None:
            if not isinstance(login, str) or not login.strip():
                raise ConfigError(f"approvers.{name}.github_user: expected a GitHub login")
            users[login.strip().casefold()] = name.strip().casefold()
    return ThreadSettings(
        str(table.get("base_url", "https://api.github.com")).rstrip("/"),
        token,
        prefix if prefix.endswith("/") else prefix + "/",
        frozenset(x.casefold() for x in logins),
        resolve_secret(table, "webhook_secret", where, config.base_dir),
        users,
        config.state_dir,
        table["approve_in_pr"],
    )


class ThreadApi:
    """GitHub's REST calls for a thread; a failure raises EffectFailed naming the call."""

    def __init__(self, settings: ThreadSettings, timeout: float = 10.0) -> None:
        self._http = httpx.Client(
            base_url=settings.base_url,
            timeout=timeout,
            headers={
                "Authorization": f"Bearer {settings.token}",
                "Accept": "application/json",
                "X-GitHub-Api-Version": "2022-11-28",
                "User-Agent": "sandbox-outbox-broker",
            },
        )

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            answer = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise EffectFailed(f"GitHub {method} {path}: {exc}") from exc
        if answer.status_code >= 400:
            raise EffectFailed(f"GitHub {method} {path}: {answer.status_code} {answer.text[:200]}")
        return answer.json() if answer.content else None

    def permission(self, repo: str, login: str) -> str:
        """The login's permission on the repository, read now (none when not a collaborator)."""
        try:
            data = self.call("GET", f"/repos/{repo}/collaborators/{login}/permission")
        except EffectFailed as exc:
            if " 404 " in str(exc):
                return "none"
            raise
        return str(data.get("permission") or "none")

    def comment(self, repo: str, comment_id: int) -> dict[str, Any]:
        return dict(self.call("GET", f"/repos/{repo}/issues/comments/{comment_id}"))

    def reply(self, repo: str, number: int, body: str) -> dict[str, Any]:
        return dict(self.call("POST", f"/repos/{repo}/issues/{number}/comments", {"body": body}))

    def edit_comment(self, repo: str, comment_id: int, body: str) -> None:
        self.call("PATCH", f"/repos/{repo}/issues/comments/{comment_id}", {"body": body})

    def head(self, repo: str, number: int) -> str:
        return str(self.call("GET", f"/repos/{repo}/pulls/{number}")["head"]["sha"])

    def private(self, repo: str) -> bool:
        return bool(self.call("GET", f"/repos/{repo}").get("private"))

    def branch_sha(self, repo: str, branch: str) -> str:
        return str(self.call("GET", f"/repos/{repo}/git/ref/{_ref(branch)}")["object"]["sha"])

    def create_branch(self, repo: str, branch: str, sha: str) -> None:
        self.call("POST", f"/repos/{repo}/git/refs", {"ref": f"refs/heads/{branch}", "sha": sha})

    def delete_branch(self, repo: str, branch: str) -> None:
        self.call("DELETE", f"/repos/{repo}/git/refs/{_ref(branch)}")

    def draft(self, repo: str, head: str, base: str, title: str, body: str) -> int:
        fields = {"title": title, "head": head, "base": base, "draft": True, "body": body}
        return int(self.call("POST", f"/repos/{repo}/pulls", fields)["number"])

    def close_pull(self, repo: str, number: int) -> None:
        self.call("PATCH", f"/repos/{repo}/pulls/{number}", {"state": "closed"})

    def check_run(self, repo: str, sha: str, output: Mapping[str, str]) -> int:
        body = {"name": CHECK_NAME, "head_sha": sha, "status": "queued", "output": dict(output)}
        return int(self.call("POST", f"/repos/{repo}/check-runs", body)["id"])

    def complete_check(
        self, repo: str, run: int, conclusion: str, output: Mapping[str, str]
    ) -> None:
        body = {"status": "completed", "conclusion": conclusion, "output": dict(output)}
        self.call("PATCH", f"/repos/{repo}/check-runs/{run}", body)

    def comments(self, repo: str, number: int) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/repos/{repo}/issues/{number}/comments?per_page=100"))

    def reviews(self, repo: str, number: int) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/repos/{repo}/pulls/{number}/reviews?per_page=100"))


THREAD_CALLS = {
    "permission": ("GET", "/repos/{owner}/{repo}/collaborators/{username}/permission"),
    "comment": ("GET", "/repos/{owner}/{repo}/issues/comments/{comment_id}"),
    "reply": ("POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments"),
    "edit_comment": ("PATCH", "/repos/{owner}/{repo}/issues/comments/{comment_id}"),
    "head": ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}"),
    "private": ("GET", "/repos/{owner}/{repo}"),
    "branch_sha": ("GET", "/repos/{owner}/{repo}/git/ref/{ref}"),
    "create_branch": ("POST", "/repos/{owner}/{repo}/git/refs"),
    "delete_branch": ("DELETE", "/repos/{owner}/{repo}/git/refs/{ref}"),
    "draft": ("POST", "/repos/{owner}/{repo}/pulls"),
    "close_pull": ("PATCH", "/repos/{owner}/{repo}/pulls/{pull_number}"),
    "check_run": ("POST", "/repos/{owner}/{repo}/check-runs"),
    "complete_check": ("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}"),
    "comments": ("GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments"),
    "reviews": ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"),
}
"""ThreadApi's method → (verb, OpenAPI path): the tests send each through Prism."""


def _ref(branch: str) -> str:
    """A branch as the refs endpoints take it: `heads/NAME`, as one path segment."""
    return quote(f"heads/{branch}", safe="")


@dataclass(frozen=True)
class Thread:
    """Where one request is approved: its pull request, the head shown, its card."""

    sandbox: str
    request_id: str
    sha256: str
    repo: str
    number: int
    head: str
    card_comment: int
    check_run: int | None = None
    branch: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.sandbox}/{self.request_id}"


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
"""


class ThreadStore:
    """What the broker remembers of its threads, comments and deliveries (SQLite)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:  # never under another thread's statement
            self._db.close()

    def add(self, thread: Thread) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO threads VALUES (?,?,?,?,?,?,?,?,?)",
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
                ),
            )

    def by_pull(self, repo: str, number: int) -> Thread | None:
        return self._one("repo = ? AND number = ?", (repo.lower(), number))

    def by_request(self, sandbox: str, request_id: str) -> Thread | None:
        return self._one("sandbox = ? AND request_id = ?", (sandbox, request_id))

    def all(self) -> list[Thread]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM threads").fetchall()
        return [Thread(*row) for row in rows]

    def _one(self, where: str, args: tuple[Any, ...]) -> Thread | None:
        with self._lock:
            row = self._db.execute(f"SELECT * FROM threads WHERE {where}", args).fetchone()
        return Thread(*row) if row else None

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

    def close_thread(self, sandbox: str, request_id: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO closed VALUES (?,?)", (sandbox, request_id))

    def closed(self, sandbox: str, request_id: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM closed WHERE sandbox = ? AND request_id = ?", (sandbox, request_id)
            ).fetchone()
        return row is not None

    def _first(self, table: str, key: str) -> bool:
        with self._lock:
            try:
                self._db.execute(f"INSERT INTO {table} VALUES (?,?)", (key, REAL.time()))
            except sqlite3.IntegrityError:
                return False
        return True

    def first_delivery(self, delivery: str) -> bool:
        """True the first time a webhook delivery id is seen; a replay is False."""
        return self._first("deliveries", delivery)


class GitHubThreads:
    """The settings, API and store one surface (the web, the poller, the notifier) uses."""

    def __init__(self, settings: ThreadSettings) -> None:
        self.settings = settings
        self.api = ThreadApi(settings)
        self.store = ThreadStore(settings.store_path)

    def close(self) -> None:
        self.api.close()
        self.store.close()

    def may_decide(self, repo: str, login: str) -> bool:
        return self.api.permission(repo, login) in WRITE_PERMISSIONS
