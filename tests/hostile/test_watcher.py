"""File-system events are a hint: the broker converges on what is really in the
outbox when the kernel's event queue overflows or the watcher itself breaks."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.intake import inotify
from broker.loop.pipeline import Broker
from broker.testing import BrokerHarness, FakeHandler

MAX_QUEUED = Path("/proc/sys/fs/inotify/max_queued_events")
HOUR = 3600.0


@pytest.fixture
def quiet_harness(tmp_path: Path) -> Iterator[BrokerHarness]:
    """An attach-mode broker (not started) whose periodic rescan is an hour away."""
    h = BrokerHarness(tmp_path / "h", handlers=[FakeHandler("test.record")], builtins=False)
    h.config = h.config._replace(rescan_interval_s=HOUR)
    yield h
    h.stop()


@pytest.fixture
def rescans(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times at which any Broker rescanned its outboxes."""
    seen: list[float] = []
    original = Broker.rescan

    def counting(self: Broker) -> None:
        seen.append(time.monotonic())
        original(self)

    monkeypatch.setattr(Broker, "rescan", counting)
    return seen


@pytest.fixture
def tiny_event_queue() -> Iterator[int]:
    """Lower fs.inotify.max_queued_events while the next watcher is made; restore it."""
    try:
        before = MAX_QUEUED.read_text()
        MAX_QUEUED.write_text("16")
    except OSError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root and must run the overflow test: {exc}")
        pytest.skip(f"cannot lower {MAX_QUEUED}: {exc}")
    try:
        yield 16
    finally:
        MAX_QUEUED.write_text(before)


def submit_many(h: BrokerHarness, count: int, prefix: str) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(count)]
    for rid in ids:
        h.write(f"{rid}.json", h.request("test.record", {"value": rid}, id=rid))
    return ids


def test_overflowed_event_queue_is_followed_by_a_rescan(
    quiet_harness: BrokerHarness,
    tiny_event_queue: int,
    rescans: list[float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel event-queue overflow triggers a rescan: a 600-file burst is answered in seconds.

    The watcher's reading thread is held while the burst is written, so the 16-event
    kernel queue overflows for certain, whatever the machine's speed."""
    hold = threading.Event()
    original = inotify.Inotify._dispatch

    def held(self: inotify.Inotify, data: bytes) -> None:
        hold.wait(30)
        original(self, data)

    monkeypatch.setattr(inotify.Inotify, "_dispatch", held)
    quiet_harness.start()
    MAX_QUEUED.write_text("16384")  # the watcher keeps its tiny queue; others need not
    time.sleep(0.2)  # the start's own rescan is done
    started = len(rescans)

    ids = submit_many(quiet_harness, 600, "burst")
    hold.set()
    results = [quiet_harness.wait(rid, timeout=20) for rid in ids]

    assert {r["status"] for r in results} == {"applied"}
    assert len(rescans) > started, "no rescan followed the overflow"


def _break_dispatch_once(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    broke = threading.Event()
    original = inotify.Inotify._dispatch

    def dispatch(self: inotify.Inotify, data: bytes) -> None:
        if not broke.is_set():
            broke.set()
            raise RuntimeError("the watcher broke")
        original(self, data)

    monkeypatch.setattr(inotify.Inotify, "_dispatch", dispatch)
    return broke


def _break_read_once(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    broke = threading.Event()
    original = os.read

    def read(fd: int, n: int) -> Any:
        if threading.current_thread().name == "broker-inotify" and not broke.is_set():
            broke.set()
            raise OSError(5, "Input/output error")
        return original(fd, n)

    monkeypatch.setattr(os, "read", read)
    return broke


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("breaker", [_break_dispatch_once, _break_read_once], ids=["raise", "eio"])
def test_watcher_that_breaks_is_restarted(
    quiet_harness: BrokerHarness, monkeypatch: pytest.MonkeyPatch, breaker: Any
) -> None:
    """A watcher thread that dies is restarted: later requests are answered in seconds."""
    quiet_harness.start()
    broke = breaker(monkeypatch)
    quiet_harness.write("trigger.json", quiet_harness.request("test.record", id="trigger"))
    assert broke.wait(5), "the watcher never read an event"
    time.sleep(0.2)

    ids = submit_many(quiet_harness, 3, "after")
    end = time.monotonic() + 5
    answered = {}
    for rid in [*ids, "trigger"]:
        try:
            answered[rid] = quiet_harness.wait(rid, timeout=max(0.1, end - time.monotonic()))
        except TimeoutError:
            answered[rid] = {"status": "no answer within 5 s"}

    assert {k: r["status"] for k, r in answered.items()} == {
        rid: "applied" for rid in [*ids, "trigger"]
    }
