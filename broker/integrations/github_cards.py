"""The pull request is the card: a waiting `github.pull_request.create` is staged as a
draft pull request on a broker-owned branch, with a bot comment that is the card, and a
Check Run `broker/approval` on its head; once the request settles, the card is updated
in place, the thread is told the outcome, the check is completed and the staging
branch is deleted.

Staging pushes nothing new: the branch is a ref at the head the agent already pushed
(`git.push` requests, whose commits are only in their bundle, are not staged yet). It
is created only under `staging_prefix`, never on the request's base, and never in a
public repository unless `staging_public = true`.

`PrCards.observe` is a results observer (the serving broker's `on_change`); the GitHub
calls run on its own thread and a failure is logged, never raised into the loop.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker.approval.decisions import Ballot, Tally, decide_and_wake
from broker.clock import parse_duration
from broker.config import Config
from broker.errors import BrokerError
from broker.integrations.github_decisions import PrDecider, card_markdown
from broker.integrations.github_poll import Poller
from broker.integrations.github_threads import CHECK_NAME, GitHubThreads, Thread, thread_settings
from broker.store.factory import open_store

if TYPE_CHECKING:
    from broker.loop.pipeline import Broker
    from broker.models import Record

__all__ = ["CHECK_NAME", "PrCards", "attach_pr_cards", "card_markdown"]

log = logging.getLogger("broker.integrations.github")
OUTCOMES = {"applied": "success", "denied": "failure", "expired": "failure", "failed": "failure"}


class PrCards:
    """Opens the thread of a waiting request and closes it once the request settles."""

    def __init__(self, threads: GitHubThreads, staging_public: bool = False) -> None:
        self.threads = threads
        self.staging_public = staging_public
        self.poller: Poller | None = None  # when [integrations.github] poll_interval is set
        self._queue: queue.Queue[tuple[str, dict[str, Any], Any] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="broker-github", daemon=True)
        self._worker.start()

    def observe(self, ledger: Any, record: Record, registry: Any) -> None:
        """A results observer: queue the thread's opening or closing."""
        if record.effect != "github.pull_request.create":
            return
        said = (record.verdict or {}).get("approve_in_pr")
        if not (self.threads.settings.default_on if said is None else said):
            return
        from broker.approval.decisions import card

        if record.state == "pending":
            self._queue.put(("open", card(ledger, record, registry), record.envelope))
        elif record.terminal and self.threads.store.by_request(*record.key):
            self._queue.put(("close", card(ledger, record, registry), record.output))

    def close(self, timeout: float = 5.0) -> None:
        if self.poller is not None:
            self.poller.stop(timeout)
            self.poller.decider.threads.close()
        self._queue.put(None)
        self._worker.join(timeout)
        self.threads.close()

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until every queued opening and closing is done (tests, shutdown)."""
        done = threading.Event()
        self._queue.put(("mark", {"event": done}, None))
        done.wait(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            what, card, extra = item
            try:
                if what == "mark":
                    card["event"].set()
                elif what == "open":
                    self._open(card, extra)
                else:
                    self._close(card, extra)
            except Exception:  # an observer never breaks anything
                log.exception("the pull request card for %s was not updated", card.get("ref"))

    def _open(self, card: Mapping[str, Any], envelope: Mapping[str, Any]) -> None:
        sandbox, request_id = str(card["sandbox"]), str(card["id"])
        if self.threads.store.by_request(sandbox, request_id) is not None:
            return
        params = envelope.get("params") or {}
        repo, head, base = str(params["repo"]), str(params["head"]), str(params["base"])
        api = self.threads.api
        if not self.staging_public and not api.private(repo):
            log.warning("%s is public: no staging branch (staging_public = false)", repo)
            return
        sha = api.branch_sha(repo, head)
        branch = f"{self.threads.settings.staging_prefix}{request_id}"
        if branch == base:
            raise BrokerError(f"the staging branch {branch} would be the request's base")
        api.create_branch(repo, branch, sha)
        title = str((card.get("what") or {}).get("title") or params.get("title"))
        body = "Staged by the broker for approval; the card is the first comment."
        number = api.draft(repo, branch, base, f"[broker] {title}", body)
        sha256 = str(card["request_sha256"])
        shown = Thread(sandbox, request_id, sha256, repo, number, sha, 0, None, branch)
        comment = api.reply(repo, number, card_markdown(card, shown))
        check = api.check_run(repo, sha, _check_output(card))
        self.threads.store.add(replace(shown, card_comment=int(comment["id"]), check_run=check))

    def _close(self, card: Mapping[str, Any], output: Any) -> None:
        thread = self.threads.store.by_request(str(card["sandbox"]), str(card["id"]))
        assert thread is not None
        self.threads.store.close_thread(thread.sandbox, thread.request_id)
        api, state = self.threads.api, str(card["status"])
        api.edit_comment(thread.repo, thread.card_comment, card_markdown(card, thread))
        if thread.check_run is not None and state in OUTCOMES:
            api.complete_check(thread.repo, thread.check_run, OUTCOMES[state], _check_output(card))
        api.reply(thread.repo, thread.number, _outcome(card, output))
        api.close_pull(thread.repo, thread.number)
        if thread.branch:
            api.delete_branch(thread.repo, thread.branch)


def _check_output(card: Mapping[str, Any]) -> dict[str, str]:
    return {
        "title": f"request {str(card['request_sha256'])[:12]}: {card['status']}",
        "summary": f"{card['effect']} {card['ref']}: {card.get('reason') or 'waiting'}",
    }


def _outcome(card: Mapping[str, Any], output: Any) -> str:
    state = str(card["status"])
    if state == "applied":
        url = output.get("url") or output.get("html_url") if isinstance(output, Mapping) else None
        return f"**Applied**: {url or 'done'}. The staging branch is deleted."
    if state == "expired":
        return f"**Expired**: nobody decided in time ({card.get('reason') or ''})."
    return f"**{state.capitalize()}**: {card.get('reason') or ''}. The staging branch is deleted."


def attach_pr_cards(broker: Broker, config: Config) -> PrCards | None:
    """Open pull request cards for `broker`'s waiting requests, as [integrations.github] says."""
    settings = thread_settings(config)
    if settings is None:
        return None
    table = config.integrations.get("github") or {}
    cards = PrCards(GitHubThreads(settings), bool(table.get("staging_public", False)))
    broker.on_change.append(lambda record: cards.observe(broker.ledger, record, broker.registry))
    if table.get("poll_interval") is not None:
        interval = parse_duration(table["poll_interval"])
        decider = PrDecider(GitHubThreads(settings), _decider(config), _card_of(broker))
        cards.poller = Poller(decider, interval)
        cards.poller.start()
    return cards


def _card_of(broker: Broker) -> Callable[[str, str], Mapping[str, Any]]:
    """The ledger's card of a request, on a connection of the poller's own."""

    def card_of(sandbox: str, request_id: str) -> Mapping[str, Any]:
        from broker.approval.decisions import card

        ledger = open_store(broker.config)
        try:
            record = ledger.get(sandbox, request_id)
            if record is None:
                raise BrokerError(f"no request {sandbox}/{request_id} in the ledger")
            return card(ledger, record, broker.registry)
        finally:
            ledger.close()

    return card_of


def _decider(config: Config) -> Callable[[Ballot], Tally]:
    """The CLI's decision path, on a ledger connection of its own per decision."""

    def decide(ballot: Ballot) -> Tally:
        ledger = open_store(config)
        try:
            return decide_and_wake(config, ledger, ballot)
        finally:
            ledger.close()

    return decide
