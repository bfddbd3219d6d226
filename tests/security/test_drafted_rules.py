"""Issue 24 finding 6: a rule drafted from one approval names every param that picks
the target or the data, as each built-in effect declares them (`identifying`): it
matches the approved request and refuses each neighbour that differs in one of them."""

from __future__ import annotations

from typing import Any

import pytest

from broker.policy.ruleset import parse_policy
from broker.registry import default_registry
from broker.review.drafting import draft_rule

# one approved request per built-in effect, and a different value for each of its
# identifying params (a neighbour differs from it in that one param)
APPROVED: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "s3.copy_object": (
        {"bucket": "site", "key": "logo.png", "source_bucket": "public", "source_key": "logo.png",
         "source_version_id": "v1"},
        {"bucket": "private", "key": "payroll.csv", "source_bucket": "hr",
         "source_key": "payroll.csv", "source_version_id": "v2"},
    ),
    "s3.put_object": ({"bucket": "b", "key": "k", "body": "x"}, {"bucket": "c", "key": "j"}),
    "s3.delete_object": ({"bucket": "b", "key": "k"}, {"bucket": "c", "key": "j"}),
    "http.request": (
        {"method": "POST", "destination": "crm", "path": "/contacts/42/notes", "json": {}},
        {"method": "DELETE", "destination": "billing", "path": "/admin/users/delete-all"},
    ),
    "github.label.add": (
        {"repo": "acme/api", "number": 7, "labels": ["bug"]},
        {"repo": "acme/web", "number": 8, "labels": ["release-blocker"]},
    ),
    "github.pull_request.create": (
        {"repo": "acme/api", "head": "agent/fix", "base": "main", "title": "t",
         "reviewers": ["alice"]},
        {"repo": "acme/web", "head": "agent/evil", "base": "release", "reviewers": ["bob"]},
    ),
    "github.issue.create": (
        {"repo": "acme/api", "title": "t", "labels": ["bug"]},
        {"repo": "acme/web", "labels": ["security"]},
    ),
    "github.issue.comment": (
        {"repo": "acme/api", "number": 1, "body": "b"},
        {"repo": "acme/web", "number": 2},
    ),
    "github.pull_request.comment": (
        {"repo": "acme/api", "number": 1, "body": "b"},
        {"repo": "acme/web", "number": 2},
    ),
    "email.send": (
        {"to": ["a@example.com"], "cc": ["b@example.com"], "bcc": ["c@example.com"],
         "reply_to": "d@example.com", "subject": "s", "text": "t"},
        {"to": ["x@evil.test"], "cc": ["y@evil.test"], "bcc": ["z@evil.test"],
         "reply_to": "w@evil.test"},
    ),
    "webhook.post": ({"target": "ci", "payload": {}}, {"target": "prod-deploy"}),
    "files.write": (
        {"path": "out/a.txt", "content": "c", "overwrite": False},
        {"path": "out/b.txt", "overwrite": True},
    ),
    "git.push": (
        {"remote": "origin", "branch": "agent/x", "base": "main", "bundle": "b",
         "expected_old": None},
        {"remote": "upstream", "branch": "main", "base": "release"},
    ),
}  # fmt: skip
REGISTRY = default_registry()


def test_every_built_in_effect_declares_params_its_schema_has() -> None:
    """Each built-in effect but code.execute declares `identifying`, all in its schema."""
    for name in REGISTRY.names():
        effect = REGISTRY.effect(name)
        if name == "code.execute":
            continue
        assert effect.identifying, f"{name} declares no identifying params"
        props = effect.schema.get("properties", {})
        assert set(effect.identifying) <= set(props), name
        assert name in APPROVED, f"{name} has no case below"


@pytest.mark.parametrize("effect", sorted(APPROVED))
def test_the_drafted_rule_refuses_each_neighbour(effect: str) -> None:
    approved, other = APPROVED[effect]
    drafted = draft_rule(effect, approved, (), reason="r", reversible=True)
    rule = parse_policy(
        {"rules": [drafted.rule]}, REGISTRY.reversibility(), "t", REGISTRY.schemas()
    ).rules[0]
    assert rule.matches(effect, approved)
    declared = REGISTRY.effect(effect).identifying or ()
    present = [k for k in declared if k in approved]
    assert sorted(present) == sorted(other), f"{effect}: a neighbour per identifying param"
    for key in present:
        neighbour = {**approved, key: other[key]}
        assert not rule.matches(effect, neighbour), f"{effect}: {key} = {other[key]!r} matched"


def test_a_param_the_approval_left_out_stays_out() -> None:
    """`/contacts/42/notes` approved: the same path with a query, and a new file approved
    then written with overwrite = true, are other requests (the rule's `unset`)."""
    http = {"method": "POST", "destination": "crm", "path": "/contacts/42/notes"}
    files = {"path": "notes/a.txt", "content": "c"}
    for effect, approved, added in (
        ("http.request", http, {"query": {"then": "delete-all"}}),
        ("files.write", files, {"overwrite": True}),
    ):
        drafted = draft_rule(effect, approved, (), reason="r", reversible=True)
        rule = parse_policy(
            {"rules": [drafted.rule]}, REGISTRY.reversibility(), "t", REGISTRY.schemas()
        ).rules[0]
        assert rule.matches(effect, approved)
        assert not rule.matches(effect, {**approved, **added})
        assert "set, and the rule is for requests without it" in rule.explain(
            effect, {**approved, **added}
        )
