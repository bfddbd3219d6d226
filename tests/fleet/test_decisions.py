"""Two brokers sharing one PostgreSQL, as real processes: a request waiting on one host is
decided from the other's CLI or web API and applied once, by its owner; quorum counts
people across hosts; sandboxes and idempotency keys are per host; a second broker for
a live host id is refused; a PostgreSQL that does not answer stops a start."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx

from tests.crash.support import Receiver
from tests.fleet.conftest import MakeHost
from tests.fleet.support import TOKENS, request, rows
from tests.support import TLS


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


GATE = (
    '[[rules]]\neffect = "crashtest.send"\naction = "approve"\nreason = "people look"\n'
    'timeout = "1h"\n'
)
QUORUM = GATE.replace('timeout = "1h"', 'timeout = "1h"\napprovals = 2')


def test_a_request_on_b_is_approved_from_a_and_applied_once_by_b(
    host: MakeHost, receiver: Receiver
) -> None:
    """B's pending requests appear in A's `broker pending`; one approved with A's CLI and
    one through A's web API are each applied once, by B, within moments."""
    a, b = host("alpha", GATE, listen=True), host("beta", GATE)
    a.start()
    b.start()
    b.write(request("by-cli"))
    b.write(request("by-api"))
    b.result("by-cli", ("pending",))
    b.result("by-api", ("pending",))
    listed = a.cli("pending")
    assert listed.returncode == 0 and "beta.default/by-cli" in listed.stdout, listed.stderr
    done = a.cli("approve", "beta.default/by-cli", "--reason", "looks right")
    assert done.returncode == 0, done.stderr
    assert "approved by" in done.stdout
    card = httpx.get(
        f"http://127.0.0.1:{a.port}/api/v1/requests/beta.default/by-api",
        headers={"Authorization": f"Bearer {TOKENS['alice']}"},
        verify=TLS,
    ).json()
    answer = httpx.post(
        f"http://127.0.0.1:{a.port}/api/v1/requests/beta.default/by-api/decision",
        headers={"Authorization": f"Bearer {TOKENS['alice']}"},
        json={"verdict": "approve", "reason": "ok", "request_sha256": card["request_sha256"]},
        verify=TLS,
    )
    assert answer.status_code == 200 and answer.json()["settled"], answer.text
    for rid in ("by-cli", "by-api"):
        assert b.result(rid)["status"] == "applied"
        assert receiver.count(f"beta.default/{rid}") == (1, 1)
    assert not (a.site.results / "by-cli.json").exists(), "only the owner answers"
    assert "alice" in b.results()["by-api"]["decided_by"]


def test_quorum_across_hosts_counts_two_people_once_each(
    host: MakeHost, receiver: Receiver
) -> None:
    """Two approvals needed: one person on A and another on B; the same person again on
    the other host is refused; applied once, naming both."""
    a, b = host("alpha", QUORUM), host("beta", QUORUM)
    a.start()
    b.start()
    a.write(request("two"))
    a.result("two", ("pending",))
    first = b.cli("approve", "alpha.default/two", "--as", "alice")
    again = a.cli("approve", "alpha.default/two", "--as", "alice")
    assert first.returncode == 0 and "1 of 2" in first.stdout, first.stderr
    assert again.returncode == 2 and "already decided" in again.stderr
    assert a.results()["two"]["status"] == "pending"
    second = a.cli("approve", "alpha.default/two", "--as", "bob")
    assert second.returncode == 0, second.stderr
    result = a.result("two")
    assert result["status"] == "applied" and result["decided_by"] == "alice, bob"
    assert receiver.count("alpha.default/two") == (1, 1)


def test_decisions_racing_deadlines_end_one_way_each(host: MakeHost, receiver: Receiver) -> None:
    """Requests on B with a 2 s deadline, approved one after another from A's CLI while
    their deadlines pass: each ends applied (its approval was taken) or expired (it was
    refused), never both, and only the applied ones reached the receiver, once."""
    short = GATE.replace('timeout = "1h"', 'timeout = "2s"\non_timeout = "deny"')
    a, b = host("alpha", short), host("beta", short)
    a.start()
    b.start()
    ids = [f"race{n}" for n in range(6)]
    b.stage([request(rid) for rid in ids])
    for rid in ids:
        b.result(rid, ("pending",))
    taken = {rid: a.cli("approve", f"beta.default/{rid}").returncode == 0 for rid in ids}
    for rid in ids:
        status = b.result(rid)["status"]
        assert status == ("applied" if taken[rid] else "expired"), (rid, status, taken)
        assert receiver.count(f"beta.default/{rid}") == ((1, 1) if taken[rid] else (0, 0))
    outcomes = [
        e
        for e in json_lines(a.cli("audit", "export").stdout)
        if e["event"] in ("decided", "expired")
    ]
    assert sorted(e["id"] for e in outcomes) == sorted(ids), outcomes


def test_same_names_on_two_hosts_are_two_requests_and_keys_replay_per_host(
    host: MakeHost, receiver: Receiver
) -> None:
    """Both hosts' `default` sandboxes send id `same` with one idempotency key: two
    requests, each applied once. After A is killed and restarted, the key replays A's
    first result instead of applying again."""
    auto = '[[rules]]\neffect = "crashtest.send"\naction = "auto"\nreason = "tests"\n'
    a, b = host("alpha", auto), host("beta", auto)
    a.start()
    b.start()
    a.write(request("same", idempotency_key="k1"))
    b.write(request("same", idempotency_key="k1"))
    assert a.result("same")["status"] == b.result("same")["status"] == "applied"
    a.kill()
    a.start(log_name="restarted.log")
    a.write(request("again", idempotency_key="k1") | {"params": {"value": "same"}})
    replay = a.result("again")
    assert replay["status"] == "applied" and replay.get("replayed") is True
    assert receiver.count("alpha.default/same") == (1, 1)
    assert receiver.count("beta.default/same") == (1, 1)
    assert receiver.count("alpha.default/again") == (0, 0)
    sandboxes = sorted(r.sandbox for r in rows(a.url))
    assert sandboxes == ["alpha.default", "alpha.default", "beta.default"]


def test_a_second_broker_for_a_live_host_id_is_refused(host: MakeHost) -> None:
    """Another state dir claiming host id alpha while alpha's broker lives: one line
    naming the holder, exit 2, and the first broker goes on serving."""
    a, impostor = host("alpha"), host("alpha")
    first = a.start()
    refused = impostor.serve_once()
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "host id alpha is held by another broker" in lines[0]
    assert f"pid {first.pid}" in lines[0]
    a.write(request("still", effect="crashtest.noop"))
    assert a.result("still")["status"] == "applied"


def test_an_unreachable_postgresql_stops_the_start_with_one_line(host: MakeHost) -> None:
    """A ledger URL where nothing listens: `broker serve` and `broker pending` each say so
    in one line and exit non-zero."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    nowhere = host("alpha", url=f"postgresql://broker@127.0.0.1:{port}/none")
    serve = nowhere.serve_once()
    pending = nowhere.cli("pending")
    for done in (serve, pending):
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1, done.stderr
        assert "PostgreSQL does not answer" in lines[0] and str(port) in lines[0]


def test_a_kill_switch_from_one_host_stops_the_effect_on_every_host(
    host: MakeHost, receiver: Receiver
) -> None:
    """`broker effects disable` on A holds on B at once (NOTIFY): B denies its next
    request with A's reason, and applies again once A's CLI enables it."""
    auto = '[[rules]]\neffect = "crashtest.send"\naction = "auto"\nreason = "tests"\n'
    a, b = host("alpha", auto), host("beta", auto)
    a.start()
    b.start()
    b.write(request("before"))
    assert b.result("before")["status"] == "applied"
    done = a.cli("effects", "disable", "crashtest.*", "--reason", "receiver is overloaded")
    assert done.returncode == 0, done.stderr
    b.write(request("during"))
    during = b.result("during")
    assert during["status"] == "denied" and "receiver is overloaded" in during["reason"]
    assert receiver.count("beta.default/during") == (0, 0)
    assert a.cli("effects", "enable", "crashtest.*").returncode == 0
    b.write(request("after"))
    assert b.result("after")["status"] == "applied"
    events = [e["event"] for e in json_lines(b.cli("audit", "export").stdout)]
    assert "effect_disabled" in events and "effect_enabled" in events
