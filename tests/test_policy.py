"""The policy file: rule matching, defaults, and refusals at load time."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from broker.errors import PolicyError
from broker.models import Verdict
from broker.policy.ruleset import (
    Policy,
    batch_allowed,
    load_policy,
    parse_duration,
    parse_policy,
    slack_buttons,
)
from broker.registry import Registry
from broker.testing import FakeHandler


def policy(text: str, reversible: dict[str, bool] | None = None) -> Policy:
    """Parse policy TOML text as the broker would load it."""
    return parse_policy(tomllib.loads(text), reversible or {}, "policy.toml")


def refusal(text: str, reversible: dict[str, bool] | None = None) -> str:
    """The message of the PolicyError that loading `text` raises."""
    with pytest.raises(PolicyError) as info:
        policy(text, reversible)
    return str(info.value)


def test_first_matching_rule_wins() -> None:
    """Two rules match; the earlier one decides."""
    pol = policy(
        """
        [[rules]]
        effect = "files.write"
        action = "deny"
        reason = "first"

        [[rules]]
        effect = "files.write"
        action = "auto"
        reason = "second"
        """
    )
    verdict = pol.classify("files.write", {}, reversible=True)
    assert (verdict.action, verdict.rule, verdict.reason) == ("deny", "rules[0]", "first")


def test_later_rule_decides_when_earlier_ones_do_not_match() -> None:
    """A rule for another effect is skipped and the next one decides."""
    pol = policy(
        """
        [[rules]]
        effect = "s3.*"
        action = "deny"

        [[rules]]
        effect = "files.*"
        action = "auto"
        """
    )
    assert pol.classify("files.write", {}, reversible=False).rule == "rules[1]"


@pytest.mark.parametrize(
    ("glob", "effect", "hit"),
    [
        ("s3.*", "s3.put", True),
        ("s3.*", "s3.object.put", True),
        ("s3.*", "s3x.put", False),
        ("*", "github.pull_request.create", True),
        ("github.*.create", "github.pull_request.create", True),
        ("github.*.create", "github.issue.close", False),
        ("files.write", "files.write", True),
        ("files.write", "files.writer", False),
        ("files.?rite", "files.write", True),
        ("Files.write", "files.write", False),
    ],
)
def test_effect_glob(glob: str, effect: str, hit: bool) -> None:
    """The rule's effect is a case-sensitive glob on the whole effect name."""
    pol = policy(f'[[rules]]\neffect = "{glob}"\naction = "deny"\n')
    assert (pol.classify(effect, {}, reversible=True).action == "deny") is hit


@pytest.mark.parametrize(
    ("when", "params", "hit"),
    [
        ('{ bucket = "agent-scratch" }', {"bucket": "agent-scratch"}, True),
        ('{ bucket = "agent-scratch" }', {"bucket": "agent-scratch-2"}, False),
        ('{ bucket = "agent-*" }', {"bucket": "agent-scratch"}, True),
        ('{ bucket = "agent-*" }', {"bucket": "prod"}, False),
        ('{ bucket = ["a", "b*"] }', {"bucket": "a"}, True),
        ('{ bucket = ["a", "b*"] }', {"bucket": "bee"}, True),
        ('{ bucket = ["a", "b*"] }', {"bucket": "c"}, False),
        ('{ "target.repo" = "acme/*" }', {"target": {"repo": "acme/api"}}, True),
        ('{ "target.repo" = "acme/*" }', {"target": {"repo": "evil/api"}}, False),
        ('{ "target.repo" = "acme/*" }', {"target": "acme/api"}, False),
        ('{ "a.b.c" = 1 }', {"a": {"b": {"c": 1}}}, True),
        ('{ bucket = "x" }', {}, False),
        ('{ bucket = "*" }', {}, False),
        ('{ bucket = "*" }', {"bucket": None}, False),
        ('{ bucket = "x", region = "eu" }', {"bucket": "x", "region": "eu"}, True),
        ('{ bucket = "x", region = "eu" }', {"bucket": "x", "region": "us"}, False),
    ],
)
def test_when_conditions(when: str, params: dict[str, Any], hit: bool) -> None:
    """`when` matches exact values, globs, lists and dotted paths; absent never matches."""
    pol = policy(f'[[rules]]\neffect = "s3.put"\nwhen = {when}\naction = "deny"\n')
    assert (pol.classify("s3.put", params, reversible=True).action == "deny") is hit


@pytest.mark.parametrize(
    ("expected", "actual", "hit"),
    [
        ("1", 1, True),
        ("1", True, False),
        ("1", "1", False),
        ("true", True, True),
        ("true", 1, False),
        ("true", "true", False),
        ('"1"', "1", True),
        ('"1"', 1, False),
        ('"true"', True, False),
        ("false", False, True),
        ("false", 0, False),
        ("0", False, False),
        ("2.5", 2.5, True),
    ],
)
def test_when_compares_non_strings_by_type(expected: str, actual: Any, hit: bool) -> None:
    """1, true and "1" are three different values to a `when` condition."""
    pol = policy(f'[[rules]]\neffect = "x.y"\nwhen = {{ v = {expected} }}\naction = "deny"\n')
    assert (pol.classify("x.y", {"v": actual}, reversible=True).action == "deny") is hit


def test_default_for_reversible_effect_is_auto() -> None:
    """With no matching rule a reversible effect applies at once."""
    verdict = Policy().classify("files.write", {}, reversible=True)
    assert (verdict.action, verdict.rule) == ("auto", "default")


def test_default_for_irreversible_effect_waits_an_hour_then_denies() -> None:
    """With no matching rule an irreversible effect needs one person within 1h, else deny."""
    pol = policy('[[rules]]\neffect = "s3.*"\naction = "auto"\n')
    verdict = pol.classify("github.pull_request.create", {}, reversible=False)
    assert verdict.action == "approve"
    assert verdict.rule == "default"
    assert verdict.approvals == 1
    assert verdict.timeout_s == 3600
    assert verdict.on_timeout == "deny"


def test_approve_rule_defaults() -> None:
    """An approve rule without terms needs one approval within an hour and fails closed."""
    verdict = policy('[[rules]]\neffect = "x.y"\naction = "approve"\n').classify(
        "x.y", {}, reversible=False
    )
    assert (verdict.approvals, verdict.timeout_s, verdict.on_timeout) == (1, 3600, "deny")


def test_approve_rule_terms_are_kept() -> None:
    """approvals, timeout and on_timeout from the file reach the verdict."""
    pol = policy(
        """
        [[rules]]
        effect = "x.y"
        action = "approve"
        approvals = 2
        timeout = "4h"
        on_timeout = "approve"
        reason = "two people"
        """,
        {"x.y": True},
    )
    verdict = pol.classify("x.y", {}, reversible=True)
    assert (verdict.approvals, verdict.timeout_s, verdict.on_timeout) == (2, 14400, "approve")
    assert verdict.reason == "two people"


def test_empty_policy_file_uses_defaults(tmp_path: Path) -> None:
    """A policy file with no rules loads and falls through to the defaults."""
    path = tmp_path / "policy.toml"
    path.write_text("")
    pol = load_policy(path, {})
    assert pol.rules == ()
    assert pol.classify("x.y", {}, reversible=False).action == "approve"


@pytest.mark.parametrize(
    ("rule", "names"),
    [
        ('effect = "x.y"\naction = "auto"\ncolour = "red"', ["rules[1]", "colour"]),
        ('effect = "x.y"\naction = "allow"', ["rules[1].action", "allow"]),
        ('effect = "x.y"', ["rules[1].action"]),
        ('action = "auto"', ["rules[1].effect"]),
        ('effect = "x.y"\naction = "approve"\ntimeout = "soon"', ["rules[1].timeout", "soon"]),
        ('effect = "x.y"\naction = "approve"\ntimeout = "4x"', ["rules[1].timeout"]),
        ('effect = "x.y"\naction = "approve"\ntimeout = "0s"', ["rules[1].timeout"]),
        ('effect = "x.y"\naction = "approve"\ntimeout = -5', ["rules[1].timeout"]),
        ('effect = "x.y"\naction = "approve"\napprovals = 0', ["rules[1].approvals"]),
        ('effect = "x.y"\naction = "approve"\napprovals = -1', ["rules[1].approvals"]),
        ('effect = "x.y"\naction = "approve"\napprovals = 1.5', ["rules[1].approvals"]),
        ('effect = "x.y"\naction = "approve"\napprovals = "2"', ["rules[1].approvals"]),
        ('effect = "x.y"\naction = "approve"\napprovals = true', ["rules[1].approvals"]),
        ('effect = "x.y"\naction = "approve"\non_timeout = "maybe"', ["rules[1].on_timeout"]),
        ('effect = "x.y"\naction = "auto"\napprovals = 2', ["rules[1].approvals"]),
        ('effect = "x.y"\naction = "deny"\ntimeout = "1h"', ["rules[1].timeout"]),
        ('effect = "x.y"\naction = "auto"\non_timeout = "deny"', ["rules[1].on_timeout"]),
        ('effect = "x.y"\naction = "auto"\nwhen = { a = [] }', ["rules[1].when.a"]),
        ('effect = "x.y"\naction = "auto"\nwhen = { a = { b = 1 } }', ["rules[1].when.a"]),
        ('effect = "x.y"\naction = "auto"\nwhen = "a"', ["rules[1].when"]),
    ],
    ids=[
        "unknown-key",
        "bad-action",
        "no-action",
        "no-effect",
        "timeout-word",
        "timeout-bad-unit",
        "timeout-zero",
        "timeout-negative",
        "approvals-zero",
        "approvals-negative",
        "approvals-float",
        "approvals-string",
        "approvals-bool",
        "on-timeout-bogus",
        "approvals-on-auto",
        "timeout-on-deny",
        "on-timeout-on-auto",
        "when-empty-list",
        "when-table",
        "when-not-table",
    ],
)
def test_bad_rule_is_refused_naming_rule_and_key(rule: str, names: list[str]) -> None:
    """A bad second rule is refused with a message naming rules[1] and the key."""
    message = refusal(f'[[rules]]\neffect = "ok.ok"\naction = "auto"\n\n[[rules]]\n{rule}\n')
    assert message.startswith("policy.toml: ")
    for name in names:
        assert name in message


def test_unknown_top_level_key_is_refused() -> None:
    """A `[[rule]]` typo is refused instead of silently meaning no rules."""
    assert "'rule'" in refusal('[[rule]]\neffect = "x.y"\naction = "deny"\n')


@pytest.mark.parametrize("timeout", ["inf", '"10000000d"'], ids=["inf", "ten-million-days"])
def test_timeout_beyond_any_date_is_refused(timeout: str) -> None:
    """A timeout no deadline can hold (inf, ten million days) is refused at load."""
    message = refusal(f'[[rules]]\neffect = "x.y"\naction = "approve"\ntimeout = {timeout}\n')
    assert "rules[0].timeout" in message


def test_on_timeout_approve_refused_for_irreversible_effect() -> None:
    """on_timeout = approve on a registered irreversible effect names the effect."""
    registry = Registry()
    registry.register(FakeHandler("bank.transfer", reversible=False), "tests")
    text = '[[rules]]\neffect = "bank.transfer"\naction = "approve"\non_timeout = "approve"\n'
    message = refusal(text, registry.reversibility())
    assert "rules[0].on_timeout" in message
    assert "bank.transfer" in message


def test_on_timeout_approve_refused_when_a_glob_covers_an_irreversible_effect() -> None:
    """A glob that takes in one irreversible effect among reversible ones is refused."""
    registry = Registry()
    registry.register(FakeHandler("bank.note"), "tests")
    registry.register(FakeHandler("bank.transfer", reversible=False), "tests")
    text = '[[rules]]\neffect = "bank.*"\naction = "approve"\non_timeout = "approve"\n'
    assert "bank.transfer" in refusal(text, registry.reversibility())


def test_on_timeout_approve_refused_for_unregistered_effect() -> None:
    """An effect nobody registered is not known to be reversible, so approve is refused."""
    text = '[[rules]]\neffect = "ghost.run"\naction = "approve"\non_timeout = "approve"\n'
    assert "rules[0].on_timeout" in refusal(text, {})


def test_on_timeout_approve_allowed_for_reversible_effect() -> None:
    """on_timeout = approve loads for a registered reversible effect."""
    registry = Registry()
    registry.register(FakeHandler("notes.add", reversible=True), "tests")
    text = '[[rules]]\neffect = "notes.add"\naction = "approve"\non_timeout = "approve"\n'
    pol = policy(text, registry.reversibility())
    assert pol.classify("notes.add", {}, reversible=True).on_timeout == "approve"


def test_bad_toml_is_refused(tmp_path: Path) -> None:
    """A file that is not TOML is refused, naming the file."""
    path = tmp_path / "policy.toml"
    path.write_text("[[rules]\neffect = \n")
    with pytest.raises(PolicyError, match="not valid TOML") as info:
        load_policy(path, {})
    assert str(path) in str(info.value)


def test_missing_policy_file_is_refused(tmp_path: Path) -> None:
    """A policy path that does not exist is an error, not an empty policy."""
    path = tmp_path / "nope.toml"
    with pytest.raises(PolicyError, match="no such policy file") as info:
        load_policy(path, {})
    assert str(path) in str(info.value)


def test_no_policy_path_means_defaults() -> None:
    """Without a policy path the broker runs on the defaults alone."""
    pol = load_policy(None, {})
    assert pol.rules == ()
    assert pol.classify("x.y", {}, reversible=True).action == "auto"


def test_explain_says_why_earlier_rules_did_not_match() -> None:
    """explain gives one line per rule tried, each saying why, up to the deciding rule."""
    pol = policy(
        """
        [[rules]]
        effect = "s3.*"
        action = "auto"

        [[rules]]
        effect = "files.write"
        when = { path = "tmp/*" }
        action = "auto"

        [[rules]]
        effect = "files.write"
        when = { overwrite = true }
        action = "deny"

        [[rules]]
        effect = "files.write"
        when = { mode = "x" }
        action = "auto"

        [[rules]]
        effect = "files.*"
        action = "approve"
        """
    )
    verdict, lines = pol.explain("files.write", {"path": "docs/a", "mode": "y"}, reversible=True)
    assert verdict.rule == "rules[4]"
    assert len(lines) == 5
    assert "does not match 's3.*'" in lines[0]
    assert "'docs/a'" in lines[1] and "tmp/*" in lines[1]
    assert "params.overwrite is absent" in lines[2]
    assert "params.mode" in lines[3] and "'y'" in lines[3]
    assert "MATCH" in lines[4]


def test_explain_falls_through_to_default() -> None:
    """When no rule matches, explain ends with the default it used."""
    pol = policy('[[rules]]\neffect = "s3.*"\naction = "auto"\n')
    verdict, lines = pol.explain("files.write", {}, reversible=False)
    assert verdict.rule == "default"
    assert lines[-1].startswith("default (approve)")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("4h", 14400),
        ("1h30m", 5400),
        ("2d", 172800),
        ("500ms", 0.5),
        ("1.5h", 5400),
        (" 1h 30m ", 5400),
        (45, 45),
    ],
)
def test_parse_duration(text: str | int, seconds: float) -> None:
    """Durations with units, combined units and bare numbers become seconds."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "  ", "h", "4", "4x", "1h30", "s30", "-1h", "0s", "0", "1e3s", "nan", "soon", True, None],
)
def test_parse_duration_refuses(text: Any) -> None:
    """Anything but a positive duration with units is a ValueError that quotes it."""
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(text)


def test_parse_duration_refuses_infinity() -> None:
    """An infinite duration is not a duration."""
    with pytest.raises(ValueError):
        parse_duration(float("inf"))


# -- how people may decide: batch and Slack buttons ------------------------------------


def test_batch_and_slack_terms_travel_with_the_verdict() -> None:
    """batch = false and slack_buttons = true are kept on the verdict the ledger records."""
    pol = policy(
        """
        [[rules]]
        effect = "s3.delete_object"
        action = "approve"
        batch = false

        [[rules]]
        effect = "files.write"
        action = "approve"
        slack_buttons = true
        """,
        {"files.write": True, "s3.delete_object": False},
    )
    strict = pol.classify("s3.delete_object", {}, reversible=False)
    easy = pol.classify("files.write", {}, reversible=True)
    assert (strict.batch, strict.slack_buttons) == (False, False)
    assert (easy.batch, easy.slack_buttons) == (True, True)
    assert strict.to_json()["batch"] is False
    assert Verdict.from_json(strict.to_json()) == strict
    assert Verdict.from_json(easy.to_json()) == easy


def test_default_terms_leave_the_recorded_verdict_as_before() -> None:
    """A rule without the new keys records the same verdict JSON as before they existed."""
    verdict = policy('[[rules]]\neffect = "x.y"\naction = "approve"\n').classify("x.y", {}, True)
    assert set(verdict.to_json()) == {
        "action", "rule", "reason", "approvals", "timeout_s", "on_timeout",
    }  # fmt: skip
    assert batch_allowed(verdict.to_json())
    assert not slack_buttons(verdict.to_json(), reversible=True)


def test_slack_buttons_never_on_irreversible_requests_unless_the_rule_says_so() -> None:
    """A glob rule with slack_buttons shows them on reversible requests only, unless it
    also says slack_buttons_irreversible; the default rule never shows them."""
    some = policy('[[rules]]\neffect = "*"\naction = "approve"\nslack_buttons = true\n')
    every = policy(
        '[[rules]]\neffect = "*"\naction = "approve"\nslack_buttons = true\n'
        "slack_buttons_irreversible = true\n"
    )
    held = some.classify("files.write", {}, reversible=False).to_json()
    assert slack_buttons(held, reversible=True)
    assert not slack_buttons(held, reversible=False)
    both = every.classify("files.write", {}, reversible=False).to_json()
    assert slack_buttons(both, reversible=False)
    assert not slack_buttons(Policy().classify("x.y", {}, False).to_json(), reversible=False)


@pytest.mark.parametrize(
    ("rule", "names"),
    [
        ('effect = "x"\naction = "approve"\nbatch = "no"', ["rules[0].batch", "true or false"]),
        ('effect = "x"\naction = "auto"\nbatch = false', ["rules[0].batch", "'approve' rule"]),
        (
            'effect = "x"\naction = "deny"\nslack_buttons = true',
            ["rules[0].slack_buttons", "'approve' rule"],
        ),
        (
            'effect = "x"\naction = "approve"\nslack_buttons = 1',
            ["rules[0].slack_buttons", "true or false"],
        ),
        (
            'effect = "x"\naction = "approve"\nslack_buttons_irreversible = true',
            ["rules[0].slack_buttons_irreversible", "slack_buttons = true"],
        ),
    ],
    ids=["batch-not-bool", "batch-on-auto", "buttons-on-deny", "buttons-not-bool", "alone"],
)
def test_bad_decision_terms_are_refused_at_load(rule: str, names: list[str]) -> None:
    """A wrong batch / slack_buttons key stops loading with the rule and key named."""
    message = refusal(f"[[rules]]\n{rule}\n")
    for name in names:
        assert name in message


def test_slack_buttons_on_a_named_irreversible_effect_need_the_rule_to_say_so() -> None:
    """slack_buttons on email.send (irreversible) alone would never show: refused, with
    the key that allows it named; with slack_buttons_irreversible it loads."""
    text = '[[rules]]\neffect = "email.send"\naction = "approve"\nslack_buttons = true\n'
    message = refusal(text, {"email.send": False})
    assert "rules[0].slack_buttons" in message
    assert "slack_buttons_irreversible = true" in message
    loaded = policy(text + "slack_buttons_irreversible = true\n", {"email.send": False})
    assert slack_buttons(loaded.classify("email.send", {}, False).to_json(), reversible=False)
