"""What the approval-thread tests share: a serving broker (a BrokerHarness with the
thread observer attached, as every hosting path attaches it) and the web app's webhook,
in front of the GitHub stand-in (fake_reviews.py) with acme/api, private, and its
collaborators; and what people do there (comment, review) delivered signed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from broker.integrations.github_cards import PrCards, attach_pr_cards
from broker.integrations.github_store import Thread
from broker.store.factory import open_store
from broker.testing import BrokerHarness, FakeClock
from broker.web.app import create_app
from broker.web.server import WebServer
from tests.effects.github.fake import commit_on, git, seed_repo
from tests.effects.github.fake_reviews import (
    ReviewingGitHub,
    comment_payload,
    delivery,
    review_payload,
)
from tests.effects.github.support import REPO, SEED, TOKEN, TOKEN_ENV
from tests.support import TLS, eventually

SECRET = "whsec-test-0123456789"
SECRET_ENV = "TEST_GITHUB_WEBHOOK_SECRET"
APPROVERS = {
    "alice": {"github_user": "alice-gh"},
    "bob": {"github_user": "bob-gh"},
    "carol": {"os_user": "carol"},
    "dave": {"github_user": "dave-gh"},
    "pr-bot": {"github_user": "pr-bot-gh", "acts_for": ["default"]},
}
PEOPLE = {"alice-gh": "write", "bob-gh": "admin", "dave-gh": "read", "agent-bot": "write"}
PEOPLE |= {"pr-bot-gh": "write", "frank-gh": "write"}  # frank: a collaborator, no approver


@dataclass
class Stack:
    harness: BrokerHarness
    hub: ReviewingGitHub
    cards: PrCards
    url: str
    config: Any
    remote: Path

    def thread_of(self, rid: str) -> Thread:
        """The thread opened for request `rid`, once its card and check are there."""

        def opened() -> Thread | None:
            thread = self.cards.threads.store.by_request("default", rid)
            if thread is None or not thread.card_comment:
                return None
            return thread if thread.kind == "issue" or thread.check_run else None

        found: Thread = eventually(opened)
        return found

    def waiting(self, title: str = "Fix x") -> tuple[str, Thread]:
        """An agent's pull request that waits for people, and the thread opened for it."""
        doc = self.harness.request(
            "github.pull_request.create",
            {"repo": REPO, "head": "agent/fix", "base": "main", "title": title},
            reason="fixes x; @alice please approve",
        )
        assert self.harness.submit(doc, terminal=False)["status"] == "pending"
        rid = str(doc["id"])
        return rid, self.thread_of(rid)

    def send(self, event: str, payload: dict[str, Any], secret: str = SECRET) -> httpx.Response:
        body, headers = delivery(secret, event, payload)
        return httpx.post(f"{self.url}/github/webhook", content=body, headers=headers, verify=TLS)

    def comment(
        self, thread: Thread, login: str, body: str, kind: str = "User", repo: str = REPO
    ) -> httpx.Response:
        made = self.hub.comment_as(login, repo, thread.number, body, kind)
        return self.send("issue_comment", comment_payload(repo, made))

    def review(self, thread: Thread, login: str, commit: str) -> httpx.Response:
        made = self.hub.review_as(login, thread.number, commit)
        return self.send("pull_request_review", review_payload(REPO, made))

    def replies(self, thread: Thread) -> list[str]:
        return self.hub.replies(thread.repo, thread.number)

    def status(self, rid: str) -> str:
        ledger = open_store(self.config)
        try:
            return ledger.find(f"default/{rid}").state
        finally:
            ledger.close()

    def branches(self) -> dict[str, str]:
        """The remote's branches and their commits, as git shows them."""
        listed = git(self.remote, "for-each-ref", "--format=%(refname:short) %(objectname)")
        return dict(line.split(" ", 1) for line in listed.splitlines() if line)


@contextmanager
def serving(
    tmp_path: Path,
    served: tuple[Any, WebServer],
    policy: str,
    integrations: dict[str, Any] | None = None,
    credentials: dict[str, Any] | None = None,
    app: tuple[int, str, int] | None = None,
    repositories: dict[str, Any] | None = None,
    **github: Any,
) -> Iterator[Stack]:
    """The stand-in with acme/api (private), a serving broker, its web app plugged in;
    `github` overrides [integrations.github]'s keys (None removes one); `app` is the
    stand-in's GitHub App (id, public key, installation) for `credentials` to mint with;
    `repositories` is `[repositories.*]` (which git remote is which GitHub repository)."""
    remote = tmp_path / "api.git"
    seed_repo(remote, SEED)
    commit_on(remote, "agent/fix", {"src/app.py": b"x = 2\n"}, start="main")
    with ReviewingGitHub(token=TOKEN) as hub:
        hub.app = app
        hub.add_repo(REPO, remote)
        hub.private.add(REPO)
        for login, level in PEOPLE.items():
            hub.permissions[(REPO, login)] = level
        table = {
            "token_env": TOKEN_ENV,
            "base_url": hub.url,
            "repos": ["acme/*"],
            "approve_in_pr": True,
            "agent_logins": ["agent-bot"],
            "webhook_secret_env": SECRET_ENV,
            **github,
        }
        table = {k: v for k, v in table.items() if v is not None}
        harness = BrokerHarness(
            tmp_path / "h",
            policy=policy,
            integrations={**(integrations or {}), "github": table},
            credentials=credentials,
            clock=FakeClock(),
        )
        config = harness.config._replace(approvers=APPROVERS, repositories_table=repositories or {})
        attached: list[PrCards] = []

        def prepare(broker: Any) -> None:
            cards = attach_pr_cards(broker, config)
            assert cards is not None
            attached.append(cards)

        harness.prepare = prepare
        try:
            with harness:
                switch, server = served
                app = create_app(config, harness.registry)
                switch.app = app
                try:
                    yield Stack(harness, hub, attached[0], server.url, config, remote)
                finally:
                    switch.app = None
                    app.state.inbox.close()
                    if app.state.github is not None:
                        app.state.github.threads.close()
        finally:
            for cards in attached:  # after the broker: its observers use their store
                cards.close()
