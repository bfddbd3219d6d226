"""The request state machine against a model: hypothesis submits valid, invalid,
gated and replayed requests, approves, denies, lets deadlines pass and restarts the
broker in any order, and after every step the results must match the model."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from broker.models import TERMINAL
from broker.testing import FakeClock
from tests.crash.support import schema_problems
from tests.fuzz.conftest import FIGURES, Driver, envelope, examples

STEPS: Counter[str] = Counter()
INVALID = [
    b"{",
    b'{"version": 1, "effect": "test.record", "params": {}, "approved": true}',
    b'{"version": 1, "effect": "no.such", "params": {}}',
    b'{"version": 1, "effect": "test.record", "params": {"value": [1]}}',
    b'{"version": 1, "effect": "test.record", "params": {"value": NaN}}',
    b'{"version": 1, "effect": "test.record", "effect": "test.gated", "params": {}}',
    b'{"version": 1, "effect": "test.record", "params": {"value": "\\udfff"}}',
    b"[" * 100 + b"]" * 100,
]


class RequestLife(RuleBasedStateMachine):
    """One broker's life; `expected` is the model: request id → status it must show."""

    def __init__(self, base: Path, clock: FakeClock) -> None:
        super().__init__()
        self.driver = Driver(base / uuid.uuid4().hex, clock=clock).open()
        logging.getLogger("broker").addHandler(self.driver.errors)
        self.clock = clock
        self.expected: dict[str, str | None] = {}
        self.replays: dict[str, str] = {}  # replay id → the id it replays
        self.keys: dict[str, tuple[str, str, dict[str, Any]]] = {}  # id → key, effect, params
        self.first_terminal: dict[str, dict[str, Any]] = {}
        self.n = 0
        STEPS["machines"] += 1

    def _new_id(self) -> str:
        self.n += 1
        return f"r{self.n}"

    def _submit(self, effect: str, status: str, fail: bool = False) -> str:
        rid = self._new_id()
        params: dict[str, Any] = {"value": rid}
        if fail:
            params["fail"] = "the service said no"
        key = f"key-{rid}"
        self.driver.write(f"{rid}.json", envelope(rid, effect, params, idempotency_key=key))
        self.driver.settle()
        STEPS[effect] += 1
        self.expected[rid] = status
        self.keys[rid] = (key, effect, params)
        return rid

    def _pending(self) -> list[str]:
        return sorted(i for i, s in self.expected.items() if s == "pending")

    def _mark(self, originals: list[str], status: str) -> None:
        for rid in originals:
            self.expected[rid] = status
        for replay, first in self.replays.items():
            if first in originals:
                self.expected[replay] = status

    @rule()
    def submit_automatic(self) -> None:
        self._submit("test.record", "applied")

    @rule()
    def submit_failing(self) -> None:
        self._submit("test.record", "failed", fail=True)

    @rule()
    def submit_gated(self) -> None:
        self._submit("test.gated", "pending")

    @rule(data=st.sampled_from(INVALID))
    def submit_invalid(self, data: bytes) -> None:
        rid = self._new_id()
        self.driver.write(f"{rid}.json", data)
        self.driver.settle()
        self.expected[rid] = "invalid"

    @precondition(lambda self: self.keys)
    @rule(data=st.data())
    def submit_replay(self, data: st.DataObject) -> None:
        first = data.draw(st.sampled_from(sorted(self.keys)))
        key, effect, params = self.keys[first]
        rid = self._new_id()
        self.driver.write(f"{rid}.json", envelope(rid, effect, params, idempotency_key=key))
        self.driver.settle()
        STEPS["replays"] += 1
        self.replays[rid] = first
        status = self.expected[first]
        self.expected[rid] = status if status in TERMINAL else None  # no answer yet

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def reuse_an_id_with_other_bytes(self, data: st.DataObject) -> None:
        taken = data.draw(st.sampled_from(sorted(self.expected)))
        name = f"again-{self._new_id()}"
        self.driver.write(f"{name}.json", envelope(taken, "test.record", {"value": "other"}))
        self.driver.settle()

    @precondition(lambda self: any(s == "pending" for s in self.expected.values()))
    @rule(data=st.data(), verdict=st.sampled_from(["approve", "deny"]))
    def decide(self, data: st.DataObject, verdict: str) -> None:
        rid = data.draw(st.sampled_from(self._pending()))
        STEPS[f"{verdict} decisions"] += 1
        self.driver.decide(rid, verdict)
        self.driver.settle()
        self._mark([rid], "applied" if verdict == "approve" else "denied")

    @precondition(lambda self: any(s == "pending" for s in self.expected.values()))
    @rule()
    def let_deadlines_pass(self) -> None:
        STEPS["deadline jumps"] += 1
        self.clock.advance(timedelta(hours=2).total_seconds())
        self.driver.settle()
        self._mark(self._pending(), "expired")

    @rule()
    def restart(self) -> None:
        STEPS["restarts"] += 1
        self.driver.restart()
        self.driver.settle()

    @invariant()
    def results_match_the_model(self) -> None:
        results = self.driver.results_now()
        shown = {rid: results.get(rid, {}).get("status") for rid in self.expected}
        assert shown == self.expected
        for rid, result in results.items():
            assert schema_problems(result) == [], rid
            if result["status"] in TERMINAL:
                first = self.first_terminal.setdefault(rid, result)
                assert result == first, f"{rid}: a terminal result was rewritten"
        for replay in self.replays:
            if results.get(replay):
                assert results[replay]["replayed"] is True

    @invariant()
    def each_effect_applied_at_most_once(self) -> None:
        applied = Counter(
            a["value"] for a in [*self.driver.record.applied, *self.driver.gated.applied]
        )
        assert [v for v, n in applied.items() if n > 1] == []
        originals = {i for i in self.expected if i not in self.replays}
        assert set(applied) == {i for i in originals if self.expected[i] == "applied"}
        assert [r.getMessage() for r in self.driver.errors.records] == []

    def teardown(self) -> None:
        logging.getLogger("broker").removeHandler(self.driver.errors)
        self.driver.close()


def test_request_state_machine_matches_its_model(tmp_path: Path, patched_clock: FakeClock) -> None:
    """Any mix of submissions, decisions, deadlines and restarts ends as the model says."""
    run_state_machine_as_test(
        lambda: RequestLife(tmp_path, patched_clock),
        settings=settings(
            max_examples=examples(40, 300),
            stateful_step_count=examples(25, 60),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    FIGURES.append(
        "state machine: " + ", ".join(f"{n} {what}" for what, n in sorted(STEPS.items()))
    )
