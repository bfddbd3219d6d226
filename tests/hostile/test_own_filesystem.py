"""An outbox on a file system of its own (a quota'd tmpfs per sandbox, as a careful
operator lays it out): claims stay on that file system, a name reused by rename the
moment its request was read loses nothing, and a layout with no such place is refused
with one line saying how to lay it out. Against a real `broker serve` (root: mounts)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crash.support import (
    Receiver,
    Site,
    broker_env,
    read_results,
    wait_for,
    write_atomically,
)

NAMES = 3
PER_NAME = 100


@pytest.fixture
def mount_tmpfs() -> Iterator[object]:
    """Mount a small tmpfs at a directory for one test; unmounted after (root only)."""
    mounted: list[Path] = []

    def mount(where: Path) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            reason = f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}"
            if os.environ.get("CI"):
                pytest.fail(f"CI runs as root and must run this test; {reason}")
            pytest.skip(reason)
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_names_reused_the_moment_they_are_read_lose_nothing(
    tmp_path: Path, mount_tmpfs: object, receiver: Receiver
) -> None:
    """300 requests through 3 names, each name renamed over as soon as its last request is
    answered, on the outbox's own tmpfs: every request answered once, applied once."""
    site = Site(tmp_path / "site", receiver.url)
    io = mount_tmpfs(tmp_path / "io")  # type: ignore[operator]
    site.outbox, site.results, site.claim = io / "outbox", io / "results", io / "claimed"
    site.outbox.mkdir()
    broker = site.start()
    errors: list[str] = []

    def agent(slot: int) -> None:
        for i in range(PER_NAME):
            rid = f"n{slot}-{i}"
            doc = {"version": 1, "id": rid, "effect": "crashtest.post", "params": {"value": rid}}
            write_atomically(site.outbox, f"slot{slot}.json", doc)
            try:
                wait_for(lambda rid=rid: (site.results / f"{rid}.json").exists(), 30, rid)
            except AssertionError as exc:
                errors.append(str(exc))
                return

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(NAMES)]
    try:
        wait_for(lambda: "serving" in broker.output(), 30, "the broker to start")
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        broker.stop()
    results = read_results(site.results)
    wanted = {f"n{s}-{i}" for s in range(NAMES) for i in range(PER_NAME)}
    assert errors == []
    assert {r for r, v in results.items() if v["status"] == "applied"} == wanted
    assert all(receiver.count(f"default/{rid}") == (1, 1) for rid in wanted)
    assert os.stat(site.claim).st_dev == os.stat(site.outbox).st_dev


def test_an_outbox_with_no_claim_dir_on_its_file_system_is_refused(
    tmp_path: Path, mount_tmpfs: object, receiver: Receiver
) -> None:
    """Attach mode with the outbox on its own mount and the state dir elsewhere: one line
    saying how to lay it out, exit 2, and the request is left where the agent put it."""
    site = Site(tmp_path / "site", receiver.url)
    site.outbox = mount_tmpfs(tmp_path / "own-outbox")  # type: ignore[operator]
    write_atomically(site.outbox, "r1.json", {"version": 1, "effect": "crashtest.noop"})
    done = subprocess.run(
        site.serve_args(),
        capture_output=True,
        text=True,
        timeout=60,
        env=broker_env(site.pythonpath),
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: sandbox default: the outbox")
    assert "on another file system" in lines[0] and "--claim DIR" in lines[0]
    assert (site.outbox / "r1.json").exists(), "a refused outbox is not read in place"


def test_a_sandbox_mounted_at_its_outbox_is_refused_and_the_others_served(
    tmp_path: Path, mount_tmpfs: object, receiver: Receiver
) -> None:
    """`serve --root`: a sandbox whose outbox/ is its own mount is refused with a hint (once,
    however often it is rescanned); a sandbox laid out right is served."""
    site = Site(
        tmp_path / "site", receiver.url, attach=False, broker_extra='rescan_interval = "500ms"'
    )
    sandboxes = site.state / "sandboxes"
    mount_tmpfs(sandboxes / "bad" / "outbox")  # type: ignore[operator]
    (sandboxes / "good" / "outbox").mkdir(parents=True)
    broker = site.start()
    try:
        wait_for(lambda: "serving" in broker.output(), 30, "the broker to start")
        doc = {"version": 1, "id": "g1", "effect": "crashtest.noop", "params": {}}
        write_atomically(sandboxes / "good" / "outbox", "g1.json", doc)
        wait_for(lambda: (sandboxes / "good" / "results" / "g1.json").exists(), 20, "good")
        write_atomically(sandboxes / "bad" / "outbox", "b1.json", doc | {"id": "b1"})
        time.sleep(2.5)  # five rescans: the refusal must not be logged again
    finally:
        broker.stop()
    log = broker.output()
    refusals = [line for line in log.splitlines() if "sandbox bad:" in line]
    assert len(refusals) == 1, log
    assert "mount the sandbox's own file system at sandboxes/<id>/" in refusals[0]
    assert json.loads((sandboxes / "good" / "results" / "g1.json").read_text())["status"] == (
        "applied"
    )
    assert (sandboxes / "bad" / "outbox" / "b1.json").exists()
