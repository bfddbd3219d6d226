"""A pull request (or an issue) as an approval thread: `[integrations.github]`'s approval
keys, and the few REST calls a thread needs.

    [integrations.github]
    approve_in_pr = true                 # a waiting git.push / github.pull_request.create
                                         # (false: only where a rule says approve_in_pr = true)
    staging_prefix = "broker/pending/"   # the only branches the broker creates
    staging_public = false               # never stage in a public repository
    issues_repo = "acme/approvals"       # other effects' threads: an issue there
    agent_logins = ["agent-bot[bot]"]    # the agents' own accounts: never decide
    webhook_secret_env = "GITHUB_WEBHOOK_SECRET"

    [approvers.alice]
    github_user = "alice-gh"             # her reviews and /broker comments count as hers

The thread's calls carry a token minted for their repository when the integration
names a provider (`credential = "NAME"`, or a GitHub App's keys: broker.integrations.
github_tokens), else the standing `token_env` / `token_file`. What the broker
remembers of each thread is in broker.integrations.github_store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from broker.config import Config
from broker.errors import ConfigError, EffectFailed
from broker.grants import Provider, provider_for
from broker.integrations.github_store import Receipt, Thread, ThreadStore
from broker.integrations.github_tokens import ThreadTokens
from broker.settings import resolve_secret

if TYPE_CHECKING:
    import httpx

__all__ = [
    "CHECK_NAME",
    "THREAD_CALLS",
    "GitHubThreads",
    "Receipt",
    "Thread",
    "ThreadApi",
    "ThreadSettings",
    "ThreadStore",
]

APPROVAL_EFFECTS = frozenset({"git.push", "github.pull_request.create"})
WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})
CHECK_NAME = "broker/approval"
REPO_NAME = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ThreadSettings:
    """What [integrations.github] says about approving in a pull request or an issue."""

    base_url: str
    token: str | None  # the standing token; None when every call's token is minted
    staging_prefix: str
    agent_logins: frozenset[str]
    webhook_secret: str | None
    users: Mapping[str, str]  # GitHub login (case-folded) → approver
    state_dir: Path
    default_on: bool = True  # approve_in_pr's value: a rule's own approve_in_pr wins
    staging_public: bool = False
    issues_repo: str | None = None

    @property
    def store_path(self) -> Path:
        return self.state_dir / "github.sqlite"


def thread_settings(config: Config) -> ThreadSettings | None:
    """The settings, or None without an approve_in_pr key; a mistake names its key."""
    table = config.integrations.get("github") or {}
    if "approve_in_pr" not in table:
        return None
    where = "integrations.github"
    if not isinstance(table["approve_in_pr"], bool):
        raise ConfigError(f"{where}.approve_in_pr: must be true or false")
    token = resolve_secret(table, "token", where, config.base_dir)
    if not token and provider_for(config.integration("github"), config.credentials) is None:
        raise ConfigError(f"{where}.approve_in_pr: needs token_env or token_file, or a credential")
    prefix = str(table.get("staging_prefix", "broker/pending/"))
    if not prefix.strip("/") or prefix.startswith(("refs/", "/")):
        raise ConfigError(f"{where}.staging_prefix: a branch prefix such as broker/pending/")
    logins = table.get("agent_logins", [])
    if not isinstance(logins, list) or not all(isinstance(x, str) for x in logins):
        raise ConfigError(f"{where}.agent_logins: expected a list of GitHub logins")
    return ThreadSettings(
        str(table.get("base_url", "https://api.github.com")).rstrip("/"),
        token,
        prefix if prefix.endswith("/") else prefix + "/",
        frozenset(x.casefold() for x in logins),
        resolve_secret(table, "webhook_secret", where, config.base_dir),
        _users(config),
        config.state_dir,
        table["approve_in_pr"],
        _flag(table, "staging_public", where),
        _repo_name(table.get("issues_repo"), f"{where}.issues_repo"),
    )


def _users(config: Config) -> dict[str, str]:
    users: dict[str, str] = {}
    for name, entry in config.approvers.items():
        login = entry.get("github_user") if isinstance(entry, Mapping) else None
        if login is not None:
            if not isinstance(login, str) or not login.strip():
                raise ConfigError(f"approvers.{name}.github_user: expected a GitHub login")
            users[login.strip().casefold()] = name.strip().casefold()
    return users


def _flag(table: Mapping[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}: must be true or false")
    return value


def _repo_name(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not REPO_NAME.fullmatch(value):
        raise ConfigError(f"{where}: expected a repository's owner/name")
    return value


class ThreadApi:
    """GitHub's REST calls for a thread; a failure raises EffectFailed naming the call.
    Each call's token is `tokens.token(repo, path)`: minted for that repository, or
    the standing one."""

    def __init__(self, settings: ThreadSettings, tokens: ThreadTokens, timeout: float = 10.0):
        import httpx  # here: every `broker serve` imports this module, few talk to GitHub

        self.tokens = tokens
        self._http: httpx.Client = httpx.Client(
            base_url=settings.base_url,
            timeout=timeout,
            headers={
                "Accept": "application/json",
                "X-GitHub-Api-Version": "2022-11-28",
                "User-Agent": "sandbox-outbox-broker",
            },
        )

    def close(self) -> None:
        self._http.close()
        self.tokens.close()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        repo = "/".join(path.split("?")[0].split("/")[2:4])
        auth = {"Authorization": f"Bearer {self.tokens.token(repo, method, path)}"}
        import httpx

        try:
            answer = self._http.request(method, path, json=body, headers=auth)
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

    def open_draft(self, repo: str, head: str) -> int | None:
        """The open pull request from branch `head` of `repo`, if there is one."""
        owner = repo.split("/", 1)[0]
        found = self.call("GET", f"/repos/{repo}/pulls?state=open&head={quote(owner + ':' + head)}")
        return int(found[0]["number"]) if found else None

    def check_runs(self, repo: str, sha: str) -> list[dict[str, Any]]:
        """The `broker/approval` check runs on commit `sha`."""
        query = f"check_name={quote(CHECK_NAME, safe='')}&per_page=100"
        found = self.call("GET", f"/repos/{repo}/commits/{sha}/check-runs?{query}")
        return list(found.get("check_runs") or [])

    def issue(self, repo: str, title: str, body: str) -> int:
        fields = {"title": title, "body": body}
        return int(self.call("POST", f"/repos/{repo}/issues", fields)["number"])

    def close_pull(self, repo: str, number: int) -> None:
        self.call("PATCH", f"/repos/{repo}/pulls/{number}", {"state": "closed"})

    def close_issue(self, repo: str, number: int) -> None:
        self.call("PATCH", f"/repos/{repo}/issues/{number}", {"state": "closed"})

    def check_run(self, repo: str, sha: str, output: Mapping[str, str]) -> int:
        body = {"name": CHECK_NAME, "head_sha": sha, "status": "queued", "output": dict(output)}
        return int(self.call("POST", f"/repos/{repo}/check-runs", body)["id"])

    def complete_check(
        self, repo: str, run: int, conclusion: str, output: Mapping[str, str]
    ) -> None:
        body = {"status": "completed", "conclusion": conclusion, "output": dict(output)}
        self.call("PATCH", f"/repos/{repo}/check-runs/{run}", body)

    def check_state(self, repo: str, run: int) -> tuple[str, str | None]:
        """The check run's status and conclusion, as GitHub has them now."""
        data = self.call("GET", f"/repos/{repo}/check-runs/{run}")
        return str(data.get("status")), data.get("conclusion")

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
    "open_draft": ("GET", "/repos/{owner}/{repo}/pulls"),
    "check_runs": ("GET", "/repos/{owner}/{repo}/commits/{ref}/check-runs"),
    "issue": ("POST", "/repos/{owner}/{repo}/issues"),
    "close_pull": ("PATCH", "/repos/{owner}/{repo}/pulls/{pull_number}"),
    "close_issue": ("PATCH", "/repos/{owner}/{repo}/issues/{issue_number}"),
    "check_run": ("POST", "/repos/{owner}/{repo}/check-runs"),
    "complete_check": ("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}"),
    "check_state": ("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}"),
    "comments": ("GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments"),
    "reviews": ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"),
}
"""ThreadApi's method → (verb, OpenAPI path): the tests send each through Prism."""


def _ref(branch: str) -> str:
    """A branch as the refs endpoints take it: `heads/NAME`, as one path segment."""
    return quote(f"heads/{branch}", safe="")


class GitHubThreads:
    """The settings, API and store one surface (the web, the poller, the cards) uses."""

    def __init__(self, settings: ThreadSettings, provider: Provider | None = None) -> None:
        self.settings = settings
        self.tokens = ThreadTokens(settings.base_url, settings.token, provider)
        self.api = ThreadApi(settings, self.tokens)
        self.store = ThreadStore(settings.store_path)

    @classmethod
    def of(cls, config: Config) -> GitHubThreads | None:
        """The threads [integrations.github] configures, or None without approve_in_pr."""
        settings = thread_settings(config)
        if settings is None:
            return None
        return cls(settings, provider_for(config.integration("github"), config.credentials))

    def close(self) -> None:
        self.api.close()
        self.store.close()

    def may_decide(self, repo: str, login: str) -> bool:
        return self.api.permission(repo, login) in WRITE_PERMISSIONS
