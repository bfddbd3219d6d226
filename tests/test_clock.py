"""The broker's one clock: nothing in broker/ reads time but through broker.clock, and
the FakeClock tests drive moves only when told."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import broker
from broker.testing import FakeClock

DIRECT = re.compile(r"\btime\.(monotonic|time|sleep)\(|\bdatetime\.now\(")


def test_only_the_clock_module_reads_the_time() -> None:
    """No module of broker/ but clock.py calls time.monotonic/time/sleep or datetime.now."""
    root = Path(broker.__file__).parent
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in sorted(root.rglob("*.py"))
        if path.name != "clock.py" or path.parent != root
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if DIRECT.search(line.split("#", 1)[0])
    ]
    assert found == []


def test_advance_moves_both_clocks_and_step_wall_only_the_wall() -> None:
    """advance(s) moves monotonic and wall time by s; step_wall moves the wall alone."""
    start = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    clock = FakeClock(start)
    mono = clock.monotonic()
    clock.advance(90)
    assert (clock.monotonic() - mono, clock.now()) == (90, start + timedelta(seconds=90))
    clock.step_wall(-timedelta(hours=1))
    assert clock.monotonic() - mono == 90
    assert clock.time() == (start + timedelta(seconds=90 - 3600)).timestamp()


def test_sleep_and_wait_end_when_the_clock_is_moved_far_enough() -> None:
    """A thread sleeping 10 s wakes once 10 s are advanced, not at 9; wait() ends at its
    timeout on the fake clock, or at once when its event is set; advance wakes a loop."""
    clock = FakeClock()
    woken: list[str] = []
    clock.on_advance(lambda: woken.append("loop"))
    slept = threading.Event()
    sleeper = threading.Thread(target=lambda: (clock.sleep(10), slept.set()))
    sleeper.start()
    while clock.sleepers != 1:
        slept.wait(0.001)
    clock.advance(9)
    assert not slept.wait(0.05) and clock.sleepers == 1
    clock.advance(1)
    sleeper.join(5)
    assert slept.is_set() and clock.sleepers == 0
    assert woken == ["loop", "loop"]
    event = threading.Event()
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(clock.wait(event, 5)))
    waiter.start()
    while waiter.is_alive():  # until the waiter has read the clock, a move is before it
        clock.advance(5)
        waiter.join(0.01)
    assert waited == [False]
    event.set()
    assert clock.wait(event, 3600) is True
