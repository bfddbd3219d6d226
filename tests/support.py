"""Helpers the test modules share (fixtures are in conftest.py)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from jsonschema import Draft202012Validator

from broker.audit import verify as audit
from broker.testing import BrokerHarness
from broker.validation import load_schema

if TYPE_CHECKING:
    import pexpect

BROKER = Path(sys.executable).with_name("broker")
RESULT = Draft202012Validator(load_schema("result"))
# The tests' own HTTP clients share one TLS context (httpx's default: certifi's roots):
# each httpx.Client or httpx.post would load the CA bundle again, ~45 ms of CPU, though
# they speak plain HTTP to 127.0.0.1.
TLS = httpx.create_ssl_context()
SETTLE_S = 0.15  # the watchfiles fallback watches a moment after `ready`

Start = Callable[..., BrokerHarness]


def checked(result: dict[str, Any]) -> dict[str, Any]:
    """`result`, after asserting that it matches schemas/result.json."""
    problems = [e.message for e in RESULT.iter_errors(result)]
    assert not problems, f"result {result.get('id')} breaks schemas/result.json: {problems}"
    return result


T = TypeVar("T")

# How long a test waits for what arrives on another thread or process. Generous on
# purpose: a passing test never waits it out, and a test asserts that something
# happens, not how fast (on two cores shared with a load of 25 a delivery took > 5 s).
PATIENCE = 60.0


def eventually(check: Callable[[], T], timeout: float = PATIENCE) -> T:
    """Return `check()`'s value once it is truthy; fail, naming it, if it is not within
    `timeout`."""
    end = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > end:
            raise AssertionError(f"not true within {timeout}s: {check.__doc__ or check}")
        time.sleep(0.01)
    return value


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

    def wait_for(self, path: str, count: int, timeout: float = PATIENCE) -> list[dict[str, Any]]:
        end = time.monotonic() + timeout
        while len(self.calls(path)) < count:
            if time.monotonic() > end:
                raise AssertionError(f"{path}: {len(self.calls(path))} of {count} calls arrived")
            time.sleep(0.01)
        return self.calls(path)


SERVE_POLICY = """
[[rules]]
effect = "files.write"
when = { path = "gate/*" }
action = "approve"
timeout = "1h"
reason = "files under gate/ are read by a person first"
"""


class ServeSite:
    """A broker.toml, a policy, an export root and an attach-mode outbox."""

    def __init__(self, base: Path, home: Path, toml: str = "") -> None:
        self.home = home
        self.outbox, self.results = base / "outbox", base / "results"
        self.exports, self.state = base / "exports", base / "state"
        for d in (self.outbox, self.results, self.exports):
            d.mkdir(parents=True)
        (base / "policy.toml").write_text(SERVE_POLICY)
        self.config = base / "broker.toml"
        self.config.write_text(
            f'[broker]\nstate_dir = "state"\npolicy = "policy.toml"\n'
            f'[integrations.files]\nroot = "{self.exports}"\n{toml}'
        )

    def write(self, doc: dict[str, Any], name: str | None = None) -> str:
        rid = str(doc.get("id") or name)
        tmp = self.outbox / f".{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(doc))
        os.rename(tmp, self.outbox / f"{name or rid}.json")
        return rid

    def request(self, effect: str, **params: Any) -> str:
        rid = uuid.uuid4().hex[:12]
        return self.write({"version": 1, "id": rid, "effect": effect, "params": params})

    def result(self, rid: str, status: str | None = None, timeout: float = 30) -> dict[str, Any]:
        """The request's result once it has one (with `status`, when given)."""
        found: dict[str, Any] = {}

        def there() -> bool:
            nonlocal found
            try:
                found = json.loads((self.results / f"{rid}.json").read_text())
            except (FileNotFoundError, ValueError):
                return False
            return status is None or found.get("status") == status

        eventually(there, timeout)
        return found

    def cli(self, *args: str) -> str:
        done = run_broker(*args, "--config", str(self.config), home=self.home)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def serve(self, *args: str) -> Serving:
        """`broker serve` on this site's outbox as sandbox sb1, once it says it serves."""
        s = Serving(
            self.home,
            "--config",
            str(self.config),
            "--outbox",
            str(self.outbox),
            "--results",
            str(self.results),
            "--sandbox",
            "sb1",
            *args,
        )
        s.line_with("serving sandboxes")
        return s


class Serving:
    """A `broker serve` process, its stderr read line by line on a thread."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(BROKER), "serve", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(home, env),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def line_with(self, words: str, timeout: float = 30) -> str:
        """The first stderr line holding `words` (every line read is kept in `seen`)."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line with {words!r}; saw {self.seen}") from None
            self.seen.append(line)
            if words in line:
                return line.strip()

    def stop(self, signum: int) -> int:
        """Send `signum`; the exit code, once stderr is read to its end into `seen`."""
        self.proc.send_signal(signum)
        code = self.proc.wait(30)
        self.reader.join(10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def line(s: Serving, *words: str) -> str:
    """The next log line holding every one of `words`."""
    while True:
        found = s.line_with(words[0])
        if all(w in found for w in words):
            return found


def barrier(h: BrokerHarness) -> None:
    """Return once everything written before it has been through a wake-up: its results
    and its audit events too (a wake-up writes results first, then the audit log)."""
    rid = f"barrier-{uuid.uuid4().hex[:8]}"
    result = h.submit({"version": 1, "id": rid, "effect": "test.nothing", "params": {}})
    assert result["status"] == "invalid"

    def logged() -> bool:
        """the barrier's own events in the audit log"""
        found = audit.read_events(h.config.audit_path)
        return any(e is not None and e.get("id") == rid for _, e, _ in found)

    eventually(logged)


def at_a_terminal(*args: str) -> pexpect.spawn:
    """The `broker` console script run as a person runs it: a 160-column terminal."""
    import pexpect  # (the tests that use a terminal load it)

    return pexpect.spawn(
        str(BROKER),
        list(args),
        encoding="utf-8",
        timeout=90,
        dimensions=(50, 160),
        env={**os.environ, "COLUMNS": "160"},
    )


def approve_at_the_prompt(child: pexpect.spawn, why: str, reason: str) -> None:
    """At `broker run`'s prompt: the card shows `why` it stopped; approve, with `reason`."""
    child.expect(why)
    child.expect("approve\\? \\[a\\]pprove")
    child.sendline("a")
    child.expect("reason")
    child.sendline(reason)
