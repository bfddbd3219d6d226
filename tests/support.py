"""Helpers the test modules share (fixtures are in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from broker.testing import BrokerHarness
from broker.validation import load_schema

BROKER = Path(sys.executable).with_name("broker")
RESULT = Draft202012Validator(load_schema("result"))
SETTLE_S = 0.15  # the watchfiles fallback watches a moment after `ready`

Start = Callable[..., BrokerHarness]


def checked(result: dict[str, Any]) -> dict[str, Any]:
    """`result`, after asserting that it matches schemas/result.json."""
    problems = [e.message for e in RESULT.iter_errors(result)]
    assert not problems, f"result {result.get('id')} breaks schemas/result.json: {problems}"
    return result


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Return once `check()` is true; fail, naming it, if it is not within `timeout`."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not true within {timeout}s: {check.__doc__ or check}")
        time.sleep(0.01)


def run_broker(
    *args: str, home: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed `broker` console script with a clean environment."""
    return subprocess.run(
        [str(BROKER), *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=clean_env(home, env),
        cwd=cwd,
        timeout=60,
        check=False,
    )


def clean_env(home: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without BROKER_* or colour settings, HOME at `home`, 200 columns."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("BROKER_")
        and k not in ("XDG_STATE_HOME", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
    }
    base.update({"HOME": str(home), "COLUMNS": "200", "TERM": "dumb"}, **(env or {}))
    return base


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *names: str) -> str:
    """A user error: non-zero exit, one line on stderr naming `names`, no traceback."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for name in names:
        assert name in lines[0]
    return lines[0]


@dataclass
class Hook:
    """What the webhook server received, and the statuses it answers with, per path."""

    base: str
    received: list[dict[str, Any]] = field(default_factory=list)
    script: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return self.base + path

    def calls(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.received if r["path"] == path]

    def wait_for(self, path: str, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        end = time.monotonic() + timeout
        while len(self.calls(path)) < count:
            if time.monotonic() > end:
                raise AssertionError(f"{path}: {len(self.calls(path))} of {count} calls arrived")
            time.sleep(0.01)
        return self.calls(path)
