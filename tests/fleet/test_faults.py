"""Faults of a fleet on one PostgreSQL, with real broker processes and a real receiver:
either broker killed (kill -9) in the middle of a flood of 300 requests per broker,
and PostgreSQL itself stopped and started again mid-flood. Every request ends with one
terminal result, nothing reaches the receiver twice, and every `applied` request
reached it exactly once."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from broker.loop.pipeline import Broker
from broker.testing import BrokerHarness, FakeHandler
from tests.crash.support import Receiver, soak, wait_for
from tests.fleet.conftest import MakeHost
from tests.fleet.support import Host, request
from tests.pgserver import PASSWORD, PgServer

FLOOD = 1000 if soak() else 300
AUTO = '[[rules]]\neffect = "crashtest.send"\naction = "auto"\nreason = "the flood"\n'


def flood(h: Host) -> None:
    h.stage([request(f"f{i}") for i in range(FLOOD)])


def check(h: Host, receiver: Receiver) -> Counter[str]:
    """Exactly one terminal result each, no effect twice, every `applied` one once."""
    results = h.answered(FLOOD, timeout=240)
    statuses = Counter(r["status"] for r in results.values())
    assert sum(statuses.values()) == FLOOD and set(statuses) <= {"applied", "unknown"}, statuses
    posts = {rid: receiver.count(f"{h.sandbox}/{rid}")[0] for rid in results}
    assert max(posts.values()) == 1, f"{h.name}: an effect reached the receiver twice"
    assert all(posts[rid] == 1 for rid, r in results.items() if r["status"] == "applied")
    return statuses


def assert_chains_verify(h: Host) -> None:
    """`broker audit verify` on this host: every host's chain and the local copy hold."""
    done = h.cli("audit", "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "host alpha: ok" in done.stdout and "host beta: ok" in done.stdout


@pytest.mark.parametrize("victim", ["alpha", "beta"])
def test_either_broker_killed_mid_flood(host: MakeHost, receiver: Receiver, victim: str) -> None:
    """300 non-idempotent requests on each host; one broker killed -9 mid-flood and
    started again: the other host's flood is untouched, and the killed one's requests
    end applied (or unknown, those caught mid-apply), none applied twice."""
    hosts = {"alpha": host("alpha", AUTO), "beta": host("beta", AUTO)}
    for h in hosts.values():
        flood(h)
        h.start()
    killed = hosts[victim]
    wait_for(lambda: len(killed.results()) >= 50, 120, "the flood to be under way")
    assert killed.process is not None
    os.kill(killed.process.pid, signal.SIGKILL)
    killed.process.wait(30)
    killed.process = None
    # handlers that had started and whose outcome was not committed: their start marks
    mid_apply = len(list((killed.site.state / "started").iterdir()))
    killed.start(log_name="successor.log")
    for name, h in hosts.items():
        statuses = check(h, receiver)
        if name != victim:
            assert statuses == {"applied": FLOOD}
            assert_chains_verify(h)
        else:
            assert statuses["unknown"] <= mid_apply, (statuses, mid_apply)


def test_postgresql_restarted_mid_flood(
    host: MakeHost, receiver: Receiver, pg_server: PgServer
) -> None:
    """PostgreSQL stopped mid-flood (half the requests in, the other half arriving while
    it is down) and started again: both brokers wait it out without exiting, saying so,
    then finish: every request applied exactly once, none lost or doubled."""
    hosts = [host("alpha", AUTO), host("beta", AUTO)]
    half = FLOOD // 2
    for h in hosts:
        h.stage([request(f"f{i}") for i in range(half)])
        h.start()
    for h in hosts:  # each broker past its start, mid-flood
        wait_for(lambda h=h: len(h.results()) >= 50, 120, f"{h.name}'s flood under way")
    pg_server.stop("fast")
    try:
        for h in hosts:
            h.stage([request(f"f{i}") for i in range(half, FLOOD)])
        for h in hosts:
            assert h.process is not None
            wait_for(lambda h=h: "does not answer" in h.process.output(), 60, "the outage seen")
            assert h.process.proc.poll() is None, h.process.output()
        seen = [len(h.results()) for h in hosts]
        time.sleep(1.0)  # a window for anything answered without a commit to show
        assert [len(h.results()) for h in hosts] == seen, "answered while nothing commits"
    finally:
        pg_server.start()
    for h in hosts:
        assert check(h, receiver) == {"applied": FLOOD}
        assert h.process is not None and h.process.proc.poll() is None
        wait_for(lambda h=h: "answers again" in h.process.output(), 60, "the broker resuming")
    assert_chains_verify(hosts[0])


def test_postgresql_gone_between_the_lock_and_the_first_read_is_waited_out(
    tmp_path: Path, pg_url: str, pg_server: PgServer, fake: FakeHandler
) -> None:
    """PostgreSQL stops after a broker took its lease and before it first reads the
    controls (a start under load): the broker waits it out as it does mid-flood, and
    answers once the server is back."""
    secret = tmp_path / "pgpass"
    secret.write_text(PASSWORD, encoding="utf-8")

    def gone_after_the_lock(broker: Broker) -> None:
        broker.lock.acquire("test")
        pg_server.stop("fast")

    h = BrokerHarness(tmp_path / "h", handlers=[fake], prepare=gone_after_the_lock)
    h.config = h.config._replace(
        ledger_url=pg_url,
        ledger_refs={"ledger_password_file": str(secret)},
        host_id_setting="alpha",
    )
    try:
        h.start()
        assert h.error is None, h.error
        doc = h.request("test.record", {"value": "after"})
        h.write(f"{doc['id']}.json", doc)
    finally:
        pg_server.start()
    try:
        assert h.wait(doc["id"], timeout=60)["status"] == "applied"
        assert fake.applied == [{"value": "after"}]
    finally:
        h.stop()
