"""Every pending request's deadline, soonest first, measured on the monotonic clock.

The deadline stored and shown (`expires_at`) is wall-clock time. While the broker runs,
it is turned once, when the request starts being watched, into a point on the
monotonic clock, so a step of the wall clock (NTP, a person setting the date) moves no
deadline: a request waits as long as its rule says. After a restart the stored time is
read again against the wall clock, the only clock that survives one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from datetime import datetime

from broker import clock
from broker.models import Record


class Deadlines:
    """A heap of (monotonic due time, sandbox, id); a decided request's entry is simply
    found no longer pending when it comes due."""

    def __init__(
        self,
        monotonic: Callable[[], float] | None = None,
        wall: Callable[[], datetime] | None = None,
    ) -> None:
        self._heap: list[tuple[float, str, str]] = []
        self._mono = monotonic
        self._wallclock = wall

    def _monotonic(self) -> float:
        return self._mono() if self._mono is not None else clock.monotonic()

    def _wall(self) -> datetime:
        return self._wallclock() if self._wallclock is not None else clock.now()

    def watch(self, record: Record) -> None:
        due = clock.parse_iso(record.expires_at)
        if due is None:
            return
        left = (due - self._wall()).total_seconds()
        heapq.heappush(self._heap, (self._monotonic() + left, record.sandbox, record.id))

    def seconds_left(self) -> float:
        """Until the soonest deadline (an hour when none is near)."""
        if not self._heap:
            return 3600.0
        return max(0.0, self._heap[0][0] - self._monotonic())

    def due(self) -> list[tuple[str, str]]:
        """The (sandbox, id) of every request whose deadline has passed."""
        found = []
        now = self._monotonic()
        while self._heap and self._heap[0][0] <= now:
            _, sandbox, request_id = heapq.heappop(self._heap)
            found.append((sandbox, request_id))
        return found
