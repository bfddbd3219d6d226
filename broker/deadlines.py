"""Every pending request's deadline, soonest first."""

from __future__ import annotations

import heapq

from broker import clock
from broker.models import Record


class Deadlines:
    """A heap of (expires_at, sandbox, id); a decided request's entry is simply found
    no longer pending when it comes due."""

    def __init__(self) -> None:
        self._heap: list[tuple[str, str, str]] = []

    def watch(self, record: Record) -> None:
        if record.expires_at:
            heapq.heappush(self._heap, (record.expires_at, record.sandbox, record.id))

    def seconds_left(self) -> float:
        """Until the soonest deadline (an hour when none is near)."""
        if not self._heap:
            return 3600.0
        due = clock.parse_iso(self._heap[0][0])
        assert due is not None
        return max(0.0, (due - clock.now()).total_seconds())

    def due(self) -> list[tuple[str, str]]:
        """The (sandbox, id) of every request whose deadline has passed."""
        found = []
        stamp = clock.iso(clock.now())
        assert stamp is not None
        while self._heap and self._heap[0][0] <= stamp:
            _, sandbox, request_id = heapq.heappop(self._heap)
            found.append((sandbox, request_id))
        return found
