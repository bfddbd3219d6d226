"""A waiting git.push approved in a pull request, with real git: the agent's bundle
(made by `git bundle` in a clone of a local bare repository, which the GitHub stand-in
serves as acme/api) is staged by the broker on a broker-owned branch of that remote as
a draft pull request; the approval binds to the commit the broker pushed; the staging
branch is deleted when the request is applied, denied or expires."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker.testing import FakeClock
from broker.web.server import WebServer
from tests.effects.github.approvals import SECRET_ENV, Stack, serving
from tests.effects.github.support import REPO, TOKEN, TOKEN_ENV
from tests.support import eventually
from tests.web.conftest import Switch

POLICY = """
[[rules]]
effect = "git.push"
action = "approve"
timeout = "1h"
on_timeout = "deny"
reason = "a person reviews every push of the agent"
"""
ENV = {
    "GIT_AUTHOR_NAME": "Agent",
    "GIT_AUTHOR_EMAIL": "agent@sandbox",
    "GIT_COMMITTER_NAME": "Agent",
    "GIT_COMMITTER_EMAIL": "agent@sandbox",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": "/usr/bin:/bin",
}


def run_git(where: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(where), *args], env=ENV, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


@contextmanager
def push_stack(tmp_path: Path, served: tuple[Switch, WebServer], **github: Any) -> Iterator[Stack]:
    git_table = {
        "remotes": {"origin": {"url": str(tmp_path / "api.git")}},
        "protected_branches": ["main", "release/*"],
    }
    with serving(
        tmp_path,
        served,
        POLICY,
        {"git": git_table},
        repositories={"api": {"github": REPO, "git_remotes": ["origin"]}},
        **github,
    ) as stack:
        yield stack


@pytest.fixture
def stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: tuple[Switch, WebServer]
) -> Iterator[Stack]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(SECRET_ENV, "whsec-test-0123456789")
    with push_stack(tmp_path, served) as running:
        yield running


def agent_push(stack: Stack, rid: str, text: str = "x = 3\n", branch: str = "agent/push") -> str:
    """The agent commits in its clone, bundles it and asks to push it; returns the commit."""
    work = stack.remote.parent / f"work-{rid}"
    subprocess.run(["git", "clone", "-q", str(stack.remote), str(work)], env=ENV, check=True)
    (work / "src" / "app.py").write_text(text, encoding="utf-8")
    run_git(work, "commit", "-qam", f"change for {rid}")
    bundle = work / "change.bundle"
    run_git(work, "bundle", "create", "-q", str(bundle), "origin/main..HEAD")
    stack.harness.write(f"{rid}.fix.bin", bundle.read_bytes())
    doc = {
        "version": 1,
        "effect": "git.push",
        "attachments": ["fix"],
        "reason": "the fix; @bob look",
        "params": {"remote": "origin", "branch": branch, "bundle": "fix", "expected_old": None},
    }
    assert stack.harness.submit(doc, name=rid, terminal=False, timeout=30)["status"] == "pending"
    return run_git(work, "rev-parse", "HEAD")


def test_a_waiting_push_is_staged_as_a_draft_and_applied_by_a_review(stack: Stack) -> None:
    """The bundle's commit is pushed to broker/pending/<id> (not to the agent's branch),
    a draft PR against main shows it, the card says the branch exists and goes; an
    Approve review of that commit pushes agent/push, the check succeeds, the staging
    branch is deleted, and the thread says what was pushed."""
    commit = agent_push(stack, "push1")
    thread = stack.thread_of("push1")
    assert thread.head == commit and thread.branch == "broker/pending/push1"
    assert stack.branches().get("broker/pending/push1") == commit
    assert "agent/push" not in stack.branches()
    pull = stack.hub.thread(REPO, thread.number)
    assert pull["draft"] and pull["head"] == "broker/pending/push1" and pull["base"] == "main"
    [card] = stack.replies(thread)
    assert "**unapproved** commit" in card and "deleted when the request is" in card
    assert f"review of commit `{commit[:12]}`" in card and "@\u200bbob" in card
    assert stack.hub.check_runs[int(str(thread.check_run))]["head_sha"] == commit
    stack.review(thread, "alice-gh", commit)
    assert stack.harness.wait("push1", timeout=30)["status"] == "applied"
    eventually(lambda: any(r.startswith("**Applied**: pushed") for r in stack.replies(thread)))
    branches = stack.branches()
    assert branches.get("agent/push") == commit and "broker/pending/push1" not in branches
    assert stack.hub.check_runs[int(str(thread.check_run))]["history"] == ["queued", "success"]
    assert stack.hub.thread(REPO, thread.number)["state"] == "closed"


def test_a_push_approved_by_prefix_and_refused_after_the_head_moved(stack: Stack) -> None:
    """Someone pushes to the staging branch: a review of the commit the broker pushed is
    refused (the head moved) and nothing is pushed; a second request is approved by
    `/broker approve <prefix>` at its unmoved head."""
    first = agent_push(stack, "push1")
    thread = stack.thread_of("push1")
    moved = stack.hub.force_push(REPO, "broker/pending/push1", {"evil.txt": b"x\n"})
    stack.review(thread, "alice-gh", first)
    stack.review(thread, "bob-gh", moved)
    refused = [r for r in stack.replies(thread) if r.startswith("**Refused**")]
    assert "head moved" in refused[0] and "review the change as it now stands" in refused[1]
    assert stack.status("push1") == "pending" and "agent/push" not in stack.branches()
    second = agent_push(stack, "push2", "x = 4\n", branch="agent/other")
    other = stack.thread_of("push2")
    stack.comment(other, "bob-gh", f"/broker approve {other.sha256[:16]} looked at it")
    assert stack.harness.wait("push2", timeout=30)["status"] == "applied"
    assert stack.branches().get("agent/other") == second


def test_a_denied_or_expired_push_deletes_its_staging_branch(stack: Stack) -> None:
    """Denied: the staging branch is deleted, the check fails, nothing reached the
    agent's branch; expired: the same."""
    agent_push(stack, "push1")
    denied = stack.thread_of("push1")
    stack.comment(denied, "bob-gh", "/broker deny split it in two")
    assert stack.harness.wait("push1", timeout=30)["status"] == "denied"
    agent_push(stack, "push2", "x = 5\n")
    expired = stack.thread_of("push2")
    clock = stack.harness.clock
    assert isinstance(clock, FakeClock)
    clock.advance(3601)
    assert stack.harness.wait("push2", timeout=30)["status"] == "expired"
    for thread in (denied, expired):
        run = int(str(thread.check_run))
        eventually(lambda run=run: stack.hub.check_runs[run]["history"] == ["queued", "failure"])
        eventually(lambda t=thread: any(_last_word(r) for r in stack.replies(t)))
    branches = stack.branches()
    assert not any(b.startswith("broker/pending/") for b in branches)
    assert "agent/push" not in branches


def test_no_staging_on_a_protected_branch_or_a_public_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: tuple[Switch, WebServer]
) -> None:
    """A staging prefix under a protected glob, then a public repository: nothing is
    pushed, no draft is opened, and the request waits in the inbox as before."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(SECRET_ENV, "whsec-test-0123456789")
    for case, extra in (("protected", {"staging_prefix": "release/"}), ("public", {})):
        where = tmp_path / case
        where.mkdir()
        with push_stack(where, served, **extra) as stack:
            if case == "public":
                stack.hub.private.clear()
            agent_push(stack, "push1")
            stack.cards.drain()
            assert stack.cards.threads.store.by_request("default", "push1") is None
            assert stack.hub.pulls(REPO) == [] and stack.status("push1") == "pending"
            assert set(stack.branches()) == {"main", "agent/fix"}


def _last_word(reply: str) -> bool:
    return reply.startswith(("**Denied**", "**Expired**")) and "is deleted" in reply
