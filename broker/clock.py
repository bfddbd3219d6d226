"""Time as the broker reads it (`Clock`), shows and stores it, and durations as people
write them.

Every part of the broker that decides something by time (a deadline, an expiry, a
rate window, a retry, a lease's renewal, how long a job may run) reads the `Clock` it
was given, never the `time` module: a test gives it `FakeClock` (also exported by
`broker.testing`) and moves time on with `advance` instead of waiting for it. `REAL` is
the default everywhere.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_DURATION_S = 366 * 86400.0  # a deadline must be a date people can still act on


class Clock:
    """Real time. Subclasses (a test's fake clock) override all five readings and waits."""

    def monotonic(self) -> float:
        """For how long things take and when deadlines come due."""
        return time.monotonic()

    def now(self) -> datetime:
        """The wall clock, in UTC: for what is shown and stored."""
        return datetime.now(UTC)

    def time(self) -> float:
        """The wall clock in epoch seconds (file times, signatures, Slack's reminders)."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` (between retries)."""
        time.sleep(max(0.0, seconds))

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until `event` is set or `seconds` have passed; whether it was set."""
        return event.wait(max(0.0, seconds))

    def on_advance(self, wake: Callable[[], None]) -> None:
        """Call `wake` whenever time jumps ahead; real time never does, a fake one may."""


REAL = Clock()


def now() -> datetime:
    """The real wall clock: for what is shown and stored, where no decision follows."""
    return REAL.now()


def monotonic() -> float:
    """The real monotonic clock (a thread's start-up, a tool's own timing)."""
    return REAL.monotonic()


def iso(moment: datetime | None) -> str | None:
    """RFC 3339 with milliseconds and a Z, as results and the audit log show time."""
    if moment is None:
        return None
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="milliseconds")[:-6] + "Z"  # "+00:00" → "Z"


def stamp() -> str:
    """Now, as `iso` writes it."""
    text = iso(now())
    assert text is not None
    return text


def parse_iso(text: str | None) -> datetime | None:
    if text is None:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def parse_duration(value: Any) -> float:
    """'90s', '4h', '1h30m', '2d' or a number of seconds → seconds (at most a year)."""
    total = _duration(value)
    if not total <= MAX_DURATION_S:  # also refuses NaN
        raise ValueError(f"{value!r} is longer than a year; use a shorter duration")
    return total


def _duration(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a duration like '30s', '4h' or '1h30m', got {value!r}")
    text = value.strip().replace(" ", "")
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or total <= 0:
        raise ValueError(f"expected a duration like '30s', '4h' or '1h30m', got {value!r}")
    return total


class FakeClock(Clock):
    """Time that moves only when the test says so, for a Broker (`clock=`) and anything
    else that takes a `broker.clock.Clock`.

    `advance(seconds)` moves the monotonic and the wall clock together and wakes what
    waits on it (a broker's loop, `sleep`, `wait`); `step_wall(delta)` moves the wall
    clock alone, as NTP or a person setting the date does. `sleep` returns once the
    test has advanced the clock that far: `sleepers` says how many threads are asleep,
    so a test can wait until a retry is waiting before it moves time on.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._wall = start if start is not None else REAL.now()
        self._mono = 1000.0  # not 0: nothing may take a monotonic 0 for "never"
        self._moved = threading.Condition()
        self._woken: list[Callable[[], None]] = []
        self.sleepers = 0

    def monotonic(self) -> float:
        with self._moved:
            return self._mono

    def now(self) -> datetime:
        with self._moved:
            return self._wall

    def time(self) -> float:
        return self.now().timestamp()

    def sleep(self, seconds: float) -> None:
        with self._moved:
            end = self._mono + max(0.0, seconds)
            self.sleepers += 1
            try:
                while self._mono < end:
                    self._moved.wait()
            finally:
                self.sleepers -= 1

    def wait(self, event: threading.Event, seconds: float) -> bool:
        with self._moved:
            end = self._mono + max(0.0, seconds)
        while not event.is_set():
            with self._moved:
                if self._mono >= end:
                    return False
                self._moved.wait(0.01)  # or sooner, when time moves
        return True

    def on_advance(self, wake: Callable[[], None]) -> None:
        with self._moved:
            self._woken.append(wake)

    def advance(self, seconds: float) -> None:
        """Move both clocks on by `seconds` and wake whatever waits on this clock."""
        if seconds < 0:
            raise ValueError("a monotonic clock never goes back; use step_wall")
        with self._moved:
            self._mono += seconds
            self._wall += timedelta(seconds=seconds)
            self._moved.notify_all()
            woken = list(self._woken)
        for wake in woken:
            wake()

    def step_wall(self, delta: timedelta) -> None:
        """Move the wall clock alone (either way); the monotonic clock stays."""
        with self._moved:
            self._wall += delta
