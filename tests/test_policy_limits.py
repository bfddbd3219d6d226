"""The policy language's newer parts: `[[limits]]` (quotas and rates), `after` history
conditions, and remembered rules: how they load, what they refuse, how they decide."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from broker.errors import PolicyError
from broker.policy.history import History, Past
from broker.policy.ruleset import Policy, parse_policy, remembered_rule
from broker.registry import default_registry
from broker.testing import BrokerHarness, FakeClock, FakeHandler
from tests.support import assert_one_line_error, run_broker

REGISTRY = default_registry()


def strict(text: str) -> Policy:
    """As `serve` loads it: checked against the registered effects."""
    return parse_policy(
        tomllib.loads(text), REGISTRY.reversibility(), "policy.toml", REGISTRY.schemas()
    )


def refused(text: str) -> str:
    with pytest.raises(PolicyError) as info:
        strict(text)
    return str(info.value)


def history(*past: tuple[str, dict[str, object], str, float], now: float = 10_000.0) -> History:
    items = [Past(effect, params, state, at) for effect, params, state, at in past]
    return History(lambda: items, now)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[limits]]\neffect = "files.write"\n', "give max (per sandbox) or rate"),
        ('[[limits]]\neffect = "files.write"\nmax = -1\n', "limits[0].max: must be a whole number"),
        ('[[limits]]\neffect = "files.write"\nrate = "10 per hour"\n', 'must read "COUNT/WINDOW"'),
        ('[[limits]]\neffect = "files.write"\nrate = "0/1h"\n', "above zero"),
        ('[[limits]]\neffect = "files.write"\nmax = 1\naction = "auto"\n', "'approve' or 'deny'"),
        ('[[limits]]\neffect = "files.write"\nmax = 1\nper = "host"\n', "unknown key 'per'"),
        ('[[limits]]\neffect = "files.writ"\nmax = 1\n', "did you mean 'files.write'"),
        (
            '[[rules]]\neffect = "email.send"\naction = "approve"\n'
            'after = { effect = "http.requst" }\n',
            "rules[0].after.effect: no registered effect matches 'http.requst'",
        ),
        (
            '[[rules]]\neffect = "email.send"\naction = "approve"\n'
            'after = { effect = "http.request", when = { destnation = "crm" } }\n',
            "did you mean 'destination'",
        ),
        (
            '[[rules]]\neffect = "email.send"\naction = "approve"\n'
            'after = { effect = "http.request", since = "1h" }\n',
            "rules[0].after: unknown key 'since'",
        ),
    ],
)
def test_mistakes_are_refused_naming_the_key(text: str, says: str) -> None:
    assert says in refused(text)


def test_policy_check_prints_a_limit_typo_as_one_line(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[[limits]]\neffect = "github.pull_request.crate"\nmax = 3\n')
    done = run_broker("policy", "check", str(path), home=home)
    assert_one_line_error(done, "limits[0].effect", "did you mean 'github.pull_request.create'")


SENDS = """
[[rules]]
effect = "email.send"
after = [{ effect = "http.request", when = { destination = "crm" }, within = "1h" },
         { effect = "s3.copy_object" }]
action = "approve"
reason = "this sandbox read customer data"

[[rules]]
effect = "email.send"
action = "auto"
reason = "internal mail"
"""


def test_after_looks_only_at_effects_that_may_have_happened() -> None:
    pol = strict(SENDS)
    params = {"to": ["a@example.com"], "subject": "hi", "body": "x"}
    crm = ("http.request", {"destination": "crm", "method": "GET"}, "applied", 9_000.0)
    assert pol.classify("email.send", params, False, (), history(crm)).rule == "rules[0]"
    denied = (*crm[:2], "denied", 9_000.0)
    assert pol.classify("email.send", params, False, (), history(denied)).rule == "rules[1]"
    old = (*crm[:3], 1_000.0)  # more than an hour before now
    assert pol.classify("email.send", params, False, (), history(old)).rule == "rules[1]"
    other = ("http.request", {"destination": "weather", "method": "GET"}, "applied", 9_000.0)
    assert pol.classify("email.send", params, False, (), history(other)).rule == "rules[1]"
    s3 = ("s3.copy_object", {"bucket": "b", "key": "k"}, "applying", 0.0)
    verdict, trace = pol.explain("email.send", params, False, (), history(other, s3))
    assert verdict.rule == "rules[0]"
    assert "this sandbox made an earlier s3.copy_object" in trace[0]


def test_a_rate_counts_only_its_window_and_approve_parks_beyond_it() -> None:
    pol = strict(
        '[[rules]]\neffect = "files.write"\naction = "auto"\n'
        '[[limits]]\neffect = "files.write"\nrate = "2/10m"\naction = "approve"\n'
    )
    w = ("files.write", {"path": "a"}, "applied")
    recent = history((*w, 9_500.0), (*w, 9_900.0))
    verdict = pol.classify("files.write", {"path": "b", "content": ""}, True, (), recent)
    assert verdict.action == "approve" and verdict.rule == "limits[0]"
    assert verdict.reason.startswith("rate limit: 2 files.write in this sandbox within 10m")
    assert verdict.batch is False  # each one beyond a limit is looked at on its own
    older = history((*w, 1_000.0), (*w, 9_900.0))
    assert pol.classify("files.write", {"path": "b", "content": ""}, True, (), older).action == (
        "auto"
    )


def test_a_deny_rule_wins_over_a_remembered_allow_wherever_it_stands() -> None:
    pol = strict(
        '[[rules]]\neffect = "files.write"\naction = "approve"\n'
        '[[rules]]\neffect = "files.write"\nwhen = { path = "bin/*" }\naction = "deny"\n'
    )
    remembered = remembered_rule(7, {"effect": "files.write", "action": "auto"})
    pol = pol.with_remembered([remembered])
    verdict, trace = pol.explain("files.write", {"path": "notes/a.txt"}, True)
    assert (verdict.action, verdict.rule) == ("auto", "remembered[7]")
    verdict, trace = pol.explain("files.write", {"path": "bin/run"}, True)
    assert (verdict.action, verdict.rule) == ("deny", "rules[1]")
    assert "overruled: rules[1] denies (deny wins)" in trace[-1]


def test_a_remembered_rule_never_passes_a_protected_path() -> None:
    pol = Policy().with_remembered([remembered_rule(1, {"effect": "git.push", "action": "auto"})])
    verdict = pol.classify("git.push", {}, False, (".github/workflows/ci.yml",))
    assert verdict.action == "approve" and "protected paths" in verdict.reason


@pytest.mark.parametrize(
    "raw",
    [
        {"effect": "email.*", "action": "auto"},
        {"effect": "email.send", "action": "approve"},
        {"effect": "git.push", "action": "auto", "protected_paths": [".github/x.yml"]},
    ],
)
def test_a_remembered_rule_is_an_auto_rule_on_one_effect(raw: dict[str, object]) -> None:
    with pytest.raises(PolicyError, match="an auto rule on one effect"):
        remembered_rule(3, raw)


def test_a_rate_window_moves_on_with_the_broker_clock(tmp_path: Path, fake: FakeHandler) -> None:
    """rate = "2/1h" on a running broker: the third request within the hour waits for a
    person; once the broker's clock has moved an hour on, the next one is applied."""
    clock = FakeClock()
    policy = (
        '[[rules]]\neffect = "test.record"\naction = "auto"\n'
        '[[limits]]\neffect = "test.record"\nrate = "2/1h"\naction = "approve"\n'
    )
    with BrokerHarness(tmp_path / "h", handlers=[fake], policy=policy, clock=clock) as h:
        for value in (0, 1):
            assert h.submit(h.request("test.record", {"value": value}))["status"] == "applied"
        third = h.submit(h.request("test.record", {"value": 2}), terminal=False)
        assert third["status"] == "pending"
        assert "rate limit: 2 test.record in this sandbox within 1h" in third["reason"]
        clock.advance(3600)
        assert h.submit(h.request("test.record", {"value": 3}))["status"] == "applied"
    assert [p["value"] for p in fake.applied] == [0, 1, 3]
