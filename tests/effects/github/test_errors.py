"""The edge: every PyGithub and requests exception becomes a reason an agent can act on."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest
import requests
from github import GithubException

from broker.errors import EffectFailed
from effects.github import IssueCreate
from effects.github import errors as gh
from tests.effects.github.prism import free_port
from tests.effects.github.support import REPO, TOKEN, TOKEN_ENV, Hub

gh_errors = importlib.import_module("github.GithubException")


# -- the edge: errors an agent can act on ---------------------------------------------------


class TestErrors:
    @pytest.mark.parametrize(
        ("status", "body", "headers", "reason"),
        [
            (401, {"message": "Bad credentials"}, {}, "refused the host's credentials"),
            (
                403,
                {"message": "API rate limit exceeded for installation ID 1."},
                {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "4102444800"},
                "rate limit stopped .* resets at 2100-01-01T00:00:00Z",
            ),
            (
                403,
                {"message": "You have exceeded a secondary rate limit."},
                {"Retry-After": "60"},
                "resets in 60 s",
            ),
            (429, {"message": "Too many requests"}, {}, "rate limit"),
            (
                403,
                {"message": "Resource not accessible by integration"},
                {},
                "Resource not accessible by integration.*lack the permission",
            ),
            (404, {"message": "Not Found"}, {}, "answered 404 .* cannot see it"),
            (409, {"message": "Git Repository is empty."}, {}, "conflict .*empty"),
            (410, {"message": "Issues are disabled for this repo"}, {}, "gone or disabled"),
            (
                422,
                {"message": "Validation Failed", "errors": [{"field": "title", "code": "missing"}]},
                {},
                "as invalid .*Validation Failed; title missing",
            ),
            (500, {"message": "boom"}, {}, "GitHub broke .* may or may not have happened"),
        ],
    )
    def test_github_answers_become_reasons(
        self, hub: Hub, status: int, body: Any, headers: dict[str, str], reason: str
    ) -> None:
        """Stand-in: the fake (a fault per case). Each status gets a sentence, not a trace."""
        hub.fake.fault("POST", "/repos/{owner}/{repo}/issues", status, body, headers=headers)
        with pytest.raises(EffectFailed, match=reason) as caught:
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx())
        assert caught.value.reason.startswith("failed: ")
        assert TOKEN not in caught.value.reason
        assert isinstance(caught.value.__cause__, gh_errors.GithubException)

    def test_a_wrong_token_is_a_credentials_failure(
        self, hub: Hub, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Stand-in: the fake (it answers 401 Bad credentials to another token)."""
        monkeypatch.setenv(TOKEN_ENV, "ghp_wrong")
        with pytest.raises(EffectFailed, match="refused the host's credentials") as caught:
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx())
        assert isinstance(caught.value.__cause__, gh_errors.BadCredentialsException)

    def test_an_unknown_repository_is_not_found(self, hub: Hub) -> None:
        """Stand-in: the fake (it serves acme/api only)."""
        with pytest.raises(EffectFailed, match="404"):
            IssueCreate().apply({"repo": "acme/nope", "title": "t"}, hub.ctx())

    def test_connection_refused_and_timeout(self, hub: Hub) -> None:
        """Stand-ins: a closed port, and the fake answering after the 1 s timeout."""
        closed = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(EffectFailed, match=f"cannot connect to {closed} from the host"):
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx(base_url=closed))
        hub.fake.fault("POST", "/repos/{owner}/{repo}/issues", 201, delay=1.5)
        with pytest.raises(EffectFailed, match="did not answer in time; it may or may not"):
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx(timeout=1))

    def test_every_pygithub_exception_has_its_own_reason(self) -> None:
        """Stand-in: none. Each class PyGithub defines is mapped by name, none by accident."""
        defined: set[type[GithubException]] = {
            cls
            for _, cls in inspect.getmembers(gh_errors, inspect.isclass)
            if issubclass(cls, GithubException) and cls.__module__ == gh_errors.__name__
        }
        assert defined == set(gh.github_reasons())
        for cls in defined:
            exc = cls(500 if cls is GithubException else 403, {"message": "m"}, {})
            reason = gh.translate(exc, "doing it", "https://api.github.com").reason
            assert reason.startswith("failed: ") and "doing it" in reason, cls
        bad = gh_errors.BadAttributeException(1, str, None)
        assert "unexpected type" in gh.translate(bad, "x", "u").reason

    def test_every_requests_exception_is_translated(self) -> None:
        """Stand-in: none. Every requests error maps to a reason naming the host's URL."""
        classes = [
            cls
            for _, cls in inspect.getmembers(requests.exceptions, inspect.isclass)
            if issubclass(cls, requests.RequestException)
        ]
        assert len(classes) > 15
        for cls in classes:
            exc = cls("x", "", 0) if cls is requests.exceptions.JSONDecodeError else cls("x")
            reason = gh.translate(exc, "doing it", "https://ghe.example/api/v3").reason
            assert reason.startswith("failed: doing it: ") and "ghe.example" in reason, cls

    def test_the_edge_lets_effect_failures_through_and_keeps_the_cause(self) -> None:
        """Stand-in: none. edge() re-raises EffectFailed as is and chains what it translates."""
        with pytest.raises(EffectFailed, match="mine"), gh.edge("x", "u"):
            raise EffectFailed("failed: mine")
        with pytest.raises(EffectFailed) as caught, gh.edge("x", "u"):
            raise gh_errors.UnknownObjectException(404, {"message": "Not Found"}, {})
        assert isinstance(caught.value.__cause__, gh_errors.UnknownObjectException)
