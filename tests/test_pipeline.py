"""The request's life through a real broker, as the agent (/results) and the operator
(ledger, audit log) see it: states, idempotency, duplicate ids, atomic results,
consumption and secrets."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import watchfiles

from broker.audit import verify as audit
from broker.clock import parse_iso
from broker.config import Limits
from broker.errors import EffectFailed
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeClock, FakeHandler
from broker.typing import JSON, Params
from effects.base import Context
from tests.support import Start, barrier, checked, eventually


def stamp(result: dict[str, Any], key: str) -> datetime:
    moment = parse_iso(result[key])
    assert moment is not None, f"{key} is missing"
    return moment


def events(h: BrokerHarness) -> list[dict[str, Any]]:
    return [e for _, e, _ in audit.read_events(h.config.audit_path) if e is not None]


def gate(effect: str = "test.record", **rule: Any) -> dict[str, Any]:
    """A policy with one approve rule for `effect`."""
    base = {"effect": effect, "action": "approve", "reason": "a person looks first"}
    return {"rules": [{**base, **rule}]}


class Boom(FakeHandler):
    """A handler with a bug: apply raises something that is not an Outcome."""

    def apply(self, params: Params, ctx: Context) -> JSON:
        raise RuntimeError('Traceback (most recent call last):\n  File "/srv/internal.py"')


class Vault(FakeHandler):
    """vault.read: hands back the host's secret, as a careless handler might."""

    def apply(self, params: Params, ctx: Context) -> JSON:
        token = ctx.secret("token")
        if "fail" in params:
            raise EffectFailed(f"failed: the vault refused token {token}")
        return {"token": token, "header": f"Bearer {token}", "nested": [{"t": token}]}


# -- the state machine --------------------------------------------------------------


def test_auto_request_is_applied_with_output(start: Start, fake: FakeHandler) -> None:
    """A reversible effect with no rule is applied at once; timestamps are in order."""
    h = start(handlers=[fake])
    doc = h.request("test.record", {"value": "hello"})
    result = checked(h.submit(doc))
    assert result["status"] == "applied"
    assert result["id"] == doc["id"]
    assert result["effect"] == "test.record"
    assert result["output"] == {"recorded": 1, "value": "hello"}
    assert result["decided_by"] == "policy"
    assert result["errors"] == []
    assert "replayed" not in result
    stamps = [stamp(result, k) for k in ("received_at", "decided_at", "completed_at")]
    assert stamps == sorted(stamps)
    assert fake.applied == [{"value": "hello"}]


def test_deny_rule_denies_with_its_reason(start: Start, fake: FakeHandler) -> None:
    """A deny rule answers `denied` with the rule's reason and never calls the handler."""
    policy = {
        "rules": [
            {
                "effect": "test.*",
                "action": "deny",
                "reason": "records are frozen this week; send it next week",
            }
        ]
    }
    h = start(handlers=[fake], policy=policy)
    result = checked(h.submit(h.request("test.record", {"value": 1})))
    assert result["status"] == "denied"
    assert "records are frozen this week; send it next week" in result["reason"]
    assert result["decided_by"] == "policy"
    assert result["output"] is None
    assert stamp(result, "received_at") <= stamp(result, "completed_at")
    assert fake.applied == []


def test_approve_rule_waits_then_expires(start: Start, fake: FakeHandler) -> None:
    """An approve rule answers `pending` with a deadline; nobody decides: `expired`."""
    clock = FakeClock()
    h = start(handlers=[fake], policy=gate(timeout="1s", on_timeout="deny"), clock=clock)
    doc = h.request("test.record", {"value": 1})
    pending = checked(h.submit(doc, terminal=False))
    assert pending["status"] == "pending"
    assert pending["on_timeout"] == "deny"
    received, expires = stamp(pending, "received_at"), stamp(pending, "expires_at")
    assert 0.5 <= (expires - received).total_seconds() <= 1.5
    assert pending["completed_at"] is None

    clock.advance(1.0)
    result = checked(h.wait(doc["id"], timeout=5))
    assert result["status"] == "expired"
    assert "nobody decided" in result["reason"]
    assert result["decided_by"] is not None
    assert stamp(result, "completed_at") >= expires
    assert fake.applied == []


def test_on_timeout_approve_applies_a_reversible_effect(start: Start, fake: FakeHandler) -> None:
    """on_timeout = approve on a reversible effect applies it when the deadline passes,
    and the applied result no longer says it is waiting."""
    clock = FakeClock()
    h = start(handlers=[fake], policy=gate(timeout="1s", on_timeout="approve"), clock=clock)
    doc = h.request("test.record", {"value": "late"})
    pending = checked(h.submit(doc, terminal=False))
    assert pending["status"] == "pending"
    assert pending["on_timeout"] == "approve"
    clock.advance(1.0)

    result = checked(h.wait(doc["id"], timeout=5))
    assert result["status"] == "applied"
    assert result["output"] == {"recorded": 1, "value": "late"}
    assert fake.applied == [{"value": "late"}]
    assert "waiting" not in result["reason"], result["reason"]


def test_effect_failed_becomes_failed_with_its_reason(start: Start, fake: FakeHandler) -> None:
    """EffectFailed from the handler is `failed`, with the handler's sentence as reason."""
    h = start(handlers=[fake])
    result = checked(h.submit(h.request("test.record", {"fail": "the quota is used up"})))
    assert result["status"] == "failed"
    assert result["reason"] == "failed: the quota is used up"
    assert result["output"] is None
    assert fake.applied == []


def test_handler_bug_is_failed_without_traceback(start: Start) -> None:
    """Any other exception is `failed` with a generic reason and nothing of the error."""
    h = start(handlers=[Boom("test.boom")])
    doc = h.request("test.boom", {"value": 1})
    result = checked(h.submit(doc))
    assert result["status"] == "failed"
    assert "test.boom" in result["reason"]
    text = (h.results / f"{doc['id']}.json").read_text()
    for leak in ("Traceback", "RuntimeError", "internal.py", 'File "'):
        assert leak not in text


def test_pending_cap_denies_the_next_gated_request(start: Start, fake: FakeHandler) -> None:
    """With two requests already waiting, a third gated one is denied with what to do;
    requests that need nobody still go through."""
    gated = FakeHandler("test.gated")
    h = start(
        handlers=[fake, gated],
        policy=gate("test.gated", timeout="1h"),
        limits=Limits(max_pending_per_sandbox=2),
    )
    for value in (1, 2):
        assert h.submit(h.request("test.gated", {"value": value}), terminal=False)["status"] == (
            "pending"
        )
    third = checked(h.submit(h.request("test.gated", {"value": 3})))
    assert third["status"] == "denied"
    assert third["decided_by"] == "policy"
    assert "2 requests" in third["reason"]
    assert "wait for their results" in third["reason"]
    assert checked(h.submit(h.request("test.record", {"value": 4})))["status"] == "applied"
    assert gated.applied == []


# -- idempotency keys ---------------------------------------------------------------


def test_same_key_same_payload_is_replayed_not_reapplied(start: Start, fake: FakeHandler) -> None:
    """A second request with the same key and payload gets the first's result, replayed."""
    h = start(handlers=[fake])
    first = checked(h.submit(h.request("test.record", {"value": 7}, idempotency_key="k-1")))
    second_doc = h.request("test.record", {"value": 7}, idempotency_key="k-1")
    second = checked(h.submit(second_doc))
    assert first["status"] == second["status"] == "applied"
    assert second["id"] == second_doc["id"]
    assert second["replayed"] is True
    assert "replayed" not in first
    assert second["output"] == first["output"]
    assert fake.applied == [{"value": 7}]


def test_same_key_other_params_is_a_conflict(start: Start, fake: FakeHandler) -> None:
    """The same key with other params is `invalid`, code idempotency_conflict."""
    h = start(handlers=[fake])
    checked(h.submit(h.request("test.record", {"value": 1}, idempotency_key="k-2")))
    result = checked(h.submit(h.request("test.record", {"value": 2}, idempotency_key="k-2")))
    assert result["status"] == "invalid"
    assert [e["code"] for e in result["errors"]] == ["idempotency_conflict"]
    assert result["errors"][0]["path"] == "/idempotency_key"
    assert "new key" in result["reason"]
    assert fake.applied == [{"value": 1}]


def test_replay_of_a_pending_request_gets_its_outcome(start: Start, fake: FakeHandler) -> None:
    """A replay that arrives while the first waits for a person ends as the first ends."""
    h = start(handlers=[fake], policy=gate(timeout="1s", on_timeout="deny"))
    first = h.request("test.record", {"value": 1}, idempotency_key="k-3")
    assert h.submit(first, terminal=False)["status"] == "pending"
    second = h.request("test.record", {"value": 1}, idempotency_key="k-3")
    h.write(f"{second['id']}.json", second)

    replay = checked(h.wait(second["id"], timeout=5))
    assert replay["status"] == "expired"
    assert replay["replayed"] is True
    assert "nobody decided" in replay["reason"]
    assert checked(h.wait(first["id"], timeout=1))["status"] == "expired"
    assert fake.applied == []


def test_replay_of_a_request_being_applied_is_not_reapplied(
    start: Start, fake: FakeHandler
) -> None:
    """A replay that arrives while the first is in the handler gets its output, once."""
    h = start(handlers=[fake])
    fake.release.clear()
    first = h.request("test.record", {"value": 5}, idempotency_key="k-4")
    h.write(f"{first['id']}.json", first)
    assert fake.started.wait(5)
    second = h.request("test.record", {"value": 5}, idempotency_key="k-4")
    h.write(f"{second['id']}.json", second)
    eventually(lambda: not list(h.outbox.iterdir()))
    fake.release.set()

    replay = checked(h.wait(second["id"]))
    original = checked(h.wait(first["id"]))
    assert replay["status"] == original["status"] == "applied"
    assert replay["replayed"] is True
    assert replay["output"] == original["output"]
    assert fake.applied == [{"value": 5}]


# -- duplicate ids ------------------------------------------------------------------


def test_same_id_same_bytes_is_answered_once(start: Start, fake: FakeHandler) -> None:
    """The same request sent twice (a retry) is applied once, with one result."""
    h = start(handlers=[fake])
    doc = h.request("test.record", {"value": "again"})
    result = checked(h.submit(doc))
    before = (h.results / f"{doc['id']}.json").read_bytes()
    h.write(f"{doc['id']}.json", doc)
    h.write("other-name.json", doc)
    barrier(h)

    assert (h.results / f"{doc['id']}.json").read_bytes() == before
    assert result["status"] == "applied"
    assert fake.applied == [{"value": "again"}]
    received = [e for e in events(h) if e["event"] == "received" and e["id"] == doc["id"]]
    assert len(received) == 1
    assert not list(h.outbox.iterdir())


@pytest.mark.parametrize(
    "second",
    [
        pytest.param({"params": {"value": "other"}}, id="other-params"),
        pytest.param({"effect": None}, id="broken-envelope"),
    ],
)
def test_same_id_other_bytes_keeps_the_first_result(
    start: Start, fake: FakeHandler, second: dict[str, Any]
) -> None:
    """An id reused with other content: the first result stands, nothing is applied,
    the operator finds a duplicate_id event in the audit log, and the new file gets an
    invalid result of its own under its file's name."""
    h = start(handlers=[fake])
    doc = h.request("test.record", {"value": "first"})
    checked(h.submit(doc))
    path = h.results / f"{doc['id']}.json"
    before = path.read_bytes()
    again = {k: v for k, v in {**doc, **second}.items() if v is not None}
    h.write("reuse.json", again)
    barrier(h)

    assert path.read_bytes() == before
    assert fake.applied == [{"value": "first"}]
    mine = [e for e in events(h) if e["id"] == doc["id"]]
    assert [e["event"] for e in mine].count("received") == 1
    assert "duplicate_id" in [e["event"] for e in mine]
    own = h.wait("reuse")
    assert own["status"] == "invalid" and own["id"] == "reuse"
    assert [e["code"] for e in own["errors"]] == ["duplicate_id"]
    assert doc["id"] in own["reason"]


# -- what the agent and the operator see ---------------------------------------------


def test_results_are_never_seen_half_written(start: Start, fake: FakeHandler) -> None:
    """A reader polling /results sees only whole JSON under final names."""
    gated = FakeHandler("test.gated")
    h = start(handlers=[fake, gated], policy=gate("test.gated", timeout="1s"))
    torn: list[str] = []
    reads = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal reads
        while not stop.is_set():
            for path in h.results.iterdir():
                if path.name.startswith("."):
                    continue
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue
                reads += 1
                try:
                    json.loads(data)
                except ValueError:
                    torn.append(f"{path.name}: {data[:80]!r}")

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        docs = [
            h.request("test.gated" if i % 4 == 0 else "test.record", {"value": i})
            for i in range(80)
        ]
        for doc in docs:
            h.write(f"{doc['id']}.json", doc)
        outcomes = [checked(h.wait(doc["id"], timeout=10))["status"] for doc in docs]
    finally:
        stop.set()
        reader.join()
    assert torn == []
    assert reads > 0
    assert outcomes.count("applied") == 60 and outcomes.count("expired") == 20
    # no temporary file left behind: the one dot-file is the effect catalogue
    assert [p.name for p in h.results.iterdir() if p.name.startswith(".")] == [".effects.json"]


def test_request_file_is_consumed_once_recorded(start: Start, fake: FakeHandler) -> None:
    """After its result appears, a request (good or broken) is gone from the outbox."""
    h = start(handlers=[fake])
    good = h.request("test.record", {"value": 1})
    h.write(f"{good['id']}.json", good)
    h.write("broken.json", b'{"version": 1, "effect": ')
    assert checked(h.wait(good["id"]))["status"] == "applied"
    assert checked(h.wait("broken"))["status"] == "invalid"
    assert not list(h.outbox.iterdir())
    # the broker's private claim dir is emptied once the broker is idle
    claimed = h.state / "claimed" / h.sandbox
    deadline = time.monotonic() + 5
    while list(claimed.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(claimed.iterdir())
    with_ids = {e["id"] for e in events(h) if e["event"] == "received"}
    assert {good["id"], "broken"} <= with_ids


def test_request_written_right_after_start_is_answered_promptly(
    fake: FakeHandler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request written as soon as the broker says it is ready is not left waiting
    for the periodic rescan (2 s here, 30 s by default), even when the watcher thread
    is slow to start (as on the first start in a process, which imports watchfiles)."""
    real_watch = watchfiles.watch

    def slow_watch(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        return real_watch(*args, **kwargs)

    monkeypatch.setattr(watchfiles, "watch", slow_watch)
    with BrokerHarness(tmp_path / "b", handlers=[fake]) as h:
        doc = h.request("test.record", {"value": "early"})
        began = time.monotonic()
        result = h.submit(doc, timeout=5)
        took = time.monotonic() - began
    assert result["status"] == "applied"
    assert took < 1.0, f"answered after {took:.2f}s"


# -- secrets ------------------------------------------------------------------------


def test_secrets_never_reach_results_ledger_or_audit(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secret a handler hands back is redacted everywhere anything is written."""
    secret = "vlt-7f3a9c-SECRET-token"
    monkeypatch.setenv("VAULT_TOKEN", secret)
    h = start(
        handlers=[Vault("vault.read")],
        integrations={"vault": {"token_env": "VAULT_TOKEN"}},
    )
    ok = checked(h.submit(h.request("vault.read", {"value": "db"})))
    bad = checked(h.submit(h.request("vault.read", {"fail": "x"})))
    assert ok["status"] == "applied"
    assert ok["output"]["token"] == "•••"
    assert ok["output"]["header"] == "Bearer •••"
    assert ok["output"]["nested"] == [{"t": "•••"}]
    assert bad["status"] == "failed"
    assert bad["reason"] == "failed: the vault refused token •••"
    h.stop()

    written = [p for d in (h.results, h.state) for p in d.rglob("*") if p.is_file()]
    assert h.config.ledger_path in written and h.config.audit_path in written
    for path in written:
        assert secret.encode() not in path.read_bytes(), f"{path} holds the secret"
    ledger = Ledger(h.config.ledger_path)
    try:
        dumped = json.dumps([r.__dict__ for r in ledger.all()], ensure_ascii=False)
    finally:
        ledger.close()
    assert secret not in dumped
    assert "•••" in dumped
