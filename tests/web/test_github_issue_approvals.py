"""Approval threads as issues, for effects that have no pull request: a waiting
email.send (delivered to a real SMTP server on 127.0.0.1 once approved) gets an issue in
`issues_repo` of the GitHub stand-in, with the same card (and the exact message the
broker would send), decided by the same `/broker` commands and rules."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker.web.server import WebServer
from tests.effects.github.approvals import PEOPLE, SECRET, SECRET_ENV, Stack, serving
from tests.effects.github.fake import seed_repo
from tests.effects.github.support import TOKEN, TOKEN_ENV
from tests.effects.netfixtures import SMTP, fixture_smtp_plain
from tests.support import eventually
from tests.web.conftest import Switch

__all__ = ["fixture_smtp_plain"]  # used by its name
ISSUES = "acme/approvals"
POLICY = """
[[rules]]
effect = "email.send"
when = { subject = "Inbox only" }
action = "approve"
approve_in_pr = false
reason = "decided in the inbox"

[[rules]]
effect = "email.send"
action = "approve"
reason = "a person reads every email the agent sends"
"""
MAIL = {
    "to": ["Jane Doe <jane@example.com>"],
    "subject": "Nightly build: 3 failures",
    "text": "Three tests failed.\nSee the log, @jane.\n",
}


def email_table(controller: Any) -> dict[str, Any]:
    return {
        "host": "127.0.0.1",
        "port": controller.port,
        "security": "none",
        "from": "Build Agent <agent@example.com>",
        "allow_domains": ["example.com"],
        "timeout": "5s",
    }


@contextmanager
def issues(
    tmp_path: Path, served: tuple[Switch, WebServer], smtp: SMTP, **github: Any
) -> Iterator[Stack]:
    """acme/api and acme/approvals on the stand-in, email through a local SMTP server."""
    with serving(
        tmp_path, served, POLICY, {"email": email_table(smtp[0])}, issues_repo=ISSUES, **github
    ) as running:
        seed_repo(tmp_path / "approvals.git", {"README.md": "approvals\n"})
        running.hub.add_repo(ISSUES, tmp_path / "approvals.git")
        for login, level in PEOPLE.items():
            running.hub.permissions[(ISSUES, login)] = level
        yield running


@pytest.fixture
def stack(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    served: tuple[Switch, WebServer],
    smtp_plain: SMTP,
) -> Iterator[Stack]:
    """Webhooks on."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with issues(tmp_path, served, smtp_plain) as running:
        yield running


def mail(stack: Stack, **changes: Any) -> str:
    doc = stack.harness.request("email.send", {**MAIL, **changes}, reason="tell @jane")
    assert stack.harness.submit(doc, terminal=False)["status"] == "pending"
    return str(doc["id"])


def test_a_waiting_email_is_an_issue_with_the_card_and_the_message(stack: Stack) -> None:
    """The issue's first comment is the card: the sha256, the agent's words marked as
    such, the exact message, how to decide by comment (no review, no check run)."""
    rid = mail(stack)
    thread = stack.thread_of(rid)
    assert thread.repo == ISSUES and thread.kind == "issue" and thread.branch is None
    issue = stack.hub.thread(ISSUES, thread.number)
    assert issue["title"].startswith("[broker] email.send:")
    [card] = stack.replies(thread)
    assert thread.sha256 in card and "written by the agent" in card
    assert "Three tests failed." in card and "@\u200bjane" in card  # no mention notifies
    assert f"/broker approve {thread.sha256[:16]}" in card and "Approve** review" not in card
    assert stack.hub.check_runs == {}


def test_an_approved_email_is_sent_and_the_issue_closed(stack: Stack, smtp_plain: SMTP) -> None:
    """A wrong prefix and a read-only commenter are refused in the issue; alice's
    `/broker approve <prefix>` sends the email once; the card says applied; the
    issue is told and closed."""
    _, inbox = smtp_plain
    rid = mail(stack)
    thread = stack.thread_of(rid)
    stack.comment(thread, "alice-gh", "/broker approve 0123456789abcdef", repo=ISSUES)
    stack.comment(thread, "dave-gh", f"/broker approve {thread.sha256[:16]}", repo=ISSUES)
    refused = [r for r in stack.replies(thread) if r.startswith("**Refused**")]
    assert "is not the sha256" in refused[0] and "does not have write access" in refused[1]
    assert stack.status(rid) == "pending" and inbox.messages == []
    stack.comment(thread, "alice-gh", f"/broker approve {thread.sha256[:16]} ok", repo=ISSUES)
    assert stack.harness.wait(rid)["status"] == "applied"
    eventually(lambda: any(r.startswith("**Applied**") for r in stack.replies(thread)))
    assert len(inbox.messages) == 1
    assert stack.hub.thread(ISSUES, thread.number)["state"] == "closed"
    card = stack.hub.repos[ISSUES].comments[thread.card_comment]["body"]
    assert "(applied)" in card and "Decided by alice" in card


def test_a_denied_email_closes_its_issue_and_a_rule_can_keep_one_out(
    stack: Stack, smtp_plain: SMTP
) -> None:
    """`/broker deny <reason>`: the agent reads the reason, the issue says denied and is
    closed, nothing is sent; a rule with approve_in_pr = false opens no issue."""
    _, inbox = smtp_plain
    rid = mail(stack)
    thread = stack.thread_of(rid)
    stack.comment(thread, "bob-gh", "/broker deny not to customers", repo=ISSUES)
    result = stack.harness.wait(rid)
    assert result["status"] == "denied" and "not to customers" in str(result)
    eventually(lambda: any(r.startswith("**Denied**:") for r in stack.replies(thread)))
    assert stack.hub.thread(ISSUES, thread.number)["state"] == "closed"
    kept = mail(stack, subject="Inbox only")
    stack.cards.drain()
    assert stack.cards.threads.store.by_request("default", kept) is None
    assert inbox.messages == []


def test_an_issue_thread_is_read_by_polling(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    served: tuple[Switch, WebServer],
    smtp_plain: SMTP,
) -> None:
    """Webhooks off, poll_interval on: alice's comment in the issue is read and sends
    the email; the issue is answered and closed."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    _, inbox = smtp_plain
    with issues(tmp_path, served, smtp_plain, webhook_secret_env=None, poll_interval="1s") as stack:
        rid = mail(stack)
        thread = stack.thread_of(rid)
        stack.hub.comment_as(
            "alice-gh", ISSUES, thread.number, f"/broker approve {thread.sha256[:16]}"
        )
        assert stack.harness.wait(rid, timeout=30)["status"] == "applied"
        eventually(lambda: any(r.startswith("**Applied**") for r in stack.replies(thread)))
        assert len(inbox.messages) == 1
        assert stack.hub.thread(ISSUES, thread.number)["state"] == "closed"
