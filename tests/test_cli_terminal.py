"""The listing commands and `approve`/`deny` as people and scripts meet them: at a real
pty 80 and 200 columns wide, piped, as --tsv and --json; long effect names that differ
only at the end (files.delete, files.write) and UUID refs are never cut."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from pathlib import Path

import pexpect
import pytest

from broker.models import Preview
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeHandler
from broker.typing import Params
from effects.base import Context
from tests.support import BROKER, Start, clean_env

POLICY = "".join(
    f'[[rules]]\neffect = "{name}"\naction = "approve"\ntimeout = "1h"\n'
    f'reason = "a person reads every {name} first"\n'
    for name in ("files.delete", "files.write")
)
HOSTILE = "report \x1b[31m\u202etxt.exe\tend"


class Verbatim(FakeHandler):
    """A fake whose preview title shows the value as written, as a path would be."""

    def preview(self, params: Params, ctx: Context) -> Preview:
        return Preview(title=f"record {params.get('value')}", target=self.name)


@pytest.fixture
def h(start: Start) -> BrokerHarness:
    """A broker where files.delete and files.write (fakes) both wait for a person."""
    return start(
        handlers=[Verbatim("files.delete", reversible=False), Verbatim("files.write")],
        policy=POLICY,
        builtins=False,
    )


def waiting(h: BrokerHarness, effect: str, value: str = "v") -> str:
    doc = h.request(effect, {"value": value}, id=str(uuid.uuid4()))
    assert h.submit(doc, terminal=False)["status"] == "pending"
    return f"default/{doc['id']}"


def at_pty(h: BrokerHarness, columns: int, *args: str) -> str:
    """What `broker ARGS` prints at a terminal `columns` wide (lines, \\r removed)."""
    child = pexpect.spawn(
        str(BROKER),
        [*args, "--state", str(h.state)],
        encoding="utf-8",
        timeout=30,
        dimensions=(50, columns),
        env=clean_env(h.base, {"COLUMNS": str(columns)}),
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return str(child.before).replace("\r", "")


def piped(h: BrokerHarness, *args: str, code: int = 0) -> str:
    done = subprocess.run(
        [str(BROKER), *args, "--state", str(h.state)],
        capture_output=True,
        text=True,
        env=clean_env(h.base, {"COLUMNS": "80"}),
        timeout=30,
        check=False,
    )
    assert done.returncode == code, done.stderr
    return done.stdout if code == 0 else done.stderr


def whole_on_one_line(text: str, *words: str) -> None:
    """Each of `words` appears whole on some line, and nothing was cut with an ellipsis."""
    assert "…" not in text
    for word in words:
        assert any(word in line for line in text.splitlines()), f"{word!r} cut in:\n{text}"


@pytest.mark.parametrize("columns", [80, 200])
def test_pending_and_stats_fit_the_terminal_and_cut_nothing(h: BrokerHarness, columns: int) -> None:
    """At 80 and 200 columns every line fits the terminal, and refs and the two effect
    names are whole (stats no longer shows `file…` twice)."""
    delete, write = waiting(h, "files.delete"), waiting(h, "files.write")
    piped(h, "approve", waiting(h, "files.write"), "--yes")
    for args in (("pending",), ("stats",)):
        text = at_pty(h, columns, *args)
        assert max(len(line) for line in text.splitlines()) <= columns, text
        whole_on_one_line(text, "files.delete", "files.write")
    whole_on_one_line(at_pty(h, columns, "pending"), delete, write)


def test_a_wide_terminal_gets_a_table_a_narrow_one_a_block_per_request(h: BrokerHarness) -> None:
    """At 200 columns `pending` is one table row per request; at 80, where a row of UUID
    refs cannot fit, each request is a block headed by its ref and effect."""
    delete = waiting(h, "files.delete", "the old logs")
    wide = at_pty(h, 200, "pending")
    header = next(line for line in wide.splitlines() if "ref" in line)
    assert all(word in header for word in ("effect", "what", "time left", "approvals"))
    row = next(line for line in wide.splitlines() if delete in line)
    assert "files.delete" in row and "record the old logs" in row and "0/1" in row
    narrow = at_pty(h, 80, "pending").splitlines()
    first = narrow.index(next(line for line in narrow if delete in line))
    assert narrow[first].split() == [delete, "files.delete"]
    block = "\n".join(narrow[first:])
    assert "what: record the old logs" in block and "approvals: 0/1" in block


def test_piped_listings_are_one_plain_line_per_row(h: BrokerHarness) -> None:
    """Piped at 80 columns: no box drawing, one line per request however long it is."""
    refs = [waiting(h, "files.delete", "x" * 120), waiting(h, "files.write")]
    lines = piped(h, "pending").splitlines()
    assert lines[0].split()[:3] == ["ref", "effect", "what"]
    assert len(lines) == 3
    for ref, line in zip(refs, lines[1:], strict=True):
        assert line.startswith(ref)
    assert "x" * 120 in lines[1]
    assert not any(ch in "".join(lines) for ch in "┃│━─")


def test_tsv_gives_scripts_one_field_per_column(h: BrokerHarness) -> None:
    """--tsv: a header, then one tab-separated line per row; hostile text (a tab, an
    escape, a bidi override) is shown as visible escapes and splits no field."""
    ref = waiting(h, "files.delete", HOSTILE)
    rows = [line.split("\t") for line in piped(h, "pending", "--tsv").splitlines()]
    assert rows[0] == ["ref", "effect", "what", "age", "time left", "then", "approvals"]
    assert len(rows) == 2 and len(rows[1]) == 7
    assert rows[1][:2] == [ref, "files.delete"]
    assert "\\x1b[31m" in rows[1][2] and "<U+202E RLO>" in rows[1][2] and "\\x09end" in rows[1][2]
    stats = [line.split("\t") for line in piped(h, "stats", "--tsv").splitlines()]
    assert stats[0][:3] == ["effect", "auto", "approved"]
    assert [row[0] for row in stats[1:]] == ["files.delete", "(all)"]
    tail = [line.split("\t") for line in piped(h, "audit", "tail", "--tsv").splitlines()]
    assert tail[0] == ["at", "event", "sandbox", "id", "effect", "detail"]
    assert ["pending", "default", ref.split("/")[1], "files.delete"] == tail[-1][1:5]
    effects = [line.split("\t") for line in piped(h, "effects", "--tsv").splitlines()]
    assert effects[0] == [
        "effect",
        "reversible",
        "idempotent",
        "undo",
        "from",
        "credential",
        "switch",
    ]
    assert all(len(row) == 7 for row in effects)


def test_json_and_tsv_together_are_refused(h: BrokerHarness) -> None:
    """A script that asks for both gets one line saying to choose."""
    err = piped(h, "pending", "--json", "--tsv", code=2)
    assert err.strip().splitlines() == ["error: --json and --tsv: choose one"]


def test_read_commands_name_the_state_dir_they_read(h: BrokerHarness, tmp_path: Path) -> None:
    """Empty: "nothing waits for a decision in <dir>"; never used: an error naming it."""
    assert piped(h, "pending").strip() == f"nothing waits for a decision in {h.state}"
    assert piped(h, "stats").strip() == f"no requests recorded in {h.state}"
    assert json.loads(piped(h, "pending", "--json")) == []
    nowhere = tmp_path / "typo"
    done = subprocess.run(
        [str(BROKER), "pending", "--state", str(nowhere)],
        capture_output=True,
        text=True,
        env=clean_env(h.base),
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert f"no broker has used the state dir {nowhere} yet" in done.stderr
    tail = subprocess.run(
        [str(BROKER), "audit", "tail", "--state", str(nowhere)],
        capture_output=True,
        text=True,
        env=clean_env(h.base),
        timeout=30,
        check=False,
    )
    assert tail.stdout.strip() == f"no audit log at {nowhere / 'audit.jsonl'}"
    export = subprocess.run(
        [str(BROKER), "audit", "export", "--state", str(nowhere)],
        capture_output=True,
        text=True,
        env=clean_env(h.base),
        timeout=30,
        check=False,
    )
    assert export.returncode == 0 and export.stdout == ""
    assert export.stderr.strip() == f"no audit log at {nowhere / 'audit.jsonl'}"


def _decide_at_pty(h: BrokerHarness, *args: str) -> pexpect.spawn[str]:
    return pexpect.spawn(
        str(BROKER),
        [*args, "--state", str(h.state)],
        encoding="utf-8",
        timeout=30,
        dimensions=(60, 120),
        env=clean_env(h.base, {"COLUMNS": "120"}),
    )


def state_of(h: BrokerHarness, ref: str) -> str:
    ledger = Ledger(h.config.ledger_path)
    try:
        return ledger.find(ref).state
    finally:
        ledger.close()


def test_approve_at_a_terminal_shows_the_card_and_asks(h: BrokerHarness) -> None:
    """At a pty `broker approve` shows the card (what, why, sha256) and asks; "n" records
    nothing (exit 1), "y" approves."""
    ref = waiting(h, "files.delete", "the old logs")
    child = _decide_at_pty(h, "approve", ref)
    child.expect_exact("[y/N]")
    card = str(child.before)
    assert "record the old logs" in card
    assert "a person reads every files.delete first" in card
    assert "request sha256" in card
    assert f"approve {ref} (files.delete)?" in card
    child.sendline("n")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1 and "nothing recorded" in str(child.before)
    assert state_of(h, ref) == "pending"

    child = _decide_at_pty(h, "approve", ref)
    child.expect_exact("[y/N]")
    child.sendline("y")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "approved by" in str(child.before)
    assert h.wait(ref.split("/")[1])["status"] == "applied"


def test_deny_at_a_terminal_shows_what_the_agent_will_read(h: BrokerHarness) -> None:
    """`broker deny` at a pty shows the card and the reason the agent will read, then asks."""
    ref = waiting(h, "files.write")
    child = _decide_at_pty(h, "deny", ref, "--reason", "write under notes/ instead")
    child.expect_exact("[y/N]")
    assert "THE AGENT WILL READ" in str(child.before)
    assert "write under notes/ instead" in str(child.before)
    child.sendline("y")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert h.wait(ref.split("/")[1])["status"] == "denied"


def test_yes_skips_the_question_and_a_pipe_never_gets_one(h: BrokerHarness) -> None:
    """--yes at a pty decides at once; without a terminal nothing is asked (as before)."""
    first, second = waiting(h, "files.write"), waiting(h, "files.write")
    child = _decide_at_pty(h, "approve", first, "--yes")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "[y/N]" not in str(child.before)
    assert "approved by" in piped(h, "approve", second)
    assert state_of(h, first) != "pending" and state_of(h, second) != "pending"


def test_the_question_names_the_request_safely(h: BrokerHarness) -> None:
    """The effect in the question is printed as written, nothing from the sandbox raw."""
    ref = waiting(h, "files.delete", HOSTILE)
    child = _decide_at_pty(h, "approve", ref)
    child.expect_exact("[y/N]")
    card = str(child.before)
    assert "\x1b[31m" not in card and "\u202e" not in card
    assert "<U+202E RLO>" in card
    child.sendline("n")
    child.expect(pexpect.EOF)


SENTENCE = (
    "please rotate the overnight export because yesterday's archive was written with the "
    "wrong retention window and auditors asked"
)


@pytest.mark.parametrize("columns", [60, 100, 160])
def test_show_wraps_at_word_boundaries_at_every_width(h: BrokerHarness, columns: int) -> None:
    """`broker show` at a 60-, 100- and 160-column pty: every line fits, and every word of
    the agent's sentence is whole on one line (words are never broken across lines)."""
    doc = h.request("files.write", {"value": "v"}, id=str(uuid.uuid4()), reason=SENTENCE)
    assert h.submit(doc, terminal=False)["status"] == "pending"
    text = at_pty(h, columns, "show", doc["id"][:8])  # a unique prefix names it
    assert max(len(line) for line in text.splitlines()) <= columns, text
    whole_on_one_line(text, *SENTENCE.split())


def test_pending_narrows_watches_and_prints_the_version(h: BrokerHarness) -> None:
    """--effect and --sandbox narrow the list; --watch lists again when a request
    arrives and ends quietly on Ctrl-C; --version prints it; an ambiguous prefix names
    its candidates in one line."""
    delete, write = waiting(h, "files.delete"), waiting(h, "files.write")
    only = piped(h, "pending", "--effect", "files.d*")
    assert delete in only and write not in only
    assert "nothing matching --effect/--sandbox" in piped(h, "pending", "--sandbox", "elsewhere")
    child = pexpect.spawn(
        str(BROKER),
        ["pending", "--watch", "--effect", "files.write", "--state", str(h.state)],
        encoding="utf-8",
        timeout=30,
        dimensions=(50, 200),
        # a watch that outlives its Ctrl-C is made to say where it was (SIGABRT)
        env=clean_env(h.base, {"COLUMNS": "200", "PYTHONFAULTHANDLER": "1"}),
    )
    try:
        child.expect_exact(write)
        later = waiting(h, "files.write")
        child.expect_exact(later)  # listed again once the ledger changed
        child.sendintr()
        if child.expect([pexpect.EOF, pexpect.TIMEOUT]) == 1:
            child.kill(signal.SIGABRT)
            child.expect(pexpect.EOF)
            raise AssertionError(f"--watch went on after Ctrl-C; it was at:\n{child.before}")
    finally:
        child.close()
    assert child.exitstatus == 0 and "Traceback" not in str(child.before)
    from broker import __version__

    version = subprocess.run([str(BROKER), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"broker {__version__}"
    first = delete.split("/")[1]
    twin = h.request("files.write", {"value": "v"}, id=first[:6] + "-twin")
    assert h.submit(twin, terminal=False)["status"] == "pending"
    said = piped(h, "show", first[:6], code=2).strip()
    assert said.count("\n") == 0 and delete in said and f"default/{first[:6]}-twin" in said
