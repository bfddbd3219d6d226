"""`broker stats` and broker.observability.stats.summarize on ledgers with known contents:
counts per outcome, approval rate and time to decision among people, and the rubber-stamp flag."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.approval.decisions import Ballot, decide, nudge
from broker.clock import iso, now
from broker.models import Record
from broker.observability.stats import summarize
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeHandler

BROKER = Path(sys.executable).with_name("broker")
_ids = itertools.count()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    """An empty ledger in <tmp>/state, where `broker --state` finds it."""
    led = Ledger(tmp_path / "state" / "ledger.sqlite3")
    yield led
    led.close()


def add(
    ledger: Ledger,
    effect: str | None,
    state: str,
    by: str | None = None,
    wait: float | None = None,
    *,
    age: timedelta = timedelta(hours=2),
) -> None:
    """Insert one request received `age` ago and decided `wait` seconds after it."""
    received = now() - age
    decided = received + timedelta(seconds=wait) if wait is not None else None
    rid = f"r{next(_ids)}"
    ledger.insert(
        Record(
            sandbox="default",
            id=rid,
            name=rid,
            state=state,
            received_at=iso(received) or "",
            effect=effect,
            decided_by=by,
            decided_at=iso(decided),
        )
    )


def people(ledger: Ledger, effect: str, approved: int, denied: int) -> None:
    """`approved` + `denied` human decisions on `effect`, one minute each."""
    for i in range(approved + denied):
        state = "applied" if i < approved else "denied"
        add(ledger, effect, state, f"person{i % 3}", 60)


def mixed(ledger: Ledger) -> None:
    """Every kind of outcome for files.write, one auto for test.record, one unparsed."""
    for _ in range(3):
        add(ledger, "files.write", "applied", "policy", 0)
    add(ledger, "files.write", "applied", "alice", 30)
    add(ledger, "files.write", "applied", "alice, bob", 90)
    add(ledger, "files.write", "denied", "bob", 60)
    add(ledger, "files.write", "denied", "policy", 0)
    add(ledger, "files.write", "expired", "policy (on_timeout)", 3600)
    add(ledger, "files.write", "invalid")
    add(ledger, "files.write", "failed", "policy", 0)
    add(ledger, "files.write", "pending")
    add(ledger, "test.record", "applied", "policy", 0)
    add(ledger, None, "invalid")


def counts(**given: int) -> dict[str, int]:
    keys = ("auto", "approved", "denied", "expired", "invalid", "failed", "staged", "waiting")
    return {k: given.get(k, 0) for k in keys}


def stats_cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BROKER_CONFIG", "COLUMNS")}
    env["COLUMNS"] = "160"
    return subprocess.run(
        [str(BROKER), "stats", *args, "--state", str(state)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=30,
    )


# -- summarize --------------------------------------------------------------------------


def test_counts_each_outcome_per_effect_and_overall(ledger: Ledger) -> None:
    """Each request counts once under its outcome (or waiting), per effect and overall."""
    mixed(ledger)
    summary = summarize(ledger.all())
    rows = summary["effects"]
    assert set(rows) == {"files.write", "test.record", "(unparsed)"}
    assert rows["files.write"]["counts"] == counts(
        auto=3, approved=2, denied=2, expired=1, invalid=1, failed=1, waiting=1
    )
    assert rows["test.record"]["counts"] == counts(auto=1)
    assert rows["(unparsed)"]["counts"] == counts(invalid=1)
    assert summary["overall"]["counts"] == counts(
        auto=4, approved=2, denied=2, expired=1, invalid=2, failed=1, waiting=1
    )


def test_rate_and_times_count_only_human_decisions(ledger: Ledger) -> None:
    """Approval rate, median and p90 come from people's decisions, not the policy's."""
    mixed(ledger)
    row = summarize(ledger.all())["effects"]["files.write"]
    assert row["human_decisions"] == 3
    assert row["approval_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["median_time_to_decision_s"] == pytest.approx(60)
    assert row["p90_time_to_decision_s"] == pytest.approx(84)
    auto_only = summarize(ledger.all())["effects"]["test.record"]
    assert auto_only["human_decisions"] == 0
    assert auto_only["approval_rate"] is None
    assert auto_only["median_time_to_decision_s"] is None


def test_median_and_p90_of_eleven_waits(ledger: Ledger) -> None:
    """Waits of 0, 10, …, 100 s: median 50 s, p90 90 s."""
    for i in range(11):
        add(ledger, "test.record", "applied" if i % 2 else "denied", "alice", 10 * i)
    row = summarize(ledger.all())["effects"]["test.record"]
    assert row["median_time_to_decision_s"] == pytest.approx(50)
    assert row["p90_time_to_decision_s"] == pytest.approx(90)
    assert row["approval_rate"] == pytest.approx(5 / 11, abs=1e-4)


@pytest.mark.parametrize(
    ("approved", "denied", "flagged"),
    [(20, 0, True), (19, 1, False), (19, 0, False), (40, 1, True), (39, 3, False)],
)
def test_rubber_stamp_flag(ledger: Ledger, approved: int, denied: int, flagged: bool) -> None:
    """An effect is flagged when people approve more than 95% of at least 20 decisions."""
    people(ledger, "test.record", approved, denied)
    add(ledger, "files.write", "applied", "policy", 0)
    rows = summarize(ledger.all())["effects"]
    row = rows["test.record"]
    assert row["human_decisions"] == approved + denied
    assert row["rubber_stamp"] is flagged
    assert (row["advice"] is not None) is flagged
    if flagged:
        assert "auto-apply" in row["advice"]
    assert rows["files.write"]["rubber_stamp"] is False


def test_since_keeps_only_recent_requests(ledger: Ledger) -> None:
    """Requests received before `since` are left out."""
    people(ledger, "test.record", 2, 0)
    add(ledger, "test.record", "denied", "bob", 5, age=timedelta(days=3))
    summary = summarize(ledger.all(), now() - timedelta(days=1))
    assert summary["effects"]["test.record"]["counts"] == counts(approved=2)
    assert summary["overall"]["approval_rate"] == 1.0


# -- the command ------------------------------------------------------------------------


def test_stats_json_gives_the_same_figures(ledger: Ledger, tmp_path: Path) -> None:
    """`broker stats --json` prints what summarize computes; `--since` narrows it."""
    mixed(ledger)
    people(ledger, "stamp.me", 20, 0)
    add(ledger, "files.write", "applied", "carol", 10, age=timedelta(days=3))
    state = tmp_path / "state"
    proc = stats_cli(state, "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    assert data == json.loads(json.dumps(summarize(ledger.all())))
    assert data["effects"]["files.write"]["counts"]["approved"] == 3
    assert data["effects"]["stamp.me"]["rubber_stamp"] is True

    recent = json.loads(stats_cli(state, "--json", "--since", "1d").stdout)
    assert recent["effects"]["files.write"]["counts"]["approved"] == 2
    assert recent["effects"]["files.write"]["approval_rate"] == pytest.approx(2 / 3, abs=1e-4)


def test_stats_table_warns_about_rubber_stamping(ledger: Ledger, tmp_path: Path) -> None:
    """`broker stats` shows each effect with its rate, and a warning for a flagged one."""
    people(ledger, "stamp.me", 20, 0)
    people(ledger, "test.record", 19, 1)
    proc = stats_cli(tmp_path / "state")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any("stamp.me" in line and "100%" in line for line in lines)
    assert any("test.record" in line and "95%" in line for line in lines)
    warnings = [line for line in lines if "⚠" in line]
    assert len(warnings) == 1
    assert "stamp.me" in warnings[0] and "auto-apply" in warnings[0]


def test_stats_refuses_a_bad_since_in_one_line(ledger: Ledger, tmp_path: Path) -> None:
    """`--since yesterday` is refused with one line saying what is expected."""
    proc = stats_cli(tmp_path / "state", "--since", "yesterday")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "24h" in proc.stderr or "7d" in proc.stderr


# -- from a real broker -------------------------------------------------------------------


def test_stats_of_a_real_broker(tmp_path: Path) -> None:
    """Outcomes produced by a running broker and people land in the right columns."""
    policy = {
        "rules": [
            {"effect": "test.denied", "action": "deny", "reason": "never"},
            {"effect": "test.expiring", "action": "approve", "timeout": "200ms", "reason": "r"},
            {"effect": "test.record", "action": "approve", "timeout": "1h", "reason": "r"},
        ]
    }
    names = ("test.auto", "test.denied", "test.expiring", "test.record")
    h = BrokerHarness(
        tmp_path / "h", handlers=[FakeHandler(n) for n in names], policy=policy, builtins=False
    )
    with h:
        time.sleep(0.15)
        assert h.submit(h.request("test.auto", {"value": 1}))["status"] == "applied"
        assert h.submit(h.request("test.auto", {"fail": "no"}))["status"] == "failed"
        assert h.submit(h.request("test.denied", {}))["status"] == "denied"
        assert h.submit(h.request("test.nothing", {}))["status"] == "invalid"
        expiring = h.submit(h.request("test.expiring", {}), terminal=False)
        gated = [h.submit(h.request("test.record", {"value": i}), terminal=False) for i in range(3)]
        led = Ledger(h.config.ledger_path)
        try:
            for result, who, verdict in zip(
                gated, ("alice", "bob", "carol"), ("approve", "approve", "deny"), strict=True
            ):
                reason = "no" if verdict == "deny" else None
                decide(
                    led,
                    Ballot(
                        result["id"],
                        verdict,
                        approver=who,
                        reason=reason,
                        surface="web",
                        sha256=None,
                    ),
                )
        finally:
            led.close()
        nudge(h.state)
        for result in [*gated, expiring]:
            h.wait(result["id"])
        led = Ledger(h.config.ledger_path)
        try:
            summary = summarize(led.all())
        finally:
            led.close()
    rows = summary["effects"]
    assert rows["test.auto"]["counts"] == counts(auto=1, failed=1)
    assert rows["test.denied"]["counts"] == counts(denied=1)
    assert rows["test.expiring"]["counts"] == counts(expired=1)
    assert rows["test.nothing"]["counts"] == counts(invalid=1)
    assert rows["test.record"]["counts"] == counts(approved=2, denied=1)
    assert rows["test.record"]["approval_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert rows["test.record"]["median_time_to_decision_s"] > 0
    assert summary["overall"]["human_decisions"] == 3
    assert summary["overall"]["counts"] == counts(
        auto=1, approved=2, denied=2, expired=1, invalid=1, failed=1
    )
