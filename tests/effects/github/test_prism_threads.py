"""Prism serving GitHub's OpenAPI description accepts every call of a pull request's
approval thread (broker.integrations.github_threads.ThreadApi), and the stand-in that
the approval tests run against (fake_reviews.py) serves each of those routes."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.integrations.github_threads import THREAD_CALLS, ThreadApi, ThreadSettings
from broker.integrations.github_tokens import ThreadTokens
from tests.effects.github.fake_reviews import ReviewingGitHub
from tests.effects.github.prism import RecordingProxy
from tests.effects.github.support import REPO, TOKEN
from tests.effects.github.test_prism import accepted

SHA = "a" * 40
OUT = {"title": "request 0123: pending", "summary": "waiting"}
CASES: dict[str, Callable[[ThreadApi], object]] = {
    "permission": lambda api: api.permission(REPO, "alice"),
    "comment": lambda api: api.comment(REPO, 42),
    "reply": lambda api: api.reply(REPO, 7, "**Recorded**"),
    "edit_comment": lambda api: api.edit_comment(REPO, 42, "the card"),
    "head": lambda api: api.head(REPO, 7),
    "private": lambda api: api.private(REPO),
    "branch_sha": lambda api: api.branch_sha(REPO, "agent/fix"),
    "create_branch": lambda api: api.create_branch(REPO, "broker/pending/r1", SHA),
    "delete_branch": lambda api: api.delete_branch(REPO, "broker/pending/r1"),
    "draft": lambda api: api.draft(REPO, "broker/pending/r1", "main", "[broker] t", "b"),
    "open_draft": lambda api: api.open_draft(REPO, "broker/pending/r1"),
    "check_runs": lambda api: api.check_runs(REPO, SHA),
    "issue": lambda api: api.issue(REPO, "[broker] s3.put_object: put", "the card follows"),
    "close_pull": lambda api: api.close_pull(REPO, 7),
    "close_issue": lambda api: api.close_issue(REPO, 7),
    "check_run": lambda api: api.check_run(REPO, SHA, OUT),
    "complete_check": lambda api: api.complete_check(REPO, 9, "success", OUT),
    "check_state": lambda api: api.check_state(REPO, 9),
    "comments": lambda api: api.comments(REPO, 7),
    "reviews": lambda api: api.reviews(REPO, 7),
}


def settings(url: str, tmp_path: Path) -> ThreadSettings:
    return ThreadSettings(url, TOKEN, "broker/pending/", frozenset(), None, {}, tmp_path)


def test_the_stand_in_serves_every_thread_call() -> None:
    """Stand-in: none. Every ThreadApi call has a case here and a route in the stand-in."""
    routes = {(method, route) for method, route, _, _ in ReviewingGitHub()._routes}
    assert set(THREAD_CALLS.values()) <= routes
    assert set(CASES) == set(THREAD_CALLS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_prism_accepts_each_thread_call(name: str, prism: RecordingProxy, tmp_path: Path) -> None:
    """Stand-in: Prism (GitHub's description validates method, path, query and body)."""
    api = ThreadApi(settings(prism.url, tmp_path), ThreadTokens(prism.url, TOKEN, None))
    prism.take()
    try:
        CASES[name](api)
    finally:
        api.close()
    exchanges = prism.take()
    accepted(exchanges)
    verb, template = THREAD_CALLS[name]
    path = re.sub(r"\{[a-z_]+\}", "[^/]+", template.replace("{owner}/{repo}", REPO))
    assert [(e.method, bool(re.fullmatch(path, e.path))) for e in exchanges] == [(verb, True)]
