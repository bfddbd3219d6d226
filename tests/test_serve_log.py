"""`broker serve` logs one line per request event (received, decided, pending, applied,
failed, denied, invalid…), as an operator reads it on stderr, with every string from a
sandbox or a person neutralised."""

from __future__ import annotations

import getpass
import json
import re
import signal
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.support import ServeSite as Site
from tests.support import Serving, line, run_broker


@pytest.fixture
def site(tmp_path: Path, home: Path) -> Site:
    return Site(tmp_path / "site", home)


@pytest.fixture
def serving(site: Site) -> Iterator[Serving]:
    s = site.serve()
    yield s
    s.close()


def test_each_request_event_is_one_line(site: Site, serving: Serving) -> None:
    """An automatic write: received, decided (which rule), applied; a gated one:
    received, pending with its deadline, then the person's approval and the outcome."""
    auto = site.request("files.write", path="notes.txt", content="hi")
    assert "files.write" in line(serving, "received", f"sb1/{auto}")
    assert "applied automatically (default)" in line(serving, "decided", f"sb1/{auto}")
    line(serving, "applied", f"sb1/{auto}", "files.write")

    gated = site.request("files.write", path="gate/a.txt", content="hi")
    pending = line(serving, "pending", f"sb1/{gated}")
    assert "waits for a person until" in pending and "then deny (rules[0])" in pending
    site.cli("approve", f"sb1/{gated}", "--reason", "looked at it")
    decided = line(serving, "decided", f"sb1/{gated}")
    assert f"approved by {getpass.getuser()} via cli: looked at it" in decided
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO broker\.requests: decided "
    assert re.match(stamp, decided), decided  # UTC, ISO 8601 with a Z, as every other time
    line(serving, "applied", f"sb1/{gated}")


def test_outcomes_decided_elsewhere_and_failures_are_logged(site: Site, serving: Serving) -> None:
    """A denial at the CLI, a failed apply (WARNING) and an invalid request each get a line
    with the reason the agent reads."""
    gated = site.request("files.write", path="gate/b.txt", content="hi")
    line(serving, "pending", f"sb1/{gated}")
    site.cli("deny", f"sb1/{gated}", "--reason", "write under notes/ instead")
    denied = line(serving, "denied", f"sb1/{gated}")
    assert "write under notes/ instead" in denied

    (site.exports / "sb1").mkdir(exist_ok=True)  # files.write writes below root/<sandbox>/

    (site.exports / "sb1" / "taken.txt").write_text("old")
    failed = site.request("files.write", path="taken.txt", content="new")
    failure = line(serving, f"sb1/{failed}", "failed")
    assert "WARNING" in failure and "exists" in failure

    typo = site.request("files.writ", path="x")
    invalid = line(serving, "invalid", f"sb1/{typo}")
    assert "did you mean 'files.write'?" in invalid


def test_untrusted_text_is_neutralised_in_the_log(site: Site, serving: Serving) -> None:
    """An effect name, file name and reason holding escapes and bidi controls show as
    visible tags; no raw control character reaches the operator's terminal."""
    hostile = site.write(
        {"version": 1, "id": "h1", "effect": "files.\x1b[2Jwrite\u202e", "params": {}}, "h1"
    )
    invalid = line(serving, "invalid", f"sb1/{hostile}")
    assert "\\x1b[2J" in invalid and "<U+202E RLO>" in invalid
    gated = site.request("files.write", path="gate/c.txt", content="hi")
    line(serving, "pending", f"sb1/{gated}")
    site.cli("deny", f"sb1/{gated}", "--reason", "no \x1b]0;owned\x07 thanks")
    denied = line(serving, "denied", f"sb1/{gated}")
    assert "\\x1b]0;owned\\x07" in denied
    serving.stop(signal.SIGINT)
    logged = "".join(serving.seen)
    assert "\x1b" not in logged and "\u202e" not in logged and "\x07" not in logged


def test_json_log_lines_carry_utc_time_the_ref_and_the_trace_id(site: Site) -> None:
    """With --log-format json every line is one JSON object: a UTC time ending in Z, the
    level, the logger, the message; a request's lines also its event, ref, effect and the
    trace id its trace has."""
    from broker.observability.logformat import trace_id_for

    s = site.serve("--log-format", "json")
    try:
        rid = site.request("files.write", path="notes.txt", content="hi")
        site.result(rid, "applied")
        found = line(s, '"event": "applied"', f"sb1/{rid}")
    finally:
        assert s.stop(signal.SIGINT) == 0
        s.close()
    entry = json.loads(found)
    assert entry["ts"].endswith("Z") and datetime.fromisoformat(entry["ts"]).utcoffset() == (
        timedelta(0)
    )
    assert (entry["level"], entry["logger"], entry["ref"], entry["effect"]) == (
        "INFO",
        "broker.requests",
        f"sb1/{rid}",
        "files.write",
    )
    assert entry["trace_id"] == trace_id_for("sb1", rid) and len(entry["trace_id"]) == 32
    assert entry["message"].startswith(f"applied  sb1/{rid}")
    for text in s.seen:
        if text.startswith("{"):
            assert set(json.loads(text)) >= {"ts", "level", "logger", "message"}


def test_a_wrong_log_format_is_one_line(site: Site) -> None:
    """--log-format xml stops the start with one line naming the choices."""
    done = run_broker("serve", "--log-format", "xml", "--config", str(site.config), home=site.home)
    assert done.returncode == 2 and "expected text or json" in done.stderr
    assert "Traceback" not in done.stderr
