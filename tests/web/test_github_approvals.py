"""Approving in the pull request, against the GitHub stand-in (tests/effects/github/
fake_reviews.py) with a serving broker, the real github.pull_request.create handler and
the web server's webhook: the draft PR and its card, decisions by review and by
`/broker` comment bound to the digest and the head, each refusal answered in the thread,
quorum across GitHub and the CLI, and the `broker/approval` check run's states."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.approval.decisions import Ballot, decide_and_wake
from broker.store.factory import open_store
from broker.testing import FakeClock
from broker.web.server import WebServer
from tests.effects.github.approvals import SECRET, SECRET_ENV, Stack, serving
from tests.effects.github.fake_reviews import comment_payload, delivery, review_payload
from tests.effects.github.support import REPO, TOKEN, TOKEN_ENV
from tests.support import TLS, eventually
from tests.web.conftest import Switch

POLICY = """
[[rules]]
effect = "github.pull_request.create"
when = { title = "Three" }
action = "approve"
approvals = 3
reason = "three people for this one"

[[rules]]
effect = "github.pull_request.create"
when = { title = "Elsewhere" }
action = "approve"
approve_in_pr = false
reason = "decided in the inbox only"

[[rules]]
effect = "github.pull_request.create"
action = "approve"
timeout = "1h"
on_timeout = "deny"
reason = "a person reviews every pull request the agent opens"
"""


@pytest.fixture
def stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: tuple[Switch, WebServer]
) -> Iterator[Stack]:
    """Webhooks on: GitHub's deliveries reach the web server."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with serving(tmp_path, served, POLICY) as running:
        yield running


def test_the_draft_pull_request_is_the_card(stack: Stack) -> None:
    """A waiting request gets a draft PR on a broker-owned branch at the agent's head,
    a card comment with the sha256 and the agent's words marked as such, and a queued check."""
    rid, thread = stack.waiting()
    pull = stack.hub.thread(REPO, thread.number)
    assert pull["draft"] and pull["head"] == f"broker/pending/{rid}" and pull["base"] == "main"
    [card] = stack.replies(thread)
    assert thread.sha256 in card and "written by the agent" in card
    assert "@\u200balice" in card and "/broker approve" in card
    run = stack.hub.check_runs[int(str(thread.check_run))]
    assert run["name"] == "broker/approval" and run["head_sha"] == thread.head
    assert run["status"] == "queued"


def test_a_rule_can_keep_its_requests_out_of_the_pull_request(stack: Stack) -> None:
    """A rule with approve_in_pr = false: the request waits, no draft, no card, no check."""
    doc = stack.harness.request(
        "github.pull_request.create",
        {"repo": REPO, "head": "agent/fix", "base": "main", "title": "Elsewhere"},
    )
    assert stack.harness.submit(doc, terminal=False)["status"] == "pending"
    stack.cards.drain()
    assert stack.cards.threads.store.by_request("default", str(doc["id"])) is None
    assert stack.hub.pulls(REPO) == [] and stack.hub.check_runs == {}


def test_an_approve_review_at_the_pushed_head_applies_once(stack: Stack) -> None:
    """Alice's APPROVE review of the head the broker pushed applies the request once;
    the card, the thread, the check run and the staging branch follow; a replay is refused."""
    rid, thread = stack.waiting()
    made = stack.hub.review_as("alice-gh", thread.number, thread.head)
    body, headers = delivery(SECRET, "pull_request_review", review_payload(REPO, made))
    assert (
        httpx.post(
            f"{stack.url}/github/webhook", content=body, headers=headers, verify=TLS
        ).status_code
        == 200
    )
    result = stack.harness.wait(rid)
    assert result["status"] == "applied"
    replay = httpx.post(f"{stack.url}/github/webhook", content=body, headers=headers, verify=TLS)
    assert replay.status_code == 409 and replay.json()["error"]["code"] == "replayed"
    eventually(lambda: stack.hub.check_runs[int(str(thread.check_run))]["history"][-1] == "success")
    real = [p for p in stack.hub.pulls(REPO) if p["head"] == "agent/fix"]
    assert len(real) == 1  # the handler opened the agent's PR, once
    assert any(r.startswith("**Approved** by alice") for r in stack.replies(thread))
    eventually(lambda: any(r.startswith("**Applied**: http") for r in stack.replies(thread)))
    said = [r.split(" ", 1)[0] for r in stack.replies(thread)[1:]]
    assert said == ["**Approved**", "**Applied**:"]  # the answer first, the outcome last
    assert stack.hub.thread(REPO, thread.number)["state"] == "closed"
    assert eventually(lambda: stack.hub.check_runs and not _branch(stack, rid))


def _branch(stack: Stack, rid: str) -> bool:
    return any(f"broker/pending/{rid}" in ref for ref in _refs(stack))


def _refs(stack: Stack) -> list[str]:
    from tests.effects.github.fake import git

    return git(stack.hub.repos[REPO].git_dir, "for-each-ref", "--format=%(refname)").split()


def test_a_review_after_the_head_moved_is_refused(stack: Stack) -> None:
    """After a force-push to the staging branch, a review at the old head and one at the
    new head both decide nothing, and the thread says why."""
    rid, thread = stack.waiting()
    moved = stack.hub.force_push(REPO, f"broker/pending/{rid}", {"evil.txt": b"x\n"})
    stack.review(thread, "alice-gh", thread.head)
    stack.review(thread, "bob-gh", moved)
    answers = [r for r in stack.replies(thread) if r.startswith("**Refused**")]
    assert "head moved" in answers[0] and "review the change as it now stands" in answers[1]
    assert stack.status(rid) == "pending"


@pytest.mark.parametrize(
    ("login", "body", "kind", "why"),
    [
        ("alice-gh", "/broker approve 0123456789abcdef", "User", "is not the sha256"),
        ("dave-gh", "/broker approve {prefix}", "User", "does not have write access"),
        ("agent-bot", "/broker approve {prefix}", "User", "an agent's account"),
        ("helper[bot]", "/broker approve {prefix}", "Bot", "an agent's account"),
        ("pr-bot-gh", "/broker approve {prefix}", "User", "is the agent that asked"),
        ("eve-gh", "/broker approve {prefix}", "User", "does not have write access"),
        ("frank-gh", "/broker approve {prefix}", "User", "is not mapped to an approver"),
        ("bob-gh", "/broker approve", "User", "needs the request's sha256"),
        ("alice-gh", "/broker deny", "User", "a denial needs a reason"),
    ],
)
def test_a_command_that_may_not_decide_is_refused_in_the_thread(
    stack: Stack, login: str, body: str, kind: str, why: str
) -> None:
    """A wrong prefix, read access or none, the agent's own account, a Bot, an approver
    who acts_for the sandbox, a missing prefix or reason: refused, answered in the
    thread, and the request still waits."""
    rid, thread = stack.waiting()
    assert (
        stack.comment(thread, login, body.format(prefix=thread.sha256[:16]), kind).status_code
        == 200
    )
    [answer] = [r for r in stack.replies(thread) if r.startswith("**Refused**")]
    assert why in answer
    assert stack.status(rid) == "pending"


def test_an_edited_comment_decides_nothing(stack: Stack) -> None:
    """A comment edited into `/broker approve …` (the edited delivery) and one edited
    after it was written (the API shows it changed) are both refused."""
    rid, thread = stack.waiting()
    first = stack.hub.comment_as("alice-gh", REPO, thread.number, "looks fine")
    edited = stack.hub.edit(REPO, first["id"], f"/broker approve {thread.sha256[:16]}")
    stack.send("issue_comment", comment_payload(REPO, edited, "edited"))
    second = stack.hub.comment_as(
        "bob-gh", REPO, thread.number, f"/broker approve {thread.sha256[:16]}"
    )
    payload = comment_payload(REPO, dict(second))
    stack.hub.edit(REPO, second["id"], "/broker approve something else")
    stack.send("issue_comment", payload)
    answers = [r for r in stack.replies(thread) if r.startswith("**Refused**")]
    assert len(answers) == 2 and all("was edited" in a for a in answers)
    assert stack.status(rid) == "pending"


def test_a_forged_or_replayed_delivery_is_refused(stack: Stack) -> None:
    """A delivery signed with another secret is a 401 before it is read; the same
    delivery sent twice decides once."""
    rid, thread = stack.waiting()
    made = stack.hub.comment_as(
        "alice-gh", REPO, thread.number, f"/broker approve {thread.sha256[:16]}"
    )
    forged = stack.send("issue_comment", comment_payload(REPO, made), secret="not-the-secret")
    assert forged.status_code == 401 and forged.json()["error"]["code"] == "bad_signature"
    assert stack.status(rid) == "pending"
    body, headers = delivery(SECRET, "issue_comment", comment_payload(REPO, made))
    assert (
        httpx.post(
            f"{stack.url}/github/webhook", content=body, headers=headers, verify=TLS
        ).status_code
        == 200
    )
    assert (
        httpx.post(
            f"{stack.url}/github/webhook", content=body, headers=headers, verify=TLS
        ).status_code
        == 409
    )
    assert stack.harness.wait(rid)["status"] == "applied"


def test_quorum_counts_github_and_the_cli(stack: Stack) -> None:
    """Three approvals needed: alice by comment, bob by review, carol at the host's CLI;
    alice's second try counts once."""
    rid, thread = stack.waiting("Three")
    stack.comment(thread, "alice-gh", f"/broker approve {thread.sha256[:16]} read it")
    stack.comment(thread, "alice-gh", f"/broker approve {thread.sha256[:16]} again")
    stack.review(thread, "bob-gh", thread.head)
    replies = stack.replies(thread)
    assert any("(1 of 3)" in r for r in replies) and any("(2 of 3)" in r for r in replies)
    assert any("already decided" in r for r in replies)
    shown = stack.hub.repos[REPO].comments[thread.card_comment]["body"]
    assert "**Approvals**: 2 of 3 (alice, bob)" in shown  # the card, edited in place
    ledger = open_store(stack.config)
    try:
        ballot = Ballot(f"default/{rid}", "approve", "carol", None, "cli", thread.sha256)
        assert decide_and_wake(stack.config, ledger, ballot).settled
    finally:
        ledger.close()
    assert stack.harness.wait(rid)["status"] == "applied"


def test_the_check_run_fails_on_deny_and_on_expiry(stack: Stack) -> None:
    """`/broker deny <reason>` denies (the agent reads the reason) and the check fails;
    a request nobody decides expires and its check fails too; both branches are deleted."""
    denied, first = stack.waiting()
    stack.comment(first, "bob-gh", "/broker deny please split this change")
    result = stack.harness.wait(denied)
    assert result["status"] == "denied" and "please split" in str(result)
    expired, second = stack.waiting()
    clock = stack.harness.clock
    assert isinstance(clock, FakeClock)
    clock.advance(3601)
    assert stack.harness.wait(expired)["status"] == "expired"
    for thread in (first, second):
        run = int(str(thread.check_run))
        eventually(lambda run=run: stack.hub.check_runs[run]["history"] == ["queued", "failure"])
    eventually(lambda: not _branch(stack, denied) and not _branch(stack, expired))


def test_polling_with_webhooks_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: tuple[Switch, WebServer]
) -> None:
    """No webhook secret, a poll_interval: the webhook is not served; an edited comment
    is refused once, a comment approving at the right prefix applies one request and
    an APPROVE review at the pushed head another."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with serving(tmp_path, served, POLICY, webhook_secret_env=None, poll_interval="1s") as stack:
        rid, thread = stack.waiting()
        assert stack.send("issue_comment", {}).status_code == 404
        edited = stack.hub.comment_as("bob-gh", REPO, thread.number, "/broker deny nope")
        stack.hub.edit(REPO, edited["id"], "/broker deny changed my mind")
        stack.hub.comment_as(
            "alice-gh", REPO, thread.number, f"/broker approve {thread.sha256[:16]}"
        )
        assert stack.harness.wait(rid, timeout=30)["status"] == "applied"
        refused = [r for r in stack.replies(thread) if r.startswith("**Refused**")]
        assert len(refused) == 1 and "was edited" in refused[0]
        reviewed, second = stack.waiting("Fix y")
        stack.hub.review_as("bob-gh", second.number, second.head)
        assert stack.harness.wait(reviewed, timeout=30)["status"] == "applied"
        eventually(lambda: any(r.startswith("**Approved** by bob") for r in stack.replies(second)))


def test_a_check_github_does_not_answer_decides_nothing(stack: Stack) -> None:
    """When GitHub fails the permission read, the comment decides nothing and the
    thread is told to try again; a new comment then approves."""
    rid, thread = stack.waiting()
    stack.hub.fault(
        "GET", "/repos/{owner}/{repo}/collaborators/{username}/permission", 502, {"message": "x"}
    )
    stack.comment(thread, "alice-gh", f"/broker approve {thread.sha256[:16]}")
    assert any(r.startswith("**Not recorded**") for r in stack.replies(thread))
    assert stack.status(rid) == "pending"
    stack.comment(thread, "alice-gh", f"/broker approve {thread.sha256[:16]}")
    assert stack.harness.wait(rid)["status"] == "applied"


def test_a_thread_half_opened_before_a_crash_is_reused(stack: Stack) -> None:
    """What a broker that died mid-way through opening left (the staging branch at the
    agent's head and its draft) is taken up again: one draft, the card on it, a check."""
    from tests.effects.github.fake import git

    rid = "halfopen1"
    branch = f"broker/pending/{rid}"
    remote = stack.hub.repos[REPO].git_dir
    git(remote, "update-ref", f"refs/heads/{branch}", git(remote, "rev-parse", "agent/fix").strip())
    left = stack.cards.threads.api.draft(REPO, branch, "main", "[broker] Fix x", "left over")
    doc = {
        "version": 1,
        "id": rid,
        "effect": "github.pull_request.create",
        "params": {"repo": REPO, "head": "agent/fix", "base": "main", "title": "Fix x"},
    }
    assert stack.harness.submit(doc, terminal=False)["status"] == "pending"
    thread = stack.thread_of(rid)
    assert thread.number == left and thread.branch == branch
    assert [p["number"] for p in stack.hub.pulls(REPO)] == [left]
    assert len(stack.replies(thread)) == 1 and thread.sha256 in stack.replies(thread)[0]
