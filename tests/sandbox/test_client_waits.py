"""The in-sandbox client against a real broker: it says it waits while a person decides,
and a retry of the same request (same id) files nothing new."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from broker.approval.decisions import Ballot, decide_and_wake
from broker.audit import verify as audit
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeHandler
from tests.sandbox.conftest import CLIENT
from tests.support import eventually

POLICY = (
    '[[rules]]\neffect = "test.record"\naction = "approve"\ntimeout = "1h"\n'
    'reason = "a person reads every record"\n'
)


@pytest.fixture
def h(
    tmp_path: Path, fake: FakeHandler, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BrokerHarness]:
    """A real broker where test.record waits for a person; the client points at it."""
    harness = BrokerHarness(tmp_path / "h", handlers=[fake], policy=POLICY, builtins=False)
    monkeypatch.setenv("OUTBOX_DIR", str(harness.outbox))
    monkeypatch.setenv("RESULTS_DIR", str(harness.results))
    monkeypatch.setenv("OUTBOX_PROGRESS_SECONDS", "0.2")
    with harness:
        yield harness


class Call:
    """outbox.request(...) on a thread, its progress lines collected."""

    def __init__(self, client: ModuleType, *args: Any, **kwargs: Any) -> None:
        self.lines: list[str] = []
        self.answer: dict[str, Any] | None = None
        self.error: BaseException | None = None
        kwargs.setdefault("timeout", 30)
        self.thread = threading.Thread(target=self._run, args=(client, args, kwargs), daemon=True)
        self.thread.start()

    def _run(self, client: ModuleType, args: Any, kwargs: Any) -> None:
        try:
            self.answer = client.request(*args, progress=self.lines.append, **kwargs)
        except BaseException as exc:
            self.error = exc

    def said(self, words: str) -> str:
        eventually(lambda: any(words in line for line in self.lines), timeout=10)
        return next(line for line in self.lines if words in line)

    def done(self) -> dict[str, Any]:
        self.thread.join(30)
        assert self.error is None, self.error
        assert self.answer is not None
        return self.answer


def approve(h: BrokerHarness, rid: str) -> None:
    ledger = Ledger(h.config.ledger_path)
    try:
        decide_and_wake(
            h.config,
            ledger,
            Ballot(rid, "approve", approver="ana", reason=None, surface="cli", sha256=None),
        )
    finally:
        ledger.close()


def test_a_pending_request_says_so_then_keeps_saying(
    h: BrokerHarness, outbox_client: ModuleType, fake: FakeHandler
) -> None:
    """Once when it starts waiting (until when, and what if nobody decides), then at the
    slow interval; the call returns the decision as it always did."""
    call = Call(outbox_client, "test.record", {"value": 1}, request_id="asked-once")
    first = call.said("waits for a person's decision")
    pending = json.loads((h.results / "asked-once.json").read_text())
    assert f"until {pending['expires_at']}" in first
    assert (
        "request asked-once (test.record)" in first and "if nobody decides, it is denied" in first
    )
    assert "expires at" in call.said("still waiting for a decision on request asked-once")
    approve(h, "asked-once")
    assert call.done()["status"] == "applied"
    assert sum("waits for a person's decision" in line for line in call.lines) == 1
    assert fake.applied == [{"value": 1}]


def test_a_retry_with_the_same_id_files_nothing_new(
    h: BrokerHarness, outbox_client: ModuleType, fake: FakeHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A harness that gave up waiting calls again with the same id: no file is written,
    the broker records one request, and both calls see the one decision."""
    args = ("test.record", {"value": "once"})
    extra = {"request_id": "retry-1", "reason": "twice", "attachments": {"log": b"\x00bytes"}}
    with pytest.raises(outbox_client.OutboxTimeout, match="--id retry-1"):
        outbox_client.request(*args, timeout=0.5, progress=False, **extra)
    written: list[str] = []
    real = outbox_client._write_atomically
    monkeypatch.setattr(
        outbox_client, "_write_atomically", lambda d, n, b: (written.append(n), real(d, n, b))
    )
    again = Call(outbox_client, *args, **extra)
    again.said("waits for a person's decision")
    approve(h, "retry-1")
    answer = again.done()
    assert answer["status"] == "applied" and answer["id"] == "retry-1"
    assert written == [], "the retry wrote into the outbox"
    assert fake.applied == [{"value": "once"}]
    events = [e for _, e, _ in audit.read_events(h.config.audit_path) if e]
    assert [e["event"] for e in events if e["event"] in ("received", "duplicate_id")] == [
        "received"
    ]


def test_a_retry_before_the_broker_reads_it_leaves_the_file_alone(
    outbox_client: ModuleType, outbox_dir: Path
) -> None:
    """No broker yet: the same call twice leaves one file, written once."""
    first = outbox_client.request("files.write", {"path": "a"}, request_id="r2", wait=False)
    stamp = os.stat(outbox_dir / "r2.json").st_mtime_ns
    second = outbox_client.request("files.write", {"path": "a"}, request_id="r2", wait=False)
    assert first == second
    assert sorted(p.name for p in outbox_dir.iterdir()) == ["r2.json"]
    assert os.stat(outbox_dir / "r2.json").st_mtime_ns == stamp


def test_the_same_id_for_another_request_is_refused(
    h: BrokerHarness, outbox_client: ModuleType
) -> None:
    """Other params under an id already used: a clear error, nothing written."""
    outbox_client.request("test.record", {"value": "a"}, request_id="taken", wait=False)
    eventually(lambda: (h.results / "taken.json").exists())
    with pytest.raises(outbox_client.OutboxError, match="already used by another request"):
        outbox_client.request("test.record", {"value": "b"}, request_id="taken", wait=False)
    assert list(h.outbox.glob("*.json")) == []


def test_an_idempotency_key_makes_calls_retries(
    h: BrokerHarness, outbox_client: ModuleType, fake: FakeHandler
) -> None:
    """The same key: the same id, one request. The same key for other params: the broker
    answers, as the protocol says (invalid, idempotency_conflict)."""
    first = outbox_client.request("test.record", {"value": 7}, idempotency_key="k-7", wait=False)
    second = outbox_client.request("test.record", {"value": 7}, idempotency_key="k-7", wait=False)
    assert first["id"] == second["id"]
    eventually(lambda: (h.results / f"{first['id']}.json").exists())
    other = outbox_client.request(
        "test.record", {"value": 8}, idempotency_key="k-7", timeout=10, progress=False
    )
    assert other["id"] != first["id"]
    assert other["status"] == "invalid"
    assert [e["code"] for e in other["errors"]] == ["idempotency_conflict"]


def test_cli_progress_goes_to_stderr_and_quiet_silences_it(h: BrokerHarness) -> None:
    """`outbox request` says it waits on stderr (stdout stays the result); --quiet says
    nothing but the timeout."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "OUTBOX_DIR": str(h.outbox),
        "RESULTS_DIR": str(h.results),
        "OUTBOX_PROGRESS_SECONDS": "0.2",
    }
    base = [sys.executable, str(CLIENT), "request", "test.record", "--param", "value=x"]
    told = subprocess.run(
        [*base, "--timeout", "1.5"], env=env, capture_output=True, text=True, timeout=30
    )
    assert told.returncode == 2 and told.stdout == ""
    assert "waits for a person's decision until" in told.stderr
    assert "this call gives up after 1.5s" in told.stderr
    quiet = subprocess.run(
        [*base, "--timeout", "1", "--quiet"], env=env, capture_output=True, text=True, timeout=30
    )
    assert quiet.returncode == 2
    [line] = quiet.stderr.splitlines()
    assert "no terminal result" in line


def test_no_answer_at_all_asks_whether_a_broker_serves(
    outbox_client: ModuleType, outbox_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing answers within the interval: the wait says no broker seems to serve."""
    monkeypatch.setenv("OUTBOX_PROGRESS_SECONDS", "0.2")
    lines: list[str] = []
    with pytest.raises(outbox_client.OutboxTimeout):
        outbox_client.request("files.write", {"path": "a"}, timeout=1, progress=lines.append)
    assert any("is a broker serving this sandbox?" in line for line in lines)


def test_the_client_runs_on_python_38(outbox_dir: Path) -> None:
    """Python 3.8 (where the machine has it) runs the client: a request and its retry."""
    py38 = Path.home() / ".pyenv" / "versions" / "3.8.18" / "bin" / "python"
    if not py38.exists():
        pytest.skip("no Python 3.8 on this machine")
    env = {"OUTBOX_DIR": str(outbox_dir), "RESULTS_DIR": str(outbox_dir.parent / "results")}
    args = [str(py38), str(CLIENT), "request", "files.write", "--param", "path=a", "--id", "p38"]
    for _ in range(2):
        done = subprocess.run([*args, "--no-wait"], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["id"] == "p38"
    assert [p.name for p in outbox_dir.iterdir()] == ["p38.json"]
