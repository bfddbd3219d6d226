"""Inline handlers: fast, idempotent effects applied in the request's own commit."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from broker.audit import verify as audit
from broker.testing import BrokerHarness, FakeHandler
from effects.base import Context


class InlineHandler(FakeHandler):
    """Records the thread it ran on; declares itself inline."""

    inline = True

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.threads: list[str] = []

    def apply(self, params: Any, ctx: Context) -> dict[str, Any]:
        self.threads.append(threading.current_thread().name)
        return super().apply(params, ctx)


def test_inline_handler_is_applied_on_the_loop(tmp_path: Path) -> None:
    """An inline handler runs on the broker's loop, not the pool, and the agent reads
    `applied`; the audit log tells the same story as for any other auto request."""
    handler = InlineHandler("test.inline")
    with BrokerHarness(tmp_path / "h", handlers=[handler], builtins=False) as h:
        result = h.submit(h.request("test.inline", {"value": 7}))
    assert result["status"] == "applied" and result["output"]["value"] == 7
    assert handler.threads == ["broker-harness"]
    events = [e["event"] for _, e, _ in audit.read_events(h.config.audit_path) if e]
    assert events == ["received", "decided", "applying", "applied"]
    assert audit.verify(h.config.audit_path)[1] is None


def test_non_idempotent_handler_is_never_inline(tmp_path: Path) -> None:
    """`inline` is ignored for a handler that is not idempotent: it runs on the pool."""
    handler = InlineHandler("test.inline")
    handler.idempotent = False
    with BrokerHarness(tmp_path / "h", handlers=[handler], builtins=False) as h:
        assert h.submit(h.request("test.inline", {"value": 1}))["status"] == "applied"
    assert handler.threads[0].startswith("broker-apply")


def test_a_quota_counts_inline_applies_of_the_same_wake_up(tmp_path: Path) -> None:
    """Inline applies are written with their outcome, later in the same commit: a burst
    read in one wake-up still meets the sandbox's quota exactly."""
    handler = InlineHandler("test.inline")
    policy = '[[limits]]\neffect = "test.*"\nmax = 3\n'
    h = BrokerHarness(tmp_path / "h", handlers=[handler], builtins=False, policy=policy)
    docs = [h.request("test.inline", {"value": i}) for i in range(8)]
    for doc in docs:  # all there before it serves: one wake-up reads them
        h.write(f"{doc['id']}.json", doc)
    with h:
        results = [h.wait(doc["id"]) for doc in docs]
    assert sorted(r["status"] for r in results) == ["applied"] * 3 + ["denied"] * 5
    assert len(handler.applied) == 3
    denied = [r for r in results if r["status"] == "denied"]
    assert all("quota: 3 of 3 test.* requests" in r["reason"] for r in denied)
