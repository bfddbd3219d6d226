"""Prism serving GitHub's OpenAPI description accepts every call the handlers send."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.testing import make_context
from effects import github as gh
from effects.base import Context
from effects.github import (
    APP_REVOKE_CALL,
    APP_TOKEN_CALL,
    Api,
    IssueComment,
    IssueCreate,
    LabelAdd,
    PullRequestComment,
    PullRequestCreate,
)
from tests.effects.github.fake import FakeGitHub
from tests.effects.github.prism import RecordingProxy
from tests.effects.github.support import FILES, REPO, TOKEN, TOKEN_ENV, pr

gh_errors = importlib.import_module("github.GithubException")


# -- Prism: GitHub's OpenAPI description accepts every call ----------------------------------

SHA, SHA2 = "a" * 40, "b" * 40
PRISM_CASES: dict[str, Callable[[Api], object]] = {
    "branch_sha": lambda api: api.branch_sha("agent/fix"),
    "commit": lambda api: api.commit(SHA),
    "tree": lambda api: api.tree(SHA),
    "blob": lambda api: api.blob(SHA),
    "compare": lambda api: api.compare(SHA, SHA2),
    "create_blob": lambda api: api.create_blob(b"\x89PNG bytes"),
    "create_tree": lambda api: api.create_tree(
        SHA,
        [
            {"path": "docs/a.md", "mode": "100644", "type": "blob", "sha": SHA2},
            {"path": "old.txt", "mode": "100644", "type": "blob", "sha": None},
        ],
    ),
    "create_commit": lambda api: api.create_commit("a message", SHA, [SHA2]),
    "create_branch": lambda api: api.create_branch("agent/fix", SHA),
    "delete_branch": lambda api: api.delete_branch("agent/fix"),
    "open_pulls": lambda api: api.open_pulls("agent/fix", "main"),
    "create_pull": lambda api: api.create_pull(
        head="agent/fix", base="main", title="t", body="b", draft=True
    ),
    "pull": lambda api: api.pull(7),
    "close_pull": lambda api: api.close_pull(7),
    "request_reviewers": lambda api: api.request_reviewers(7, ["alice"], ["core"]),
    "issue": lambda api: api.issue(7),
    "create_issue": lambda api: api.create_issue(title="t", body="b", labels=["bug"]),
    "close_issue": lambda api: api.close_issue(7),
    "comment": lambda api: api.comment(7, "a comment"),
    "delete_comment": lambda api: api.delete_comment(42),
    "labels": lambda api: api.labels(7),
    "add_labels": lambda api: api.add_labels(7, ["bug", "needs review"]),
    "remove_label": lambda api: api.remove_label(7, "needs review"),
}


def prism_ctx(proxy: RecordingProxy, tmp_path: Path, **settings: Any) -> Context:
    table = {"token_env": TOKEN_ENV, "base_url": proxy.url, **settings}
    return make_context(
        table,
        integration="github",
        sandbox="sb",
        request_id="prism",
        request_sha256="c" * 64,
        state_dir=tmp_path,
        secrets={"token": TOKEN},
    )


def accepted(exchanges: list[Any]) -> None:
    assert exchanges, "no request reached Prism"
    for ex in exchanges:
        assert 200 <= ex.status < 300, f"{ex.method} {ex.path} → {ex.status}"
        request_errors = [e for e in ex.errors if e.startswith("request")]
        assert request_errors == [], f"{ex.method} {ex.path}: {request_errors}"


def test_the_fake_serves_exactly_the_handlers_operations() -> None:
    """Stand-in: none. The fake routes exactly the REST calls Api names, by the same paths."""
    routes = {(method, route) for method, route, _, _ in FakeGitHub()._routes}
    assert routes == {*Api.operations().values(), APP_TOKEN_CALL, APP_REVOKE_CALL}
    assert set(PRISM_CASES) == set(Api.operations())


@pytest.mark.parametrize("name", sorted(PRISM_CASES))
def test_prism_accepts_each_call(
    name: str, prism: RecordingProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in: Prism (GitHub's description validates method, path, query and body)."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    prism.take()
    PRISM_CASES[name](Api(gh.client(prism_ctx(prism, tmp_path)), REPO))
    exchanges = prism.take()
    accepted(exchanges)
    verb, template = Api.operations()[name]
    path = re.sub(r"\{[a-z_]+\}", "[^/]+", template.replace("{owner}/{repo}", REPO))
    assert [(e.method, bool(re.fullmatch(path, e.path))) for e in exchanges] == [(verb, True)]


def test_prism_accepts_every_handlers_calls(
    prism: RecordingProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in: Prism. Each handler's preview, apply and undo send only valid requests."""
    # Prism answers with the description's examples, so the flows follow them (an open
    # pull request exists already, say); what is checked is that every request is valid
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    ctx = prism_ctx(prism, tmp_path)
    prism.take()
    flows: list[tuple[Any, dict[str, Any]]] = [
        (PullRequestCreate(), pr(labels=["bug"], reviewers=["alice"])),
        (PullRequestCreate(), pr(files=FILES, base_sha=SHA)),
        (IssueCreate(), {"repo": REPO, "title": "t", "body": "@bob", "labels": ["bug"]}),
        (IssueComment(), {"repo": REPO, "number": 7, "body": "b"}),
        (PullRequestComment(), {"repo": REPO, "number": 7, "body": "b"}),
        (LabelAdd(), {"repo": REPO, "number": 7, "labels": ["triage"]}),
    ]
    for handler, params in flows:
        handler.check(params, ctx)
        handler.preview(params, ctx)
        out = handler.apply(params, ctx)
        if out.get("created", True):
            handler.revert(out, ctx)
    accepted(prism.take())
