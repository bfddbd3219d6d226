"""One rule of the policy: what it matches (an effect glob, `when` conditions on the
params, `after` conditions on the sandbox's earlier effects) and how a `[[rules]]` table
becomes one, with a fault naming the rule and the key. `broker.policy.ruleset` orders them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from broker.clock import parse_duration
from broker.errors import PolicyError
from broker.models import Verdict
from broker.policy.deciders import (
    DECIDER_KEYS,
    StepUp,
    parse_approvers,
    parse_notify,
    parse_step_up,
)
from broker.policy.history import NO_HISTORY, History

__all__ = [
    "ACTIONS",
    "DEFAULT_TIMEOUT_S",
    "After",
    "Reversibility",
    "Rule",
    "checked_table",
    "effect_glob",
    "parse_rule",
]

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


def parse_rule(
    i: int, raw: Any, reversible: Reversibility, source: str, kind: str = "rules"
) -> Rule:
    where = f"{source}: {kind}[{i}]"
    raw = checked_table(where, raw, RULE_KEYS)
    effect = effect_glob(where, raw, "the effect name")
    action = raw.get("action")
    if action not in ACTIONS:
        raise PolicyError(f"{where}.action: must be one of auto, approve, deny; got {action!r}")
    reason = raw.get("reason", f"{action} by {where.split(': ')[-1]}")
    if not isinstance(reason, str):
        raise PolicyError(f"{where}.reason: must be a string")
    when = _when(f"{where}.when", raw.get("when", {}))
    unset = _unset(f"{where}.unset", raw.get("unset", []))
    protected = _protected_paths(where, raw, action)
    after = _after(f"{where}.after", raw.get("after"))
    if action != "approve":
        for key in ("approvals", "timeout", "on_timeout", *SURFACE_KEYS, *DECIDER_KEYS):
            if key in raw:
                raise PolicyError(f"{where}.{key}: only an 'approve' rule takes {key}")
        return Rule(
            i,
            effect,
            action,
            reason,
            when,
            protected_paths=protected,
            after=after,
            kind=kind,
            unset=unset,
        )
    approvals, timeout_s, on_timeout = _gate_terms(where, raw, effect, reversible)
    surfaces = _surfaces(where, raw, effect, reversible)
    return Rule(
        i,
        effect,
        action,
        reason,
        when,
        approvals,
        timeout_s,
        on_timeout,
        *surfaces,
        protected,
        after,
        kind,
        unset=unset,
        approvers=parse_approvers(f"{where}.approvers", raw.get("approvers")),
        step_up=parse_step_up(f"{where}.step_up", raw.get("step_up")),
        notify=parse_notify(f"{where}.notify", raw.get("notify")),
        approve_in_pr=_approve_in_pr(where, raw.get("approve_in_pr")),
    )


def _gate_terms(
    where: str, raw: Mapping[str, Any], effect: str, reversible: Reversibility
) -> tuple[int, float, str]:
    """An approve rule's quorum, deadline and what its deadline does."""
    approvals = raw.get("approvals", 1)
    if not isinstance(approvals, int) or isinstance(approvals, bool) or approvals < 1:
        raise PolicyError(f"{where}.approvals: must be a whole number ≥ 1")
    try:
        timeout_s = parse_duration(raw.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError as exc:
        raise PolicyError(f"{where}.timeout: {exc}") from exc
    on_timeout = raw.get("on_timeout", "deny")
    if on_timeout not in ("deny", "approve"):
        raise PolicyError(f"{where}.on_timeout: must be 'deny' or 'approve'; got {on_timeout!r}")
    if on_timeout == "approve":
        _refuse_irreversible_auto_approve(where, effect, reversible)
    return approvals, timeout_s, on_timeout


def _approve_in_pr(where: str, value: Any) -> bool | None:
    """`approve_in_pr`: this rule's requests shown (or not) as a pull request's card."""
    if value is not None and not isinstance(value, bool):
        raise PolicyError(f"{where}.approve_in_pr: must be true or false; got {value!r}")
    return value


def _unset(where: str, value: Any) -> tuple[str, ...]:
    """`unset = ["query"]`: params a request must leave out for the rule to match."""
    if not isinstance(value, list) or not all(isinstance(k, str) and k for k in value):
        raise PolicyError(f"{where}: must be a list of param names")
    return tuple(value)


def checked_table(where: str, raw: Any, keys: set[str]) -> Mapping[str, Any]:
    """A policy table with only `keys` in it, or a PolicyError naming what is wrong."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: must be a table")
    unknown = set(raw) - keys
    if unknown:
        raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    return raw


def effect_glob(where: str, raw: Mapping[str, Any], what: str) -> str:
    effect = raw.get("effect")
    if not isinstance(effect, str) or not effect:
        raise PolicyError(f"{where}.effect: required, a glob on {what}")
    return effect


def _when(where: str, when: Any) -> dict[str, Any]:
    if not isinstance(when, dict):
        raise PolicyError(f"{where}: must be a table of param = value, glob or list")
    for key, value in when.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(
            isinstance(v, (str, int, float, bool)) and not isinstance(v, dict) for v in values
        ):
            raise PolicyError(f"{where}.{key}: must be a value, a glob or a list of them")
    return when


def _after(where: str, value: Any) -> tuple[After, ...]:
    """`after = { effect = "http.request", when = {...}, within = "1h" }`, or a list of
    such tables (any one of them)."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not items:
        raise PolicyError(f"{where}: must be a table (or a list of tables) naming an effect")
    found = []
    for n, item in enumerate(items):
        here = f"{where}[{n}]" if isinstance(value, list) else where
        item = checked_table(here, item, AFTER_KEYS)
        effect = effect_glob(here, item, "the earlier effect's name")
        within = None
        if "within" in item:
            try:
                within = parse_duration(item["within"])
            except ValueError as exc:
                raise PolicyError(f"{here}.within: {exc}") from exc
        found.append(After(effect, _when(f"{here}.when", item.get("when", {})), within))
    return tuple(found)


def _protected_paths(where: str, raw: Mapping[str, Any], action: str) -> tuple[str, ...]:
    """The protected paths a rule names explicitly: each a path or a glob with a literal
    part (a bare `*` names nothing); a deny rule has nothing to let through."""
    value = raw.get("protected_paths")
    if value is None:
        return ()
    if action == "deny":
        raise PolicyError(f"{where}.protected_paths: a deny rule denies them already")
    if not isinstance(value, list) or not value:
        raise PolicyError(f"{where}.protected_paths: must be a list of paths or globs")
    for glob in value:
        if not isinstance(glob, str) or not glob.strip("*?[]/!"):
            raise PolicyError(
                f"{where}.protected_paths: {glob!r} names no path; name each protected "
                'path (or a glob with a literal part, e.g. ".github/workflows/lint.yml")'
            )
    return tuple(value)


def _surfaces(
    where: str, raw: Mapping[str, Any], glob: str, reversible: Reversibility
) -> tuple[bool, bool, bool]:
    """batch, slack_buttons, slack_buttons_irreversible: true or false, and consistent."""
    defaults = {"batch": True, "slack_buttons": False, "slack_buttons_irreversible": False}
    values = {key: raw.get(key, default) for key, default in defaults.items()}
    for key, value in values.items():
        if not isinstance(value, bool):
            raise PolicyError(f"{where}.{key}: must be true or false; got {value!r}")
    if values["slack_buttons_irreversible"] and not values["slack_buttons"]:
        raise PolicyError(f"{where}.slack_buttons_irreversible: goes with slack_buttons = true")
    literal = not any(c in glob for c in "*?[")
    if (
        values["slack_buttons"]
        and not values["slack_buttons_irreversible"]
        and literal
        and reversible.get(glob) is False
    ):
        raise PolicyError(
            f"{where}.slack_buttons: {glob} is irreversible, and Slack buttons are never "
            "shown on irreversible requests unless the rule says so: add "
            "slack_buttons_irreversible = true if a click in Slack should approve it"
        )
    return values["batch"], values["slack_buttons"], values["slack_buttons_irreversible"]


def _refuse_irreversible_auto_approve(where: str, glob: str, reversible: Reversibility) -> None:
    names = [n for n in reversible if fnmatchcase(n, glob)]
    if not names and "*" not in glob and "?" not in glob and "[" not in glob:
        names = [glob]
    for name in names:
        if reversible.get(name) is not True:
            raise PolicyError(
                f"{where}.on_timeout: 'approve' is allowed only for reversible effects, "
                f'and {name} is not reversible; use on_timeout = "deny"'
            )
