"""Receipts survive a broker's death: a real `broker serve` (with its web server) is
killed mid-way through a settled request's receipts (BROKER_CRASH_AT at the point where
one reached GitHub but is not yet marked sent), or is down while the request is denied
at the CLI; the next `broker serve` on the same state dir sends what is still owed,
each once: one outcome reply, the check run completed once, the branch deleted."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from broker.clock import REAL
from broker.integrations.github_receipts import reply, send_owed, unanswered
from broker.integrations.github_store import Thread, ThreadStore
from broker.integrations.github_threads import GitHubThreads, ThreadSettings
from tests.effects.github.fake import commit_on, seed_repo
from tests.effects.github.fake_reviews import ReviewingGitHub, comment_payload, delivery
from tests.effects.github.support import REPO, SEED, TOKEN, TOKEN_ENV
from tests.support import TLS, Serving, eventually, run_broker

SECRET = "whsec-crash-0123456789"
_NONE = Thread("", "", "", "", 0, "", 0)
SECRET_ENV = "TEST_GITHUB_WEBHOOK_SECRET"
POLICY = """
[[rules]]
effect = "github.pull_request.create"
action = "approve"
reason = "a person reviews every pull request the agent opens"
"""


@dataclass
class Site:
    home: Path
    hub: ReviewingGitHub
    args: tuple[str, ...]
    outbox: Path
    results: Path
    state: Path

    def serve(self, crash_at: str | None = None) -> tuple[Serving, str]:
        env = {"BROKER_CRASH_AT": crash_at} if crash_at else None
        serving = Serving(self.home, *self.args, "--listen", "127.0.0.1:0", env=env)
        url = serving.line_with("broker: web inbox on ").rsplit(" ", 1)[1]
        return serving, url

    def ask(self) -> tuple[int, str]:
        """The agent's request; the draft's number and the card's sha256 once it waits."""
        doc = {
            "version": 1,
            "id": "pr1",
            "effect": "github.pull_request.create",
            "params": {"repo": REPO, "head": "agent/fix", "base": "main", "title": "Fix x"},
        }
        (self.outbox / ".pr1.tmp").write_text(json.dumps(doc), encoding="utf-8")
        os.rename(self.outbox / ".pr1.tmp", self.outbox / "pr1.json")
        draft = eventually(lambda: self.hub.pulls(REPO))[0]
        card = eventually(lambda: self.hub.replies(REPO, draft["number"]))[0]
        eventually(lambda: self.hub.check_runs)
        return int(draft["number"]), card.split("**Request sha256**: `", 1)[1][:64]

    def result(self) -> str | None:
        try:
            found = json.loads((self.results / "pr1.json").read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None
        status = found.get("status")
        return None if status in (None, "pending", "received") else str(status)

    def words(self, number: int, start: str) -> list[str]:
        return [r for r in self.hub.replies(REPO, number) if r.startswith(start)]

    def branches(self) -> list[str]:
        from tests.effects.github.fake import git

        listed = git(self.hub.repos[REPO].git_dir, "for-each-ref", "--format=%(refname:short)")
        return listed.split()


@pytest.fixture
def site(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    """The stand-in with acme/api (private) and alice; broker.toml and its state dir."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    remote = tmp_path / "api.git"
    seed_repo(remote, SEED)
    commit_on(remote, "agent/fix", {"src/app.py": b"x = 2\n"}, start="main")
    outbox, results, state = (tmp_path / d for d in ("outbox", "results", "state"))
    for d in (outbox, results, state):
        d.mkdir()
    with ReviewingGitHub(token=TOKEN) as hub:
        hub.add_repo(REPO, remote)
        hub.private.add(REPO)
        hub.permissions[(REPO, "alice-gh")] = "write"
        (tmp_path / "broker.toml").write_text(
            f"""
[broker]
allow_as = true

[integrations.github]
token_env = "{TOKEN_ENV}"
base_url = "{hub.url}"
repos = ["acme/*"]
approve_in_pr = true
webhook_secret_env = "{SECRET_ENV}"

[approvers.alice]
github_user = "alice-gh"
""",
            encoding="utf-8",
        )
        (tmp_path / "policy.toml").write_text(POLICY, encoding="utf-8")
        args = (
            *("--config", str(tmp_path / "broker.toml"), "--policy", str(tmp_path / "policy.toml")),
            *("--state", str(state), "--outbox", str(outbox), "--results", str(results)),
        )
        yield Site(home, hub, args, outbox, results, state)


@pytest.mark.parametrize(
    ("crash_at", "what"),
    [
        ("github_receipt_sent:3", "the check run completed"),
        ("github_receipt_sent:6", "the outcome"),
    ],
)
def test_a_crash_between_sending_a_receipt_and_marking_it(
    site: Site, crash_at: str, what: str
) -> None:
    """Killed right after `what` reached GitHub (receipts: the approval's answer, then the
    card, the check, the close, the branch, the outcome): after the restart the thread
    has one answer and one outcome, the check completed once, the branch is gone."""
    first, url = site.serve(crash_at)
    try:
        number, sha256 = site.ask()
        said = site.hub.comment_as("alice-gh", REPO, number, f"/broker approve {sha256[:16]}")
        body, headers = delivery(SECRET, "issue_comment", comment_payload(REPO, said))
        assert (
            httpx.post(
                f"{url}/github/webhook", content=body, headers=headers, verify=TLS
            ).status_code
            == 200
        )
        assert first.proc.wait(60) == -signal.SIGKILL  # died at the point, as planned
    finally:
        first.close()
    assert site.result() == "applied"
    second, _ = site.serve()
    try:
        eventually(lambda: site.words(number, "**Applied**"))
        run = next(iter(site.hub.check_runs.values()))
        eventually(lambda: "broker/pending/pr1" not in site.branches())
        assert run["history"] == ["queued", "success"]
        assert len(site.words(number, "**Applied**")) == 1
        assert len(site.words(number, "**Approved** by alice")) == 1
        assert site.hub.thread(REPO, number)["state"] == "closed"
        assert second.stop(signal.SIGTERM) == 0, second.seen
    finally:
        second.close()


def test_a_request_denied_while_no_broker_ran(site: Site) -> None:
    """The broker is killed while the request waits; alice denies it at the CLI; the next
    broker finds the thread of a settled request and sends its receipts, once."""
    first, _ = site.serve()
    try:
        number, _ = site.ask()
        store = ThreadStore(site.state / "github.sqlite")
        try:  # the broker remembers the check run it made (a kill before: see finish)
            eventually(lambda: (store.by_request("default", "pr1") or _NONE).check_run)
        finally:
            store.close()
    finally:
        first.proc.kill()
        first.close()
    denied = run_broker(
        "deny",
        "default/pr1",
        "--reason",
        "split it in two",
        "--as",
        "alice",
        "--yes",
        *site.args[:2],
        *site.args[4:6],
        home=site.home,
    )
    assert denied.returncode == 0, denied.stderr
    second, _ = site.serve()
    try:
        eventually(lambda: site.words(number, "**Denied**:"))
        eventually(lambda: site.result() == "denied")
        run = next(iter(site.hub.check_runs.values()))
        assert run["history"] == ["queued", "failure"]
        assert "broker/pending/pr1" not in site.branches()
        assert len(site.words(number, "**Denied**:")) == 1
        assert second.stop(signal.SIGTERM) == 0, second.seen
    finally:
        second.close()


def test_an_answer_cut_off_by_a_crash_is_said_and_holds_the_outcome_back(
    tmp_path: Path,
) -> None:
    """An answer queued ahead of its words holds back the thread's later receipts (the
    outcome never comes first); one left so by a crash is told as not answered, at the
    next start, and the outcome follows it."""
    remote = tmp_path / "api.git"
    seed_repo(remote, SEED)
    with ReviewingGitHub(token=TOKEN) as hub:
        hub.add_repo(REPO, remote)
        settings = ThreadSettings(
            hub.url, TOKEN, "broker/pending/", frozenset(), None, {}, tmp_path
        )
        threads = GitHubThreads(settings)
        try:
            number = threads.api.issue(REPO, "[broker] email.send: x", "the card follows")
            thread = Thread("default", "r1", "a" * 64, REPO, number, "", 1, kind="issue")
            threads.store.owe([reply(thread, "answer:comment:9:created", None, "alice-gh")])
            threads.store.owe([reply(thread, "close:outcome", "**Denied**: no.")])
            assert send_owed(threads) == 0 and hub.replies(REPO, number) == []
            unanswered(threads, before=REAL.time() + 1)
            assert send_owed(threads) == 2
        finally:
            threads.close()
        first, second = hub.replies(REPO, number)
    assert first.startswith("**Not answered** (@alice-gh)") and second.startswith("**Denied**:")
