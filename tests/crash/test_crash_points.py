"""SIGKILL the broker at every point of a request's life, restart it, and check that
nothing was lost, nothing happened twice, and the audit log still tells the truth.

Each run is a real `broker serve` process with BROKER_CRASH_AT=<point>:<n>: it is
killed the n-th time it passes <point>, then started again without it. Effects POST
to a real HTTP receiver on 127.0.0.1, which counts what it got per request.
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from broker.approval import decisions as approval
from broker.approval.decisions import Ballot
from broker.audit.log import AuditLog, flush
from broker.clock import now, parse_iso
from broker.faults import FAULT_POINTS
from broker.lifecycle import undo
from broker.models import TERMINAL
from broker.store.sqlite import Ledger
from tests.crash.support import (
    FIGURES,
    Receiver,
    Site,
    audit_disagreements,
    audit_events,
    read_results,
    schema_problems,
    soak,
    wait_for,
)
from tests.support import PATIENCE

POLICY = """
[[rules]]
effect = "crashtest.send"
action = "auto"
reason = "the crash suite sends at once"

[[rules]]
effect = "crashtest.post"
when = { gate = "expire" }
action = "approve"
timeout = "1s"
on_timeout = "deny"
reason = "waits for a person, then fails closed"

[[rules]]
effect = "crashtest.post"
when = { gate = "approve" }
action = "approve"
timeout = "1h"
reason = "waits for a person"
"""

# Points passed once per request or per wake-up are crashed at several passes.
EXTRA_PASSES = {
    "after_read": (3, 7),
    "before_commit": (2, 3),
    "after_commit": (2, 4),
    "before_remove": (3, 8),
    "after_remove": (5,),
    "before_results": (3,),
    "after_result": (2, 6),
    "before_audit": (2,),
    "after_audit": (3,),
    "before_apply": (2, 4),
    "after_apply": (2, 4),
}
SOAK_PASSES = range(1, 13)


def matrix() -> list[tuple[str, int]]:
    if soak():
        return [(p, n) for p in FAULT_POINTS for n in SOAK_PASSES]
    return [(p, 1) for p in FAULT_POINTS] + [
        (p, n) for p in FAULT_POINTS for n in EXTRA_PASSES.get(p, ())
    ]


@dataclass
class Workload:
    """The requests of one run, keyed by id, with what each must end as."""

    tag: str
    docs: dict[str, Any] = field(default_factory=dict)
    broken: str = ""
    expect: dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, tag: str) -> Workload:
        w = cls(tag)

        def add(key: str, effect: str, expect: str, **extra: Any) -> None:
            rid = f"{tag}-{key}"
            params = {"value": rid, **extra.pop("params", {})}
            w.docs[rid] = {"version": 1, "id": rid, "effect": effect, "params": params, **extra}
            w.expect[rid] = expect

        for i in (1, 2, 3):
            add(f"post-{i}", "crashtest.post", "applied")
        for i in (1, 2):
            add(f"send-{i}", "crashtest.send", "applied|unknown")
        add("keyed", "crashtest.post", "applied", idempotency_key="k1")
        add("keyed-again", "crashtest.post", "applied", idempotency_key="k1")
        w.docs[f"{tag}-keyed-again"]["params"] = w.docs[f"{tag}-keyed"]["params"]
        add("gate-expire", "crashtest.post", "expired", params={"gate": "expire"})
        add("gate-approve", "crashtest.post", "applied", params={"gate": "approve"})
        w.broken = f"{tag}-broken"
        w.expect[w.broken] = "invalid"
        return w

    def wave2(self) -> dict[str, Any]:
        docs = {}
        for i in (1, 2):
            rid = f"{self.tag}-late-{i}"
            docs[rid] = {
                "version": 1,
                "id": rid,
                "effect": "crashtest.post",
                "params": {"value": rid},
            }
            self.expect[rid] = "applied"
        return docs

    def barrier(self) -> dict[str, Any]:
        rid = f"{self.tag}-barrier"
        self.expect[rid] = "applied"
        return {"version": 1, "id": rid, "effect": "crashtest.post", "params": {"value": rid}}

    @property
    def gate_approve(self) -> str:
        return f"{self.tag}-gate-approve"

    @property
    def gate_expire(self) -> str:
        return f"{self.tag}-gate-expire"


@dataclass
class Outcome:
    """What one crash run found."""

    point: str
    n: int
    crashed: bool = False
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    redelivered: int = 0
    unknown: int = 0
    pending_across: int = 0
    seconds: float = 0.0
    error: BaseException | None = None


class Watch:
    """Polls a results dir, remembering each id's first terminal result."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.first: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, dict[str, Any]] = {}

    def poll(self) -> dict[str, dict[str, Any]]:
        self.seen = read_results(self.site.results)
        for rid, result in self.seen.items():
            if result.get("status") in TERMINAL:
                self.first.setdefault(rid, result)
        return self.seen

    def status(self, rid: str) -> str | None:
        return self.seen.get(rid, {}).get("status")


def settled(w: Workload, watch: Watch) -> bool:
    """Everything terminal but the request that waits for the suite's approval."""
    watch.poll()
    for rid in w.expect:
        if rid == w.gate_approve:
            if watch.status(rid) not in ("pending", *TERMINAL):
                return False
        elif watch.status(rid) not in TERMINAL:
            return False
    return True


def approve(site: Site, ref: str) -> None:
    """Approve as a person at the CLI would: decide, flush the audit queue, nudge."""
    ledger = Ledger(site.state / "ledger.sqlite3")
    try:
        approval.decide(
            ledger,
            Ballot(
                ref,
                "approve",
                approver="crash-suite",
                reason="checked after the restart",
                surface="cli",
                sha256=None,
            ),
        )
        flush(ledger, AuditLog(site.state / "audit.jsonl"))
    finally:
        ledger.close()
    approval.nudge(site.state)


def started_marks(site: Site) -> set[str] | None:
    """Ids whose non-idempotent call had begun, by the broker's start marks (None: no marks)."""
    folder = site.state / "started"
    if not folder.is_dir():
        return None
    present = set(os.listdir(folder))
    return {
        rid
        for rid in (r.id for r in site.ledger())
        if hashlib.sha256(f"default/{rid}".encode()).hexdigest() in present
    }


def reconcile(site: Site, rid: str, applied: bool) -> None:
    """Settle an `unknown` request as `broker reconcile` does (the CLI has its own test)."""
    ledger = Ledger(site.state / "ledger.sqlite3")
    try:
        undo.reconcile(ledger, f"default/{rid}", applied, "crash-suite", "receiver log")
        flush(ledger, AuditLog(site.state / "audit.jsonl"))
    finally:
        ledger.close()


def crash_run(base: Path, receiver: Receiver, point: str, n: int) -> Outcome:
    """Crash at point:n, restart, settle, reconcile, and count what went wrong."""
    started = time.monotonic()
    out = Outcome(point, n)
    tag = f"{point.replace('_', '')}{n}"
    site = Site(base / tag, receiver.url, POLICY, broker_extra='rescan_interval = "1h"')
    w = Workload.make(tag)
    for rid, doc in w.docs.items():
        site.write(f"{rid}.json", doc)
    site.write(f"{w.broken}.json", b"{not json")
    site.write("bad name.json", b"{}")
    watch = Watch(site)

    first = site.start(crash_at=f"{point}:{n}", log_name="crashing.log")
    try:
        assert first.started(), f"the broker to crash at {point}:{n} never started"
        time.sleep(0.2)
        for rid, doc in w.wave2().items():
            site.write(f"{rid}.json", doc)
        end = time.monotonic() + 8
        while first.proc.poll() is None and time.monotonic() < end:
            if settled(w, watch):
                break
            time.sleep(0.02)
        code = first.wait(0.3)
        if code is None:
            code = first.stop()
        watch.poll()
    finally:
        first.kill()
    out.crashed = code == -9
    if code not in (-9, 0):
        out.problems.append(f"the crashing broker exited {code}: {first.output()[-2000:]}")
    pending_at_crash = {rid: r for rid, r in watch.seen.items() if r.get("status") == "pending"}
    out.pending_across = len(pending_at_crash)
    at_crash = {r.id: r.state for r in site.ledger()}
    marked = started_marks(site)

    second = site.start(log_name="restarted.log")
    try:
        wait_for(lambda: "serving" in second.output(), PATIENCE, f"{tag}: the restarted broker")
        restarted = now()
        barrier = w.barrier()  # answered once the restarted broker watches its outbox
        site.write(f"{barrier['id']}.json", barrier)
        wait_for(lambda: settled(w, watch), PATIENCE, f"{tag}: every request settled after restart")
        if watch.status(w.gate_approve) == "pending":
            approve(site, f"default/{w.gate_approve}")
        wait_for(
            lambda: watch.poll() and watch.status(w.gate_approve) in TERMINAL,
            10,
            f"{tag}: the approved request applied",
        )
        time.sleep(0.1)
        watch.poll()
        for rid, result in watch.seen.items():
            if result.get("status") == "unknown":
                out.unknown += 1
                posts, _ = receiver.count(f"default/{rid}")
                reconcile(site, rid, applied=bool(posts))
    finally:
        code = second.stop()
    if code != 0:
        out.problems.append(f"the restarted broker exited {code}: {second.output()[-2000:]}")

    watch.poll()
    check_run(site, w, watch, receiver, out)
    for rid, result in watch.seen.items():
        if result.get("status") != "unknown":
            continue
        if at_crash.get(rid) != "applying":
            out.problems.append(
                f"{rid}: ended unknown, but it was {at_crash.get(rid, 'not recorded')} "
                "when the broker died, so its handler had never been called"
            )
        elif marked is not None and rid not in marked:
            out.problems.append(f"{rid}: ended unknown, but its call had not begun (no mark)")
    if pending_at_crash.get(w.gate_expire):
        check_deadline_kept(
            pending_at_crash[w.gate_expire], watch.seen[w.gate_expire], restarted, out
        )
    out.seconds = time.monotonic() - started
    return out


def check_run(site: Site, w: Workload, watch: Watch, receiver: Receiver, out: Outcome) -> None:
    """Fill `out` with what was lost, duplicated or inconsistent in this run."""
    for rid, expect in w.expect.items():
        result = watch.seen.get(rid)
        if result is None or result.get("status") not in TERMINAL:
            out.lost.append(f"{rid}: no terminal result ({result and result.get('status')})")
            continue
        if schema_problems(result):
            out.problems.append(f"{rid}: result breaks the schema: {schema_problems(result)}")
        if watch.first.get(rid) != result:
            out.problems.append(f"{rid}: a terminal result was rewritten")
        if result["status"] not in expect.split("|"):
            out.problems.append(f"{rid}: {result['status']}, expected {expect}")
    extra = set(watch.seen) - set(w.expect)
    if extra:
        out.problems.append(f"results for requests nobody sent: {sorted(extra)}")
    left = sorted(p.name for p in site.outbox.iterdir())
    if left != ["bad name.json"]:
        out.problems.append(f"outbox not consumed: {left}")
    claimed = site.state / "claimed" / "default"
    if claimed.exists() and list(claimed.iterdir()):
        out.problems.append(f"claim dir not emptied: {sorted(os.listdir(claimed))}")

    keyed = [f"{w.tag}-keyed", f"{w.tag}-keyed-again"]
    for rid in w.expect:
        if rid == w.broken:
            continue
        posts, applied = receiver.count(f"default/{rid}")
        status = watch.status(rid)
        out.redelivered += max(0, posts - applied)
        if applied > 1:
            out.duplicated.append(f"{rid}: applied {applied} times at the receiver")
        if rid in keyed:
            continue
        if status == "applied" and applied == 0:
            out.lost.append(f"{rid}: result says applied, the receiver never got it")
        if status in ("expired", "invalid", "denied") and posts:
            out.duplicated.append(f"{rid}: {status}, yet the receiver got it")
        if status == "unknown" and posts > 1:
            out.duplicated.append(f"{rid}: unknown, and delivered {posts} times")
    pair = [receiver.count(f"default/{k}")[1] for k in keyed]
    if sum(pair) != 1:
        (out.duplicated if sum(pair) > 1 else out.lost).append(
            f"one idempotency key, {sum(pair)} effects at the receiver"
        )
    if not any(watch.seen.get(k, {}).get("replayed") for k in keyed):
        out.problems.append("neither request with the shared key was answered as a replay")

    out.problems.extend(audit_disagreements(site.state))
    reconciled = {e["id"]: e for e in audit_events(site.state) if e.get("event") == "reconciled"}
    for rid, result in watch.seen.items():
        if result.get("status") == "unknown":
            posts, _ = receiver.count(f"default/{rid}")
            event = reconciled.get(rid)
            if event is None or event.get("applied") is not bool(posts):
                out.problems.append(f"{rid}: unknown, not reconciled as found: {event}")


def check_deadline_kept(
    pending: dict[str, Any], final: dict[str, Any], restarted: datetime, out: Outcome
) -> None:
    """A request pending at the crash expires at its original deadline (or as soon as
    the broker is back, if that passed while it was down), not at a new one."""
    if final.get("status") != "expired":
        out.problems.append(f"pending across the crash, then {final.get('status')}")
        return
    due, done = parse_iso(pending.get("expires_at")), parse_iso(final.get("completed_at"))
    assert due is not None and done is not None
    if done < due:
        out.problems.append(f"expired at {done}, before its deadline {due}")
    elif (done - max(due, restarted)).total_seconds() > 4:
        out.problems.append(
            f"expired at {done}: its deadline {due} was not kept (restarted {restarted})"
        )


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Outcome]:
    """The crash runs selected (all of the matrix by default), three at a time."""
    base = tmp_path_factory.mktemp("crash")
    receiver = Receiver()
    chosen = {
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_crash_at_point_loses_and_duplicates_nothing"
    }
    cases = [(p, n) for p, n in matrix() if not chosen or f"{p}:{n}" in chosen]

    def one(case: tuple[str, int]) -> Outcome:
        try:
            return crash_run(base, receiver, *case)
        except BaseException as exc:  # reported by the case's own test
            return Outcome(case[0], case[1], error=exc)

    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            found = dict(zip((f"{p}:{n}" for p, n in cases), pool.map(one, cases), strict=True))
    finally:
        receiver.close()
    for o in found.values():
        FIGURES.record(o.crashed, len(o.lost), len(o.duplicated), o.redelivered, o.unknown)
        FIGURES.pending_across += o.pending_across
    return found


@pytest.mark.parametrize("case", [f"{p}:{n}" for p, n in matrix()])
def test_crash_at_point_loses_and_duplicates_nothing(
    outcomes: dict[str, Outcome], case: str
) -> None:
    """Killed here and restarted: one terminal result each, no double effect, audit agrees."""
    o = outcomes[case]
    if o.error is not None:
        raise o.error
    assert o.lost == [], f"lost after a crash at {case}: {o.lost}"
    assert o.duplicated == [], f"duplicated after a crash at {case}: {o.duplicated}"
    assert o.problems == [], f"after a crash at {case}: {o.problems}"


def test_every_fault_point_was_crashed(outcomes: dict[str, Outcome]) -> None:
    """Each FAULT_POINT killed the broker at least once, and some approval waited across a crash."""
    if len(outcomes) < len(matrix()):
        pytest.skip("only part of the crash matrix was selected")
    crashed = {o.point for o in outcomes.values() if o.crashed}
    assert set(FAULT_POINTS) - crashed == set(), "fault points never reached"
    assert any(o.pending_across for o in outcomes.values()), "no approval was pending at a crash"
