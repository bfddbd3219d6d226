"""[web.oidc], a rule's approvers/step_up/notify and [approvers]' person keys: each
mistake refused at load with the key named; one person across the CLI and the inbox."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from broker.cli.common import identity
from broker.config import Config
from broker.errors import ConfigError, PolicyError
from broker.identity import Proof, os_user
from broker.people import People
from broker.policy.ruleset import parse_policy
from broker.web.oidc import oidc_settings

ISSUER = {"issuer": "https://login.example.com", "client_id": "inbox"}


def settings(tmp_path: Path, **table: Any) -> Any:
    return oidc_settings(Config(state_dir=tmp_path, web={"oidc": {**ISSUER, **table}}))


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"algorithms": ["RS256", "HS256"]}, "web.oidc.algorithms: HS256"),
        ({"algorithms": ["none"]}, "web.oidc.algorithms: none"),
        ({"algorithms": []}, "web.oidc.algorithms: an empty list"),
        ({"issuer": "http://login.example.com"}, "web.oidc.issuer: 'http://login.example.com'"),
        ({"client_secret": "s3cret"}, "web.oidc.client_secret: secrets are never written"),
        ({"scopes": ["profile"]}, 'web.oidc.scopes: must include "openid"'),
        ({"groups": "x"}, "web.oidc.groups: unknown key"),
    ],
)
def test_oidc_mistakes_refused(tmp_path: Path, table: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(tmp_path, **table)
    assert str(info.value).startswith(named)


def test_oidc_defaults_and_loopback(tmp_path: Path) -> None:
    read = settings(tmp_path, issuer="http://127.0.0.1:9000/")
    assert read.issuer == "http://127.0.0.1:9000"
    assert read.algorithms == ("RS256", "ES256") and "openid" in read.scopes
    assert read.client_secret is None  # a public client: PKCE alone


def rules(text: str) -> Any:
    return parse_policy(tomllib.loads(text), {"git.push": False}, "policy.toml")


def test_rule_terms_recorded_with_the_verdict() -> None:
    pol = rules(
        '[[rules]]\neffect = "git.push"\naction = "approve"\napprovals = 2\n'
        'approvers = ["group:platform", " Alice "]\nstep_up = { max_age = "5m", amr = ["otp"] }\n'
        'notify = "group:platform"\n'
    )
    verdict = pol.rules[0].verdict().to_json()
    assert verdict["approvers"] == ["group:platform", "alice"]
    assert verdict["step_up"] == {"max_age_s": 300.0, "acr": [], "amr": ["otp"]}
    assert verdict["notify"] == "platform"


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ('approvers = ["group:"]', "rules[0].approvers: 'group:' names no group"),
        ("approvers = []", "rules[0].approvers: a list"),
        ('step_up = { max_age = "5m", pin = 1 }', "rules[0].step_up: unknown key 'pin'"),
        ('step_up = "soon"', "rules[0].step_up:"),
        ("notify = 3", "rules[0].notify:"),
    ],
)
def test_rule_term_mistakes_refused(keys: str, named: str) -> None:
    with pytest.raises(PolicyError, match=named.replace("[", r"\[").replace("]", r"\]")):
        rules(f'[[rules]]\neffect = "git.push"\naction = "approve"\n{keys}\n')


def test_only_an_approve_rule_names_approvers() -> None:
    with pytest.raises(PolicyError, match="only an 'approve' rule takes approvers"):
        rules('[[rules]]\neffect = "git.push"\naction = "deny"\napprovers = ["alice"]\n')


def test_people_across_surfaces() -> None:
    people = People.of(
        {
            "alice": {"os_user": "asmith", "oidc_sub": ["248289761001"]},
            "pr-bot": {"oidc_sub": "bot", "acts_for": ["pr-*"]},
            "olga": {"token_expires": datetime(2030, 1, 1, tzinfo=UTC)},
        }
    )
    assert people.of_os_user("asmith") == "alice" and people.of_os_user("bob") == "bob"
    proof = Proof("https://login.example.com", "248289761001", "A. Smith", 0.0)
    assert people.of_proof(proof) == "alice"
    stranger = Proof("https://login.example.com", "77", "A. Smith", 0.0)
    assert people.of_proof(stranger).startswith("oidc:")  # a display name is nobody
    assert people.acts_for("pr-bot", "pr-42") and people.acts_for("pr-bot", "host1.pr-42")
    assert not people.acts_for("pr-bot", "docs") and not people.acts_for("alice", "pr-42")
    assert people.token_live("olga", datetime(2029, 1, 1, tzinfo=UTC))
    assert not people.token_live("olga", datetime(2031, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"a": {"oidc_sub": "1"}, "b": {"oidc_sub": "1"}}, "approvers.b.oidc_sub: '1'"),
        ({"a": {"os_user": 3}}, "approvers.a.os_user: expected a string"),
        ({"a": {"token_expires": "tomorrow"}}, "approvers.a.token_expires"),
        ({"a": {"token_expires": "2030-01-01T00:00:00"}}, "approvers.a.token_expires"),
    ],
)
def test_people_mistakes_refused(table: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        People.of(table)
    assert str(info.value).startswith(named)


def test_cli_os_account_decides_as_its_approver(tmp_path: Path) -> None:
    """`broker approve` run by an OS account that an [approvers] table names with
    os_user is recorded as that approver, so a quorum counts the person once."""
    config = Config(state_dir=tmp_path, approvers={"alice": {"os_user": os_user()}})
    assert identity(None, config) == "alice"
    assert identity(None, Config(state_dir=tmp_path)) == os_user()
