"""One rule of the policy: what it matches (an effect glob, `when` conditions on the
params, `after` conditions on the sandbox's earlier effects) and what it decides.
`broker.policy.parsing` makes one from a `[[rules]]` table; `broker.policy.ruleset`
orders them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from broker.models import Verdict
from broker.policy.deciders import (
    DECIDER_KEYS,
    StepUp,
)
from broker.policy.history import NO_HISTORY, History

__all__ = ["ACTIONS", "DEFAULT_TIMEOUT_S", "After", "Reversibility", "Rule"]

ACTIONS = ("auto", "approve", "deny")
# how people may decide what an approve rule holds: within a selection, from Slack
SURFACE_KEYS = ("batch", "slack_buttons", "slack_buttons_irreversible", "approve_in_pr")
RULE_KEYS = {"effect", "when", "action", "reason", "approvals", "timeout", "on_timeout"}
RULE_KEYS |= {*SURFACE_KEYS, *DECIDER_KEYS, "protected_paths", "after", "unset"}
AFTER_KEYS = {"effect", "when", "within"}
PROTECTED_RULE = "protected_paths"
RUNS_IN_SANDBOX = "sandbox"
DEFAULT_TIMEOUT_S = 3600.0

# effect name -> does its handler declare it reversible? (the registered effects)
Reversibility = Mapping[str, bool]


def _lookup(params: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    value: Any = params
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if isinstance(value, list):  # a path through a list: every item must match
            found = [_lookup(item, ".".join(parts[i:])) for item in value]
            if not found or not all(ok for ok, _ in found):
                return False, None
            return True, _Each(v for _, v in found)
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


class _Each(tuple[Any, ...]):
    """The values a path through a list reached; a condition must hold for each."""


def _outside_sandbox(when: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    """A request that declares it runs outside a sandbox (`runs_in` other than
    "sandbox", e.g. code.execute for the caller's own process) is matched only by a rule
    that names `runs_in`: a rule written for sandboxed code never decides for it."""
    runs_in = params.get("runs_in", RUNS_IN_SANDBOX)
    return runs_in != RUNS_IN_SANDBOX and "runs_in" not in when


def _when_matches(when: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    if _outside_sandbox(when, params):
        return False
    for key, expected in when.items():
        found, actual = _lookup(params, key)
        if not found or not _value_matches(expected, actual):
            return False
    return True


@dataclass(frozen=True)
class After:
    """A history condition: an earlier effect of the same sandbox (within a window)."""

    effect: str
    when: Mapping[str, Any] = field(default_factory=dict)
    within_s: float | None = None

    def describe(self) -> str:
        conds = "".join(f", {k} matching {v!r}" for k, v in self.when.items())
        window = f" within {self.within_s:g} s" if self.within_s is not None else ""
        return f"an earlier {self.effect}{conds}{window}"

    def found(self, history: History) -> bool:
        return (
            history.happened(self.effect, lambda p: _when_matches(self.when, p), self.within_s)
            is not None
        )


def _value_matches(expected: Any, actual: Any) -> bool:
    if isinstance(actual, _Each):
        return all(_value_matches(expected, item) for item in actual)
    if isinstance(actual, list):  # a list param: each of its items must match
        return bool(actual) and all(_value_matches(expected, item) for item in actual)
    if isinstance(expected, list):
        return any(_value_matches(e, actual) for e in expected)
    if isinstance(expected, str):
        return isinstance(actual, str) and fnmatchcase(actual, expected)
    return type(expected) is type(actual) and expected == actual


@dataclass(frozen=True)
class Rule:
    """One `[[rules]]` table."""

    index: int
    effect: str
    action: str
    reason: str
    when: Mapping[str, Any] = field(default_factory=dict)
    approvals: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    on_timeout: str = "deny"
    batch: bool = True
    slack_buttons: bool = False
    slack_buttons_irreversible: bool = False
    protected_paths: tuple[str, ...] = ()
    after: tuple[After, ...] = ()  # any one of them must have happened
    kind: str = "rules"  # or "remembered": an accepted proposal (broker.policy.controls)
    reversible_only: bool = False  # remembered from a reversible request: only for those
    unset: tuple[str, ...] = ()  # params a matching request must leave out
    approvers: tuple[str, ...] = ()  # who may decide: names and "group:NAME" (all: empty)
    step_up: StepUp | None = None  # a recent sign-in to decide (broker.policy.deciders)
    notify: str | None = None  # the group told ([notify.groups.NAME])
    approve_in_pr: bool | None = None  # the pull request as the card; None: the integration's

    @property
    def label(self) -> str:
        return f"{self.kind}[{self.index}]"

    def names(self, path: str) -> bool:
        """Whether this rule names a protected path in its own `protected_paths`."""
        if path.startswith("(not known"):  # an assessment that did not finish names nothing
            return False
        return any(fnmatchcase(path, glob) for glob in self.protected_paths)

    def matches(
        self, effect: str, params: Mapping[str, Any], history: History = NO_HISTORY
    ) -> bool:
        if not fnmatchcase(effect, self.effect) or not _when_matches(self.when, params):
            return False
        if any(_lookup(params, key)[0] for key in self.unset):
            return False
        return not self.after or any(a.found(history) for a in self.after)

    def explain(self, effect: str, params: Mapping[str, Any], history: History = NO_HISTORY) -> str:
        """Why this rule does or does not match, in one line."""
        if not fnmatchcase(effect, self.effect):
            return f"effect {effect!r} does not match {self.effect!r}"
        if _outside_sandbox(self.when, params):
            return (
                f"params.runs_in = {params.get('runs_in')!r}: only a rule naming runs_in "
                "matches code that runs outside a sandbox"
            )
        for key, expected in self.when.items():
            found, actual = _lookup(params, key)
            if not found:
                return f"params.{key} is absent"
            if not _value_matches(expected, actual):
                return f"params.{key} = {actual!r} does not match {expected!r}"
        for key in self.unset:
            if _lookup(params, key)[0]:
                return f"params.{key} is set, and the rule is for requests without it"
        conds = [f"params.{k} matches {v!r}" for k, v in self.when.items()]
        if self.after:
            met = [a for a in self.after if a.found(history)]
            if not met:
                wanted = " or ".join(a.describe() for a in self.after)
                return f"this sandbox has no {wanted.removeprefix('an ')}"
            conds.append(f"this sandbox made {met[0].describe()}")
        return f"effect matches {self.effect!r}" + (f" and {', '.join(conds)}" if conds else "")

    def verdict(self) -> Verdict:
        return Verdict(
            action=self.action,
            rule=self.label,
            reason=self.reason,
            approvals=self.approvals,
            timeout_s=self.timeout_s,
            on_timeout=self.on_timeout,
            batch=self.batch,
            slack_buttons=self.slack_buttons,
            slack_buttons_irreversible=self.slack_buttons_irreversible,
            approvers=self.approvers,
            step_up=self.step_up.to_json() if self.step_up else None,
            notify=self.notify,
            approve_in_pr=self.approve_in_pr,
        )
