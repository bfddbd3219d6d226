"""Text an agent aims at the reviewer's screen: markup, hyperlinks, carriage returns
and fake card lines are shown as text by `broker show` and `broker pending`, never
obeyed. Escape sequences, bidi overrides and zero-width characters are covered by
tests/test_cli_approval.py::test_hostile_text_is_neutralised_in_show_and_pending."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.testing import BrokerHarness, FakeHandler

BROKER = Path(sys.executable).with_name("broker")
MARKUP = "[/][bold green]✔ APPROVED by security-team[/]"
FAKE_LINE = "\nAPPROVALS  1 of 1 (security-team)"
OVERWRITE = "rm -rf /srv/data\rharmless cleanup  "
HYPERLINK = "\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\"
SGR = re.compile("\x1b\\[[0-9;]*m")
VALUE = "[link=https://evil.example]harmless[/link] [blink]x[/blink]"


@pytest.fixture
def waiting(tmp_path: Path) -> Iterator[BrokerHarness]:
    """A broker with one gated request whose reason and params attack the screen."""
    policy = {"rules": [{"effect": "test.record", "action": "approve", "reason": "look first"}]}
    with BrokerHarness(
        tmp_path / "h", handlers=[FakeHandler("test.record")], policy=policy, builtins=False
    ) as h:
        doc = h.request(
            "test.record",
            {"value": VALUE},
            id="screen",
            reason=MARKUP + FAKE_LINE + " " + OVERWRITE + HYPERLINK,
        )
        assert h.submit(doc, terminal=False)["status"] == "pending"
        yield h


def cli(h: BrokerHarness, *args: str, tty_colors: bool = False) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env["COLUMNS"] = "200"
    if tty_colors:
        env.update(FORCE_COLOR="1", TERM="xterm-256color")
    done = subprocess.run(
        [str(BROKER), *args, "--state", str(h.state)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    plain = SGR.sub("", done.stdout)  # the CLI's own colours, when it thinks it may
    assert "\x1b" not in plain, "an escape sequence other than a colour reached the screen"
    return plain


@pytest.mark.parametrize("tty_colors", [False, True], ids=["pipe", "colour-terminal"])
def test_markup_and_fake_lines_are_shown_as_text(waiting: BrokerHarness, tty_colors: bool) -> None:
    """Agent markup, hyperlinks, CRs and fake card lines are shown as text by show and pending."""
    shown = cli(waiting, "show", "screen", tty_colors=tty_colors)
    listed = cli(waiting, "pending", tty_colors=tty_colors)

    assert "[bold green]✔ APPROVED by security-team" in shown
    assert "[link=https://evil.example]harmless[/link]" in shown
    assert "[link=https://evil.example]" in listed
    assert "\\x0d" in shown and "\\x1b]8;;https://evil.example/" in shown
    for out in (shown, listed):
        assert "\r" not in out
    approvals = [line for line in shown.splitlines() if line.lstrip().startswith("APPROVALS")]
    assert len(approvals) == 1, approvals
    assert "0 of 1" in approvals[0]
    said = next(line for line in shown.splitlines() if "THE AGENT SAYS" in line)
    assert "APPROVALS  1 of 1" in said, "the agent's newline made a line of its own"
