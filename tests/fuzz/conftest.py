"""A broker driven step by step, with no watcher thread and a clock the test moves.

`Driver` writes files into an attach-mode outbox and calls Broker.drain(), which
steps the real pipeline until everything written is answered and every apply is
back; `restart()` closes the Broker and opens a new one on the same state, which
recovers from the ledger as after a stop.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from broker.approval import decisions as approval
from broker.approval.decisions import Ballot
from broker.audit.log import AuditLog, flush
from broker.config import Config, Limits
from broker.events import Rescan
from broker.intake.outbox import attach
from broker.loop.pipeline import Broker
from broker.policy.ruleset import parse_policy
from broker.registry import Registry
from broker.store.sqlite import Ledger
from broker.testing import FakeClock, FakeHandler
from tests.crash.support import read_results, soak

GATED = {
    "rules": [
        {
            "effect": "test.gated",
            "action": "approve",
            "timeout": "1h",
            "on_timeout": "deny",
            "reason": "a person looks first",
        }
    ]
}


FIGURES: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("fuzzing")
        for line in FIGURES:
            terminalreporter.write_line(line)


def examples(default: int, long: int) -> int:
    """How many examples hypothesis tries: `long` under BROKER_SOAK=1."""
    return long if soak() else default


class ErrorLog(logging.Handler):
    """Keeps every ERROR the broker logs (a swallowed exception is a failure)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Driver:
    """A real Broker on an attach-mode outbox, stepped synchronously."""

    def __init__(
        self, base: Path, limits: Limits | None = None, clock: FakeClock | None = None
    ) -> None:
        self.base = base
        self.outbox, self.results, self.state = base / "outbox", base / "results", base / "state"
        for d in (self.outbox, self.results, self.state):
            d.mkdir(parents=True, exist_ok=True)
        self.record = FakeHandler("test.record")
        self.gated = FakeHandler("test.gated", reversible=False, idempotent=False)
        self.registry = Registry()
        self.registry.register(self.record, "fuzz")
        self.registry.register(self.gated, "fuzz")
        self.config = Config(
            state_dir=self.state, limits=limits or Limits(), rescan_interval_s=3600.0
        )
        self.policy = parse_policy(GATED, self.registry.reversibility(), "fuzz")
        self.clock = clock or FakeClock()  # the broker's: time passes when the test says
        self.errors = ErrorLog()
        self.broker: Broker | None = None
        self.answers: Counter[str] = Counter()

    def open(self) -> Driver:
        self.broker = Broker(self.config, self.registry, self.policy, workers=2, clock=self.clock)
        self.broker.add(attach("default", self.outbox, self.results, self.state))
        self.broker.recover()
        return self

    def close(self) -> None:
        if self.broker is not None:
            self.broker.close()
            self.broker = None

    def restart(self) -> None:
        self.close()
        self.open()

    def write(self, name: str | bytes, data: bytes) -> None:
        tmp = self.outbox / f".{uuid.uuid4().hex}.tmp"
        tmp.write_bytes(data)
        os.rename(os.fsencode(tmp), os.path.join(os.fsencode(self.outbox), os.fsencode(name)))

    def settle(self) -> None:
        """Step until every file is answered and every apply has come back."""
        assert self.broker is not None
        self.broker.events.put(Rescan())  # reload decisions taken on other connections
        self.broker.drain(timeout=20)

    def decide(self, request_id: str, verdict: str) -> None:
        """A person's decision, taken as the CLI takes it: on its own connection."""
        ledger = Ledger(self.config.ledger_path)
        try:
            approval.decide(
                ledger,
                Ballot(
                    f"default/{request_id}",
                    verdict,
                    approver="fuzz-person",
                    reason="the model said so",
                    surface="cli",
                    sha256=None,
                ),
                now=self.clock,
            )
            flush(ledger, AuditLog(self.config.audit_path))
        finally:
            ledger.close()

    def results_now(self) -> dict[str, dict[str, Any]]:
        return read_results(self.results)


@pytest.fixture
def patched_clock() -> FakeClock:
    """The clock the test's brokers run on (deadlines, approvals, what is stored): time
    passing moves its wall and its monotonic clock alike."""
    return FakeClock()


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    """One stepped broker for a whole module, with its ERROR log captured."""
    d = Driver(tmp_path_factory.mktemp("fuzz")).open()
    logger = logging.getLogger("broker")
    logger.addHandler(d.errors)
    yield d
    logger.removeHandler(d.errors)
    d.close()
    if d.answers:
        counts = ", ".join(f"{n} {s}" for s, n in d.answers.most_common())
        FIGURES.append(f"hypothesis: {d.answers.total()} generated requests answered: {counts}")


def envelope(request_id: str, effect: str, params: Mapping[str, Any], **extra: Any) -> bytes:
    return json.dumps(
        {"version": 1, "id": request_id, "effect": effect, "params": dict(params), **extra}
    ).encode()
