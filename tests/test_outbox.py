"""The served outboxes and their watcher: what the loop hears about, and a sandbox
served the moment its outbox exists, whatever order its directories appear in."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import Config
from broker.events import DirsChanged, Event, FileSeen
from broker.intake.outbox import Served, Watcher
from broker.loop.pipeline import Broker
from broker.policy.ruleset import Policy
from broker.registry import Registry
from broker.testing import FakeHandler
from tests.crash.support import read_results, wait_for, write_atomically


def drain(events: queue.Queue[Event], timeout: float = 2.0) -> list[Event]:
    got = [events.get(timeout=timeout)]
    while True:
        try:
            got.append(events.get(timeout=0.2))
        except queue.Empty:
            return got


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Watcher, queue.Queue[Event], Path, Path]]:
    events: queue.Queue[Event] = queue.Queue()
    outbox, parent = tmp_path / "outbox", tmp_path / "root"
    outbox.mkdir()
    parent.mkdir()
    watcher = Watcher(events)
    watcher.sync([outbox], [parent])
    yield watcher, events, outbox, parent
    watcher.stop()


def test_watcher_reports_renamed_files_and_ignores_temporary_names(
    watched: tuple[Watcher, queue.Queue[Event], Path, Path],
) -> None:
    """A file renamed into place is seen; the temporary name it was written under is not."""
    _, events, outbox, _ = watched
    (outbox / ".r1.tmp").write_text("{}")
    os.rename(outbox / ".r1.tmp", outbox / "r1.json")
    got = drain(events)
    assert FileSeen(str(outbox), "r1.json") in got
    assert not [e for e in got if isinstance(e, FileSeen) and e.name.endswith(".tmp")]


def test_watcher_reports_changes_to_watched_parents(
    watched: tuple[Watcher, queue.Queue[Event], Path, Path],
) -> None:
    """A new directory under a watched parent (a new sandbox) is a DirsChanged."""
    _, events, _, parent = watched
    (parent / "sb-new").mkdir()
    assert DirsChanged() in drain(events)


def test_served_watches_a_sandbox_until_its_outbox_appears(tmp_path: Path) -> None:
    """A sandbox dir without an outbox is watched itself, then served once it has one."""
    served = Served(tmp_path / "control")
    served.add_root(tmp_path / "sandboxes")
    (tmp_path / "sandboxes" / "early").mkdir()
    assert served.discover() == []
    assert tmp_path / "sandboxes" / "early" in served.parents()
    (tmp_path / "sandboxes" / "early" / "outbox").mkdir()
    assert [b.sandbox for b in served.discover()] == ["early"]
    assert tmp_path / "sandboxes" / "early" not in served.parents()
    served.close()


@pytest.mark.parametrize("order", ["outbox-last", "results-first", "all-at-once"])
def test_sandbox_is_served_as_soon_as_its_outbox_exists(tmp_path: Path, order: str) -> None:
    """`serve --root`: whatever order a sandbox's dirs appear in, its first request is
    answered without waiting for a rescan (the rescan interval here is an hour)."""
    state = tmp_path / "state"
    registry = Registry()
    registry.register(FakeHandler("test.record"), "tests")
    config = Config(state_dir=state, rescan_interval_s=3600.0)
    broker = Broker(config, registry, Policy())
    broker.serve_root(state / "sandboxes")
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=broker.serve, args=(stop,), kwargs={"ready": ready.set})
    thread.start()
    try:
        assert ready.wait(30)
        base = state / "sandboxes" / "late"
        if order == "all-at-once":
            (base / "outbox").mkdir(parents=True)
        else:
            base.mkdir()
            if order == "results-first":
                (base / "results").mkdir()
            (base / "outbox").mkdir()
        doc = {"version": 1, "id": "r1", "effect": "test.record", "params": {"value": 1}}
        wait_for(lambda: "late" in broker.outboxes, 10, "the sandbox to be served")
        write_atomically(base / "outbox", "r1.json", doc)
        wait_for(lambda: "r1" in read_results(base / "results"), 10, "the first answer")
    finally:
        stop.set()
        broker.wake()
        thread.join(30)
    assert read_results(base / "results")["r1"]["status"] == "applied"
