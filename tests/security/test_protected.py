"""Findings 2 and 3: protected paths are a policy fact. A change touching one waits for
a person whatever the rules say, unless the matching rule names it; `touch_protected`
is only the agent's acknowledgement."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from broker.policy.ruleset import parse_policy
from broker.testing import BrokerHarness, make_context
from effects.s3 import PutObject
from tests.support import checked

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Agent",
    "GIT_AUTHOR_EMAIL": "agent@sandbox",
    "GIT_COMMITTER_NAME": "Agent",
    "GIT_COMMITTER_EMAIL": "agent@sandbox",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": "/usr/bin:/bin",
}

README_POLICY = """
[[rules]]
effect = "git.push"
when = { branch = "agent/*" }
action = "auto"
reason = "agent branches are scratch space"
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=GIT_ENV, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def remote_head(remote: Path, branch: str) -> str | None:
    done = subprocess.run(
        ["git", "--git-dir", str(remote), "rev-parse", "--verify", "--quiet", branch],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or None


def repo_with_change(tmp_path: Path, path: str) -> tuple[Path, bytes]:
    """A bare remote with main, and a bundle of one commit changing `path`."""
    remote, work = tmp_path / "remote.git", tmp_path / "work"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "README.md").write_text("hello\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "initial")
    git(work, "remote", "add", "origin", str(remote))
    git(work, "push", "-q", "origin", "main")
    git(work, "fetch", "-q", "origin")
    target = work / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("on: push\njobs: {}\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "change")
    bundle = tmp_path / "fix.bundle"
    git(work, "bundle", "create", "-q", str(bundle), "origin/main..HEAD")
    return remote, bundle.read_bytes()


def push(h: BrokerHarness, bundle: bytes, **params: Any) -> dict[str, Any]:
    doc = h.request(
        "git.push",
        {
            "remote": "origin",
            "branch": "agent/fix",
            "bundle": "fix",
            "expected_old": None,
            **params,
        },
        attachments=["fix"],
    )
    h.write(f"{doc['id']}.fix.bin", bundle)
    return checked(h.submit(doc, terminal=False, timeout=30))


def git_broker(tmp_path: Path, remote: Path, policy: str) -> BrokerHarness:
    settings = {
        "remotes": {"origin": {"url": str(remote)}},
        "protected_paths": [".github/workflows/*"],
    }
    return BrokerHarness(tmp_path / "h", policy=policy, integrations={"git": settings})


@pytest.mark.parametrize("path", [".github/workflows/ci.yml", ".github/workflows/d\u00e9ploy.yml"])
def test_touch_protected_does_not_get_past_every_person(tmp_path: Path, path: str) -> None:
    """Under the README's `agent/*` auto rule, a push editing a workflow (even one whose
    name git would quote) with touch_protected waits for a person and is not pushed."""
    remote, bundle = repo_with_change(tmp_path, path)
    with git_broker(tmp_path, remote, README_POLICY) as h:
        result = push(h, bundle, touch_protected=True)
    assert result["status"] == "pending", result
    assert "protected paths" in result["reason"] and path in result["reason"]
    assert remote_head(remote, "agent/fix") is None


def test_without_the_acknowledgement_the_push_is_invalid(tmp_path: Path) -> None:
    """A protected change without touch_protected is `invalid` before anyone is asked."""
    remote, bundle = repo_with_change(tmp_path, ".github/workflows/ci.yml")
    with git_broker(tmp_path, remote, README_POLICY) as h:
        result = push(h, bundle)
    assert result["status"] == "invalid"
    assert result["errors"][0]["path"] == "/params/touch_protected"
    assert remote_head(remote, "agent/fix") is None


def test_a_rule_naming_the_path_decides_for_it(tmp_path: Path) -> None:
    """A rule whose protected_paths names the workflow lets its auto verdict stand."""
    remote, bundle = repo_with_change(tmp_path, ".github/workflows/lint.yml")
    policy = README_POLICY.replace(
        'action = "auto"', 'action = "auto"\nprotected_paths = [".github/workflows/lint.yml"]'
    )
    with git_broker(tmp_path, remote, policy) as h:
        result = push(h, bundle, touch_protected=True)
        if result["status"] != "applied":
            result = checked(h.wait(result["id"], timeout=30))
    assert result["status"] == "applied", result
    assert remote_head(remote, "agent/fix") is not None


def test_an_unprotected_push_still_applies_at_once(tmp_path: Path) -> None:
    """The guard changes nothing for a change outside the protected paths."""
    remote, bundle = repo_with_change(tmp_path, "src/app.py")
    with git_broker(tmp_path, remote, README_POLICY) as h:
        result = push(h, bundle)
        if result["status"] != "applied":
            result = checked(h.wait(result["id"], timeout=30))
    assert result["status"] == "applied", result


def test_files_write_to_a_protected_path_waits_under_an_auto_rule(tmp_path: Path) -> None:
    """files.write with protected_paths: `./bin/run` under an auto-everything rule waits."""
    root = tmp_path / "exports"
    root.mkdir()
    policy = '[[rules]]\neffect = "files.*"\naction = "auto"\nreason = "exports are cheap"\n'
    settings = {"files": {"root": str(root), "protected_paths": ["bin/*"]}}
    with BrokerHarness(tmp_path / "h", policy=policy, integrations=settings) as h:
        doc = h.request("files.write", {"path": "./bin/run", "content": "x"})
        result = checked(h.submit(doc, terminal=False))
        other = checked(h.submit(h.request("files.write", {"path": "doc.txt", "content": "x"})))
    assert result["status"] == "pending"
    assert "bin/run" in result["reason"]
    assert other["status"] == "applied"
    assert not (root / "default" / "bin" / "run").exists()


def test_s3_protected_keys_make_a_person_decide() -> None:
    """s3 protected_keys: a write to a named key is protected; the policy makes it wait,
    a deny rule still denies, and a rule naming the key lets its verdict stand."""
    settings = {"allow": ["scratch/*"], "protected_keys": ["scratch/config/*"]}
    ctx = make_context(settings, integration="s3")
    handler = PutObject()
    params = {"bucket": "scratch", "key": "config/app.toml", "body": "x"}
    touched = tuple(handler.protected_for(params, ctx))
    assert touched == ("scratch/config/app.toml",)
    assert tuple(handler.protected_for({**params, "key": "data/x"}, ctx)) == ()
    rules = {
        "rules": [
            {"effect": "s3.*", "when": {"key": "deny/*"}, "action": "deny"},
            {
                "effect": "s3.*",
                "when": {"key": "config/app.toml"},
                "action": "auto",
                "protected_paths": ["scratch/config/app.toml"],
            },
            {"effect": "s3.*", "action": "auto"},
        ]
    }
    policy = parse_policy(rules, {"s3.put_object": True}, "test")
    assert policy.classify("s3.put_object", {**params, "key": "x"}, True, touched).action == (
        "approve"
    )
    assert policy.classify("s3.put_object", params, True, touched).action == "auto"
    denied = {**params, "key": "deny/x"}
    assert policy.classify("s3.put_object", denied, True, touched).action == "deny"


def test_protected_verdict_fails_closed_and_is_decided_alone() -> None:
    """The approve verdict a protected path forces never approves itself at its deadline
    and is not decided in a batch or by a Slack button."""
    policy = parse_policy(
        {
            "rules": [
                {
                    "effect": "files.write",
                    "action": "approve",
                    "on_timeout": "approve",
                    "slack_buttons": True,
                }
            ]
        },
        {"files.write": True},
        "test",
    )
    verdict = policy.classify("files.write", {"path": "bin/x"}, True, ("bin/x",))
    assert (verdict.action, verdict.on_timeout, verdict.batch) == ("approve", "deny", False)
    assert verdict.slack_buttons is False
    assert verdict.rule == "rules[0]+protected_paths"
