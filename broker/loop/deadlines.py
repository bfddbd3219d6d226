"""Every pending request's deadline, soonest first, measured on the monotonic clock.

The deadline stored and shown (`expires_at`) is wall-clock time. While the broker runs,
it is turned once, when the request starts being watched, into a point on the
monotonic clock, so a step of the wall clock (NTP, a person setting the date) moves no
deadline: a request waits as long as its rule says. After a restart the stored time is
read again against the wall clock, the only clock that survives one.
"""

from __future__ import annotations

import heapq

from broker import clock
from broker.clock import REAL, Clock
from broker.models import Record


class Deadlines:
    """A heap of (monotonic due time, sandbox, id); a decided request's entry is simply
    found no longer pending when it comes due."""

    def __init__(self, clock: Clock = REAL) -> None:
        self._heap: list[tuple[float, str, str]] = []
        self.clock = clock

    def watch(self, record: Record) -> None:
        due = clock.parse_iso(record.expires_at)
        if due is None:
            return
        left = (due - self.clock.now()).total_seconds()
        heapq.heappush(self._heap, (self.clock.monotonic() + left, record.sandbox, record.id))

    def seconds_left(self) -> float:
        """Until the soonest deadline (an hour when none is near)."""
        if not self._heap:
            return 3600.0
        return max(0.0, self._heap[0][0] - self.clock.monotonic())

    def due(self) -> list[tuple[str, str]]:
        """The (sandbox, id) of every request whose deadline has passed."""
        found = []
        now = self.clock.monotonic()
        while self._heap and self._heap[0][0] <= now:
            _, sandbox, request_id = heapq.heappop(self._heap)
            found.append((sandbox, request_id))
        return found
