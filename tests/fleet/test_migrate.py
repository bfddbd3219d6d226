"""`broker ledger migrate --to postgresql://…` against a real PostgreSQL: a SQLite host's
requests, decisions and audit chain move over with the chain's hashes intact, `broker
audit verify` passes on the fleet's chains and the local copy, the host's broker
carries on there (a request pending before the move is approved and applied after
it), a second migration into the same database is refused, and an edited line of the
chain in PostgreSQL is found."""

from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg

from tests.crash.support import Receiver, Site, wait_for
from tests.fleet.support import request
from tests.pgserver import PASSWORD

POLICY = (
    '[[rules]]\neffect = "crashtest.send"\naction = "approve"\nreason = "people look"\n'
    'timeout = "1h"\n'
)


def config_for_postgresql(site: Site, url: str, secret: Path) -> None:
    text = site.config.read_text(encoding="utf-8")
    text = text.replace(
        "[broker]\n", f'[broker]\nledger = "{url}"\nledger_password_file = "{secret}"\n', 1
    )
    site.config.write_text(text, encoding="utf-8")


def test_migrate_round_trip_keeps_the_chain_and_the_requests(
    tmp_path: Path, pg_url: str, receiver: Receiver
) -> None:
    """SQLite → PostgreSQL: counts printed, chain verified there, a pending request goes
    on to be approved and applied, new requests are served, verify passes again."""
    site = Site(tmp_path / "site", receiver.url, POLICY)
    broker = site.start()
    wait_for(lambda: "serving" in broker.output(), 30, "the SQLite broker")
    for rid in ("a1", "a2", "a3"):
        site.write(f"{rid}.json", request(rid, effect="crashtest.noop"))
    site.write("p1.json", request("p1"))
    wait_for(lambda: len(site.results_now()) == 4, 30, "four results")
    broker.stop()
    switched = site.cli("effects", "disable", "crashtest.post", "--reason", "moving hosts")
    assert switched.returncode == 0, switched.stderr
    before = site.cli("audit", "verify")
    secret = tmp_path / "pgpass"
    secret.write_text(PASSWORD, encoding="utf-8")

    moved = site.cli("ledger", "migrate", "--to", pg_url, "--password-file", str(secret))
    again = site.cli("ledger", "migrate", "--to", pg_url, "--password-file", str(secret))

    assert before.returncode == 0, before.stderr
    events = int(re.search(r"ok, (\d+) event", before.stdout).group(1))  # type: ignore[union-attr]
    assert moved.returncode == 0, moved.stderr
    host = (site.state / "host_id").read_text().strip()
    assert f"migrated 4 request(s), 0 decision(s) and {events} audit event(s) of host {host}" in (
        moved.stdout
    )
    assert again.returncode == 2 and "is not empty" in again.stderr
    with psycopg.connect(pg_url, password=PASSWORD, autocommit=True) as conn:
        facts = dict(conn.execute("SELECT id, facts FROM requests").fetchall())
    assert {k: json.loads(v) for k, v in facts.items()} == {  # what replay needs, carried
        rid: {"protected": []} for rid in ("a1", "a2", "a3", "p1")
    }
    config_for_postgresql(site, pg_url, secret)
    effects = json.loads(site.cli("effects", "--json").stdout)
    post = next(e for e in effects if e["effect"] == "crashtest.post")
    assert post["disabled"]["reason"] == "moving hosts"  # the kill switch came along
    verified = site.cli("audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"host {host}: ok, {events} event(s), chain intact" in verified.stdout
    assert "local copy" in verified.stdout and f"ok, {events} event(s)" in verified.stdout

    broker = site.start(log_name="postgresql.log")
    try:
        wait_for(lambda: "serving" in broker.output(), 30, "the broker on PostgreSQL")
        listed = site.cli("pending")
        assert f"{host}.default/p1" in listed.stdout, listed.stdout + listed.stderr
        approved = site.cli("approve", f"{host}.default/p1", "--reason", "after the move")
        assert approved.returncode == 0, approved.stderr
        site.write("n1.json", request("n1", effect="crashtest.noop"))
        wait_for(
            lambda: (
                site.results_now().get("p1", {}).get("status") == "applied"
                and site.results_now().get("n1", {}).get("status") == "applied"
            ),
            30,
            "p1 and n1 applied",
        )
    finally:
        broker.stop()
    after = site.cli("audit", "verify")
    assert after.returncode == 0, after.stdout + after.stderr
    grown = int(re.search(rf"host {host}: ok, (\d+) event", after.stdout).group(1))  # type: ignore[union-attr]
    assert grown > events
    assert receiver.count(f"{host}.default/p1") == (1, 1)
    shown = site.cli("show", f"{host}.default/a1", "--json")
    assert json.loads(shown.stdout)["status"] == "applied"

    with psycopg.connect(pg_url, password=PASSWORD, autocommit=True) as conn:
        conn.execute(
            "UPDATE audit_lines SET line = replace(line, '\"a2\"', '\"zz\"') "
            "WHERE host = %s AND line LIKE '%%\"a2\"%%'",
            (host,),
        )
    tampered = site.cli("audit", "verify")
    assert tampered.returncode == 1
    assert re.search(
        rf"host {host}: line \d+: its content does not match its hash", tampered.stderr
    )
