"""Crash injection for the reliability suite: `BROKER_CRASH_AT=<point>[:<n>]` SIGKILLs
the broker the n-th time it passes that point. Free when the variable is unset."""

from __future__ import annotations

import os

FAULT_POINTS = (
    "after_read",  # the request's bytes are in memory, nothing recorded yet
    "before_commit",  # the wake-up's ledger transaction is about to commit
    "after_commit",  # committed: recorded (and `applying`, for auto requests)
    "before_remove",  # about to remove the consumed file from the claim dir
    "after_remove",
    "before_results",  # about to write the wake-up's result files
    "after_result",  # one result renamed into place
    "before_audit",  # about to append the wake-up's audit events
    "after_audit",
    "before_apply",  # the handler is about to be called (start marked, if needed)
    "after_apply",  # the handler returned: the service accepted the call
)


def _crash_plan() -> tuple[str, int]:
    """BROKER_CRASH_AT=<point>[:<n>]: SIGKILL this process the n-th time it passes."""
    spec = os.environ.get("BROKER_CRASH_AT", "")
    point, _, count = spec.partition(":")
    return point, int(count) if count.isdigit() else 1


_CRASH_POINT, _CRASH_COUNT = _crash_plan()
_crash_hits = 0


def fault(point: str) -> None:
    """Crash injection for the reliability suite; free when BROKER_CRASH_AT is unset."""
    global _crash_hits
    if _CRASH_POINT and point == _CRASH_POINT:
        _crash_hits += 1
        if _crash_hits >= _CRASH_COUNT:
            os.kill(os.getpid(), 9)
