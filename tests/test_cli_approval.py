"""`broker pending | show | approve | deny` run as a person runs them: a separate process
on the state dir of a broker that is serving (or stopped), printing to a pipe."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from broker.audit import verify as audit
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeHandler
from effects.files import FilesWrite
from tests.support import BROKER, PATIENCE, Start, barrier
from tests.support import assert_one_line_error as refused

RECORD_REASON = "a person looks at every record first"
FILES_REASON = "files leave the sandbox: a person reads them first"
HOSTILE_PATH = "notes/a\u202etxt.exe"
HOSTILE_CONTENT = "hi \x1b[2J there\u200d\nline2\u202e\n"
HOSTILE_REASON = "please \x1b[31m trust \u202e me\u200d"
RAW = ("\x1b", "\u202e", "\u200d")


def gate(approvals: int = 1, timeout: str = "1h") -> str:
    """A policy that sends test.record and files.write to people; test.auto is automatic."""
    rule = 'action = "approve"\napprovals = {}\ntimeout = "{}"\non_timeout = "deny"\n'
    rule = rule.format(approvals, timeout)
    return (
        f'[[rules]]\neffect = "test.record"\n{rule}reason = "{RECORD_REASON}"\n'
        f'[[rules]]\neffect = "files.write"\n{rule}reason = "{FILES_REASON}"\n'
    )


NO_RESCAN_S = 3600.0


@pytest.fixture
def start(start: Start, fake: FakeHandler, exports: Path) -> Start:
    """Start a broker with test.record and files.write gated (gate() kwargs). It never
    rescans the outbox on its own: what it does after a CLI decision, the CLI's nudge made
    it do (so the tests wait as long as a loaded machine needs, and still show that)."""
    return lambda **terms: start(
        handlers=[fake, FakeHandler("test.auto")],
        policy=gate(**terms),
        integrations={"files": {"root": str(exports)}},
        rescan_interval_s=NO_RESCAN_S,
    )


def cli(h: BrokerHarness, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `broker ARGS --state <h.state>` in its own process, output to a pipe."""
    env = {k: v for k, v in os.environ.items() if k not in ("BROKER_CONFIG", "COLUMNS")}
    env["COLUMNS"] = "80"
    return subprocess.run(
        [str(BROKER), *args, "--state", str(h.state)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=30,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def waiting(h: BrokerHarness, value: Any = "v", **fields: Any) -> dict[str, Any]:
    result = h.submit(h.request("test.record", {"value": value}, **fields), terminal=False)
    assert result["status"] == "pending", result
    return result


def file_waiting(h: BrokerHarness, path: str, content: str, reason: str) -> dict[str, Any]:
    doc = h.request("files.write", {"path": path, "content": content}, reason=reason)
    result = h.submit(doc, terminal=False)
    assert result["status"] == "pending", result
    return result


def allow_as(h: BrokerHarness) -> None:
    """Let this state dir's CLI take `--as` (load_config reads <state>/broker.toml)."""
    (h.state / "broker.toml").write_text("[broker]\nallow_as = true\n", encoding="utf-8")


def state_of(h: BrokerHarness, ref: str) -> str:
    ledger = Ledger(h.config.ledger_path)
    try:
        return ledger.find(ref).state
    finally:
        ledger.close()


def audit_events(h: BrokerHarness) -> list[dict[str, Any]]:
    return [e for _, e, _ in audit.read_events(h.config.audit_path) if e is not None]


# -- approve and deny ---------------------------------------------------------------


def test_approve_applies_while_the_broker_runs(start: Start, fake: FakeHandler) -> None:
    """`broker approve` applies at once (it nudges the broker) in the OS user's name."""
    h = start()
    pending = waiting(h, "shipped")
    out = ok(cli(h, "approve", pending["id"], "--reason", "checked the record"))
    user = getpass.getuser()
    assert f"approved by {user}" in out
    result = h.wait(pending["id"], timeout=PATIENCE)  # no rescan: the nudge
    assert result["status"] == "applied"
    assert result["decided_by"] == user
    assert result["reason"] == f"approved by {user}: checked the record"
    assert fake.applied == [{"value": "shipped"}]


def test_deny_sends_the_reason_to_the_agent(start: Start, fake: FakeHandler) -> None:
    """`broker deny --reason` denies; the agent reads the reason, and so does the person."""
    h = start()
    pending = waiting(h)
    out = ok(cli(h, "deny", f"default/{pending['id']}", "--reason", "use the staging table"))
    assert "use the staging table" in out
    result = h.wait(pending["id"], timeout=PATIENCE)
    assert result["status"] == "denied"
    assert result["decided_by"] == getpass.getuser()
    assert "use the staging table" in result["reason"]
    assert fake.applied == []


def test_deny_without_a_reason_is_refused(start: Start) -> None:
    """`broker deny` with no reason, or a blank one, is refused and the request waits."""
    h = start()
    pending = waiting(h)
    missing = cli(h, "deny", pending["id"])
    assert missing.returncode != 0
    assert "--reason" in missing.stderr
    assert "Traceback" not in missing.stderr + missing.stdout
    refused(cli(h, "deny", pending["id"], "--reason", "  "), "needs a reason")
    assert state_of(h, pending["id"]) == "pending"


def test_stale_or_short_sha256_is_refused(start: Start, fake: FakeHandler) -> None:
    """`--sha256` must match what is recorded, with at least 12 digits; 12 are enough."""
    h = start()
    pending = waiting(h)
    sha = pending["request_sha256"]
    other = ("0" if sha[0] != "0" else "1") + sha[1:]
    refused(cli(h, "approve", pending["id"], "--sha256", other), "look at it again")
    refused(cli(h, "approve", pending["id"], "--sha256", sha[:11]), pending["id"])
    assert state_of(h, pending["id"]) == "pending"
    ok(cli(h, "approve", pending["id"], "--sha256", sha[:12]))
    assert h.wait(pending["id"], timeout=PATIENCE)["status"] == "applied"
    assert len(fake.applied) == 1


def test_unknown_or_settled_request_is_refused(start: Start) -> None:
    """Approving an id that does not exist, or a request already decided, is one line."""
    h = start()
    pending = waiting(h)
    refused(cli(h, "approve", "no-such-request"), "no-such-request")
    ok(cli(h, "deny", pending["id"], "--reason", "no"))
    refused(cli(h, "approve", pending["id"]), "not waiting")
    refused(cli(h, "show", "no-such-request"), "no-such-request")


def test_as_is_refused_unless_the_host_allows_it(start: Start) -> None:
    """`--as` needs allow_as = true in broker.toml; then it names the decider."""
    h = start()
    pending = waiting(h)
    refused(cli(h, "approve", pending["id"], "--as", "mallory"), "--as is not allowed")
    assert state_of(h, pending["id"]) == "pending"
    allow_as(h)
    ok(cli(h, "approve", pending["id"], "--as", "carol"))
    assert h.wait(pending["id"], timeout=PATIENCE)["decided_by"] == "carol"


def test_quorum_counts_people_not_commands(start: Start, fake: FakeHandler) -> None:
    """Under approvals = 2: the first approval waits, the same name again is refused."""
    h = start(approvals=2)
    allow_as(h)
    pending = waiting(h)
    assert "1 of 2" in ok(cli(h, "approve", pending["id"], "--as", "alice"))
    refused(cli(h, "approve", pending["id"], "--as", "alice"), "already decided")
    assert state_of(h, pending["id"]) == "pending"
    assert fake.applied == []
    ok(cli(h, "approve", pending["id"], "--as", "bob"))
    result = h.wait(pending["id"], timeout=PATIENCE)
    assert result["status"] == "applied"
    assert result["decided_by"] == "alice, bob"


def test_approval_while_the_broker_is_down_is_applied_on_start(
    start: Start, fake: FakeHandler
) -> None:
    """`broker approve` with no broker running is kept and applied when it starts."""
    h = start()
    pending = waiting(h, "later")
    h.stop()
    ok(cli(h, "approve", pending["id"]))
    h.start()
    result = h.wait(pending["id"])
    assert result["status"] == "applied"
    assert result["decided_by"] == getpass.getuser()
    assert fake.applied == [{"value": "later"}]


def test_cli_decisions_keep_the_audit_chain_intact(start: Start) -> None:
    """CLI decisions and a busy broker share one intact chain; each decision is one event."""
    h = start()
    a, b = waiting(h, "a"), waiting(h, "b")
    busy = threading.Event()

    def traffic() -> None:
        while not busy.is_set():
            h.submit(h.request("test.auto", {"value": "noise"}))

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        ok(cli(h, "approve", a["id"], "--reason", "fine"))
        ok(cli(h, "deny", b["id"], "--reason", "not this one"))
        assert h.wait(a["id"], timeout=PATIENCE)["status"] == "applied"
        assert h.wait(b["id"], timeout=PATIENCE)["status"] == "denied"
    finally:
        busy.set()
        worker.join(10)
    barrier(h)  # the audit log is written after the results
    assert "chain intact" in ok(cli(h, "audit", "verify"))
    events = audit_events(h)
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs))
    user = getpass.getuser()
    decisions = [
        (e["id"], e["by"], e["verdict"], e["surface"]) for e in events if e["event"] == "decision"
    ]
    assert decisions == [(a["id"], user, "approve", "cli"), (b["id"], user, "deny", "cli")]
    applied = [e for e in events if e["event"] == "applied" and e["id"] == a["id"]]
    assert len(applied) == 1


# -- pending and show ---------------------------------------------------------------


def test_pending_json_lists_oldest_first(start: Start) -> None:
    """`pending --json` lists what waits, oldest first, with ref, effect and time left."""
    h = start(timeout="2h")
    assert ok(cli(h, "pending")).strip() == f"nothing waits for a decision in {h.state}"
    first, second, third = (waiting(h, i) for i in range(3))
    ok(cli(h, "approve", second["id"]))
    rows = json.loads(ok(cli(h, "pending", "--json")))
    assert [r["ref"] for r in rows] == [f"default/{first['id']}", f"default/{third['id']}"]
    for row in rows:
        assert row["sandbox"] == "default"
        assert row["effect"] == "test.record"
        assert 7000 < row["if_nobody_answers"]["seconds_left"] <= 7200
        assert row["if_nobody_answers"]["on_timeout"] == "deny"
    assert rows[0]["age_s"] >= rows[1]["age_s"]


def test_pending_table_shows_whole_refs(start: Start) -> None:
    """`broker pending` at 80 columns shows a UUID ref whole, ready to paste into approve."""
    h = start()
    rid = str(uuid.uuid4())
    waiting(h, id=rid)
    assert f"default/{rid}" in ok(cli(h, "pending"))


def test_show_card_has_what_where_why_deadline_flags_and_undo(start: Start, exports: Path) -> None:
    """`broker show` has the literal content, rule, deadline, agent's words, flags and undo."""
    h = start()
    content = "line one\nline two\n"
    pending = file_waiting(h, "out/report.txt", content, "the user asked for the report")
    out = ok(cli(h, "show", pending["id"]))
    assert f"default/{pending['id']}" in out
    assert "line one" in out and "line two" in out
    assert str(exports / "default" / "out" / "report.txt") in out
    assert f"rules[1]: {FILES_REASON}" in out
    assert pending["expires_at"] in out
    assert "denied (fails closed)" in out
    said = next(line for line in out.splitlines() if "the user asked for the report" in line)
    assert "its words" in said
    assert "reversible: yes, idempotent: yes" in out
    assert FilesWrite.undo in out
    assert pending["request_sha256"] in out

    c = json.loads(ok(cli(h, "show", pending["id"], "--json")))
    assert c["what"]["body"] == content
    assert c["why"] == {"rule": "rules[1]", "reason": FILES_REASON}
    assert c["if_nobody_answers"]["expires_at"] == pending["expires_at"]
    assert c["if_nobody_answers"]["on_timeout"] == "deny"
    assert c["agent_reason"] == "the user asked for the report"
    assert (c["reversible"], c["idempotent"], c["undo"]) == (True, True, FilesWrite.undo)
    assert c["request_sha256"] == pending["request_sha256"]


def test_show_names_the_status(start: Start) -> None:
    """The card's header line says where the request stands (`pending`)."""
    h = start()
    pending = waiting(h)
    header = ok(cli(h, "show", pending["id"])).splitlines()[0]
    assert pending["id"] in header
    assert "pending" in header


def test_hostile_text_is_neutralised_in_show_and_pending(start: Start) -> None:
    """ESC, bidi and zero-width characters are shown visibly by `show` and `pending`, not raw."""
    h = start()
    pending = file_waiting(h, HOSTILE_PATH, HOSTILE_CONTENT, HOSTILE_REASON)
    shown = ok(cli(h, "show", pending["id"]))
    listed = ok(cli(h, "pending"))
    for raw in RAW:
        assert raw not in shown
        assert raw not in listed
    assert "<U+202E RLO>" in shown
    assert "\\x1b[2J" in shown
    assert "<U+200D ZWJ>" in shown
    said = next(line for line in shown.splitlines() if "trust" in line)
    assert "its words" in said
    assert "\\x1b[31m" in said


def test_json_listings_carry_no_raw_control_characters(start: Start) -> None:
    """`pending --json` and `show --json` keep hostile text in the data but escape it in output."""
    h = start()
    pending = file_waiting(h, HOSTILE_PATH, HOSTILE_CONTENT, HOSTILE_REASON)
    for args in (("pending", "--json"), ("show", pending["id"], "--json")):
        out = ok(cli(h, *args))
        data = json.loads(out)
        c = data[0] if isinstance(data, list) else data
        assert c["what"]["body"] == HOSTILE_CONTENT
        assert c["agent_reason"] == HOSTILE_REASON
        for raw in RAW:
            assert raw not in out, f"broker {' '.join(args)} printed {raw!r} raw"
