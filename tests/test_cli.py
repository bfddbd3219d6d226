"""The `broker` command as a user runs it: output, exit codes, one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from broker.testing import BrokerHarness, FakeHandler
from broker.validation import load_schema
from tests.support import assert_one_line_error
from tests.support import run_broker as run

EVIL = "boom \x1b[2J\x1b[31mred \u202egnp.exe"

POLICY = """
[[rules]]
effect = "s3.*"
action = "auto"

[[rules]]
effect = "files.write"
when = { path = "tmp/*" }
action = "auto"
reason = "scratch space"

[[rules]]
effect = "files.write"
when = { overwrite = true }
action = "deny"
reason = "no overwrites"

[[rules]]
effect = "files.*"
action = "approve"
approvals = 2
timeout = "4h"
"""


@pytest.fixture(scope="module")
def served_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The state dir of a real broker run: one applied request, one failed with a hostile reason."""
    base = tmp_path_factory.mktemp("served")
    harness = BrokerHarness(base, handlers=[FakeHandler("test.record")])
    with harness:
        applied = harness.submit(harness.request("test.record", {"value": "ok"}))
        failed = harness.submit(harness.request("test.record", {"fail": EVIL}))
    assert (applied["status"], failed["status"]) == ("applied", "failed")
    return harness.state


@pytest.fixture
def state(served_state: Path, tmp_path: Path) -> Path:
    """A private copy of the served state dir, free to tamper with."""
    return Path(shutil.copytree(served_state, tmp_path / "state"))


def audit_lines(state: Path) -> list[str]:
    """The audit log's lines, each with its newline."""
    return (state / "audit.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)


def write_request(path: Path, effect: str, params: dict[str, Any]) -> Path:
    """A request file as an agent would write it."""
    path.write_text(json.dumps({"version": 1, "id": "r1", "effect": effect, "params": params}))
    return path


# -- effects --------------------------------------------------------------------


def test_effects_lists_files_write(home: Path) -> None:
    """`broker effects` shows files.write with its flags."""
    proc = run("effects", home=home)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if "files.write" in line)
    assert "yes" in row


def test_effects_json(home: Path) -> None:
    """`broker effects --json` is a JSON list with files.write, its flags and its schema."""
    proc = run("effects", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    entry = next(r for r in rows if r["effect"] == "files.write")
    assert entry["integration"] == "files"
    assert entry["reversible"] is True
    assert entry["idempotent"] is True
    assert entry["schema"] == load_schema("files.write")
    assert isinstance(entry["undo"], str) and entry["undo"]
    assert "effects.files:FilesWrite" in entry["origin"]


# -- policy ---------------------------------------------------------------------


def test_policy_check_ok(home: Path, tmp_path: Path) -> None:
    """A good policy file is reported ok with one line per rule and its terms."""
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    proc = run("policy", "check", str(path), home=home)
    assert proc.returncode == 0, proc.stderr
    assert "ok, 4 rule(s)" in proc.stdout
    for i in range(4):
        assert f"rules[{i}]" in proc.stdout
    assert "approvals=2" in proc.stdout and "timeout=14400s" in proc.stdout
    assert proc.stderr == ""


def test_policy_check_allows_on_timeout_approve_for_reversible_builtin(
    home: Path, tmp_path: Path
) -> None:
    """files.write is reversible, so on_timeout = approve on it passes the check."""
    path = tmp_path / "policy.toml"
    path.write_text(
        '[[rules]]\neffect = "files.write"\naction = "approve"\non_timeout = "approve"\n'
    )
    proc = run("policy", "check", str(path), home=home)
    assert proc.returncode == 0, proc.stderr
    assert "on_timeout=approve" in proc.stdout


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('[[rules]]\neffect = "a.b"\naction = "auto"\n'
         '[[rules]]\neffect = "a.b"\naction = "maybe"\n', ["rules[1].action", "maybe"]),
        ('[[rules]]\neffect = "a.b"\naction = "auto"\nfoo = 1\n', ["rules[0]", "foo"]),
        ('[[rules]]\neffect = "a.b"\naction = "approve"\ntimeout = "soon"\n', ["rules[0].timeout"]),
        ('[[rules]]\neffect = "a.b"\naction = "approve"\napprovals = 0\n', ["rules[0].approvals"]),
        ('[[rules]]\neffect = "a.b"\naction = "deny"\ntimeout = "1h"\n', ["rules[0].timeout"]),
        ('[[rules]]\neffect = "nothere.*"\naction = "approve"\non_timeout = "approve"\n'
         '[[rules]]\neffect = "ghost.run"\naction = "approve"\non_timeout = "approve"\n',
         ["rules[1].on_timeout"]),
        ("[[rules]\n", ["not valid TOML"]),
    ],
    ids=[
        "bad-action", "unknown-key", "bad-timeout", "zero-approvals", "timeout-on-deny",
        "on-timeout-approve-irreversible", "bad-toml",
    ],
)  # fmt: skip
def test_policy_check_bad_file(home: Path, tmp_path: Path, text: str, names: list[str]) -> None:
    """A bad policy exits non-zero with one line naming the file, rule and key."""
    path = tmp_path / "policy.toml"
    path.write_text(text)
    proc = run("policy", "check", str(path), home=home)
    assert_one_line_error(proc, "policy.toml", *names)
    assert proc.stdout == ""


def test_policy_explain_names_rule_and_why_not_the_others(home: Path, tmp_path: Path) -> None:
    """explain shows each earlier rule's reason for not matching and the deciding rule."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    request = write_request(
        tmp_path / "r1.json",
        "files.write",
        {"path": "docs/a.txt", "content": "x", "overwrite": True},
    )
    proc = run("policy", "explain", str(request), "--policy", str(policy), home=home)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"policy: {policy}"
    assert lines[1].startswith("  rules[0] (auto): no:") and "does not match 's3.*'" in lines[1]
    assert lines[2].startswith("  rules[1] (auto): no:")
    assert "'docs/a.txt'" in lines[2] and "tmp/*" in lines[2]
    assert lines[3].startswith("  rules[2] (deny): MATCH")
    assert not any("rules[3]" in line for line in lines)
    assert lines[-1].startswith("→ deny by rules[2]")
    assert "no overwrites" in lines[-1]


def test_policy_explain_json(home: Path, tmp_path: Path) -> None:
    """explain --json gives the verdict and the trace as JSON."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    request = write_request(tmp_path / "r1.json", "files.write", {"path": "src/a", "content": ""})
    proc = run("policy", "explain", str(request), "--policy", str(policy), "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"]["rule"] == "rules[3]"
    assert doc["verdict"]["action"] == "approve"
    assert doc["verdict"]["approvals"] == 2
    assert len(doc["trace"]) == 4
    assert "params.overwrite is absent" in doc["trace"][2]


def test_policy_explain_default(home: Path, tmp_path: Path) -> None:
    """With no matching rule explain ends on the default for the effect's reversibility."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\neffect = "s3.*"\naction = "deny"\n')
    request = write_request(tmp_path / "r1.json", "files.write", {"path": "a", "content": ""})
    proc = run("policy", "explain", str(request), "--policy", str(policy), home=home)
    assert proc.returncode == 0, proc.stderr
    assert "default (auto)" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("→ auto by default")


# -- audit ----------------------------------------------------------------------


def test_audit_verify_after_real_run(home: Path, state: Path) -> None:
    """After a real broker run the chain verifies and the event count is given."""
    count = len(audit_lines(state))
    proc = run("audit", "verify", "--state", str(state), home=home)
    assert proc.returncode == 0, proc.stderr
    assert f"ok, {count} event(s)" in proc.stdout


def _edit(lines: list[str]) -> int:
    entry = json.loads(lines[2])
    entry["effect"] = "files.write"
    lines[2] = json.dumps(entry) + "\n"
    return 3


def _delete_middle(lines: list[str]) -> int:
    del lines[3]
    return 4


def _swap(lines: list[str]) -> int:
    lines[1], lines[2] = lines[2], lines[1]
    return 2


def _delete_last(lines: list[str]) -> int:
    lines.pop()
    return len(lines) + 1


@pytest.mark.parametrize("tamper", [_edit, _delete_middle, _swap, _delete_last])
def test_audit_verify_after_tampering(home: Path, state: Path, tamper: Any) -> None:
    """Edited, deleted, swapped or cut lines make verify exit 1 naming the line."""
    lines = audit_lines(state)
    line = tamper(lines)
    (state / "audit.jsonl").write_text("".join(lines), encoding="utf-8")
    proc = run("audit", "verify", "--state", str(state), home=home)
    assert proc.returncode == 1
    assert_one_line_error(proc, f"line {line}:")


def test_audit_verify_with_config_from_env(home: Path, state: Path, tmp_path: Path) -> None:
    """$BROKER_CONFIG is honoured: its relative state_dir is the one verified."""
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\nstate_dir = "state"\n')
    proc = run("audit", "verify", home=home, env={"BROKER_CONFIG": str(config)}, cwd=home)
    assert proc.returncode == 0, proc.stderr
    assert str(state / "audit.jsonl") in proc.stdout


def test_audit_verify_of_missing_log_is_not_ok(home: Path, tmp_path: Path) -> None:
    """A state dir without an audit log (a typo) is not reported as an intact chain."""
    proc = run("audit", "verify", "--state", str(tmp_path / "no-such-state"), home=home)
    assert proc.returncode != 0
    assert "intact" not in proc.stdout


def test_audit_tail_shows_last_events(home: Path, state: Path) -> None:
    """`audit tail -n 3` prints the last three events, the failure last."""
    proc = run("audit", "tail", "--state", str(state), "-n", "3", home=home)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3
    assert " failed default/" in lines[-1]
    assert "test.record" in lines[-1]


def test_audit_tail_neutralises_untrusted_text(home: Path, state: Path) -> None:
    """An agent's escape codes and bidi overrides in a reason are shown, not obeyed."""
    proc = run("audit", "tail", "--state", str(state), home=home)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout
    assert "\u202e" not in proc.stdout
    failed = proc.stdout.splitlines()[-1]
    assert "\\x1b[2J" in failed
    assert "U+202E" in failed


def test_audit_tail_json(home: Path, state: Path) -> None:
    """`audit tail --json` prints one JSON event per line, with its hash."""
    proc = run("audit", "tail", "--state", str(state), "-n", "2", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    expected = [json.loads(line) for line in audit_lines(state)[-2:]]
    assert events == expected


def test_audit_export_since_duration(home: Path, state: Path) -> None:
    """`audit export --since 1h` prints every event of the fresh run, as in the log."""
    proc = run("audit", "export", "--state", str(state), "--since", "1h", home=home)
    assert proc.returncode == 0, proc.stderr
    exported = [json.loads(line) for line in proc.stdout.splitlines()]
    assert exported == [json.loads(line) for line in audit_lines(state)]


def test_audit_export_since_time(home: Path, state: Path) -> None:
    """--since with an ISO time keeps events at or after it; a future time keeps none."""
    entries = [json.loads(line) for line in audit_lines(state)]
    cut = entries[-1]["at"]
    proc = run("audit", "export", "--state", str(state), "--since", cut, home=home)
    assert proc.returncode == 0, proc.stderr
    exported = [json.loads(line) for line in proc.stdout.splitlines()]
    assert exported == [e for e in entries if e["at"] >= cut]
    later = run("audit", "export", "--state", str(state), "--since", "2999-01-01", home=home)
    assert later.returncode == 0 and later.stdout == ""


# -- errors a user can cause ----------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "verify", "--config", "{tmp}/missing.toml"],
        ["audit", "tail", "--config", "{tmp}/missing.toml"],
        ["audit", "export", "--config", "{tmp}/missing.toml"],
        ["policy", "check", "{tmp}/missing-policy.toml"],
        ["policy", "explain", "{tmp}/req.json", "--policy", "{tmp}/missing-policy.toml"],
        ["policy", "explain", "{tmp}/missing-request.json"],
        ["serve", "--state", "{tmp}/state", "--policy", "{tmp}/missing-policy.toml"],
        ["audit", "export", "--state", "{tmp}/state", "--since", "yesterday"],
        ["audit", "export", "--state", "{tmp}/state", "--since", "2026-13-45"],
        ["audit", "export", "--state", "{tmp}/state", "--since", "99999999999d"],
    ],
    ids=[
        "verify-missing-config",
        "tail-missing-config",
        "export-missing-config",
        "check-missing-policy",
        "explain-missing-policy",
        "explain-missing-request",
        "serve-missing-policy",
        "since-word",
        "since-bad-date",
        "since-huge-duration",
    ],
)
def test_user_errors_are_one_clear_line(home: Path, tmp_path: Path, args: list[str]) -> None:
    """Mistakes a user can make exit non-zero with one line on stderr and no traceback."""
    write_request(tmp_path / "req.json", "files.write", {"path": "a", "content": ""})
    proc = run(*(a.format(tmp=tmp_path) for a in args), home=home)
    line = assert_one_line_error(proc)
    assert line.startswith("error: ")


def test_serve_refuses_bad_policy_naming_rule_and_key(home: Path, tmp_path: Path) -> None:
    """`broker serve` with a broken policy stops at once, naming the rule and key."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\neffect = "a.b"\naction = "auto"\napprovals = 2\n')
    proc = run("serve", "--state", str(tmp_path / "state"), "--policy", str(policy), home=home)
    assert_one_line_error(proc, "rules[0].approvals")


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ('[integrations.github]\ntoken = "ghp_abc"\n', ["integrations.github.token", "token_env"]),
        ('[integrations.github]\ntoken_env = "GH"\n', ["integrations.github"]),
        ('[integrations.files]\nroot = "/no/such/dir"\n', ["integrations.files.root"]),
        ('[broker]\nstate_dri = "x"\n', ["broker.state_dri"]),
    ],
    ids=["literal-secret", "unknown-integration", "bad-files-root", "unknown-broker-key"],
)
def test_bad_config_is_one_clear_line(
    home: Path, tmp_path: Path, config: str, names: list[str]
) -> None:
    """A broken broker.toml stops a command with one line naming the key, secret unshown."""
    path = tmp_path / "broker.toml"
    path.write_text(config)
    request = write_request(tmp_path / "req.json", "files.write", {"path": "a", "content": ""})
    proc = run("policy", "explain", str(request), "--config", str(path), home=home)
    line = assert_one_line_error(proc, *names)
    assert "ghp_abc" not in line


@pytest.mark.parametrize("columns", ["60", "200"])
def test_run_help_lists_every_option_at_the_terminals_width(home: Path, columns: str) -> None:
    """`broker run --help` (argparse, on run's light path) wraps at COLUMNS as the other
    commands' help does, and names each option."""
    done = run("run", "--help", home=home, env={"COLUMNS": columns})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "usage: broker run [OPTIONS] -- CMD [ARGS]..."
    assert max(map(len, lines)) <= int(columns) - 2
    for option in ("--image", "--name", "--workspace", "--detach", "--runtime", "--config"):
        assert option in done.stdout
