"""While the shared store does not answer: the loop stops taking requests (they wait
in their outboxes), answers nothing it could not commit, says so once a minute, and
carries on by itself when the store is back.

What a wake-up had in hand when its commit failed is kept here, not lost: files it had
claimed (read again from the claim dir), outcomes the workers brought back, results of
work off the loop, deadlines that came due, and result files written but not yet
noted. Once the store answers they go into the next wake-up, with a reload and a
rescan, so every request still gets exactly one committed outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from broker.clock import REAL
from broker.errors import StoreUnavailable
from broker.events import Applied, Assessed, Key
from broker.intake.outbox import Outbox

T = TypeVar("T")

log = logging.getLogger("broker")
SAY_EVERY_S = 60.0
PROBE_EVERY_S = 0.5


@dataclass
class Kept:
    """A wake-up's work that waits for the store."""

    claimed: list[tuple[Outbox, str, str | None]] = field(default_factory=list)
    done: list[Applied] = field(default_factory=list)
    assessed: list[Assessed] = field(default_factory=list)
    due: list[Key] = field(default_factory=list)
    written: list[tuple[str, str, str]] = field(default_factory=list)
    recover: bool = False  # the start's recovery did not commit: it runs again


class Outage:
    """The broker's side of a store that went away; the loop asks it every wake-up."""

    def __init__(self, clock: Callable[[], float] = REAL.monotonic) -> None:
        self._clock = clock
        self.kept: Kept | None = None
        self._since = 0.0
        self._said = 0.0
        self._probed = 0.0

    @property
    def active(self) -> bool:
        return self.kept is not None

    def begin(self, why: Exception, work: Kept | None = None) -> None:
        """The store did not answer; keep `work` for when it does."""
        now = self._clock()
        if self.kept is None:
            self.kept, self._since, self._said = Kept(), now, now
            log.error("%s; new requests wait in their outboxes until it answers again", why)
        if work is not None:
            self.keep(work)

    def attempt(self, fn: Callable[[], T], default: T, work: Kept | None = None) -> T:
        """`fn()`; if the store does not answer, `default`, and an outage keeping `work`."""
        try:
            return fn()
        except StoreUnavailable as exc:
            self.begin(exc, work)
            return default

    def keep(self, work: Kept) -> None:
        assert self.kept is not None
        self.kept.claimed.extend(work.claimed)
        self.kept.done.extend(work.done)
        self.kept.assessed.extend(work.assessed)
        self.kept.due.extend(work.due)
        self.kept.written.extend(work.written)
        self.kept.recover |= work.recover

    def over(self, ping: Callable[[], bool]) -> bool:
        """Whether the store answers again (asked at most twice a second)."""
        now = self._clock()
        if now - self._probed < PROBE_EVERY_S:
            return False
        self._probed = now
        if ping():
            log.warning("the ledger answers again after %.0fs; carrying on", now - self._since)
            return True
        if now - self._said >= SAY_EVERY_S:
            self._said = now
            log.error(
                "the ledger has not answered for %.0fs; requests wait in their outboxes",
                now - self._since,
            )
        return False

    def take(self) -> Kept:
        kept, self.kept = self.kept or Kept(), None
        return kept
