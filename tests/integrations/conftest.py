"""Fixtures for the integration tests: a host's broker.toml, a real `broker serve`
process, the broker CLI, and the real Docker engine (shared with tests/sandbox)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.loop import lockfile
from tests.sandbox.conftest import agent_image, engine

__all__ = ["agent_image", "engine"]

BROKER = str(Path(sys.executable).parent / "broker")
CLIENT = Path(__file__).resolve().parents[2] / "sandbox_images" / "client" / "outbox.py"


@dataclass
class Host:
    """One host: broker.toml (state dir, export root, policy, allow_as) in a temp dir."""

    base: Path
    config: Path
    state: Path
    exports: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "BROKER_CONFIG": str(self.config)}

    def policy(self, text: str) -> None:
        (self.base / "policy.toml").write_text(text)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the broker CLI against this host, as a person at another terminal would."""
        done = subprocess.run(
            [BROKER, *args, "--config", str(self.config)],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        if check:
            assert done.returncode == 0, done.stderr
        return done

    def pending(self, effect: str | None = None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = json.loads(self.cli("pending", "--json").stdout)
        return [r for r in rows if effect is None or r.get("effect") == effect]

    def wait_pending(self, effect: str, count: int = 1) -> list[dict[str, Any]]:
        """The first `count` requests of `effect` waiting for a person (bounded wait)."""
        end = time.monotonic() + 60
        while time.monotonic() < end:
            rows = self.pending(effect)
            if len(rows) >= count:
                return rows
            time.sleep(0.1)
        raise AssertionError(f"no pending {effect} request within 60s")

    def audit(self) -> list[dict[str, Any]]:
        lines = self.cli("audit", "tail", "-n", "500", "--json").stdout.splitlines()
        return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture
def host(tmp_path: Path) -> Host:
    """A host whose policy starts empty (the defaults) and whose `--as` is allowed."""
    exports = tmp_path / "exports"
    exports.mkdir()
    config = tmp_path / "broker.toml"
    config.write_text(
        '[broker]\nstate_dir = "state"\npolicy = "policy.toml"\nallow_as = true\n'
        f'[integrations.files]\nroot = "{exports}"\nper_sandbox = false\n'
    )
    (tmp_path / "policy.toml").write_text("")
    return Host(tmp_path, config, tmp_path / "state", exports)


@pytest.fixture
def serve(host: Host) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start a real `broker serve` process on the host (extra args allowed); stopped after."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        log = host.base / f"serve-{len(started)}.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                [BROKER, "serve", "--config", str(host.config), *args],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                text=True,
            )
        started.append(proc)
        end = time.monotonic() + 60
        while not lockfile.served(host.state):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < end, "broker serve did not start within 60s"
            time.sleep(0.05)
        return proc

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
