"""Posting waiting requests to Slack, updating the message when they settle, and a
reminder before the deadline: one thread, a queue, never in the broker's way.

Fed by broker.approval.notify (an observer of the broker's loop): `pending(card)` when a request
starts waiting, `settled(card)` when it reaches an outcome. Which message shows which
request is kept in the SlackStore, so a restart neither posts twice nor forgets to
update or remind. A failed call is logged and counted; people can always decide in the
inbox or the CLI.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any

import httpx

from broker.clock import REAL, Clock, parse_iso
from broker.errors import BrokerError
from broker.slack import messages
from broker.slack.api import Busy, SlackApi
from broker.slack.settings import SlackSettings
from broker.slack.store import Posted, SlackStore

log = logging.getLogger("broker.slack")
IDLE_S = 60.0  # look at the reminders at least this often


class SlackNotifier:
    """Delivers to Slack on its own thread; `clock` decides reminders and paces retries."""

    def __init__(
        self,
        settings: SlackSettings,
        *,
        clock: Clock = REAL,
        retries: int = 3,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.retries = retries
        self.backoff = backoff
        self.delivered = 0
        self.failed = 0
        self.store = SlackStore(settings.store_path)
        self.api = SlackApi(settings, transport=transport)
        self._queue: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="broker-slack", daemon=True)
        self._thread.start()

    # -- what the broker tells it ---------------------------------------------------

    def pending(self, card: Mapping[str, Any]) -> None:
        self._queue.put(("post", dict(card)))

    def settled(self, card: Mapping[str, Any]) -> None:
        self._queue.put(("update", dict(card)))

    def wake(self) -> None:
        """Look at the reminders now (the clock may have moved)."""
        self._queue.put(("remind", {}))

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
        self.api.close()
        self.store.close()

    # -- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._wait())
            except queue.Empty:
                item = ("remind", {})
            if item is None:
                return
            kind, card = item
            try:
                if kind == "post":
                    self._post(card)
                elif kind == "update":
                    self._update(card)
                self._remind()
            except Exception:  # an observer never breaks anything
                self.failed += 1
                log.exception("a Slack notification failed")

    def _wait(self) -> float:
        due = self.store.next_reminder()
        if due is None:
            return IDLE_S
        return min(IDLE_S, max(0.05, due - self.clock.time()))

    def _post(self, card: dict[str, Any]) -> None:
        known = self.store.get(card["sandbox"], card["id"])
        if known is not None and known.sha256 == card["request_sha256"]:
            return  # already posted (a restart, or a second notice)
        channel = card.get("slack_channel") or self.settings.channel  # a group's, if routed
        body = {"channel": channel, **messages.message(card, self.settings.inbox_url)}
        answer = self._call("chat.postMessage", body)
        if answer is None:
            return
        deadline = card.get("if_nobody_answers") or {}
        expires = parse_iso(deadline.get("expires_at"))
        expires_at = expires.timestamp() if expires else None
        remind_at = None
        if expires_at is not None and self.settings.remind_before_s is not None:
            remind_at = expires_at - self.settings.remind_before_s
            if remind_at <= self.clock.time():
                remind_at = None  # the whole wait is shorter than the reminder's lead
        self.store.remember(
            Posted(
                card["sandbox"],
                card["id"],
                str(card["request_sha256"]),
                str(answer.get("channel") or channel),
                str(answer["ts"]),
                expires_at,
                deadline.get("on_timeout"),
                remind_at,
            )
        )

    def _update(self, card: dict[str, Any]) -> None:
        posted = self.store.get(card["sandbox"], card["id"])
        if posted is None:
            return
        body = {
            "channel": posted.channel,
            "ts": posted.ts,
            **messages.message(card, self.settings.inbox_url),
        }
        if self._call("chat.update", body) is not None and card.get("status") != "pending":
            self.store.mark(posted, settled=True)

    def _remind(self) -> None:
        for posted in self.store.due(self.clock.time()):
            text = messages.reminder(posted.ref, posted.expires_at, posted.on_timeout)
            body = {
                "channel": posted.channel,
                "thread_ts": posted.ts,
                "reply_broadcast": True,
                "text": text,
            }
            if self._call("chat.postMessage", body) is not None:
                self.store.mark(posted, reminded=True)

    def _call(self, method: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """One Web API call with retries; None (logged, counted) when it never succeeds."""
        delay = self.backoff
        for attempt in range(1, self.retries + 1):
            try:
                answer = self.api.call(method, body)
            except BrokerError as exc:
                if attempt == self.retries or not isinstance(exc, Busy):
                    self.failed += 1
                    log.warning("%s after %d attempt(s); not delivered", exc, attempt)
                    return None
                self.clock.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            self.delivered += 1
            return answer
        return None
