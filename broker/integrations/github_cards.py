"""The pull request (or issue) is the card: a waiting request's thread is opened
(broker.integrations.github_staging: a draft pull request on a broker-owned branch with
a `broker/approval` Check Run on its head, or an issue in `issues_repo`), its first
comment is the card; once the request settles, the thread is owed its receipts (the
card updated in place, the outcome, the check completed, the draft or issue closed,
the staging branch deleted), queued and sent once (broker.integrations.github_receipts).

`PrCards.observe` is a results observer on any broker that serves requests (`broker
serve`, `broker run`, an embedded executor's broker): `attach_pr_cards` adds it. Its
GitHub calls run on its own thread; a failure is logged, never raised into the loop.
When it starts it catches up from the ledger: a thread whose request settled while no
broker watched is owed its receipts, a waiting request with no thread gets one, and
receipts a crash left owed are sent.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from broker.approval.decisions import Ballot, Tally, decide_and_wake
from broker.clock import REAL, parse_duration
from broker.config import Config
from broker.errors import BrokerError
from broker.integrations.github_decisions import PrDecider, card_markdown
from broker.integrations.github_poll import Poller
from broker.integrations.github_receipts import closing_receipts, send_owed, unanswered
from broker.integrations.github_staging import Stager, thread_kind
from broker.integrations.github_store import Thread
from broker.integrations.github_threads import CHECK_NAME, GitHubThreads
from broker.store.factory import open_store

if TYPE_CHECKING:
    from broker.loop.pipeline import Broker
    from broker.models import Record
    from broker.registry import Registry
    from broker.store.base import Store

__all__ = ["CHECK_NAME", "PrCards", "attach_pr_cards", "card_markdown", "on_broker"]

log = logging.getLogger("broker.integrations.github")
Job = tuple[str, Any, Any]


class PrCards:
    """Opens the thread of a waiting request and closes it once the request settles."""

    def __init__(self, threads: GitHubThreads, config: Config, registry: Registry) -> None:
        self.threads = threads
        self.stager = Stager(threads, config, registry)
        self.poller: Poller | None = None  # when [integrations.github] poll_interval is set
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="broker-github", daemon=True)
        self._worker.start()

    def observe(self, ledger: Store, record: Record, registry: Registry) -> None:
        """A results observer: queue the thread's opening or closing."""
        from broker.approval.decisions import card

        if record.state == "pending":
            if thread_kind(self.threads.settings, record) is not None:
                self._queue.put(("open", card(ledger, record, registry), record))
        elif record.terminal and self.threads.store.by_request(*record.key):
            self._queue.put(("close", card(ledger, record, registry), record.output))

    def catch_up(self, ledger: Store, registry: Registry) -> None:
        """What happened while no broker watched: queue it (called as the broker starts)."""
        from broker.approval.decisions import card

        # receipts a crash left unsent, first; answers queued a minute before this start
        # and still without words were being decided when a broker or web server died
        self._queue.put(("owed", None, REAL.time() - 60))
        for thread in self.threads.store.all():
            if self.threads.store.closed(thread.sandbox, thread.request_id):
                continue
            record = ledger.get(thread.sandbox, thread.request_id)
            if record is not None and record.terminal:
                self._queue.put(("close", card(ledger, record, registry), record.output))
        for record in ledger.in_states(["pending"]):
            opened = self.threads.store.by_request(*record.key)
            if opened is None or not opened.card_comment or _unchecked(opened):
                self.observe(ledger, record, registry)  # opened, or finished opening

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
        self._queue.put(("mark", done, None))
        done.wait(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            what, card, extra = item
            try:
                if what == "mark":
                    card.set()
                elif what == "open":
                    self._open(card, extra)
                elif what == "close":
                    self._close(card, extra)
                else:
                    unanswered(self.threads, before=extra)
                    send_owed(self.threads)
            except BrokerError as exc:  # a refusal (a protected branch) or GitHub's answer
                ref = card.get("ref") if isinstance(card, Mapping) else what
                log.warning("the GitHub thread of %s was not updated: %s", ref, exc)
            except Exception:  # an observer never breaks anything
                ref = card.get("ref") if isinstance(card, Mapping) else what
                log.exception("the GitHub thread of %s was not updated", ref)

    def _open(self, card: Mapping[str, Any], record: Record) -> None:
        thread = self.threads.store.by_request(record.sandbox, record.id)
        if thread is None:
            thread = self.stager.open(card, record)
            if thread is None:
                return
            self.threads.store.add(thread)  # kept as it is opened: a restart finishes it
        self.stager.finish(card, thread, self.threads.store.add)

    def _close(self, card: Mapping[str, Any], output: Any) -> None:
        thread = self.threads.store.by_request(str(card["sandbox"]), str(card["id"]))
        if thread is None:
            return
        # owed first, then closed: a crash in between leaves receipts owed, never lost
        # (their keys make a second closing owe nothing more)
        self.threads.store.owe(closing_receipts(thread, card, card_markdown(card, thread), output))
        self.threads.store.close_thread(thread.sandbox, thread.request_id)
        send_owed(self.threads, thread.ref)


def _unchecked(thread: Thread) -> bool:
    return thread.kind == "pull" and thread.check_run is None


def attach_pr_cards(broker: Broker, config: Config) -> PrCards | None:
    """Open GitHub threads for `broker`'s waiting requests, as [integrations.github] says;
    the caller closes what this returns after the broker stops (its last observers ran)."""
    threads = GitHubThreads.of(config)
    if threads is None:
        return None
    log.info("GitHub approval threads: %s", threads.tokens.kind)
    cards = PrCards(threads, config, broker.registry)
    broker.on_change.append(lambda record: cards.observe(broker.ledger, record, broker.registry))
    cards.catch_up(broker.ledger, broker.registry)
    table = config.integrations.get("github") or {}
    if table.get("poll_interval") is not None:
        interval = parse_duration(table["poll_interval"])
        polled = GitHubThreads.of(config)
        assert polled is not None
        decider = PrDecider(polled, _decider(config), _card_of(broker))
        cards.poller = Poller(decider, interval)
        cards.poller.start()
    return cards


def on_broker(config: Config) -> Callable[[Broker], Callable[[], None] | None]:
    """`attach_pr_cards` for a broker a host runs (broker.hosting.serving's on_broker):
    what it returns closes the threads' observer after that broker stops."""

    def attach(broker: Broker) -> Callable[[], None] | None:
        cards = attach_pr_cards(broker, config)
        return None if cards is None else cards.close

    return attach


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
