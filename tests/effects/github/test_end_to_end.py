"""End to end through a real broker: an agent pushes, asks for a PR, a person approves."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from broker.approval.decisions import Ballot, card, decide, nudge
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness
from tests.effects.github.support import REPO, TOKEN, Hub, pr

# -- end to end: an agent pushes, asks for a PR, a person approves ---------------------------

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Agent",
    "GIT_AUTHOR_EMAIL": "agent@sandbox",
    "GIT_COMMITTER_NAME": "Agent",
    "GIT_COMMITTER_EMAIL": "agent@sandbox",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": "/usr/bin:/bin",
}

POLICY = """
[[rules]]
effect = "git.push"
when = { branch = "agent/*" }
action = "auto"
reason = "agent branches are scratch space"

[[rules]]
effect = "github.pull_request.create"
action = "approve"
timeout = "1h"
reason = "a person reads every pull request first"
"""


def agent_git(work: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(work), *args], env=GIT_ENV, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def test_agent_pushes_asks_for_a_pr_and_a_person_approves(hub: Hub, tmp_path: Path) -> None:
    """Stand-ins: the fake serving the bare repo git.push writes to; the agent gets the PR URL."""
    # git.push applies by policy, the PR waits; the card holds the compare diff; after
    # `decide` the agent's result carries the URL, and no result file holds the token
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(hub.remote), str(work)], check=True, env=GIT_ENV)
    base = agent_git(work, "rev-parse", "HEAD")
    (work / "src" / "app.py").write_text("x = 42\n")
    agent_git(work, "commit", "-q", "-am", "make x the answer")
    agent_git(work, "bundle", "create", "-q", str(tmp_path / "fix.bundle"), "origin/main..HEAD")
    integrations = {
        "git": {"remotes": {"origin": {"url": str(hub.remote)}}, "protected_branches": ["main"]},
        "github": hub.settings,
    }
    h = BrokerHarness(tmp_path / "broker", integrations=integrations, policy=POLICY)
    with h:
        time.sleep(0.15)  # the watcher starts a moment after `ready`
        h.write("push.fix.bin", (tmp_path / "fix.bundle").read_bytes())
        push = h.submit(
            {
                "version": 1,
                "effect": "git.push",
                "attachments": ["fix"],
                "params": {
                    "remote": "origin",
                    "branch": "agent/fix",
                    "bundle": "fix",
                    "expected_old": None,
                },
            },
            name="push",
            timeout=30,
        )
        assert push["status"] == "applied", push
        request = h.request(
            "github.pull_request.create",
            pr(body="The answer, as discussed with @alice.", base_sha=base),
            reason="the fix for the failing test",
        )
        pending = h.submit(request, terminal=False, timeout=30)
        assert pending["status"] == "pending", pending
        ledger = Ledger(h.config.ledger_path)
        try:
            shown = card(ledger, ledger.find(request["id"]), h.registry)
            assert "-x = 1\n+x = 42" in shown["what"]["body"]
            assert "The answer, as discussed with @ alice." in shown["what"]["body"]
            sha = pending["request_sha256"]
            decide(
                ledger,
                Ballot(
                    request["id"],
                    "approve",
                    approver="ops",
                    reason="read",
                    surface="web",
                    sha256=sha,
                ),
            )
        finally:
            ledger.close()
            nudge(h.state)
        result = h.wait(request["id"], timeout=30)
    assert result["status"] == "applied", result
    pulls = hub.fake.pulls(REPO)
    assert len(pulls) == 1 and pulls[0]["head"] == "agent/fix"
    assert result["output"]["url"] == f"{hub.fake.url}/acme/api/pull/{pulls[0]['number']}"
    assert result["decided_by"] == "ops"
    for written in h.results.glob("*.json"):
        assert TOKEN not in written.read_text()
