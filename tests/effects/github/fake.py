"""A recording stand-in for the GitHub REST API on 127.0.0.1, with state.

Only the endpoints effects/github/ calls. Branches, commits, trees and blobs are those
of a real bare git repository per repo (so a `git.push` to that repository and this
fake see the same branches); pull requests, issues, comments and labels live in memory.
Every request is recorded (`calls`), and faults can be queued per route (`fault`).

Why it exists next to Prism: Prism answers every call with the spec's example and keeps
no state, so what depends on state (an open pull request found again, a base that moved,
a blob that changed, a branch created then deleted) is tested here.

Used by the tests under tests/effects/github/ and by scripts/demo_github.py.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import jwt

GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "broker-bot",
    "GIT_AUTHOR_EMAIL": "broker-bot@users.noreply.example",
    "GIT_COMMITTER_NAME": "broker-bot",
    "GIT_COMMITTER_EMAIL": "broker-bot@users.noreply.example",
    "LC_ALL": "C",
}
ZERO = "0" * 40
DEFAULT_USERS = frozenset({"alice", "bob", "carol", "octocat"})
DEFAULT_TEAMS = frozenset({"reviewers", "core"})

Reply = tuple[int, Any]


class GitFailed(Exception):
    """A git command in a fake repository failed."""


def git(repo: Path, *args: str, data: bytes | None = None, env: Mapping[str, str] = {}) -> str:
    done = subprocess.run(
        ["git", "--git-dir", str(repo), *args],
        input=data,
        capture_output=True,
        env={**GIT_ENV, **env},
    )
    if done.returncode != 0:
        raise GitFailed(done.stderr.decode("utf-8", "replace").strip())
    return done.stdout.decode("utf-8", "replace")


def seed_repo(repo: Path, files: Mapping[str, str], branch: str = "main") -> str:
    """A bare repository with one commit of `files` on `branch`; returns its SHA."""
    subprocess.run(
        ["git", "init", "-q", "--bare", "-b", branch, str(repo)], check=True, env=GIT_ENV
    )
    tree = write_tree(repo, None, {p: c.encode() for p, c in files.items()})
    sha = git(repo, "commit-tree", tree, "-m", "initial").strip()
    git(repo, "update-ref", f"refs/heads/{branch}", sha)
    return sha


def write_tree(repo: Path, base: str | None, files: Mapping[str, bytes | None]) -> str:
    """A tree: `base` with `files` written (None: removed), built in a private index."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", *([base] if base else ["--empty"]), env=env)
        lines = []
        for path, data in files.items():
            if data is None:
                lines.append(f"0 {ZERO}\t{path}\n")
            else:
                sha = git(repo, "hash-object", "-w", "--stdin", data=data).strip()
                lines.append(f"100644 {sha}\t{path}\n")
        git(repo, "update-index", "--index-info", data="".join(lines).encode(), env=env)
        return git(repo, "write-tree", env=env).strip()


def commit_on(
    repo: Path,
    branch: str,
    files: Mapping[str, bytes | None],
    message: str = "a change",
    *,
    start: str | None = None,
) -> str:
    """Commit `files` on `branch` (a new one starts at `start`), as a push would."""
    ref = f"refs/heads/{branch}"
    try:
        old = git(repo, "rev-parse", "--verify", "--quiet", ref).strip()
    except GitFailed:
        old = ""
    if not old and start is None:
        raise GitFailed(f"no branch {branch}; give start= to create it")
    parent = old or git(repo, "rev-parse", f"refs/heads/{start}").strip()
    tree = write_tree(repo, f"{parent}^{{tree}}", files)
    sha = git(repo, "commit-tree", tree, "-p", parent, "-m", message).strip()
    git(repo, "update-ref", ref, sha, old or ZERO)
    return sha


@dataclass
class Call:
    """One request the fake answered."""

    method: str
    path: str
    route: str
    query: dict[str, str]
    body: Any
    status: int
    auth: str


@dataclass
class Fault:
    """Answer `method route` with this, `times` times, after `delay` seconds."""

    method: str
    route: str
    status: int
    body: Any
    headers: dict[str, str]
    times: int
    delay: float


APP_PERMISSIONS = {
    "contents": "write",
    "pull_requests": "write",
    "issues": "write",
    "checks": "write",
    "metadata": "read",
}
"""What the test App is granted on its installation ("write" > "read" as strings)."""


def needed(route: str, verb: str) -> tuple[set[str], str]:
    """The permissions of which any one, at this level, lets a token call `route`."""
    level = "read" if verb == "GET" else "write"
    if "/check-runs" in route:
        return {"checks"}, level
    if "/collaborators/" in route or route == "/repos/{owner}/{repo}":
        return {"metadata"}, "read"
    if "/git/" in route or "/compare/" in route:
        return {"contents"}, level
    if "/pulls" in route:
        return {"pull_requests"}, level
    return {"issues", "pull_requests"}, level  # GitHub takes either on a PR's issue routes


@dataclass
class Minted:
    """An installation token the fake issued: the repositories and permissions it has."""

    repositories: set[str] | None
    permissions: dict[str, str]

    def allows(self, full_name: str, route: str, verb: str) -> bool:
        if self.repositories is not None and full_name not in self.repositories:
            return False
        names, level = needed(route, verb)
        return any(self.permissions.get(n, "") >= level for n in names)


@dataclass
class Repo:
    """One repository: its bare git directory and its issues, pulls and comments."""

    full_name: str
    git_dir: Path
    threads: dict[int, dict[str, Any]] = field(default_factory=dict)  # issues and pulls
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    issues_enabled: bool = True

    @property
    def owner(self) -> str:
        return self.full_name.split("/")[0]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def setup(self) -> None:
        super().setup()
        # answers go out as headers then body: without this, Nagle and delayed ACKs
        # add 40 ms to every request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        status, data, headers = self.server.fake.dispatch(
            self.command, self.path, dict(self.headers.items()), raw
        )
        payload = b"" if data is None else json.dumps(data).encode()
        if isinstance(data, str):
            payload = data.encode()
        self.send_response(status)
        kind = "text/plain" if isinstance(data, str) else "application/json"
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (the timeout tests)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeGitHub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake


Endpoint = Callable[[Repo, dict[str, str], dict[str, str], Any], Reply]


class FakeGitHub:
    """GitHub's REST API for a few repositories, recorded; start() it, then use .url."""

    def __init__(
        self,
        *,
        token: str = "fake-token",
        app: tuple[int, str, int] | None = None,
        users: Iterable[str] = DEFAULT_USERS,
        teams: Iterable[str] = DEFAULT_TEAMS,
    ) -> None:
        """`app`: (app id, the App's public key PEM, installation id) to accept App auth."""
        self.token = token
        self.app = app
        self.users = set(users)
        self.teams = set(teams)
        self.repos: dict[str, Repo] = {}
        self.calls: list[Call] = []
        self.faults: list[Fault] = []
        self.installation_tokens: dict[str, Minted] = {}
        self.revoked: list[str] = []
        self._lock = threading.RLock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._next_comment = 1000
        self._verb = "GET"
        self._routes: list[tuple[str, str, re.Pattern[str], Endpoint]] = []
        for method, route, fn in self._endpoints():
            pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", route)
            self._routes.append((method, route, re.compile(pattern + r"\Z"), fn))

    # -- life

    def start(self) -> FakeGitHub:
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-github", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- set-up and inspection

    def add_repo(self, full_name: str, git_dir: Path) -> Repo:
        repo = Repo(full_name, git_dir)
        self.repos[full_name.lower()] = repo
        return repo

    def fault(
        self,
        method: str,
        route: str,
        status: int,
        body: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
        times: int = 1,
        delay: float = 0.0,
    ) -> None:
        """Answer the next `times` calls of `method route` (an OpenAPI path) with this."""
        with self._lock:
            self.faults.append(
                Fault(
                    method,
                    route,
                    status,
                    body or {"message": "x"},
                    dict(headers or {}),
                    times,
                    delay,
                )
            )

    def called(self, method: str | None = None, route: str | None = None) -> list[Call]:
        with self._lock:
            return [
                c
                for c in self.calls
                if (method is None or c.method == method) and (route is None or c.route == route)
            ]

    def routes_called(self) -> set[tuple[str, str]]:
        with self._lock:
            return {(c.method, c.route) for c in self.calls}

    def thread(self, full_name: str, number: int) -> dict[str, Any]:
        return self.repos[full_name.lower()].threads[number]

    def pulls(self, full_name: str) -> list[dict[str, Any]]:
        repo = self.repos[full_name.lower()]
        return [t for t in repo.threads.values() if t["kind"] == "pull"]

    # -- dispatch

    def dispatch(
        self, method: str, target: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        split = urlsplit(target)
        path, query = split.path, dict(parse_qsl(split.query))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        auth = {k.lower(): v for k, v in headers.items()}.get("authorization", "")
        route, status, data, extra = "?", 404, {"message": "Not Found"}, {}
        with self._lock:
            for verb, template, pattern, fn in self._routes:
                match = pattern.match(path)
                if not match or verb != method:
                    continue
                route = template
                fault = self._fault(method, route)
                if fault is not None:
                    if fault.delay:
                        time.sleep(fault.delay)
                    status, data, extra = fault.status, fault.body, fault.headers
                    break
                params = {k: unquote(v) for k, v in match.groupdict().items()}
                self._verb = method
                status, data = self._call(fn, params, query, body, auth, route)
                break
            else:
                if method == "GET" and re.match(r"/[^/]+/[^/]+/(pull|issues)/\d+\Z", path):
                    route, (status, data) = "(html)", self._page(path)
            self.calls.append(Call(method, path, route, query, body, status, auth))
        return status, data, extra

    def _fault(self, method: str, route: str) -> Fault | None:
        for fault in self.faults:
            if fault.times > 0 and fault.method == method and fault.route in (route, "*"):
                fault.times -= 1
                return fault
        return None

    def _call(
        self,
        fn: Endpoint,
        params: dict[str, str],
        query: dict[str, str],
        body: Any,
        auth: str,
        route: str,
    ) -> Reply:
        if route.startswith("/app/"):
            return self._access_token(params, auth, body)
        presented = auth.split(" ", 1)[-1]
        if route == "/installation/token":
            if self.installation_tokens.pop(presented, None) is None:
                return 401, {"message": "Bad credentials"}
            self.revoked.append(presented)
            return 204, None
        if presented not in {self.token, *self.installation_tokens}:
            return 401, {"message": "Bad credentials", "documentation_url": "https://docs"}
        full_name = f"{params.get('owner')}/{params.get('repo')}".lower()
        minted = self.installation_tokens.get(presented)
        if minted is not None and not minted.allows(full_name, route, self._verb):
            # GitHub answers a token without the repository or the permission so
            return 403, {"message": "Resource not accessible by integration"}
        repo = self.repos.get(full_name)
        if repo is None:
            return 404, {"message": "Not Found"}
        try:
            return fn(repo, params, query, body)
        except GitFailed:
            return 404, {"message": "Not Found"}

    def _access_token(self, params: dict[str, str], auth: str, body: Any) -> Reply:
        if self.app is None:
            return 404, {"message": "Not Found"}
        app_id, public_key, installation = self.app
        try:
            claims = jwt.decode(
                auth.removeprefix("Bearer "),
                public_key,
                algorithms=["RS256"],
                options={"verify_iss": False},
            )
        except jwt.PyJWTError:
            return 401, {"message": "A JSON web token could not be decoded"}
        if str(claims.get("iss")) != str(app_id):
            return 401, {"message": "'Issuer' claim ('iss') must be the App's id"}
        if params["installation_id"] != str(installation):
            return 404, {"message": "Not Found"}
        body = body if isinstance(body, dict) else {}
        names = body.get("repositories")
        owned = {r.full_name.split("/")[1].lower(): r.full_name for r in self.repos.values()}
        if names is not None and any(str(n).lower() not in owned for n in names):
            return 422, {
                "message": "There is at least one repository that does not exist or is not "
                "accessible to the parent installation."
            }
        permissions = dict(body.get("permissions") or APP_PERMISSIONS)
        if any(APP_PERMISSIONS.get(k, "") < v for k, v in permissions.items()):
            return 422, {
                "message": "The permissions requested are not granted to this installation."
            }
        token = "ghs_" + secrets.token_hex(16)
        repos = None if names is None else {owned[str(n).lower()].lower() for n in names}
        self.installation_tokens[token] = Minted(repos, {**permissions, "metadata": "read"})
        expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        answer: dict[str, Any] = {
            "token": token,
            "expires_at": expires,
            "permissions": self.installation_tokens[token].permissions,
            "repository_selection": "all" if repos is None else "selected",
        }
        if repos is not None:
            answer["repositories"] = [{"full_name": r} for r in sorted(repos)]
        return 201, answer

    def _endpoints(self) -> list[tuple[str, str, Endpoint]]:
        r = "/repos/{owner}/{repo}"
        return [
            ("POST", "/app/installations/{installation_id}/access_tokens", self._no_repo),
            ("DELETE", "/installation/token", self._no_repo),
            ("GET", f"{r}/git/ref/{{ref}}", self._get_ref),
            ("POST", f"{r}/git/refs", self._create_ref),
            ("DELETE", f"{r}/git/refs/{{ref}}", self._delete_ref),
            ("GET", f"{r}/git/commits/{{commit_sha}}", self._get_commit),
            ("POST", f"{r}/git/commits", self._create_commit),
            ("GET", f"{r}/git/trees/{{tree_sha}}", self._get_tree),
            ("POST", f"{r}/git/trees", self._create_tree),
            ("GET", f"{r}/git/blobs/{{file_sha}}", self._get_blob),
            ("POST", f"{r}/git/blobs", self._create_blob),
            ("GET", f"{r}/compare/{{basehead}}", self._compare),
            ("GET", f"{r}/pulls", self._list_pulls),
            ("POST", f"{r}/pulls", self._create_pull),
            ("GET", f"{r}/pulls/{{pull_number}}", self._get_pull),
            ("PATCH", f"{r}/pulls/{{pull_number}}", self._update_pull),
            ("POST", f"{r}/pulls/{{pull_number}}/requested_reviewers", self._request_reviewers),
            ("POST", f"{r}/issues", self._create_issue),
            ("DELETE", f"{r}/issues/comments/{{comment_id}}", self._delete_comment),
            ("GET", f"{r}/issues/{{issue_number}}", self._get_issue),
            ("PATCH", f"{r}/issues/{{issue_number}}", self._update_issue),
            ("POST", f"{r}/issues/{{issue_number}}/comments", self._create_comment),
            ("GET", f"{r}/issues/{{issue_number}}/labels", self._get_labels),
            ("POST", f"{r}/issues/{{issue_number}}/labels", self._add_labels),
            ("DELETE", f"{r}/issues/{{issue_number}}/labels/{{name}}", self._remove_label),
        ]

    def _no_repo(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        raise AssertionError("answered in _call")

    # -- git data

    def _api(self, repo: Repo, rest: str) -> str:
        return f"{self.url}/repos/{repo.full_name}/{rest}"

    def _rev(self, repo: Repo, name: str) -> str | None:
        try:
            return git(repo.git_dir, "rev-parse", "--verify", "--quiet", name).strip() or None
        except GitFailed:
            return None

    def _kind(self, repo: Repo, sha: str) -> str | None:
        if not re.fullmatch(r"[0-9a-f]{40}", sha):
            return None
        try:
            return git(repo.git_dir, "cat-file", "-t", sha).strip()
        except GitFailed:
            return None

    def _get_ref(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        ref = p["ref"]
        sha = self._rev(repo, f"refs/{ref}")
        if sha is None or not ref.startswith(("heads/", "tags/")):
            return 404, {"message": "Not Found"}
        return 200, {
            "ref": f"refs/{ref}",
            "node_id": "REF_" + sha[:8],
            "url": self._api(repo, f"git/refs/{ref}"),
            "object": {"sha": sha, "type": "commit", "url": self._api(repo, f"git/commits/{sha}")},
        }

    def _create_ref(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        ref, sha = str(body.get("ref", "")), str(body.get("sha", ""))
        if not re.fullmatch(r"refs/[^/]+/.+", ref):
            return 422, {"message": "Reference name must start with 'refs/' and have two slashes"}
        if self._kind(repo, sha) != "commit":
            return 422, {"message": "Object does not exist"}
        if self._rev(repo, ref) is not None:
            return 422, {"message": "Reference already exists"}
        git(repo.git_dir, "update-ref", ref, sha, ZERO)
        return 201, {
            "ref": ref,
            "url": self._api(repo, f"git/{ref}"),
            "object": {"sha": sha, "type": "commit"},
        }

    def _delete_ref(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        ref = f"refs/{p['ref']}"
        if self._rev(repo, ref) is None:
            return 422, {"message": "Reference does not exist"}
        git(repo.git_dir, "update-ref", "-d", ref)
        return 204, None

    def _commit_json(self, repo: Repo, sha: str) -> dict[str, Any]:
        text = git(repo.git_dir, "cat-file", "commit", sha)
        head, _, message = text.partition("\n\n")
        tree, parents, people = "", [], {}
        for line in head.splitlines():
            key, _, value = line.partition(" ")
            if key == "tree":
                tree = value
            elif key == "parent":
                parents.append(value)
            elif key in ("author", "committer"):
                m = re.match(r"(.*) <(.*)> (\d+) ", value)
                if m:
                    stamp = datetime.fromtimestamp(int(m.group(3)), UTC)
                    people[key] = {
                        "name": m.group(1),
                        "email": m.group(2),
                        "date": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
        return {
            "sha": sha,
            "node_id": "C_" + sha[:8],
            "url": self._api(repo, f"git/commits/{sha}"),
            "html_url": f"{self.url}/{repo.full_name}/commit/{sha}",
            "author": people.get("author", {}),
            "committer": people.get("committer", {}),
            "message": message.rstrip("\n"),
            "tree": {"sha": tree, "url": self._api(repo, f"git/trees/{tree}")},
            "parents": [{"sha": s, "url": self._api(repo, f"git/commits/{s}")} for s in parents],
            "verification": {"verified": False, "reason": "unsigned"},
        }

    def _get_commit(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        if self._kind(repo, p["commit_sha"]) != "commit":
            return 404, {"message": "Not Found"}
        return 200, self._commit_json(repo, p["commit_sha"])

    def _create_commit(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        tree, parents = str(body.get("tree", "")), body.get("parents") or []
        if self._kind(repo, tree) != "tree":
            return 422, {"message": "Tree SHA does not exist"}
        if any(self._kind(repo, str(s)) != "commit" for s in parents):
            return 422, {"message": "Parent SHA does not exist or is not a commit object"}
        args = ["commit-tree", tree, "-m", str(body.get("message", ""))]
        for parent in parents:
            args += ["-p", str(parent)]
        sha = git(repo.git_dir, *args).strip()
        return 201, self._commit_json(repo, sha)

    def _tree_json(self, repo: Repo, sha: str) -> dict[str, Any]:
        listing = git(repo.git_dir, "ls-tree", "-l", "-z", sha)
        entries = []
        for item in filter(None, listing.split("\0")):
            meta, _, path = item.partition("\t")
            mode, kind, obj, size = meta.split()
            entry: dict[str, Any] = {"path": path, "mode": mode, "type": kind, "sha": obj}
            if kind == "blob":
                entry["size"] = int(size)
            entry["url"] = self._api(repo, f"git/{kind}s/{obj}")
            entries.append(entry)
        url = self._api(repo, f"git/trees/{sha}")
        return {"sha": sha, "url": url, "tree": entries, "truncated": False}

    def _get_tree(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        if self._kind(repo, p["tree_sha"]) != "tree":
            return 404, {"message": "Not Found"}
        return 200, self._tree_json(repo, p["tree_sha"])

    def _create_tree(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        base = body.get("base_tree")
        if base is not None and self._kind(repo, str(base)) != "tree":
            return 422, {"message": "base_tree is not a valid tree oid"}
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            git(repo.git_dir, "read-tree", *([str(base)] if base else ["--empty"]), env=env)
            lines = []
            for entry in body.get("tree") or []:
                path, mode = str(entry.get("path", "")), str(entry.get("mode", ""))
                if "content" in entry:
                    data = str(entry["content"]).encode()
                    sha = git(repo.git_dir, "hash-object", "-w", "--stdin", data=data).strip()
                else:
                    sha = entry.get("sha")
                if sha is None:
                    lines.append(f"0 {ZERO}\t{path}\n")
                    continue
                if mode not in ("100644", "100755") or self._kind(repo, str(sha)) != "blob":
                    return 422, {"message": f"tree.sha {sha} is not a valid blob"}
                lines.append(f"{mode} {sha}\t{path}\n")
            info = "".join(lines).encode()
            git(repo.git_dir, "update-index", "--index-info", data=info, env=env)
            tree = git(repo.git_dir, "write-tree", env=env).strip()
        return 201, self._tree_json(repo, tree)

    def _get_blob(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        sha = p["file_sha"]
        if self._kind(repo, sha) != "blob":
            return 404, {"message": "Not Found"}
        done = subprocess.run(
            ["git", "--git-dir", str(repo.git_dir), "cat-file", "blob", sha],
            capture_output=True,
            env=GIT_ENV,
            check=True,
        )
        content = base64.encodebytes(done.stdout).decode()
        return 200, {
            "sha": sha,
            "node_id": "B_" + sha[:8],
            "size": len(done.stdout),
            "url": self._api(repo, f"git/blobs/{sha}"),
            "content": content,
            "encoding": "base64",
        }

    def _create_blob(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        content = str(body.get("content", ""))
        if body.get("encoding") == "base64":
            data = base64.b64decode(content)
        else:
            data = content.encode()
        sha = git(repo.git_dir, "hash-object", "-w", "--stdin", data=data).strip()
        return 201, {"sha": sha, "url": self._api(repo, f"git/blobs/{sha}")}

    def _compare(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        base_name, _, head_name = p["basehead"].partition("...")
        base, head = self._rev(repo, base_name), self._rev(repo, head_name)
        if base is None or head is None:
            return 404, {"message": "Not Found"}
        gd = repo.git_dir
        try:
            merge_base = git(gd, "merge-base", base, head).strip()
        except GitFailed:
            return 404, {"message": f"No common ancestor between {base_name} and {head_name}."}
        ahead = int(git(gd, "rev-list", "--count", f"{base}..{head}"))
        behind = int(git(gd, "rev-list", "--count", f"{head}..{base}"))
        log = git(gd, "log", "--reverse", "--format=%H", f"{base}..{head}").split()
        files = []
        names = git(gd, "diff", "--no-renames", "--name-status", "-z", merge_base, head)
        fields = names.split("\0")
        numstat = git(gd, "diff", "--no-renames", "--numstat", "-z", merge_base, head)
        counts = {}
        for row in filter(None, numstat.split("\0")):
            added, removed, name = row.split("\t", 2)
            counts[name] = (added, removed)
        for status, name in zip(fields[0::2], fields[1::2], strict=False):
            if not status:
                continue
            added, removed = counts.get(name, ("0", "0"))
            kind = {"A": "added", "D": "removed", "M": "modified"}.get(status[0], "changed")
            entry: dict[str, Any] = {
                "sha": self._rev(repo, f"{head}:{name}") if kind != "removed" else None,
                "filename": name,
                "status": kind,
                "additions": int(added) if added != "-" else 0,
                "deletions": int(removed) if removed != "-" else 0,
            }
            entry["changes"] = entry["additions"] + entry["deletions"]
            if added != "-":
                patch = git(gd, "diff", "--no-renames", merge_base, head, "--", name)
                at = patch.find("\n@@")
                if at >= 0:
                    entry["patch"] = patch[at + 1 :].rstrip("\n")
            files.append(entry)
        status = (
            "identical"
            if not ahead and not behind
            else "ahead"
            if not behind
            else "behind"
            if not ahead
            else "diverged"
        )
        return 200, {
            "url": self._api(repo, f"compare/{p['basehead']}"),
            "html_url": f"{self.url}/{repo.full_name}/compare/{p['basehead']}",
            "base_commit": {"sha": base, "commit": self._commit_json(repo, base)},
            "merge_base_commit": {"sha": merge_base, "commit": self._commit_json(repo, merge_base)},
            "status": status,
            "ahead_by": ahead,
            "behind_by": behind,
            "total_commits": ahead,
            "commits": [{"sha": s, "commit": self._commit_json(repo, s)} for s in log],
            "files": files,
        }

    # -- issues and pull requests

    def _thread_json(self, repo: Repo, t: dict[str, Any]) -> dict[str, Any]:
        n = t["number"]
        kind = "pull" if t["kind"] == "pull" else "issues"
        out: dict[str, Any] = {
            "id": 100000 + n,
            "node_id": f"T_{n}",
            "number": n,
            "url": self._api(repo, f"issues/{n}"),
            "html_url": f"{self.url}/{repo.full_name}/{kind}/{n}",
            "state": t["state"],
            "state_reason": t.get("state_reason"),
            "locked": t.get("locked", False),
            "title": t["title"],
            "body": t["body"],
            "user": {"login": "broker-bot", "id": 1},
            "labels": [{"name": name, "color": "ededed"} for name in t["labels"]],
        }
        if t["kind"] == "pull":
            out["pull_request"] = {
                "url": self._api(repo, f"pulls/{n}"),
                "html_url": out["html_url"],
            }
        return out

    def _pull_json(self, repo: Repo, t: dict[str, Any]) -> dict[str, Any]:
        out = self._thread_json(repo, t)
        out.pop("pull_request")
        head_sha = self._rev(repo, f"refs/heads/{t['head']}") or t["head_sha"]
        out.update(
            url=self._api(repo, f"pulls/{t['number']}"),
            draft=t["draft"],
            merged=t.get("merged", False),
            head={"label": f"{repo.owner}:{t['head']}", "ref": t["head"], "sha": head_sha},
            base={
                "label": f"{repo.owner}:{t['base']}",
                "ref": t["base"],
                "sha": self._rev(repo, f"refs/heads/{t['base']}"),
            },
            requested_reviewers=[{"login": u} for u in t["reviewers"]],
            requested_teams=[{"slug": s} for s in t["teams"]],
        )
        return out

    def _new_thread(self, repo: Repo, kind: str, **fields: Any) -> dict[str, Any]:
        n = max(repo.threads, default=0) + 1
        t = {"number": n, "kind": kind, "state": "open", "labels": [], **fields}
        repo.threads[n] = t
        return t

    def _find(self, repo: Repo, number: str, kind: str | None = None) -> dict[str, Any] | None:
        t = repo.threads.get(int(number)) if number.isdigit() else None
        return t if t is not None and (kind is None or t["kind"] == kind) else None

    def _list_pulls(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        state = q.get("state", "open")
        head = q.get("head", "")
        found = [
            self._pull_json(repo, t)
            for t in repo.threads.values()
            if t["kind"] == "pull"
            and (state == "all" or t["state"] == state)
            and (not head or f"{repo.owner}:{t['head']}".lower() == head.lower())
            and ("base" not in q or t["base"] == q["base"])
        ]
        return 200, found

    def _create_pull(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        head = str(body.get("head", "")).split(":")[-1]
        base = str(body.get("base", ""))

        def invalid(field_: str) -> Reply:
            error = {"resource": "PullRequest", "field": field_, "code": "invalid"}
            return 422, {"message": "Validation Failed", "errors": [error]}

        def custom(message: str) -> Reply:
            error = {"resource": "PullRequest", "code": "custom", "message": message}
            return 422, {"message": "Validation Failed", "errors": [error]}

        base_sha = self._rev(repo, f"refs/heads/{base}")
        head_sha = self._rev(repo, f"refs/heads/{head}")
        if base_sha is None:
            return invalid("base")
        if head_sha is None:
            return invalid("head")
        for t in repo.threads.values():
            if (
                t["kind"] == "pull"
                and t["state"] == "open"
                and (t["head"], t["base"])
                == (
                    head,
                    base,
                )
            ):
                return custom(f"A pull request already exists for {repo.owner}:{head}.")
        if int(git(repo.git_dir, "rev-list", "--count", f"{base_sha}..{head_sha}")) == 0:
            return custom(f"No commits between {base} and {head}")
        t = self._new_thread(
            repo,
            "pull",
            title=str(body.get("title", "")),
            body=body.get("body"),
            draft=bool(body.get("draft", False)),
            head=head,
            base=base,
            head_sha=head_sha,
            reviewers=[],
            teams=[],
        )
        return 201, self._pull_json(repo, t)

    def _get_pull(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        t = self._find(repo, p["pull_number"], "pull")
        return (404, {"message": "Not Found"}) if t is None else (200, self._pull_json(repo, t))

    def _update_pull(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        t = self._find(repo, p["pull_number"], "pull")
        if t is None:
            return 404, {"message": "Not Found"}
        for key in ("state", "title", "body"):
            if key in body:
                t[key] = body[key]
        return 200, self._pull_json(repo, t)

    def _request_reviewers(
        self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any
    ) -> Reply:
        t = self._find(repo, p["pull_number"], "pull")
        if t is None:
            return 404, {"message": "Not Found"}
        users, teams = body.get("reviewers") or [], body.get("team_reviewers") or []
        if not set(users) <= self.users or not set(teams) <= self.teams:
            return 422, {
                "message": "Reviews may only be requested from collaborators. One or more of "
                f"the users or teams you specified is not a collaborator of the "
                f"{repo.full_name} repository."
            }
        t["reviewers"] += [u for u in users if u not in t["reviewers"]]
        t["teams"] += [s for s in teams if s not in t["teams"]]
        return 201, self._pull_json(repo, t)

    def _create_issue(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        if not repo.issues_enabled:
            return 410, {"message": "Issues are disabled for this repo"}
        if not body.get("title"):
            return 422, {"message": "Validation Failed", "errors": [{"field": "title"}]}
        t = self._new_thread(
            repo, "issue", title=str(body["title"]), body=body.get("body"), draft=False
        )
        t["labels"] = list(body.get("labels") or [])
        return 201, self._thread_json(repo, t)

    def _get_issue(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        t = self._find(repo, p["issue_number"])
        return (404, {"message": "Not Found"}) if t is None else (200, self._thread_json(repo, t))

    def _update_issue(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        t = self._find(repo, p["issue_number"])
        if t is None:
            return 404, {"message": "Not Found"}
        for key in ("state", "state_reason", "title", "body"):
            if key in body:
                t[key] = body[key]
        return 200, self._thread_json(repo, t)

    def _create_comment(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        t = self._find(repo, p["issue_number"])
        if t is None:
            return 404, {"message": "Not Found"}
        if t.get("locked"):
            return 403, {"message": "Unable to create comment because issue is locked."}
        self._next_comment += 1
        cid = self._next_comment
        kind = "pull" if t["kind"] == "pull" else "issues"
        comment = {
            "id": cid,
            "node_id": f"IC_{cid}",
            "url": self._api(repo, f"issues/comments/{cid}"),
            "html_url": f"{self.url}/{repo.full_name}/{kind}/{t['number']}#issuecomment-{cid}",
            "body": str(body.get("body", "")),
            "user": {"login": "broker-bot", "id": 1},
            "number": t["number"],
        }
        repo.comments[cid] = comment
        return 201, comment

    def _delete_comment(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        cid = int(p["comment_id"]) if p["comment_id"].isdigit() else -1
        if repo.comments.pop(cid, None) is None:
            return 404, {"message": "Not Found"}
        return 204, None

    def _labels(self, t: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"name": name, "color": "ededed", "default": False} for name in t["labels"]]

    def _get_labels(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        t = self._find(repo, p["issue_number"])
        return (404, {"message": "Not Found"}) if t is None else (200, self._labels(t))

    def _add_labels(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        t = self._find(repo, p["issue_number"])
        if t is None:
            return 404, {"message": "Not Found"}
        for name in body.get("labels") or []:
            if str(name).lower() not in {x.lower() for x in t["labels"]}:
                t["labels"].append(str(name))
        return 200, self._labels(t)

    def _remove_label(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        t = self._find(repo, p["issue_number"])
        if t is None:
            return 404, {"message": "Not Found"}
        if p["name"] not in t["labels"]:
            return 404, {"message": "Label does not exist"}
        t["labels"].remove(p["name"])
        return 200, self._labels(t)

    def _page(self, path: str) -> Reply:
        owner, name, _, number = path.strip("/").split("/")
        repo = self.repos.get(f"{owner}/{name}".lower())
        t = repo.threads.get(int(number)) if repo else None
        if t is None:
            return 404, "Not Found"
        return 200, f"#{t['number']} {t['title']} ({t['state']})\n\n{t['body'] or ''}\n"
