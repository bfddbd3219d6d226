"""Remembered decisions as reviewed rules, on a running broker: approve with --propose
drafts the narrowest rule, `broker policy accept N` makes the next such request apply
at once (no restart), a request that differs in an identifying param still waits, a
deny rule of the policy file still wins, reject leaves nothing, protected paths never
auto-apply. And the proposals' storage on both store back ends."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from broker.models import Record
from broker.policy.ruleset import Policy, parse_policy
from broker.registry import default_registry
from broker.review.drafting import DraftError, draft_rule, escape_glob, rule_toml
from broker.review.proposals import accept, listing, propose, reject, withdraw
from broker.store.base import Store
from broker.testing import BrokerHarness
from tests.stores import chained_events
from tests.support import run_broker
from tests.test_replay import serve_calls

POLICY = """
[[rules]]
effect = "http.request"
when = { path = "/admin/*" }
action = "deny"
reason = "nothing reaches /admin"

[[rules]]
effect = "http.request"
when = { method = "POST" }
action = "approve"
reason = "posts wait for a person"

[[rules]]
effect = "files.write"
action = "approve"
reason = "files wait for a person"
"""


@pytest.fixture
def api() -> Iterator[ThreadingHTTPServer]:
    yield from serve_calls()


@pytest.fixture
def site(tmp_path: Path, api: ThreadingHTTPServer) -> Iterator[dict[str, Any]]:
    exports = tmp_path / "exports"
    exports.mkdir()
    port = api.server_address[1]
    (tmp_path / "policy.toml").write_text(POLICY)
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\nstate_dir = "{tmp_path / "h" / "state"}"\n'
        f'policy = "{tmp_path / "policy.toml"}"\n'
        f'[integrations.files]\nroot = "{exports}"\nprotected_paths = ["locked/*"]\n'
        f'[integrations.http]\nallow_networks = ["127.0.0.0/8"]\n'
        f'[integrations.http.destinations.api]\nbase_url = "http://127.0.0.1:{port}"\n'
        f'[integrations.http.destinations.crm]\nbase_url = "http://127.0.0.1:{port}/crm"\n'
    )
    h = BrokerHarness(
        tmp_path / "h",
        policy=POLICY,
        integrations={
            "files": {"root": str(exports), "protected_paths": ["locked/*"]},
            "http": {
                "allow_networks": ["127.0.0.0/8"],
                "destinations": {
                    "api": {"base_url": f"http://127.0.0.1:{port}"},
                    "crm": {"base_url": f"http://127.0.0.1:{port}/crm"},
                },
            },
        },
    )
    with h:
        yield {"h": h, "config": config, "api": api, "home": tmp_path}


def cli(site: dict[str, Any], *args: str) -> str:
    done = run_broker(*args, "--config", str(site["config"]), home=site["home"])
    assert done.returncode == 0, done.stderr
    return done.stdout


def post(site: dict[str, Any], destination: str, path: str) -> dict[str, Any]:
    h: BrokerHarness = site["h"]
    params = {"method": "POST", "destination": destination, "path": path, "json": {"a": 1}}
    return h.submit(h.request("http.request", params), terminal=False)


def test_an_accepted_proposal_applies_the_next_such_request_at_once(site: dict[str, Any]) -> None:
    first = post(site, "api", "/items")
    assert first["status"] == "pending"
    said = cli(site, "approve", first["id"], "--yes", "--propose")
    assert "proposed as rule 1; it takes effect once someone accepts it" in said
    assert 'when = { method = "POST", destination = "api", path = "/items" }' in said
    assert "matches 1 of 1 past request(s)" in said and "1 of them would have applied" in said
    # proposed, not accepted: the next one still waits
    assert post(site, "api", "/items")["status"] == "pending"
    listed = json.loads(cli(site, "policy", "proposals", "--json"))
    assert [(p["number"], p["state"]) for p in listed] == [(1, "proposed")]
    assert listed[0]["replay"]["matches"] == 2  # brought up to date: two such requests now

    assert "accepted by" in cli(site, "policy", "accept", "1")
    applied = post(site, "api", "/items")
    assert applied["status"] == "applied"  # the running broker, no restart
    assert applied["decided_by"] == "policy"
    assert "remembered[1]" in applied["reason"]
    assert ("POST", "/items") in site["api"].seen
    # another path at the same destination is another target: it waits (issue 24)
    assert post(site, "api", "/other")["status"] == "pending"
    # another destination differs in an identifying param: it waits
    assert post(site, "crm", "/items")["status"] == "pending"
    # the policy file's deny rule matches too: deny wins over the remembered allow
    denied = post(site, "api", "/admin/users")
    assert denied["status"] == "denied" and "rules[0]" in denied["reason"]
    # withdrawn: such requests wait for people again
    cli(site, "policy", "withdraw", "1", "--reason", "too broad")
    assert post(site, "api", "/items")["status"] == "pending"
    events = [e["event"] for e in audit(site)]
    assert events.count("rule_proposed") == events.count("rule_accepted") == 1
    assert events.count("rule_withdrawn") == 1


def audit(site: dict[str, Any]) -> list[dict[str, Any]]:
    h: BrokerHarness = site["h"]
    path = h.state / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_reject_leaves_nothing(site: dict[str, Any]) -> None:
    first = post(site, "api", "/items")
    cli(site, "approve", first["id"], "--yes", "--propose")
    assert "rejected" in cli(site, "policy", "reject", "1", "--reason", "no")
    assert post(site, "api", "/items")["status"] == "pending"
    done = run_broker("policy", "accept", "1", "--config", str(site["config"]), home=site["home"])
    assert done.returncode == 2 and "proposal 1 is rejected" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    h: BrokerHarness = site["h"]
    from broker.store.sqlite import SQLiteStore

    ledger = SQLiteStore(h.state / "ledger.sqlite3")
    assert ledger.controls("rule") == {}
    ledger.close()


def test_a_protected_path_never_auto_applies(site: dict[str, Any]) -> None:
    h: BrokerHarness = site["h"]
    doc = h.request("files.write", {"path": "locked/run.sh", "content": "echo 1\n"})
    first = h.submit(doc, terminal=False)
    assert first["status"] == "pending"
    said = cli(site, "approve", first["id"], "--yes", "--propose")
    assert "the rule does not name them" in said
    cli(site, "policy", "accept", "1")
    assert h.wait(first["id"])["status"] == "applied"
    again = h.request(
        "files.write", {"path": "locked/run.sh", "content": "echo 2\n", "overwrite": True}
    )
    waiting = h.submit(again, terminal=False)
    assert waiting["status"] == "pending"
    assert "protected paths" in waiting["reason"]


def test_a_rule_remembered_from_a_new_file_never_overwrites_it(site: dict[str, Any]) -> None:
    """Approving a new file says nothing about destroying it: the remembered rule decides
    only requests as undoable as the one it was drafted from."""
    h: BrokerHarness = site["h"]
    first = h.submit(
        h.request("files.write", {"path": "notes/a.txt", "content": "1"}), terminal=False
    )
    assert first["status"] == "pending"
    cli(site, "approve", first["id"], "--yes", "--propose")
    cli(site, "policy", "accept", "1")
    assert h.wait(first["id"])["status"] == "applied"
    again = h.submit(
        h.request("files.write", {"path": "notes/a.txt", "content": "1"}), terminal=False
    )
    assert again["status"] != "pending" and "remembered[1]" in again["reason"]
    over = {"path": "notes/a.txt", "content": "2", "overwrite": True}
    waiting = h.submit(h.request("files.write", over), terminal=False)
    assert waiting["status"] == "pending" and "files wait for a person" in waiting["reason"]


def test_a_bad_proposal_number_is_one_line(site: dict[str, Any]) -> None:
    done = run_broker("policy", "accept", "7", "--config", str(site["config"]), home=site["home"])
    assert done.returncode == 2 and "no proposal '7'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# -- drafting ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("effect", "params", "when"),
    [
        (
            "http.request",
            {"method": "GET", "destination": "crm", "path": "/x"},
            {"method": "GET", "destination": "crm", "path": "/x"},
        ),
        (
            "http.request",
            {"method": "PUT", "url": "https://a.test/x?y=1"},
            {"method": "PUT", "url": "https://a.test/x[?]y=1"},
        ),
        (
            "github.pull_request.create",
            {"repo": "o/r", "head": "h", "base": "main", "title": "t", "body": "b"},
            {"repo": "o/r", "base": "main", "head": "h"},
        ),
        (
            "github.issue.comment",
            {"repo": "o/r", "number": 3, "body": "hi"},
            {"repo": "o/r", "number": 3},
        ),
        (
            "s3.put_object",
            {"bucket": "b", "key": "k/*.txt", "body": "x"},
            {"bucket": "b", "key": "k/[*].txt"},
        ),
        ("email.send", {"to": "a@b.test", "subject": "s", "text": "t"}, {"to": "a@b.test"}),
        ("webhook.post", {"target": "ci", "payload": {"a": 1}}, {"target": "ci"}),
        ("files.write", {"path": "out/a.txt", "content": "c"}, {"path": "out/a.txt"}),
        (
            "git.push",
            {"remote": "origin", "branch": "b", "bundle": "x", "expected_old": None},
            {"remote": "origin", "branch": "b"},
        ),
        ("code.execute", {"blocks": [{"code": "1"}]}, None),
        (
            "test.thing",
            {"name": "n", "count": 2, "content": "long", "text": "t", "x": "y\nz"},
            {"count": 2, "name": "n"},
        ),
    ],
)
def test_the_narrowest_rule_per_effect(
    effect: str, params: dict[str, Any], when: dict[str, Any] | None
) -> None:
    if when is None:
        with pytest.raises(DraftError):
            draft_rule(effect, params, (), reason="r", reversible=True)
        return
    drafted = draft_rule(effect, params, (), reason="r", reversible=True)
    unset = drafted.rule.pop("unset", [])
    assert drafted.rule == {"effect": effect, "when": when, "action": "auto", "reason": "r"}
    assert not set(unset) & set(params)
    drafted.rule.update({"unset": unset} if unset else {})
    assert tomllib.loads(rule_toml(drafted.rule))["rules"][0] == drafted.rule


def test_a_list_of_recipients_is_drafted_as_exactly_those() -> None:
    """A list of short values becomes the list of those literals: a request matches only
    when each of its recipients is one of them."""
    registry = default_registry()
    drafted = draft_rule(
        "email.send",
        {"to": ["a@b.test", "c*@d.test"], "subject": "s"},
        (),
        reason="r",
        reversible=False,
    )
    assert drafted.rule["when"] == {"to": ["a@b.test", "c[*]@d.test"]}
    rule = parse_policy(
        {"rules": [drafted.rule]}, registry.reversibility(), "t", registry.schemas()
    ).rules[0]
    assert rule.matches("email.send", {"to": ["a@b.test", "c*@d.test"], "subject": "x"})
    assert not rule.matches("email.send", {"to": ["a@b.test", "cx@d.test"], "subject": "x"})
    assert not rule.matches("email.send", {"to": [], "subject": "x"})


def test_an_escaped_value_matches_only_itself() -> None:
    registry = default_registry()
    drafted = draft_rule(
        "files.write", {"path": "a/[x]*.txt", "content": "c"}, (), reason="r", reversible=True
    )
    policy = parse_policy(
        {"rules": [drafted.rule]}, registry.reversibility(), "t", registry.schemas()
    )
    assert policy.rules[0].matches("files.write", {"path": "a/[x]*.txt"})
    assert not policy.rules[0].matches("files.write", {"path": "a/x-anything.txt"})
    assert escape_glob("a?b") == "a[?]b"


# -- storage on both back ends ---------------------------------------------------------


def recorded(store: Store, path: str, protected: list[str]) -> Record:
    payload = {
        "version": 1,
        "id": "r1",
        "effect": "files.write",
        "params": {"path": path, "content": "c"},
    }
    record = Record(
        sandbox="alpha.sb",
        id="r1",
        name="r1",
        state="pending",
        received_at="2024-01-01T00:00:00.000Z",
        effect="files.write",
        payload=json.dumps(payload),
        sha256="a" * 64,
        reversible=True,
        verdict={"action": "approve", "rule": "rules[0]", "reason": "r"},
        facts={"protected": protected},
    )
    with store.transaction():
        return store.insert(record)


def test_facts_are_stored_and_read_back(store: Store) -> None:
    recorded(store, "locked/a", ["locked/a"])
    assert store.get("alpha.sb", "r1").facts == {"protected": ["locked/a"]}  # type: ignore[union-attr]
    first = store.get("alpha.sb", "r1")
    assert first is not None
    with store.transaction():
        store.update(first, state="denied", facts={"protected": []})
    assert store.get("alpha.sb", "r1").facts == {"protected": []}  # type: ignore[union-attr]


def test_proposals_are_stored_accepted_and_audited(store: Store) -> None:
    policy = Policy()
    record = recorded(store, "out/a.txt", [])
    number, value, new = propose(store, policy, record, "alice")
    assert (number, new, value["state"]) == ("1", True, "proposed")
    assert value["rule"]["when"] == {"path": "out/a.txt"}
    again = propose(store, policy, record, "bob")
    assert again[0] == "1" and again[2] is False  # the same rule is not proposed twice
    accept(store, "1", "bob")
    assert store.controls("rule")["1"]["rule"] == value["rule"]
    assert store.controls("rule")["1"]["accepted_by"] == "bob"
    assert [p["state"] for p in listing(store)] == ["accepted"]
    with pytest.raises(Exception, match="only a proposed one"):
        reject(store, "1", "carol", None)
    withdraw(store, "1", "carol", "done")
    assert store.controls("rule") == {}
    assert listing(store)[0]["state"] == "withdrawn"
    kinds = [e["event"] for e in chained_events(store) if e["event"].startswith("rule_")]
    assert kinds == ["rule_proposed", "rule_accepted", "rule_withdrawn"]
