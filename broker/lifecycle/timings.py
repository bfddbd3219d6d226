"""How long admission's stages took for each request, for traces (broker.observability.tracing).

Set as `Admission.stages` only when tracing is on; off, admission pays one attribute
test per stage. Times are wall-clock nanoseconds, as spans take them.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from broker.events import Key

Times = list[tuple[str, int, int]]
"""(stage, start ns, end ns), in the order measured."""
REMEMBERED = 100_000  # requests whose times wait for their outcome; the oldest go first


class StageTimes:
    """Stage times per request until its trace takes them."""

    def __init__(self) -> None:
        self._times: OrderedDict[Key, Times] = OrderedDict()

    @staticmethod
    def start() -> int:
        return time.time_ns()

    def done(self, key: Key, stage: str, began: int) -> None:
        """`stage` of request `key` ran from `began` until now."""
        self._times.setdefault(key, []).append((stage, began, time.time_ns()))
        while len(self._times) > REMEMBERED:
            self._times.popitem(last=False)

    def take(self, key: Key) -> Times:
        return self._times.pop(key, [])
