"""Fixtures for hostile sandboxes: a real broker serving real containers.

`host` is an in-process Broker serving <state>/sandboxes/* (the layout `broker run`
makes), with test.record (automatic) and test.gated (waits for a person). Agents are
Python scripts run in the built agent image as SANDBOX_UID, with no network and no
capabilities, exactly as `broker run` starts them.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest

from broker.config import Config, Limits
from broker.hosting import sandbox
from broker.intake import inotify
from broker.loop.pipeline import Broker
from broker.policy.ruleset import parse_policy
from broker.registry import Registry
from broker.testing import BrokerHarness, FakeHandler
from tests.crash.support import read_results, wait_for
from tests.sandbox.conftest import agent_image, engine  # noqa: F401  (shared fixtures)

GATED_POLICY = {
    "rules": [{"effect": "test.gated", "action": "approve", "timeout": "1h", "reason": "look"}]
}
IN_OPEN = 0x00000020
IN_ACCESS = 0x00000001
FIGURES: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("hostile sandboxes")
        for _, line in sorted(FIGURES.items()):
            terminalreporter.write_line(line)


@dataclass
class Ran:
    """What an agent script printed and how it ended."""

    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout.strip().splitlines()[-1])


@dataclass
class HostileHost:
    """A broker serving sandbox outboxes, and a way to run agents in them."""

    engine: docker.DockerClient
    image: str
    state: Path
    rescan_s: float = 30.0
    limits: Limits = field(default_factory=Limits)
    record: FakeHandler = field(default_factory=lambda: FakeHandler("test.record"))
    gated: FakeHandler = field(
        default_factory=lambda: FakeHandler("test.gated", reversible=False, idempotent=False)
    )
    containers: list[Any] = field(default_factory=list)
    broker: Broker | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sandbox(self, name: str | None = None) -> sandbox.SandboxPaths:
        """A sandbox's directories (made before the broker starts, or found later)."""
        return sandbox.prepare_dirs(self.state, name or f"sb-{uuid.uuid4().hex[:8]}")

    def start(self) -> HostileHost:
        registry = Registry()
        registry.register(self.record, "tests")
        registry.register(self.gated, "tests")
        config = Config(state_dir=self.state, limits=self.limits, rescan_interval_s=self.rescan_s)
        policy = parse_policy(GATED_POLICY, registry.reversibility(), "hostile")
        self.broker = Broker(config, registry, policy)
        self.broker.serve_root(self.state / "sandboxes")
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self.broker.serve, args=(self._stop,), kwargs={"ready": ready.set}, daemon=True
        )
        self._thread.start()
        assert ready.wait(30), "the broker did not start"
        return self

    def stop(self) -> None:
        for container in self.containers:
            sandbox.remove(container)
        self.containers.clear()
        self._stop.set()
        if self.broker is not None:
            self.broker.wake()
        if self._thread is not None:
            self._thread.join(30)

    def run(self, paths: sandbox.SandboxPaths, script: str, *args: str, timeout: int = 120) -> Ran:
        """Run an agent script in the sandbox until it exits."""
        container = self.start_agent(paths, script, *args)
        status = container.wait(timeout=timeout)
        return Ran(
            status["StatusCode"],
            container.logs(stdout=True, stderr=False).decode(errors="replace"),
            container.logs(stdout=False, stderr=True).decode(errors="replace"),
        )

    def start_agent(self, paths: sandbox.SandboxPaths, script: str, *args: str) -> Any:
        container = sandbox.start(self.engine, paths, self.image, ["python3", "-c", script, *args])
        self.containers.append(container)
        return container

    def results(self, paths: sandbox.SandboxPaths) -> dict[str, dict[str, Any]]:
        return read_results(paths.results)

    def wait_results(
        self, paths: sandbox.SandboxPaths, ids: list[str], timeout: float = 10
    ) -> dict[str, dict[str, Any]]:
        """The terminal results of `ids`, once all are there."""
        from broker.models import TERMINAL

        def done() -> bool:
            found = self.results(paths)
            return all(found.get(i, {}).get("status") in TERMINAL for i in ids)

        wait_for(done, timeout, f"terminal results for {ids}")
        return self.results(paths)

    def still_serving(self, paths: sandbox.SandboxPaths) -> None:
        """A plain request from the host side is applied: the broker is alive."""
        rid = f"alive-{uuid.uuid4().hex[:8]}"
        doc = {"version": 1, "id": rid, "effect": "test.record", "params": {"value": rid}}
        tmp = paths.outbox / f".{rid}.tmp"
        tmp.write_text(json.dumps(doc))
        os.rename(tmp, paths.outbox / f"{rid}.json")
        assert self.wait_results(paths, [rid])[rid]["status"] == "applied"


@pytest.fixture
def host(
    engine: docker.DockerClient,  # noqa: F811
    agent_image: str,  # noqa: F811
    tmp_path: Path,
) -> Iterator[HostileHost]:
    """A broker (not yet started) for sandboxes under a fresh state dir; cleaned up."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    h = HostileHost(engine, agent_image, state)
    yield h
    h.stop()


@pytest.fixture
def attach_harness(tmp_path: Path) -> Iterator[BrokerHarness]:
    """A broker in attach mode (an orchestrator's own dirs) with test.record."""
    with BrokerHarness(
        tmp_path / "attach", handlers=[FakeHandler("test.record")], builtins=False
    ) as h:
        yield h


class OpenProbe:
    """Records every open or read of any file in `folder`, by anyone (inotify)."""

    def __init__(self, folder: Path) -> None:
        self.events: list[tuple[str, int]] = []
        self._watch = inotify.Inotify(lambda _folder, name, mask: self.events.append((name, mask)))
        self._watch.add(folder, IN_OPEN | IN_ACCESS)

    def prove(self, path: Path) -> None:
        """Read `path` once and see the probe notice it, then forget that read."""
        path.read_bytes()
        wait_for(lambda: bool(self.events), 5, "the open probe to notice a read")
        time.sleep(0.05)
        self.events.clear()

    def close(self) -> None:
        time.sleep(0.1)  # let the reading thread deliver the last events
        self._watch.close()
