"""Polling for hosts GitHub's webhooks cannot reach: every `poll_interval`, the
comments and reviews of each open thread are read and fed to the same decision path
as the webhook (broker.integrations.github_decisions.PrDecider), then the CLI's.

Each comment and review is looked at once (the store remembers its id), whether the
webhook or the poller saw it first. A comment whose `updated_at` is not its
`created_at` was edited, and is refused as the webhook's `edited` action is.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from broker.errors import BrokerError
from broker.integrations.github_decisions import Event, PrDecider

__all__ = ["Poller"]

log = logging.getLogger("broker.integrations.github")


class Poller:
    """Reads the broker's threads on GitHub and hands what it finds to `decider`."""

    def __init__(self, decider: PrDecider, interval_s: float) -> None:
        self.decider = decider
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Poller:
        self._thread = threading.Thread(target=self._run, name="broker-github-poll", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll_once()
            except Exception:  # GitHub away: the next round tries again
                log.exception("polling GitHub for decisions failed")

    def poll_once(self) -> int:
        """One round over every open thread; returns how many events were handed on."""
        threads, handed = self.decider.threads, 0
        for thread in threads.store.all():
            if threads.store.closed(thread.sandbox, thread.request_id):
                continue
            try:
                comments = threads.api.comments(thread.repo, thread.number)
                reviews = (  # an issue has none: its endpoint would answer 404
                    threads.api.reviews(thread.repo, thread.number) if thread.kind == "pull" else []
                )
            except BrokerError as exc:
                log.warning("could not read %s#%d: %s", thread.repo, thread.number, exc)
                continue
            for event in [*map(_comment, comments), *map(_review, reviews)]:
                if event is None or event.comment_id is None:
                    continue
                if not threads.store.looked(event.key):
                    handed += 1
                    self.decider.handle(_on(event, thread.repo, thread.number))
        return handed


def _on(event: Event, repo: str, number: int) -> Event:
    return Event(
        event.kind,
        repo,
        number,
        event.login,
        event.user_type,
        event.body,
        event.comment_id,
        event.action,
        event.review_state,
        event.commit_id,
    )


def _comment(data: dict[str, Any]) -> Event | None:
    user = data.get("user") or {}
    edited = data.get("updated_at") != data.get("created_at")
    return Event(
        "comment",
        "",
        0,
        str(user.get("login") or ""),
        str(user.get("type") or "User"),
        str(data.get("body") or ""),
        int(data.get("id") or 0) or None,
        "edited" if edited else "created",
    )


def _review(data: dict[str, Any]) -> Event | None:
    user = data.get("user") or {}
    return Event(
        "review",
        "",
        0,
        str(user.get("login") or ""),
        str(user.get("type") or "User"),
        str(data.get("body") or ""),
        int(data.get("id") or 0) or None,
        "submitted",
        str(data.get("state") or "").upper(),
        str(data.get("commit_id") or ""),
    )
