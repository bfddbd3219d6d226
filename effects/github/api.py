"""One method per GitHub REST call the handlers make, each marked with the operation it
sends (`Api.operations()`); the tests send every one of them to Prism serving GitHub's
OpenAPI description.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from broker.errors import EffectFailed

if TYPE_CHECKING:
    from github import Github

F = TypeVar("F", bound=Callable[..., Any])


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


def pick(data: Any, *keys: str) -> Any:
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
        from github.GithubException import UnknownObjectException

        try:
            data = self._send("GET", "/git/ref/" + quote(f"heads/{branch}", safe=""))
        except UnknownObjectException:
            return None
        return str(pick(data, "object", "sha"))

    @rest("GET", "/repos/{owner}/{repo}/git/commits/{commit_sha}")
    def commit(self, sha: str) -> Commit:
        data = self._send("GET", f"/git/commits/{quote(sha, safe='')}")
        parents = tuple(str(pick(p, "sha")) for p in pick(data, "parents"))
        return Commit(str(pick(data, "sha")), str(pick(data, "tree", "sha")), parents)

    @rest("GET", "/repos/{owner}/{repo}/git/trees/{tree_sha}")
    def tree(self, sha: str) -> dict[str, Entry]:
        """One level of a tree: name → entry."""
        data = self._send("GET", f"/git/trees/{quote(sha, safe='')}")
        out: dict[str, Entry] = {}
        for item in pick(data, "tree"):
            size = item.get("size")
            out[str(pick(item, "path"))] = Entry(
                str(pick(item, "mode")),
                str(pick(item, "type")),
                str(pick(item, "sha")),
                size if isinstance(size, int) else None,
            )
        return out

    @rest("GET", "/repos/{owner}/{repo}/git/blobs/{file_sha}")
    def blob(self, sha: str) -> bytes:
        data = self._send("GET", f"/git/blobs/{quote(sha, safe='')}")
        content = str(pick(data, "content"))
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
        return str(pick(self._send("POST", "/git/blobs", body=body), "sha"))

    @rest("POST", "/repos/{owner}/{repo}/git/trees")
    def create_tree(self, base_tree: str, entries: Sequence[Mapping[str, Any]]) -> str:
        body = {"base_tree": base_tree, "tree": [dict(e) for e in entries]}
        return str(pick(self._send("POST", "/git/trees", body=body), "sha"))

    @rest("POST", "/repos/{owner}/{repo}/git/commits")
    def create_commit(self, message: str, tree: str, parents: Sequence[str]) -> str:
        body = {"message": message, "tree": tree, "parents": list(parents)}
        return str(pick(self._send("POST", "/git/commits", body=body), "sha"))

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
        return [str(pick(label, "name")) for label in data]

    @rest("POST", "/repos/{owner}/{repo}/issues/{issue_number}/labels")
    def add_labels(self, number: int, labels: Sequence[str]) -> list[str]:
        data = self._send("POST", f"/issues/{number}/labels", body={"labels": list(labels)})
        return [str(pick(label, "name")) for label in data]

    @rest("DELETE", "/repos/{owner}/{repo}/issues/{issue_number}/labels/{name}")
    def remove_label(self, number: int, label: str) -> None:
        self._send("DELETE", f"/issues/{number}/labels/{quote(label, safe='')}")


def number_of(value: Any) -> int:
    """A number in GitHub's answer (an issue's, a comment's id); else a sentence."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise EffectFailed(f"failed: GitHub answered with {value!r} where a number belongs")
