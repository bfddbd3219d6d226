"""Time as the broker reads it (`Clock`), shows and stores it, and durations as people
write them.

Every part of the broker that decides something by time (a deadline, an expiry, a
rate window, a retry, a lease's renewal, how long a job may run) reads the `Clock` it
was given, never the `time` module: a test gives it `broker.testing.FakeClock` and moves
time on with `advance` instead of waiting for it. `REAL` is the default everywhere.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
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
