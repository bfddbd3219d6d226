"""Finding 10: a policy typo is refused with a hint, a rule that never decides is
reported, and `policy explain` computes what the broker decides, per request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker.testing import BrokerHarness
from tests.support import assert_one_line_error, checked, run_broker


def policy_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("rules", "names"),
    [
        (
            'effect = "files.writ"\naction = "deny"',
            ["rules[0].effect", "did you mean 'files.write'"],
        ),
        (
            'effect = "files.write"\nwhen = { overwrte = true }\naction = "approve"',
            ["rules[0].when.overwrte", "did you mean 'overwrite'"],
        ),
        (
            'effect = "github.pull_request.create"\nwhen = { "files.pth" = "x" }\naction = "deny"',
            ["files.pth", "did you mean 'path'"],
        ),
    ],
)
def test_policy_check_and_serve_refuse_typos(
    home: Path, tmp_path: Path, rules: str, names: list[str]
) -> None:
    """An unknown effect or param key: `policy check` and `serve` both say where, with a
    hint, in one line, and serve never starts."""
    path = policy_file(tmp_path, f"[[rules]]\n{rules}\n")
    assert_one_line_error(run_broker("policy", "check", str(path), home=home), *names)
    (tmp_path / "o").mkdir()
    (tmp_path / "r").mkdir()
    served = run_broker(
        "serve", "--outbox", str(tmp_path / "o"), "--results", str(tmp_path / "r"),
        "--state", str(tmp_path / "s"), "--policy", str(path), home=home,
    )  # fmt: skip
    assert_one_line_error(served, *names)


def test_keys_reaching_into_open_objects_and_lists_are_accepted(home: Path, tmp_path: Path) -> None:
    """`query.page` (an open object) and `files.path` (a list of objects) are params."""
    path = policy_file(
        tmp_path,
        '[[rules]]\neffect = "http.request"\nwhen = { "query.page" = "1" }\naction = "deny"\n'
        '[[rules]]\neffect = "github.pull_request.create"\nwhen = { "files.path" = "docs/*" }\n'
        'action = "auto"\n',
    )
    done = run_broker("policy", "check", str(path), home=home)
    assert done.returncode == 0, done.stderr
    assert "ok, 2 rule(s)" in done.stdout


def test_shadowed_rules_are_warned_about(home: Path, tmp_path: Path) -> None:
    """A rule an earlier one always decides for is named, and why."""
    path = policy_file(
        tmp_path,
        '[[rules]]\neffect = "files.*"\naction = "auto"\n'
        '[[rules]]\neffect = "files.write"\nwhen = { overwrite = true }\naction = "approve"\n',
    )
    done = run_broker("policy", "check", str(path), home=home)
    assert done.returncode == 0, done.stderr
    assert "warning: rules[1] never decides: rules[0] comes first" in done.stdout


EXPLAINED = """
[[rules]]
effect = "files.write"
when = { path = "bin/*" }
action = "deny"
reason = "no binaries"
"""

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("files.write", {"path": "a.txt", "content": "x"}, "auto"),
    ("files.write", {"path": "a.txt", "content": "y", "overwrite": True}, "approve"),
    ("files.write", {"path": "./bin/x", "content": "y"}, "deny"),
    ("http.request", {"method": "GET", "url": "https://example.com/x"}, "approve"),
    ("http.request", {"method": "GET", "destination": "crm", "path": "/x"}, "auto"),
]


@pytest.mark.parametrize(("effect", "params", "action"), CASES)
def test_explain_says_what_the_broker_does(
    home: Path, tmp_path: Path, effect: str, params: dict[str, Any], action: str
) -> None:
    """explain's verdict (per-request reversibility, canonical params) is the running
    broker's: an overwrite waits, a GET to a raw URL waits, one to a destination applies."""
    root = tmp_path / "exports"
    root.mkdir()
    integrations = {
        "files": {"root": str(root)},
        "http": {
            "destinations": {
                "crm": {"base_url": "http://127.0.0.1:9", "allow_networks": ["127.0.0.0/8"]}
            }
        },
    }
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nstate_dir = "state"\npolicy = "policy.toml"\n'
        f'[integrations.files]\nroot = "{root}"\n'
        '[integrations.http.destinations.crm]\nbase_url = "http://127.0.0.1:9"\n'
        'allow_networks = ["127.0.0.0/8"]\n'
    )
    policy_file(tmp_path, EXPLAINED)
    request = tmp_path / "r.json"
    request.write_text(json.dumps({"version": 1, "id": "r1", "effect": effect, "params": params}))
    done = run_broker(
        "policy",
        "explain",
        str(request),
        "--json",
        "--config",
        str(tmp_path / "broker.toml"),
        home=home,
    )
    assert done.returncode == 0, done.stderr
    explained = json.loads(done.stdout)
    assert explained["verdict"]["action"] == action
    with BrokerHarness(tmp_path / "h", policy=EXPLAINED, integrations=integrations) as h:
        if action == "approve":  # an overwrite: the file must be there to be overwritten
            (root / "default").mkdir(exist_ok=True)
            (root / "default" / "a.txt").write_text("x")
        result = checked(h.submit(h.request(effect, params), terminal=False))
    seen = {"pending": "approve", "denied": "deny"}.get(result["status"], "auto")
    if action == "auto":  # the http stand-in is not listening: applied or failed, never asked
        assert result["status"] in ("applied", "failed"), result
    assert seen == action, result
