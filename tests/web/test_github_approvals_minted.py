"""The approval threads' calls carry tokens minted through the credential seam when
[integrations.github] names a GitHub App (`credential = "NAME"`): against the
stand-in, which issues the App's installation tokens, refuses a token outside its
repository or permissions (403) and records every call's token. Without one, the
threads use the standing token, and say so."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from broker.integrations.github_tokens import REF_PERMISSIONS, THREAD_PERMISSIONS
from broker.web.server import WebServer
from effects.github import APP_TOKEN_CALL
from tests.effects.github.approvals import SECRET, SECRET_ENV, Stack, serving
from tests.effects.github.support import TOKEN, TOKEN_ENV, app_key
from tests.support import eventually
from tests.web.conftest import Switch

POLICY = """
[[rules]]
effect = "github.pull_request.create"
action = "approve"
reason = "a person reviews every pull request the agent opens"
"""
THREAD_ROUTES = ("/comments", "/check-runs", "/collaborators/", "/git/refs")


@contextmanager
def minted(tmp_path: Path, served: tuple[Switch, WebServer]) -> Iterator[Stack]:
    """The stand-in's App (id 4242, installation 77) as [credentials.acme-app]; no token_env."""
    key_file, public = app_key(tmp_path)
    app = {"kind": "github_app", "app_id": 4242, "installation_id": 77}
    with serving(
        tmp_path,
        served,
        POLICY,
        credentials={"acme-app": {**app, "private_key_file": str(key_file)}},
        app=(4242, public, 77),
        token_env=None,
        credential="acme-app",
    ) as running:
        yield running


def _permissions(actions: tuple[str, ...]) -> dict[str, str]:
    return dict(a.split(":", 1) for a in actions)


def test_thread_calls_carry_tokens_minted_for_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: tuple[Switch, WebServer]
) -> None:
    """Opening, deciding and closing the thread: each call's token was minted for acme/api
    alone, with checks/issues/pull_requests (or contents, for the staging ref) and no
    more; every one is revoked once the broker and its web server stop."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with minted(tmp_path, served) as stack:
        assert "github_app:acme-app" in stack.cards.threads.tokens.kind
        rid, thread = stack.waiting()
        stack.comment(thread, "alice-gh", f"/broker approve {thread.sha256[:16]}")
        assert stack.harness.wait(rid)["status"] == "applied"
        eventually(lambda: any(r.startswith("**Applied**") for r in stack.replies(thread)))
        hub = stack.hub
        minted_calls = hub.called(*APP_TOKEN_CALL)
        thread_calls = [c for c in hub.called() if any(p in c.route for p in THREAD_ROUTES)]
    asked = [c.body["permissions"] for c in minted_calls]
    assert all(c.body["repositories"] == ["api"] for c in minted_calls)
    assert _permissions(THREAD_PERMISSIONS) in asked and _permissions(REF_PERMISSIONS) in asked
    assert thread_calls and all(c.status < 400 for c in thread_calls)
    used = {c.auth.split(" ", 1)[-1] for c in thread_calls}
    assert all(token.startswith("ghs_") for token in used)  # installation tokens, not a PAT
    assert used <= set(hub.revoked)


def test_without_a_provider_the_standing_token_is_marked(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    served: tuple[Switch, WebServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """token_env only: the threads say they use a standing credential (the log line as
    the broker starts them), and every call carries that token."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with (
        caplog.at_level(logging.INFO, "broker.integrations.github"),
        serving(tmp_path, served, POLICY) as stack,
    ):
        assert stack.cards.threads.tokens.kind == "standing credential"
        stack.waiting()
        calls = [c for c in stack.hub.called() if "/comments" in c.route]
        assert calls and {c.auth for c in calls} == {f"Bearer {TOKEN}"}
    assert "GitHub approval threads: standing credential" in caplog.text
