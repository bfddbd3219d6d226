"""The terminal prompt `broker run` puts to the person at its terminal (broker.cli.prompt),
driven through a real pty against a real broker: approve, deny, skip, decided elsewhere,
the terminal closing mid-answer, hostile text."""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect

from broker.audit import verify as audit
from broker.cli.prompt import AGAIN, ASK_REASON, NEEDS_REASON, QUESTION
from broker.testing import BrokerHarness, FakeHandler
from tests.support import BROKER, Start, barrier, clean_env

REASON = "a person looks at every record first"
POLICY = (
    f'[[rules]]\neffect = "test.record"\naction = "approve"\ntimeout = "1h"\nreason = "{REASON}"\n'
)
HOSTILE_REASON = "please \x1b[31m trust \u202e me\u200d"

# The prompt as `broker run` drives it, over the state dir in argv[1]: every waiting
# request handed to it oldest first; the process ends when the prompt's thread does.
PROMPT = """
import sys, threading, time
from pathlib import Path
from broker.cli.prompt import Prompt
from broker.config import load_config
from broker.store.sqlite import Ledger
from broker.registry import default_registry

cfg = load_config(None, state_dir=Path(sys.argv[1]))
prompt = Prompt(cfg, default_registry())
for record in sorted(Ledger(cfg.ledger_path).in_states(["pending"]), key=lambda r: r.received_at):
    prompt(record)
while any(t.name == "broker-prompt" for t in threading.enumerate()):
    time.sleep(0.05)
"""


def waiting(h: BrokerHarness, value: str, **fields: Any) -> str:
    result = h.submit(h.request("test.record", {"value": value}, **fields), terminal=False)
    assert result["status"] == "pending", result
    return str(result["id"])


def card_then_question(child: pexpect.spawn[str]) -> str:
    """What the prompt printed up to its question: the card it asks about."""
    child.expect_exact(QUESTION)
    return str(child.before)


def test_the_prompt_decides_skips_and_lets_go(start: Start, fake: FakeHandler, home: Path) -> None:
    """At a pty: approve, deny with a reason (a wrong key and a missing reason asked again),
    skip and leave (each naming the commands that answer it); a request decided elsewhere
    meanwhile is not asked about; closing the terminal mid-answer records nothing and prints
    no traceback."""
    h = start(handlers=[fake], policy=POLICY, builtins=False)
    one = waiting(h, "one", reason=HOSTILE_REASON)
    two, three, four, five = (waiting(h, v) for v in ("two", "three", "four", "five"))
    env = clean_env(home, {"COLUMNS": "160"})
    child = pexpect.spawn(
        sys.executable, ["-c", PROMPT, str(h.state)], encoding="utf-8", timeout=30, env=env
    )
    try:
        card = card_then_question(child)
        assert f"default/{one}" in card and f"rules[0]: {REASON}" in card
        assert "its words, not verified" in card and "<U+202E RLO>" in card
        assert "\x1b" not in card and "\u202e" not in card
        denied = subprocess.run(
            [str(BROKER), "deny", two, "--reason", "not now", "--state", str(h.state)],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert denied.returncode == 0, denied.stderr
        child.sendline("a")
        child.expect_exact(ASK_REASON)
        child.sendline("looks right")
        child.expect_exact("approved")
        card = card_then_question(child)
        assert f"default/{three}" in card and two not in card
        child.sendline("x")  # a key it does not know is asked again
        child.expect_exact(AGAIN)
        child.expect_exact(QUESTION)
        child.sendline("d")
        child.expect_exact(ASK_REASON)
        child.sendline("")  # a denial with no reason is asked again, not dropped
        child.expect_exact(NEEDS_REASON)
        child.expect_exact(ASK_REASON)
        child.sendline("use the other table")
        child.expect_exact("denied")
        assert f"default/{four}" in card_then_question(child)
        child.sendline("s")
        child.expect_exact(
            f"skipped: it waits for its deadline, or `broker approve default/{four}`"
        )
        child.expect_exact(f'`broker deny default/{four} --reason "what to do instead"`')
        assert f"default/{five}" in card_then_question(child)
        child.sendline("a")
        child.expect_exact(ASK_REASON)
        child.sendeof()
        child.expect_exact(
            f"not answered: it waits for its deadline, or `broker approve default/{five}`"
        )
        child.expect(pexpect.EOF)
        assert "Traceback" not in str(child.before)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0

    user = getpass.getuser()
    approved = h.wait(one)
    assert (approved["status"], approved["decided_by"]) == ("applied", user)
    assert approved["reason"] == f"approved by {user}: looks right"
    assert "use the other table" in h.wait(three)["reason"]
    assert fake.applied == [{"value": "one"}]
    for rid in (four, five):
        assert h.wait(rid, terminal=False)["status"] == "pending"
    barrier(h)  # the audit log is written after the results
    events = [e for _, e, _ in audit.read_events(h.config.audit_path) if e is not None]
    decisions = [(e["id"], e["verdict"], e["surface"]) for e in events if e["event"] == "decision"]
    assert decisions == [
        (two, "deny", "cli"),
        (one, "approve", "prompt"),
        (three, "deny", "prompt"),
    ]
