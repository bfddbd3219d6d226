"""The GitHub stand-in, extended for approving in a pull request: comments by any user
(and their edits), reviews with their `commit_id`, collaborator permissions, check
runs, the repository's visibility, and webhook deliveries signed as GitHub signs them.

`ReviewingGitHub` is `FakeGitHub` with these routes added; what people do on GitHub's
side (comment, edit, review, force-push) are its methods, and `delivery` builds the
signed webhook GitHub would send for it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from tests.effects.github.fake import Endpoint, FakeGitHub, Reply, Repo, commit_on


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ReviewingGitHub(FakeGitHub):
    """FakeGitHub with reviews, people's comments, permissions and check runs."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.permissions: dict[tuple[str, str], str] = {}  # (repo, login) → admin|write|read
        self.private: set[str] = set()
        self.reviews: dict[int, dict[str, Any]] = {}
        self.check_runs: dict[int, dict[str, Any]] = {}
        self._next_id = 5000

    def _endpoints(self) -> list[tuple[str, str, Endpoint]]:
        r = "/repos/{owner}/{repo}"
        return [
            *super()._endpoints(),
            ("GET", r, self._get_repo),
            ("GET", f"{r}/collaborators/{{username}}/permission", self._permission),
            ("GET", f"{r}/issues/comments/{{comment_id}}", self._get_comment),
            ("PATCH", f"{r}/issues/comments/{{comment_id}}", self._edit_comment),
            ("GET", f"{r}/issues/{{issue_number}}/comments", self._list_comments),
            ("GET", f"{r}/pulls/{{pull_number}}/reviews", self._list_reviews),
            ("POST", f"{r}/check-runs", self._create_check),
            ("PATCH", f"{r}/check-runs/{{check_run_id}}", self._update_check),
            ("GET", f"{r}/check-runs/{{check_run_id}}", self._get_check),
            ("GET", f"{r}/commits/{{ref}}/check-runs", self._list_checks),
        ]

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- routes

    def _get_repo(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        private = repo.full_name.lower() in self.private
        return 200, {
            "id": 1,
            "full_name": repo.full_name,
            "private": private,
            "visibility": "private" if private else "public",
        }

    def _permission(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        level = self.permissions.get((repo.full_name.lower(), p["username"].lower()))
        if level is None:
            return 404, {"message": f"{p['username']} is not a user"}
        return 200, {"permission": level, "role_name": level, "user": {"login": p["username"]}}

    def _get_comment(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        comment = repo.comments.get(int(p["comment_id"]))
        return (404, {"message": "Not Found"}) if comment is None else (200, comment)

    def _edit_comment(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        comment = repo.comments.get(int(p["comment_id"]))
        if comment is None:
            return 404, {"message": "Not Found"}
        comment.update(body=str(body.get("body", "")), updated_at=_stamp())
        return 200, comment

    def _list_comments(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        number = int(p["issue_number"])
        return 200, [c for c in repo.comments.values() if c["number"] == number]

    def _list_reviews(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        number = int(p["pull_number"])
        return 200, [r for r in self.reviews.values() if r["pull_number"] == number]

    def _create_check(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        if not body.get("name") or not body.get("head_sha"):
            return 422, {"message": "Validation Failed"}
        run = {"id": self._id(), "repo": repo.full_name, **body, "history": [body.get("status")]}
        self.check_runs[run["id"]] = run
        return 201, run

    def _get_check(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        run = self.check_runs.get(int(p["check_run_id"]))
        return (404, {"message": "Not Found"}) if run is None else (200, run)

    def _list_checks(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        runs = [
            r
            for r in self.check_runs.values()
            if r["repo"].lower() == repo.full_name.lower()
            and r["head_sha"] == p["ref"]
            and r["name"] == q.get("check_name", r["name"])
        ]
        return 200, {"total_count": len(runs), "check_runs": runs}

    def _update_check(self, repo: Repo, p: dict[str, str], q: dict[str, str], body: Any) -> Reply:
        run = self.check_runs.get(int(p["check_run_id"]))
        if run is None:
            return 404, {"message": "Not Found"}
        run.update(body)
        run["history"].append(body.get("conclusion") or body.get("status"))
        return 200, run

    # -- what people do on GitHub

    def _repo(self, full_name: str) -> Repo:
        return self.repos[full_name.lower()]

    def comment_as(
        self, login: str, full_name: str, number: int, body: str, kind: str = "User"
    ) -> dict[str, Any]:
        """`login` comments on the thread; returns the comment as the API shows it."""
        with self._lock:
            repo, cid, now = self._repo(full_name), self._id(), _stamp()
            comment = {
                "id": cid,
                "body": body,
                "user": {"login": login, "id": cid, "type": kind},
                "created_at": now,
                "updated_at": now,
                "number": number,
                "html_url": f"{self.url}/{full_name}/pull/{number}#issuecomment-{cid}",
            }
            repo.comments[cid] = comment
            return comment

    def edit(self, full_name: str, comment_id: int, body: str) -> dict[str, Any]:
        with self._lock:
            comment = self._repo(full_name).comments[comment_id]
            comment.update(body=body, updated_at="2099-01-01T00:00:00Z")
            return comment

    def review_as(
        self, login: str, number: int, commit_id: str, state: str = "APPROVED", kind: str = "User"
    ) -> dict[str, Any]:
        with self._lock:
            rid = self._id()
            review = {
                "id": rid,
                "user": {"login": login, "id": rid, "type": kind},
                "body": "",
                "state": state,
                "commit_id": commit_id,
                "pull_number": number,
                "submitted_at": _stamp(),
            }
            self.reviews[rid] = review
            return review

    def force_push(self, full_name: str, branch: str, files: dict[str, bytes | None]) -> str:
        """Someone pushes to the staging branch after the broker did: the head moves."""
        with self._lock:
            return commit_on(self._repo(full_name).git_dir, branch, files, "moved")

    def replies(self, full_name: str, number: int) -> list[str]:
        with self._lock:
            return [
                c["body"]
                for c in self._repo(full_name).comments.values()
                if c["number"] == number and c["user"]["login"] == "broker-bot"
            ]


def delivery(secret: str, event: str, payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a webhook delivery GitHub signs with `secret`."""
    body = json.dumps(payload).encode()
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": f"sha256={digest}",
    }


def comment_payload(
    full_name: str, comment: dict[str, Any], action: str = "created"
) -> dict[str, Any]:
    return {
        "action": action,
        "repository": {"full_name": full_name},
        "issue": {"number": comment["number"], "pull_request": {}},
        "comment": comment,
    }


def review_payload(full_name: str, review: dict[str, Any]) -> dict[str, Any]:
    return {
        "action": "submitted",
        "repository": {"full_name": full_name},
        "pull_request": {"number": review["pull_number"]},
        "review": review,
    }
