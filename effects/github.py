"""github.*: pull requests (with the files they change), issues, comments and labels.

Effects: `github.pull_request.create`, `github.pull_request.comment`,
`github.issue.create`, `github.issue.comment`, `github.label.add`.

Settings, `[integrations.github]`:

    token_env = "GITHUB_TOKEN"            # a token (or token_file), or a GitHub App:
    app_id = 12345                        #   the App's id,
    private_key_file = "github-app.pem"   #   its private key (or private_key_env),
    installation_id = 6789                #   and its installation on the account
    base_url = "https://api.github.com"   # GitHub Enterprise: "https://HOST/api/v3"
    repos = ["acme/*"]                    # optional: the only repositories requests may name
    allow_mentions = false                # true: @user and @org/team in text stay live
    timeout = 15                          # seconds per HTTP request to GitHub

Every call to GitHub is one method of `Api`, named with the REST operation it sends
(`Api.operations()`); the tests run each against Prism serving GitHub's OpenAPI description.

Text the agent writes (titles, bodies, comments, commit messages) is posted with every
`@name` and `@org/team` turned into `@ name` / `@ org/team` (and `&#64;` / `&commat;`
spelled as `@ `), unless `allow_mentions`: GitHub links and notifies only an `@` directly
followed by the name, and the visible space shows a reader what was done. URLs are left
as they are; code blocks are not (a decorator `@cache` becomes `@ cache`). The output
lists the names so neutralised.

`github.pull_request.create` takes `head`, a branch already pushed (`git.push`), or
`head` plus `files`, which the host commits on a new branch `head` made from `base`
through the Git Data API. The preview is the diff GitHub will show: for a pushed branch
from the compare API, for `files` computed against the blobs on `base`. What the
approver saw (the base and head commits, the blob of each path) is kept under
<state_dir>/github/seen/ until the request is applied, and re-checked first: a base or
head that moved since makes the result `failed`, not a pull request nobody saw.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import hashlib
import ipaddress
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import jwt
import requests
from github import Auth, Github, GithubException
from github.GithubException import (
    BadAttributeException,
    BadCredentialsException,
    BadUserAgentException,
    IncompletableObject,
    RateLimitExceededExceedsMaxWait,
    RateLimitExceededException,
    TwoFactorException,
    UnknownObjectException,
)
from urllib3.util.retry import Retry

from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context, Handler

DEFAULT_BASE_URL = "https://api.github.com"
DEFAULT_TIMEOUT_S = 15
USER_AGENT = "sandbox-outbox-broker"
MAX_DIFF = 1 << 20  # characters of diff shown to the approver
SHOW_MAX = 256 * 1024  # larger blobs are described, not diffed
SEEN_MAX_AGE_S = 30 * 86400
COMPARE_MAX_FILES = 300  # the compare API lists at most this many files
CONFIG_KEYS = frozenset(
    {
        "base_url",
        "repos",
        "allow_mentions",
        "timeout",
        "token_env",
        "token_file",
        "app_id",
        "private_key_env",
        "private_key_file",
        "installation_id",
    }
)
APP_TOKEN_CALL = ("POST", "/app/installations/{installation_id}/access_tokens")
"""What PyGithub sends first with GitHub App credentials, before any `Api` call."""

_BRANCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_TEAM = re.compile(r"([A-Za-z0-9][A-Za-z0-9-]*)/([A-Za-z0-9][A-Za-z0-9_.-]*)")
_URL = re.compile(r"https?://[^\s<>()\[\]]+", re.I)
_MENTION = re.compile(
    r"(?<![A-Za-z0-9_])(?:@|&#0*64;|&#x0*40;|&commat;)"
    r"([A-Za-z0-9][A-Za-z0-9-]*(?:/[A-Za-z0-9][A-Za-z0-9_.-]*)?)",
    re.I,
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_LOOPBACK_NAMES = {"localhost"}

F = TypeVar("F", bound=Callable[..., Any])


# -- settings and credentials ------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """[integrations.github], checked."""

    base_url: str
    repos: tuple[str, ...]
    allow_mentions: bool
    timeout: int


def check_settings(settings: Mapping[str, Any]) -> Settings:
    """Validate [integrations.github]; raises ConfigError naming the key at fault."""
    where = "integrations.github"
    unknown = set(settings) - CONFIG_KEYS
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key")
    base_url = settings.get("base_url", DEFAULT_BASE_URL)
    if not isinstance(base_url, str):
        raise ConfigError(f"{where}.base_url: expected a URL, got {base_url!r}")
    parts = urlsplit(base_url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(f"{where}.base_url: {base_url!r} is not an http(s) URL")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise ConfigError(
            f"{where}.base_url: {base_url!r} would send the host's credentials in clear "
            "text; use https (plain http is accepted for 127.0.0.1 and localhost only)"
        )
    if parts.query or parts.fragment or parts.username:
        raise ConfigError(f"{where}.base_url: no query, fragment or user-info, please")
    repos = settings.get("repos", [])
    if not isinstance(repos, list) or not all(
        isinstance(r, str) and r.count("/") == 1 for r in repos
    ):
        raise ConfigError(f"{where}.repos: must be a list of owner/name globs, e.g. ['acme/*']")
    mentions = settings.get("allow_mentions", False)
    if not isinstance(mentions, bool):
        raise ConfigError(f"{where}.allow_mentions: expected true or false")
    timeout = settings.get("timeout", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 0 < timeout <= 600:
        raise ConfigError(f"{where}.timeout: expected whole seconds between 1 and 600")
    _check_credentials(settings, where)
    return Settings(base_url.rstrip("/"), tuple(repos), mentions, timeout)


def _check_credentials(settings: Mapping[str, Any], where: str) -> None:
    token = [k for k in ("token_env", "token_file") if k in settings]
    app = [k for k in ("app_id", "installation_id") if k in settings]
    key = [k for k in ("private_key_env", "private_key_file") if k in settings]
    if len(token) > 1 or len(key) > 1:
        raise ConfigError(f"{where}.{(token + key)[-1]}: give one of *_env or *_file, not both")
    if token and (app or key):
        raise ConfigError(
            f"{where}.{(app + key)[0]}: give either a token (token_env) or a GitHub App "
            "(app_id, private_key_file, installation_id), not both"
        )
    if app or key:
        for name in ("app_id", "installation_id"):
            value = settings.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}.{name}: a GitHub App needs it, a positive integer")
        if not key:
            raise ConfigError(f"{where}.private_key_file: a GitHub App needs its private key")
    for name in ("token_env", "private_key_env", "token_file", "private_key_file"):
        value = settings.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{where}.{name}: expected a name, got {value!r}")
    for name in ("token_env", "private_key_env"):
        if name in settings and settings[name] not in os.environ:
            raise ConfigError(f"{where}.{name}: environment variable {settings[name]} is not set")


def _loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _retry() -> Retry:
    """Retry reads on gateway errors, briefly; never a write, never a long rate-limit sleep."""
    return Retry(
        total=2,
        backoff_factor=0.2,
        status_forcelist=(502, 503, 504),
        allowed_methods=frozenset({"GET", "HEAD"}),
        respect_retry_after_header=False,
        raise_on_status=False,
    )


def settings_of(ctx: Context) -> Settings:
    """The checked settings; broken ones (checked at start too) fail the request."""
    try:
        return check_settings(ctx.settings)
    except ConfigError as exc:
        raise EffectFailed(
            f"failed: GitHub is misconfigured on this host ({exc}); ask the operator"
        ) from exc


def client(ctx: Context) -> Github:
    """A PyGithub client with the host's credentials for one handler call."""
    settings = settings_of(ctx)
    try:
        token = ctx.secret("token")
        key = ctx.secret("private_key") if "app_id" in ctx.settings else None
    except ConfigError as exc:
        raise EffectFailed(
            f"failed: the host's GitHub credentials are unavailable ({exc}); ask the operator"
        ) from exc
    auth: Auth.Auth
    if token:
        auth = Auth.Token(token)
    elif key:
        app = Auth.AppAuth(int(ctx.settings["app_id"]), key)
        try:
            app.create_jwt()
        except (ValueError, TypeError, jwt.PyJWTError) as exc:
            raise EffectFailed(
                "failed: the host's GitHub App private key cannot sign a token "
                f"({type(exc).__name__}); ask the operator to check private_key_file"
            ) from exc
        auth = app.get_installation_auth(int(ctx.settings["installation_id"]))
    else:
        raise EffectFailed(
            "failed: GitHub is not configured on this host ([integrations.github] token_env, "
            "or app_id, private_key_file and installation_id); ask the operator"
        )
    return Github(
        auth=auth,
        base_url=settings.base_url,
        timeout=settings.timeout,
        user_agent=USER_AGENT,
        retry=_retry(),
        seconds_between_requests=None,
        seconds_between_writes=None,
    )


# -- the edge: PyGithub's and requests' exceptions become EffectFailed ----------------

Reason = Callable[[GithubException, str], str]


def _said(exc: GithubException) -> str:
    """GitHub's own words from an error answer, one line, bounded."""
    data = exc.data if isinstance(exc.data, Mapping) else {}
    words = [str(data.get("message") or exc.message or "")]
    for err in data.get("errors") or []:
        if isinstance(err, Mapping):
            words.append(
                str(err.get("message") or " ".join(str(err.get(k, "")) for k in ("field", "code")))
            )
        else:
            words.append(str(err))
    text = _CONTROL.sub(" ", "; ".join(w.strip() for w in words if w and w.strip()))
    return text[:300] or "no message"


def _reset_time(exc: GithubException) -> str:
    headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
    if headers.get("retry-after", "").isdigit():
        return f"in {headers['retry-after']} s"
    reset = headers.get("x-ratelimit-reset", "")
    if reset.isdigit():
        return "at " + datetime.fromtimestamp(int(reset), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return "in a few minutes"


def _by_status(exc: GithubException, doing: str) -> str:
    status = exc.status
    said = _said(exc)
    if status == 401:
        return _GITHUB_REASONS[BadCredentialsException](exc, doing)
    if status == 403 or status == 429:
        if status == 429 or "rate limit" in said.lower():
            return _GITHUB_REASONS[RateLimitExceededException](exc, doing)
        return (
            f"failed: GitHub refused {doing} (403: {said}); the host's credentials lack the "
            "permission, or the repository forbids it; ask the operator, or ask for less"
        )
    if status == 404:
        return _GITHUB_REASONS[UnknownObjectException](exc, doing)
    if status == 409:
        return f"failed: GitHub reports a conflict {doing} (409: {said}); check the repo's state"
    if status == 410:
        return f"failed: GitHub says this is gone or disabled {doing} (410: {said})"
    if status == 422:
        return f"failed: GitHub refused the request {doing} as invalid (422: {said})"
    if status >= 500:
        return (
            f"failed: GitHub broke {doing} ({status}: {said}); it may or may not have "
            "happened: check before sending the request again"
        )
    return f"failed: GitHub answered {status} {doing}: {said}"


def _bad_credentials(exc: GithubException, doing: str) -> str:
    return (
        f"failed: GitHub refused the host's credentials {doing} ({exc.status}: {_said(exc)}); "
        "the agent cannot fix this: ask the operator to renew the token or the App's key"
    )


def _rate_limited(exc: GithubException, doing: str) -> str:
    return (
        f"failed: GitHub's rate limit stopped {doing} ({exc.status}: {_said(exc)}); it resets "
        f"{_reset_time(exc)}: send the request again after that"
    )


def _not_found(exc: GithubException, doing: str) -> str:
    return (
        f"failed: GitHub answered 404 {doing}: the repository, or the number or branch the "
        "request names, does not exist, or the host's credentials cannot see it; check them"
    )


_GITHUB_REASONS: dict[type[GithubException], Reason] = {
    GithubException: _by_status,
    BadCredentialsException: _bad_credentials,
    UnknownObjectException: _not_found,
    RateLimitExceededException: _rate_limited,
    RateLimitExceededExceedsMaxWait: _rate_limited,
    BadUserAgentException: lambda exc, doing: (
        f"failed: GitHub refused the broker's User-Agent {doing} ({_said(exc)}); ask the operator"
    ),
    TwoFactorException: lambda exc, doing: (
        f"failed: GitHub asks for a one-time password {doing}: the host is configured with a "
        "password, not a token or an App; ask the operator"
    ),
    IncompletableObject: lambda exc, doing: (
        f"failed: GitHub's answer {doing} lacked the URL needed to go on ({_said(exc)})"
    ),
}
"""Every exception class PyGithub defines, by exact class (the tests check it is complete)."""

_NETWORK_REASONS: tuple[tuple[type[requests.RequestException], str], ...] = (
    (requests.exceptions.SSLError, "the TLS handshake with {url} failed; ask the operator"),
    (
        requests.exceptions.ConnectTimeout,
        "{url} did not accept a connection in time; try again later",
    ),
    (
        requests.exceptions.ReadTimeout,
        "{url} did not answer in time; it may or may not have happened: check before "
        "sending the request again",
    ),
    (
        requests.exceptions.ProxyError,
        "the host's proxy refused the connection to {url}; ask the operator",
    ),
    (
        requests.exceptions.ConnectionError,
        "cannot connect to {url} from the host; try again later",
    ),
    (
        requests.exceptions.RetryError,
        "{url} kept failing after retries; try again later",
    ),
    (
        requests.exceptions.ChunkedEncodingError,
        "the connection to {url} broke mid-answer; it may or may not have happened: "
        "check before sending the request again",
    ),
    (
        requests.exceptions.ContentDecodingError,
        "the answer from {url} could not be decoded; try again later",
    ),
    (
        requests.exceptions.TooManyRedirects,
        "{url} redirected too many times; ask the operator to check base_url",
    ),
    (
        requests.exceptions.InvalidJSONError,
        "the answer from {url} was not JSON; ask the operator to check base_url",
    ),
    (
        requests.exceptions.RequestException,
        "the HTTP request to {url} failed ({kind}); ask the operator",
    ),
)
"""requests' exceptions, most specific first; the last one catches the rest."""


def translate(exc: BaseException, doing: str, base_url: str) -> EffectFailed:
    """The EffectFailed an agent reads for an exception of PyGithub or requests."""
    if isinstance(exc, GithubException):
        for cls in type(exc).__mro__:
            reason = _GITHUB_REASONS.get(cls)
            if reason is not None:
                return EffectFailed(reason(exc, doing))
    if isinstance(exc, BadAttributeException):
        return EffectFailed(f"failed: GitHub's answer {doing} had a field of an unexpected type")
    if isinstance(exc, requests.RequestException):
        for cls, text in _NETWORK_REASONS:
            if isinstance(exc, cls):
                said = text.format(url=base_url, kind=type(exc).__name__)
                return EffectFailed(f"failed: {doing}: {said}")
    return EffectFailed(f"failed: {doing}: {type(exc).__name__}")


@contextmanager
def edge(doing: str, base_url: str) -> Iterator[None]:
    """Translate PyGithub's and requests' exceptions raised inside into EffectFailed."""
    try:
        yield
    except EffectFailed:
        raise
    except (GithubException, BadAttributeException, requests.RequestException) as exc:
        raise translate(exc, doing, base_url) from exc


# -- the REST calls ----------------------------------------------------------------


def rest(verb: str, path: str) -> Callable[[F], F]:
    """Mark an Api method with the one REST operation it sends (verb, OpenAPI path)."""

    def mark(fn: F) -> F:
        setattr(fn, "github_call", (verb, path))  # noqa: B010
        return fn

    return mark


@dataclass(frozen=True)
class Entry:
    """A path in a git tree: mode, type (blob, tree, commit) and object SHA."""

    mode: str
    type: str
    sha: str
    size: int | None = None


@dataclass(frozen=True)
class Commit:
    sha: str
    tree: str
    parents: tuple[str, ...]


def _get(data: Any, *keys: str) -> Any:
    """A field of GitHub's answer; a missing one fails with a sentence, not a KeyError."""
    for key in keys:
        if not isinstance(data, Mapping) or key not in data:
            raise EffectFailed(f"failed: GitHub's answer lacked {'.'.join(keys)}")
        data = data[key]
    return data


class Api:
    """One method per GitHub REST call the handlers make, on one repository.

    Each method sends exactly the operation named by its `rest` mark; the tests send
    every one of them to Prism serving GitHub's OpenAPI description.
    """

    def __init__(self, gh: Github, repo: str) -> None:
        self._requester = gh.requester
        self.repo = repo
        self.owner = repo.split("/", 1)[0]
        self._at = f"/repos/{repo}"

    @staticmethod
    def operations() -> dict[str, tuple[str, str]]:
        """Method name → (verb, OpenAPI path) for every REST call of this class."""
        return {
            name: getattr(fn, "github_call")  # noqa: B009
            for name, fn in vars(Api).items()
            if hasattr(fn, "github_call")
        }

    def _send(
        self,
        verb: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Any:
        _, data = self._requester.requestJsonAndCheck(
            verb, self._at + path, parameters=dict(query) if query else None, input=body
        )
        return data

    # git data

    @rest("GET", "/repos/{owner}/{repo}/git/ref/{ref}")
    def branch_sha(self, branch: str) -> str | None:
        """The commit a branch points at, or None when there is no such branch."""
        # the ref is one path segment, slashes encoded, as GitHub's own SDK sends it
        try:
            data = self._send("GET", "/git/ref/" + quote(f"heads/{branch}", safe=""))
        except UnknownObjectException:
            return None
        return str(_get(data, "object", "sha"))

    @rest("GET", "/repos/{owner}/{repo}/git/commits/{commit_sha}")
    def commit(self, sha: str) -> Commit:
        data = self._send("GET", f"/git/commits/{quote(sha, safe='')}")
        parents = tuple(str(_get(p, "sha")) for p in _get(data, "parents"))
        return Commit(str(_get(data, "sha")), str(_get(data, "tree", "sha")), parents)

    @rest("GET", "/repos/{owner}/{repo}/git/trees/{tree_sha}")
    def tree(self, sha: str) -> dict[str, Entry]:
        """One level of a tree: name → entry."""
        data = self._send("GET", f"/git/trees/{quote(sha, safe='')}")
        out: dict[str, Entry] = {}
        for item in _get(data, "tree"):
            size = item.get("size")
            out[str(_get(item, "path"))] = Entry(
                str(_get(item, "mode")),
                str(_get(item, "type")),
                str(_get(item, "sha")),
                size if isinstance(size, int) else None,
            )
        return out

    @rest("GET", "/repos/{owner}/{repo}/git/blobs/{file_sha}")
    def blob(self, sha: str) -> bytes:
        data = self._send("GET", f"/git/blobs/{quote(sha, safe='')}")
        content = str(_get(data, "content"))
        if data.get("encoding") == "base64":
            return base64.b64decode(content)
        return content.encode("utf-8")

    @rest("GET", "/repos/{owner}/{repo}/compare/{basehead}")
    def compare(self, base: str, head: str) -> dict[str, Any]:
        data = self._send("GET", f"/compare/{quote(base, safe='')}...{quote(head, safe='')}")
        if not isinstance(data, dict):
            raise EffectFailed("failed: GitHub's comparison answer was not an object")
        return data

    @rest("POST", "/repos/{owner}/{repo}/git/blobs")
    def create_blob(self, data: bytes) -> str:
        body = {"content": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
        return str(_get(self._send("POST", "/git/blobs", body=body), "sha"))

    @rest("POST", "/repos/{owner}/{repo}/git/trees")
    def create_tree(self, base_tree: str, entries: Sequence[Mapping[str, Any]]) -> str:
        body = {"base_tree": base_tree, "tree": [dict(e) for e in entries]}
        return str(_get(self._send("POST", "/git/trees", body=body), "sha"))

    @rest("POST", "/repos/{owner}/{repo}/git/commits")
    def create_commit(self, message: str, tree: str, parents: Sequence[str]) -> str:
        body = {"message": message, "tree": tree, "parents": list(parents)}
        return str(_get(self._send("POST", "/git/commits", body=body), "sha"))

    @rest("POST", "/repos/{owner}/{repo}/git/refs")
    def create_branch(self, branch: str, sha: str) -> None:
        self._send("POST", "/git/refs", body={"ref": f"refs/heads/{branch}", "sha": sha})

    @rest("DELETE", "/repos/{owner}/{repo}/git/refs/{ref}")
    def delete_branch(self, branch: str) -> None:
        self._send("DELETE", "/git/refs/" + quote(f"heads/{branch}", safe=""))

    # pull requests

    @rest("GET", "/repos/{owner}/{repo}/pulls")
    def open_pulls(self, head: str, base: str) -> list[dict[str, Any]]:
        """Open pull requests from `head` (a branch of this repository) into `base`."""
        query = {"state": "open", "head": f"{self.owner}:{head}", "base": base, "per_page": 100}
        data = self._send("GET", "/pulls", query=query)
        return [p for p in data if isinstance(p, dict)] if isinstance(data, list) else []

    @rest("POST", "/repos/{owner}/{repo}/pulls")
    def create_pull(
        self, *, head: str, base: str, title: str, body: str, draft: bool
    ) -> dict[str, Any]:
        payload = {"head": head, "base": base, "title": title, "body": body, "draft": draft}
        data = self._send("POST", "/pulls", body=payload)
        return dict(data)

    @rest("GET", "/repos/{owner}/{repo}/pulls/{pull_number}")
    def pull(self, number: int) -> dict[str, Any]:
        return dict(self._send("GET", f"/pulls/{number}"))

    @rest("PATCH", "/repos/{owner}/{repo}/pulls/{pull_number}")
    def close_pull(self, number: int) -> None:
        self._send("PATCH", f"/pulls/{number}", body={"state": "closed"})

    @rest("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/requested_reviewers")
    def request_reviewers(self, number: int, users: Sequence[str], teams: Sequence[str]) -> None:
        body = {"reviewers": list(users), "team_reviewers": list(teams)}
        self._send("POST", f"/pulls/{number}/requested_reviewers", body=body)

    # issues, comments, labels

    @rest("GET", "/repos/{owner}/{repo}/issues/{issue_number}")
    def issue(self, number: int) -> dict[str, Any]:
        return dict(self._send("GET", f"/issues/{number}"))

    @rest("POST", "/repos/{owner}/{repo}/issues")
    def create_issue(self, *, title: str, body: str, labels: Sequence[str]) -> dict[str, Any]:
        payload: dict[str, Any] = {"title": title, "body": body}
        if labels:
            payload["labels"] = list(labels)
        return dict(self._send("POST", "/issues", body=payload))

    @rest("PATCH", "/repos/{owner}/{repo}/issues/{issue_number}")
    def close_issue(self, number: int) -> None:
        body = {"state": "closed", "state_reason": "not_planned"}
        self._send("PATCH", f"/issues/{number}", body=body)

    @rest("POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments")
    def comment(self, number: int, body: str) -> dict[str, Any]:
        return dict(self._send("POST", f"/issues/{number}/comments", body={"body": body}))

    @rest("DELETE", "/repos/{owner}/{repo}/issues/comments/{comment_id}")
    def delete_comment(self, comment_id: int) -> None:
        self._send("DELETE", f"/issues/comments/{comment_id}")

    @rest("GET", "/repos/{owner}/{repo}/issues/{issue_number}/labels")
    def labels(self, number: int) -> list[str]:
        data = self._send("GET", f"/issues/{number}/labels", query={"per_page": 100})
        return [str(_get(label, "name")) for label in data]

    @rest("POST", "/repos/{owner}/{repo}/issues/{issue_number}/labels")
    def add_labels(self, number: int, labels: Sequence[str]) -> list[str]:
        data = self._send("POST", f"/issues/{number}/labels", body={"labels": list(labels)})
        return [str(_get(label, "name")) for label in data]

    @rest("DELETE", "/repos/{owner}/{repo}/issues/{issue_number}/labels/{name}")
    def remove_label(self, number: int, label: str) -> None:
        self._send("DELETE", f"/issues/{number}/labels/{quote(label, safe='')}")


# -- text the agent wrote -------------------------------------------------------------


def neutralise(text: str) -> tuple[str, list[str]]:
    """Make @-mentions inert but visible: `@name` → `@ name`; returns the names found."""
    found: list[str] = []

    def inert(match: re.Match[str]) -> str:
        found.append(match.group(1))
        return "@ " + match.group(1)

    out: list[str] = []
    pos = 0
    for url in _URL.finditer(text):
        out.append(_MENTION.sub(inert, text[pos : url.start()]))
        out.append(url.group(0))
        pos = url.end()
    out.append(_MENTION.sub(inert, text[pos:]))
    return "".join(out), found


class Text:
    """The agent's text fields as they will be posted, and the mentions neutralised."""

    def __init__(self, allow_mentions: bool) -> None:
        self.allow = allow_mentions
        self.mentions: list[str] = []

    def __call__(self, value: str | None) -> str:
        if not value or self.allow:
            return value or ""
        out, found = neutralise(value)
        self.mentions.extend(m for m in found if m not in self.mentions)
        return out


# -- what the approver saw ---------------------------------------------------------------


def _seen_path(ctx: Context) -> Path:
    name = f"{ctx.sandbox}\0{ctx.request_id}\0{ctx.request_sha256}".encode()
    return ctx.state_dir / "github" / "seen" / f"{hashlib.sha256(name).hexdigest()}.json"


def remember(ctx: Context, seen: Mapping[str, Any]) -> None:
    """Keep what the preview showed, for `apply` to re-check; old records are pruned."""
    path = _seen_path(ctx)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(dict(seen)), encoding="utf-8")
    os.replace(tmp, path)
    cutoff = time.time() - SEEN_MAX_AGE_S
    for old in path.parent.glob("*.json"):
        try:
            if old.stat().st_mtime < cutoff:
                old.unlink()
        except OSError:
            pass


def recall(ctx: Context) -> dict[str, Any] | None:
    try:
        data = json.loads(_seen_path(ctx).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def forget(ctx: Context) -> None:
    _seen_path(ctx).unlink(missing_ok=True)


# -- the handlers ----------------------------------------------------------------------


class GitHubHandler(Handler):
    """What the github.* effects share: settings, the allowlist, a client per call."""

    config_keys = CONFIG_KEYS

    def check_config(self, settings: Mapping[str, Any]) -> None:
        check_settings(settings)

    def check(self, params: Params, ctx: Context) -> None:
        self._allowed(params["repo"], ctx)

    @staticmethod
    def _allowed(repo: str, ctx: Context) -> None:
        if set(repo.split("/")) & {".", ".."}:
            raise InvalidParams("/params/repo", f"{repo!r} is not owner/name")
        globs = settings_of(ctx).repos
        if globs and not any(fnmatchcase(repo.lower(), g.lower()) for g in globs):
            raise InvalidParams(
                "/params/repo",
                f"{repo} is not among the repositories this host allows ({', '.join(globs)})",
                "repo_not_allowed",
            )

    def _api(self, params: Params, ctx: Context) -> Api:
        self._allowed(params["repo"], ctx)
        return Api(client(ctx), params["repo"])

    @staticmethod
    def _url(ctx: Context) -> str:
        return str(ctx.settings.get("base_url", DEFAULT_BASE_URL))

    def _edge(self, doing: str, ctx: Context) -> AbstractContextManager[None]:
        return edge(doing, self._url(ctx))

    @staticmethod
    def _text(ctx: Context) -> Text:
        return Text(bool(ctx.settings.get("allow_mentions", False)))


def _number(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise EffectFailed(f"failed: GitHub answered with {value!r} where a number belongs")


def _thread(data: Mapping[str, Any]) -> str:
    state = data.get("state", "?")
    if data.get("locked"):
        state = f"{state}, locked"
    return f"#{data.get('number')} {_oneline(str(data.get('title', '')))} ({state})"


def _oneline(text: str, limit: int = 200) -> str:
    return _CONTROL.sub(" ", text.replace("\n", " "))[:limit]


def _mention_facts(text: Text) -> list[tuple[str, str]]:
    if not text.mentions:
        return []
    names = ", ".join(text.mentions[:20])
    return [("mentions neutralised", f"{names} (posted as '@ name': nobody is notified)")]


class IssueCreate(GitHubHandler):
    """Open an issue."""

    name = "github.issue.create"
    reversible = False
    idempotent = False
    undo = (
        "`broker undo` closes the issue as not planned (GitHub's REST API cannot delete "
        "it); the notifications it sent stay"
    )

    def preview(self, params: Params, ctx: Context) -> Preview:
        text = self._text(ctx)
        title, body = text(params["title"]), text(params.get("body"))
        facts = [("repo", params["repo"])]
        if params.get("labels"):
            facts.append(("labels", ", ".join(params["labels"])))
        return Preview(
            title=f"open an issue in {params['repo']}: {_oneline(title)}",
            target=f"github: {params['repo']} issues",
            body=f"{title}\n\n{body}",
            facts=tuple(facts + _mention_facts(text)),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        text = self._text(ctx)
        title, body = text(params["title"]), text(params.get("body"))
        with self._edge(f"opening an issue in {params['repo']}", ctx):
            api = self._api(params, ctx)
            issue = api.create_issue(title=title, body=body, labels=params.get("labels", []))
        return {
            "repo": params["repo"],
            "number": _number(_get(issue, "number")),
            "url": str(_get(issue, "html_url")),
            "labels": list(params.get("labels", [])),
            "mentions_neutralised": text.mentions,
        }

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        return Preview(
            title=f"close issue #{output['number']} in {output['repo']} as not planned",
            target=f"github: {output['url']}",
        )

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        number = int(output["number"])
        with self._edge(f"closing issue #{number} in {output['repo']}", ctx):
            api = self._api(output, ctx)
            if api.issue(number).get("state") == "closed":
                return {"number": number, "closed": False, "note": "it was closed already"}
            api.close_issue(number)
        return {"number": number, "closed": True}


class _Comment(GitHubHandler):
    """A comment on an issue or a pull request's conversation."""

    reversible = False
    idempotent = False
    undo = "`broker undo` deletes the comment; the notifications it sent (e-mail included) stay"
    kind = ""

    def _target(self, api: Api, number: int) -> dict[str, Any]:
        raise NotImplementedError

    def preview(self, params: Params, ctx: Context) -> Preview:
        text = self._text(ctx)
        body = text(params["body"])
        number = int(params["number"])
        with self._edge(f"reading {self.kind} #{number} in {params['repo']}", ctx):
            thread = self._target(self._api(params, ctx), number)
        facts = [("on", _thread(thread)), ("url", str(thread.get("html_url", "")))]
        return Preview(
            title=f"comment on {self.kind} #{number} in {params['repo']}",
            target=f"github: {thread.get('html_url') or params['repo']}",
            body=body,
            facts=tuple(facts + _mention_facts(text)),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        text = self._text(ctx)
        body = text(params["body"])
        number = int(params["number"])
        with self._edge(f"commenting on {self.kind} #{number} in {params['repo']}", ctx):
            api = self._api(params, ctx)
            self._target(api, number)
            made = api.comment(number, body)
        return {
            "repo": params["repo"],
            "number": number,
            "id": _number(_get(made, "id")),
            "url": str(_get(made, "html_url")),
            "mentions_neutralised": text.mentions,
        }

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        return Preview(
            title=f"delete comment {output['id']} on #{output['number']} in {output['repo']}",
            target=f"github: {output['url']}",
        )

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        with self._edge(f"deleting comment {output['id']} in {output['repo']}", ctx):
            api = self._api(output, ctx)
            try:
                api.delete_comment(int(output["id"]))
            except UnknownObjectException:
                return {"id": output["id"], "deleted": False, "note": "it was deleted already"}
        return {"id": output["id"], "deleted": True}


class IssueComment(_Comment):
    """Comment on an issue (not a pull request: that is github.pull_request.comment)."""

    name = "github.issue.comment"
    kind = "issue"

    def _target(self, api: Api, number: int) -> dict[str, Any]:
        issue = api.issue(number)
        if issue.get("pull_request"):
            # separate effects, so a policy can treat them apart
            raise InvalidParams(
                "/params/number",
                f"#{number} in {api.repo} is a pull request; use github.pull_request.comment",
                "is_pull_request",
            )
        return issue


class PullRequestComment(_Comment):
    """Comment on a pull request's conversation."""

    name = "github.pull_request.comment"
    kind = "pull request"

    def _target(self, api: Api, number: int) -> dict[str, Any]:
        try:
            return api.pull(number)
        except UnknownObjectException as exc:
            raise InvalidParams(
                "/params/number",
                f"{api.repo} has no pull request #{number} (an issue? use github.issue.comment)",
                "not_a_pull_request",
            ) from exc


class LabelAdd(GitHubHandler):
    """Add labels to an issue or a pull request."""

    name = "github.label.add"
    # removing a label is easy, but a `labeled` event may already have started a workflow
    # (deploys, "safe to test" runs with secrets): not reversible, like git.push
    reversible = False
    idempotent = True
    undo = (
        "`broker undo` removes the labels this request added (not those already there); "
        "workflows their `labeled` events started stay"
    )

    def preview(self, params: Params, ctx: Context) -> Preview:
        number = int(params["number"])
        with self._edge(f"reading #{number} in {params['repo']}", ctx):
            api = self._api(params, ctx)
            thread = api.issue(number)
            now = api.labels(number)
        new = _missing(params["labels"], now)
        facts = [
            ("on", _thread(thread)),
            ("labels now", ", ".join(now) or "none"),
            ("added", ", ".join(new) or "none: all are there already"),
        ]
        return Preview(
            title=f"label #{number} in {params['repo']}: {', '.join(params['labels'])}",
            target=f"github: {thread.get('html_url') or params['repo']}",
            facts=tuple(facts),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        number = int(params["number"])
        with self._edge(f"labelling #{number} in {params['repo']}", ctx):
            api = self._api(params, ctx)
            new = _missing(params["labels"], api.labels(number))
            labels = api.add_labels(number, new) if new else api.labels(number)
        return {"repo": params["repo"], "number": number, "added": new, "labels": labels}

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        added = list(output.get("added") or [])
        if not added:
            raise EffectFailed("failed: this request added no label; there is nothing to remove")
        return Preview(
            title=f"remove {', '.join(added)} from #{output['number']} in {output['repo']}",
            target=f"github: {output['repo']}",
        )

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        number = int(output["number"])
        removed = []
        with self._edge(f"removing labels from #{number} in {output['repo']}", ctx):
            api = self._api(output, ctx)
            for label in output.get("added") or []:
                try:
                    api.remove_label(number, label)
                    removed.append(label)
                except UnknownObjectException:
                    pass  # removed by someone already
        return {"number": number, "removed": removed}


def _missing(wanted: Sequence[str], present: Sequence[str]) -> list[str]:
    have = {p.lower() for p in present}
    out: list[str] = []
    for label in wanted:
        if label.lower() not in have and label not in out:
            out.append(label)
    return out


# -- github.pull_request.create -------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One entry of `files`: new bytes for a path, or None to delete it."""

    path: str
    data: bytes | None


def changes(params: Params) -> list[Change]:
    """`files` decoded and checked; raises InvalidParams naming the entry at fault."""
    out: list[Change] = []
    seen: set[str] = set()
    for i, item in enumerate(params.get("files") or []):
        where = f"/params/files/{i}"
        path = item["path"]
        parts = PurePosixPath(path).parts
        if (
            path.startswith("/")
            or path.endswith("/")
            or "//" in path
            or any(p in (".", "..") or p.lower() == ".git" for p in parts)
            or _CONTROL.search(path)
        ):
            raise InvalidParams(
                f"{where}/path", f"{path!r} must be a relative path without '.', '..' or .git"
            )
        if path in seen:
            raise InvalidParams(f"{where}/path", f"{path} is listed twice", "duplicate_path")
        seen.add(path)
        given = [k for k in ("content", "content_b64", "delete") if k in item]
        if len(given) != 1 or ("delete" in item and item["delete"] is not True):
            raise InvalidParams(where, "give exactly one of content, content_b64, delete: true")
        if "content" in item:
            out.append(Change(path, item["content"].encode("utf-8")))
        elif "content_b64" in item:
            try:
                out.append(Change(path, base64.b64decode(item["content_b64"], validate=True)))
            except (binascii.Error, ValueError) as exc:
                raise InvalidParams(f"{where}/content_b64", "is not valid base64") from exc
        else:
            out.append(Change(path, None))
    return out


def git_blob_sha(data: bytes) -> str:
    """The SHA git (and GitHub) gives a blob with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _reviewers(params: Params) -> tuple[list[str], list[str]]:
    users, teams = [], []
    for name in params.get("reviewers") or []:
        team = _TEAM.fullmatch(name)
        if team:
            teams.append(team.group(2))
        else:
            users.append(name)
    return users, teams


@dataclass(frozen=True)
class Live:
    """A pull request's live state: what is shown, and re-checked before applying."""

    base_sha: str
    head_sha: str | None
    base_tree: str | None = None
    entries: Mapping[str, Entry | None] | None = None  # files mode: each path on base

    def blobs(self) -> dict[str, str | None]:
        return {p: (e.sha if e else None) for p, e in (self.entries or {}).items()}


def entries_at(api: Api, tree: str, paths: Sequence[str]) -> dict[str, Entry | None]:
    """Each path's entry in `tree`, walking one level per directory (never truncated)."""
    cache: dict[str, dict[str, Entry]] = {"": api.tree(tree)}
    out: dict[str, Entry | None] = {}
    for path in paths:
        parts = path.split("/")
        entry: Entry | None = None
        prefix = ""
        for i, part in enumerate(parts):
            listing = cache.get(prefix)
            if listing is None:
                out[path] = None
                break
            entry = listing.get(part)
            if entry is None:
                out[path] = None
                break
            if i < len(parts) - 1:
                if entry.type != "tree":
                    raise EffectFailed(
                        f"failed: {'/'.join(parts[: i + 1])} is a file in {api.repo}, so "
                        f"{path} cannot be written below it"
                    )
                prefix = "/".join(parts[: i + 1])
                if prefix not in cache:
                    cache[prefix] = api.tree(entry.sha)
        else:
            out[path] = entry
    return out


def _unwritable(path: str, entry: Entry | None, change: Change) -> str | None:
    """Why this change cannot be made on top of `entry`, or None."""
    if entry is None:
        return f"{path} does not exist on the base" if change.data is None else None
    if entry.type == "tree":
        return f"{path} is a directory on the base"
    if entry.mode == "120000":
        return f"{path} is a symbolic link on the base"
    if entry.type != "blob":
        return f"{path} is a submodule on the base"
    return None


class PullRequestCreate(GitHubHandler):
    """Open a pull request from a pushed branch, or from files the host commits."""

    name = "github.pull_request.create"
    reversible = False
    idempotent = True
    undo = (
        "`broker undo` closes the pull request and deletes the branch the host created "
        "for `files` (if nobody moved it); notifications and CI runs it started stay"
    )

    def check(self, params: Params, ctx: Context) -> None:
        super().check(params, ctx)
        for key in ("base", "head"):
            name = params[key]
            if ".." in name or name.endswith((".lock", "/", ".")) or "//" in name:
                raise InvalidParams(f"/params/{key}", f"{name!r} is not a valid branch name")
        if params["head"] == params["base"]:
            raise InvalidParams("/params/head", "head and base are the same branch")
        changes(params)
        owner = params["repo"].split("/")[0].lower()
        for i, name in enumerate(params.get("reviewers") or []):
            team = _TEAM.fullmatch(name)
            if team and team.group(1).lower() != owner:
                raise InvalidParams(
                    f"/params/reviewers/{i}", f"team {name} is not in {owner}'s organisation"
                )

    # -- live state

    def _live(self, api: Api, params: Params, changed: Sequence[Change]) -> Live:
        base = params["base"]
        base_sha = api.branch_sha(base)
        if base_sha is None:
            raise EffectFailed(f"failed: {api.repo} has no branch {base} to open a PR into")
        head_sha = api.branch_sha(params["head"])
        if not changed:
            if head_sha is None:
                raise EffectFailed(
                    f"failed: {api.repo} has no branch {params['head']}; push it with "
                    "git.push first, or give `files` for the host to commit"
                )
            return Live(base_sha, head_sha)
        tree = api.commit(base_sha).tree
        return Live(base_sha, head_sha, tree, entries_at(api, tree, [c.path for c in changed]))

    def _conflicts(
        self, api: Api, params: Params, live: Live, changed: Sequence[Change]
    ) -> list[str]:
        """`files` that cannot be applied: unwritable, or changed since the agent's base_sha."""
        entries = live.entries or {}
        found = [
            why for c in changed if (why := _unwritable(c.path, entries.get(c.path), c)) is not None
        ]
        agent = params.get("base_sha")
        if changed and agent and agent != live.base_sha:
            try:
                then = entries_at(api, api.commit(agent).tree, [c.path for c in changed])
            except UnknownObjectException:
                return [*found, f"base_sha {agent[:12]} is not a commit in {api.repo}"]
            for c in changed:
                was, now = then.get(c.path), entries.get(c.path)
                if (was.sha if was else None) != (now.sha if now else None):
                    found.append(
                        f"{c.path} changed on {params['base']} since base_sha {agent[:12]}; "
                        "read it again and send the new content"
                    )
        return found

    # -- preview

    def preview(self, params: Params, ctx: Context) -> Preview:
        text = self._text(ctx)
        title, body = text(params["title"]), text(params.get("body"))
        message = text(params.get("commit_message") or params["title"])
        changed = changes(params)
        with self._edge(f"reading {params['repo']}", ctx):
            api = self._api(params, ctx)
            live = self._live(api, params, changed)
            existing = api.open_pulls(params["head"], params["base"])
            if changed:
                diff, facts = self._files_diff(api, params, live, changed)
            else:
                diff, facts = self._compare_diff(api, live)
            conflicts = self._conflicts(api, params, live, changed)
        remember(ctx, {"base": live.base_sha, "head": live.head_sha, "blobs": live.blobs()})
        head_state = (
            ("head", f"{params['head']} @ {str(live.head_sha)[:12]}")
            if not changed
            else (
                "head",
                f"{params['head']}: a new branch the host commits the files on"
                + (
                    ""
                    if live.head_sha is None
                    else f" (EXISTS at {live.head_sha[:12]}: applying will fail unless it "
                    "holds exactly these changes)"
                ),
            )
        )
        lines: list[tuple[str, str]] = [
            ("repo", params["repo"]),
            ("base", f"{params['base']} @ {live.base_sha[:12]}"),
            head_state,
            *facts,
        ]
        agent = params.get("base_sha")
        if agent and agent != live.base_sha:
            lines.append(
                (
                    "base moved",
                    f"{params['base']} is at {live.base_sha[:12]} now; the agent worked from "
                    f"{agent[:12]}",
                )
            )
        for why in conflicts:
            lines.append(("CONFLICT (applying will fail)", why))
        if existing:
            lines.append(
                (
                    "already open",
                    f"#{existing[0].get('number')} {existing[0].get('html_url')}: applying "
                    "returns it and creates nothing",
                )
            )
        if params.get("draft"):
            lines.append(("draft", "yes"))
        if params.get("labels"):
            lines.append(("labels", ", ".join(params["labels"])))
        if params.get("reviewers"):
            lines.append(("reviewers", ", ".join(params["reviewers"])))
        if changed:
            lines.append(("commit message", _oneline(message)))
        lines += _mention_facts(text)
        shown = f"Title: {title}\n\n{body or '(no description)'}\n\n{'=' * 72}\n{diff}"
        if len(shown) > MAX_DIFF:
            lines.append(
                ("truncated", f"the preview is {len(shown)} characters; shown: {MAX_DIFF}")
            )
            shown = shown[:MAX_DIFF]
        return Preview(
            title=f"open a pull request in {params['repo']}: {params['head']} → {params['base']}"
            f": {_oneline(title)}",
            target=f"github: {params['repo']} pull request {params['base']} ← {params['head']}",
            body=shown,
            body_kind="diff",
            facts=tuple(lines),
        )

    def _compare_diff(self, api: Api, live: Live) -> tuple[str, list[tuple[str, str]]]:
        assert live.head_sha is not None
        data = api.compare(live.base_sha, live.head_sha)
        commits = data.get("commits") or []
        files = data.get("files") or []
        log = []
        for c in commits:
            who = ((c.get("commit") or {}).get("author")) or {}
            message = str((c.get("commit") or {}).get("message", "")).splitlines() or [""]
            log.append(
                f"{str(c.get('sha', ''))[:12]} {who.get('name', '?')} <{who.get('email', '?')}>"
                f"\n    {message[0]}"
            )
        patches = [_file_patch(f) for f in files if isinstance(f, Mapping)]
        facts = [
            (
                "commits",
                f"{data.get('ahead_by', len(commits))} ahead, "
                f"{data.get('behind_by', 0)} behind {live.base_sha[:12]}",
            ),
            ("files", str(len(files))),
        ]
        if data.get("status") in ("identical", "behind"):
            facts.append(("NO CHANGES", "head has no commits base lacks: GitHub will refuse"))
        if len(files) >= COMPARE_MAX_FILES:
            facts.append(("truncated", f"GitHub lists at most {COMPARE_MAX_FILES} files"))
        return "\n".join(log) + "\n\n" + "".join(patches), facts

    def _files_diff(
        self, api: Api, params: Params, live: Live, changed: Sequence[Change]
    ) -> tuple[str, list[tuple[str, str]]]:
        entries = live.entries or {}
        parts = []
        unchanged = []
        for c in changed:
            entry = entries.get(c.path)
            if entry is not None and c.data is not None and git_blob_sha(c.data) == entry.sha:
                unchanged.append(c.path)
                continue
            old: bytes | None = None
            if entry is not None and entry.type == "blob" and entry.mode != "120000":
                if entry.size is not None and entry.size > SHOW_MAX:
                    parts.append(f"diff --git a/{c.path} b/{c.path}\n({entry.size} bytes now)\n")
                    continue
                old = api.blob(entry.sha)
            parts.append(_local_patch(c.path, old, c.data, entry.mode if entry else "100644"))
        facts = [("files", f"{len(changed)} ({len(unchanged)} unchanged)")]
        if unchanged and len(unchanged) == len(changed):
            facts.append(("NO CHANGES", "every file already has this content on the base"))
        return "".join(parts), facts

    # -- apply

    def apply(self, params: Params, ctx: Context) -> JSON:
        try:
            with self._edge(f"opening a pull request in {params['repo']}", ctx):
                return self._apply(self._api(params, ctx), params, ctx, recall(ctx))
        finally:
            forget(ctx)

    def _apply(
        self, api: Api, params: Params, ctx: Context, seen: Mapping[str, Any] | None
    ) -> JSON:
        text = self._text(ctx)
        title, body = text(params["title"]), text(params.get("body"))
        message = text(params.get("commit_message") or params["title"])
        head, base = params["head"], params["base"]
        existing = api.open_pulls(head, base)
        if existing:
            return self._output(existing[0], params, text, created=False, branch_created=False)
        changed = changes(params)
        live = self._live(api, params, changed)
        who = "the approver saw it" if seen else "the agent's base_sha"
        expected = seen.get("base") if seen else params.get("base_sha")
        if expected and expected != live.base_sha:
            raise EffectFailed(
                f"failed: {base} in {api.repo} moved since {who} ({str(expected)[:12]} → "
                f"{live.base_sha[:12]}); nothing was done: send the request again"
                + (" with base_sha " + live.base_sha if params.get("base_sha") else "")
            )
        branch_created = False
        if changed:
            if seen is not None and seen.get("blobs") != live.blobs():
                moved = [
                    p for p, s in live.blobs().items() if (seen.get("blobs") or {}).get(p) != s
                ]
                raise EffectFailed(
                    f"failed: {', '.join(moved[:5]) or 'the files'} changed on {base} since "
                    "the approver saw it; nothing was done: send the request again"
                )
            conflicts = self._conflicts(api, params, live, changed)
            if conflicts:
                raise EffectFailed(f"failed: {conflicts[0]}; nothing was done")
            branch_created = self._commit(api, params, live, changed, message)
        elif seen is not None and seen.get("head") != live.head_sha:
            raise EffectFailed(
                f"failed: {head} in {api.repo} moved since the approver saw it "
                f"({str(seen.get('head'))[:12]} → {str(live.head_sha)[:12]}); nothing was "
                "done: send the request again"
            )
        try:
            pull = api.create_pull(
                head=head, base=base, title=title, body=body, draft=bool(params.get("draft"))
            )
        except GithubException as exc:
            again = api.open_pulls(head, base) if exc.status == 422 else []
            if not again:
                raise
            pull = again[0]  # a pull request for head→base opened meanwhile
            return self._output(pull, params, text, created=False, branch_created=branch_created)
        number = _number(_get(pull, "number"))
        # the pull request exists now: what fails after it is a warning, not a failure
        warnings = []
        users, teams = _reviewers(params)
        steps: list[tuple[str, Callable[[], object]]] = []
        if params.get("labels"):
            steps.append(("adding labels", lambda: api.add_labels(number, params["labels"])))
        if users or teams:
            steps.append(
                ("requesting reviewers", lambda: api.request_reviewers(number, users, teams))
            )
        for doing, step in steps:
            try:
                step()
            except (GithubException, requests.RequestException) as exc:
                warnings.append(translate(exc, f"{doing} to #{number}", self._url(ctx)).reason)
        out = self._output(pull, params, text, created=True, branch_created=branch_created)
        out["warnings"] = warnings
        return out

    def _commit(
        self, api: Api, params: Params, live: Live, changed: Sequence[Change], message: str
    ) -> bool:
        """Commit `files` on base as the new branch head; False if this request did already."""
        assert live.base_tree is not None and live.entries is not None
        tree_entries: list[dict[str, Any]] = []
        for c in changed:
            entry = live.entries.get(c.path)
            mode = entry.mode if entry is not None else "100644"
            sha = None if c.data is None else api.create_blob(c.data)
            tree_entries.append({"path": c.path, "mode": mode, "type": "blob", "sha": sha})
        tree = api.create_tree(live.base_tree, tree_entries)
        if tree == live.base_tree:
            raise EffectFailed(
                f"failed: the files change nothing on {params['base']}; nothing was done"
            )
        head = params["head"]
        if live.head_sha is not None:
            return self._ours(api, head, live.head_sha, tree, live.base_sha)
        commit = api.create_commit(message, tree, [live.base_sha])
        try:
            api.create_branch(head, commit)
        except GithubException as exc:
            now = api.branch_sha(head) if exc.status == 422 else None
            if now is None:
                raise
            return self._ours(api, head, now, tree, live.base_sha)
        return True

    @staticmethod
    def _ours(api: Api, head: str, at: str, tree: str, base: str) -> bool:
        """An existing head is fine only if it holds exactly this change (a retry)."""
        found = api.commit(at)
        if found.tree == tree and found.parents == (base,):
            return True
        raise EffectFailed(
            f"failed: branch {head} already exists in {api.repo} with other commits; choose a "
            "new head name (with files the host creates the branch)"
        )

    @staticmethod
    def _output(
        pull: Mapping[str, Any],
        params: Params,
        text: Text,
        *,
        created: bool,
        branch_created: bool,
    ) -> JSON:
        return {
            "repo": params["repo"],
            "number": _number(_get(pull, "number")),
            "url": str(_get(pull, "html_url")),
            "head": params["head"],
            "base": params["base"],
            "head_sha": str((pull.get("head") or {}).get("sha", "")),
            "created": created,
            "branch_created": branch_created,
            "draft": bool(pull.get("draft", False)),
            "labels": list(params.get("labels") or []) if created else [],
            "reviewers": list(params.get("reviewers") or []) if created else [],
            "mentions_neutralised": text.mentions,
        }

    # -- undo

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        self._undoable(output)
        extra = (
            f", and delete branch {output['head']} (only if still at "
            f"{str(output['head_sha'])[:12]})"
            if output.get("branch_created")
            else ""
        )
        return Preview(
            title=f"close pull request #{output['number']} in {output['repo']}{extra}",
            target=f"github: {output['url']}",
        )

    @staticmethod
    def _undoable(output: Mapping[str, Any]) -> None:
        if not output.get("created"):
            raise EffectFailed(
                f"failed: this request found pull request #{output.get('number')} already open "
                "and did not create it; close it on GitHub if it should go"
            )

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        self._undoable(output)
        number = int(output["number"])
        done: JSON = {"number": number, "closed": False, "branch_deleted": False}
        with self._edge(f"closing pull request #{number} in {output['repo']}", ctx):
            api = self._api(output, ctx)
            pull = api.pull(number)
            if pull.get("merged"):
                raise EffectFailed(
                    f"failed: pull request #{number} was merged; closing cannot undo that: "
                    "revert the merge commit on GitHub"
                )
            if pull.get("state") == "open":
                api.close_pull(number)
                done["closed"] = True
            if output.get("branch_created"):
                now = api.branch_sha(str(output["head"]))
                if now is not None and now == output.get("head_sha"):
                    api.delete_branch(str(output["head"]))
                    done["branch_deleted"] = True
                elif now is not None:
                    done["note"] = f"{output['head']} moved since; it was left in place"
        return done


def _file_patch(f: Mapping[str, Any]) -> str:
    """One file of a comparison as `git diff` prints it."""
    name = str(f.get("filename", "?"))
    old = str(f.get("previous_filename") or name)
    status = f.get("status")
    head = f"diff --git a/{old} b/{name}\n"
    if status == "added":
        head += f"new file\n--- /dev/null\n+++ b/{name}\n"
    elif status == "removed":
        head += f"deleted file\n--- a/{old}\n+++ /dev/null\n"
    else:
        head += (f"rename from {old}\nrename to {name}\n" if old != name else "") + (
            f"--- a/{old}\n+++ b/{name}\n"
        )
    patch = f.get("patch")
    if patch is None:
        changes_count = f.get("changes", "?")
        return head + f"(binary, or too large for GitHub to show: {changes_count} changes)\n"
    return head + str(patch).rstrip("\n") + "\n"


def _local_patch(path: str, old: bytes | None, new: bytes | None, mode: str) -> str:
    """The diff of one `files` entry against the base, as GitHub will show it."""
    head = f"diff --git a/{path} b/{path}\n"
    if old is None and new is None:
        return head + "(nothing to delete: the file is not on the base)\n"
    if old is None:
        head += f"new file mode {mode}\n"
    elif new is None:
        head += f"deleted file mode {mode}\n"
    try:
        old_text = (old or b"").decode("utf-8")
        new_text = (new or b"").decode("utf-8")
        if "\0" in old_text or "\0" in new_text:
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "NUL byte")
    except UnicodeDecodeError:
        sizes = f"{len(old) if old is not None else 0} → {len(new) if new is not None else 0}"
        return head + f"Binary files differ ({sizes} bytes)\n"
    lines = difflib.unified_diff(
        _lines(old_text),
        _lines(new_text),
        fromfile="/dev/null" if old is None else f"a/{path}",
        tofile="/dev/null" if new is None else f"b/{path}",
    )
    body = "".join(lines)
    if not body and old != new:
        body = "(only the newline at the end of the file changes)\n"
    return head + body


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


HANDLERS = (PullRequestCreate, PullRequestComment, IssueCreate, IssueComment, LabelAdd)
