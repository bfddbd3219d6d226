"""A non-idempotent effect caught by a crash once its call may have begun ends `unknown`,
and a person settles it with `broker reconcile`, on the record; one whose call never
began is simply applied on restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crash.support import Receiver, Site, audit_events, wait_for
from tests.crash.test_crash_points import POLICY
from tests.support import PATIENCE


@pytest.mark.parametrize(
    "crash_at, delivered, flag",
    [("after_apply:1", 1, "--applied"), ("before_apply:1", 0, "--not-applied")],
    ids=["service-took-it", "killed-as-the-call-began"],
)
def test_interrupted_send_ends_unknown_and_reconcile_settles_it(
    tmp_path: Path, receiver: Receiver, crash_at: str, delivered: int, flag: str
) -> None:
    """A send killed mid-apply is not repeated: `unknown`, settled once by `broker reconcile`."""
    site = Site(tmp_path, receiver.url, POLICY)
    rid = f"mail-{crash_at.replace(':', '-').replace('_', '-')}"
    site.write(f"{rid}.json", {"version": 1, "id": rid, "effect": "crashtest.send", "params": {}})

    crashing = site.start(crash_at=crash_at)
    assert crashing.started() and crashing.wait(60) == -9, crashing.output()
    assert receiver.count(f"default/{rid}")[0] == delivered
    broker = site.start(log_name="restarted.log")
    try:
        wait_for(lambda: site.results_now().get(rid, {}).get("status") == "unknown", PATIENCE, rid)
        result = site.results_now()[rid]
        assert "broker reconcile" in result["reason"]

        done = site.cli("reconcile", rid, flag, "--reason", "checked the receiver's log")
        assert done.returncode == 0, done.stderr
        assert f"recorded as {flag.strip('-').replace('-', ' ')}" in done.stdout
        again = site.cli("reconcile", rid, "--applied")
        assert again.returncode != 0 and "already reconciled" in again.stderr
    finally:
        assert broker.stop() == 0, broker.output()

    assert receiver.count(f"default/{rid}")[0] == delivered, "the send was repeated"
    assert site.results_now()[rid] == result, "the agent's terminal result was rewritten"
    settled = [e for e in audit_events(site.state) if e["event"] == "reconciled"]
    assert [(e["id"], e["applied"]) for e in settled] == [(rid, bool(delivered))]
    verify = site.cli("audit", "verify")
    assert verify.returncode == 0 and "chain intact" in verify.stdout, verify.stdout


def test_send_killed_before_its_handler_ran_is_applied_once_on_restart(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Killed after `applying` was committed but before the call, a send is applied once."""
    site = Site(tmp_path, receiver.url, POLICY)
    rid = "mail-never-started"
    site.write(f"{rid}.json", {"version": 1, "id": rid, "effect": "crashtest.send", "params": {}})

    crashing = site.start(crash_at="after_commit:1")
    assert crashing.started() and crashing.wait(60) == -9, crashing.output()
    assert receiver.count(f"default/{rid}")[0] == 0
    broker = site.start(log_name="restarted.log")
    try:
        wait_for(lambda: site.results_now().get(rid, {}).get("status") == "applied", PATIENCE, rid)
    finally:
        assert broker.stop() == 0, broker.output()

    assert receiver.count(f"default/{rid}") == (1, 1)
    assert [e["event"] for e in audit_events(site.state) if e["id"] == rid].count("unknown") == 0
