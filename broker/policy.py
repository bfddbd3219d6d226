"""Rules a reviewer can read in a code review, turned into a verdict per request.

Ordered rules; the first whose `effect` glob and `when` conditions match decides.
With no matching rule: reversible effects apply automatically, the rest wait for a
person for one hour and are then denied. A request whose change touches a protected
path (the handler's `protected_for`) waits for a person whatever the rule says, unless
that rule names each such path in its own `protected_paths`; a deny still denies.
`classify` is a pure function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from broker.clock import parse_duration
from broker.errors import PolicyError
from broker.models import Verdict

__all__ = [
    "ACTIONS",
    "Policy",
    "Rule",
    "batch_allowed",
    "load_policy",
    "parse_duration",
    "parse_policy",
    "slack_buttons",
]

ACTIONS = ("auto", "approve", "deny")
# how people may decide what an approve rule holds: within a selection, from Slack
SURFACE_KEYS = ("batch", "slack_buttons", "slack_buttons_irreversible")
RULE_KEYS = {"effect", "when", "action", "reason", "approvals", "timeout", "on_timeout"}
RULE_KEYS |= {*SURFACE_KEYS, "protected_paths"}
PROTECTED_RULE = "protected_paths"
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


def _value_matches(expected: Any, actual: Any) -> bool:
    if isinstance(actual, _Each):
        return all(_value_matches(expected, item) for item in actual)
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

    @property
    def label(self) -> str:
        return f"rules[{self.index}]"

    def names(self, path: str) -> bool:
        """Whether this rule names a protected path in its own `protected_paths`."""
        if path.startswith("(not known"):  # an assessment that did not finish names nothing
            return False
        return any(fnmatchcase(path, glob) for glob in self.protected_paths)

    def matches(self, effect: str, params: Mapping[str, Any]) -> bool:
        if not fnmatchcase(effect, self.effect):
            return False
        for key, expected in self.when.items():
            found, actual = _lookup(params, key)
            if not found or not _value_matches(expected, actual):
                return False
        return True

    def explain(self, effect: str, params: Mapping[str, Any]) -> str:
        """Why this rule does or does not match, in one line."""
        if not fnmatchcase(effect, self.effect):
            return f"effect {effect!r} does not match {self.effect!r}"
        for key, expected in self.when.items():
            found, actual = _lookup(params, key)
            if not found:
                return f"params.{key} is absent"
            if not _value_matches(expected, actual):
                return f"params.{key} = {actual!r} does not match {expected!r}"
        conds = ", ".join(f"params.{k} matches {v!r}" for k, v in self.when.items())
        return f"effect matches {self.effect!r}" + (f" and {conds}" if conds else "")

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
        )


@dataclass(frozen=True)
class Policy:
    """The loaded rules; `classify` is the only thing the pipeline asks of it."""

    rules: tuple[Rule, ...] = ()
    source: str = "(no policy file: defaults only)"
    warnings: tuple[str, ...] = ()  # rules that never decide (broker.policy_check)

    def classify(
        self,
        effect: str,
        params: Mapping[str, Any],
        reversible: bool,
        protected: Sequence[str] = (),
    ) -> Verdict:
        return self.explain(effect, params, reversible, protected)[0]

    def explain(
        self,
        effect: str,
        params: Mapping[str, Any],
        reversible: bool,
        protected: Sequence[str] = (),
    ) -> tuple[Verdict, list[str]]:
        """The verdict and one line per rule tried, up to the one that decided (and a
        last line when protected paths overrule it)."""
        lines: list[str] = []
        for rule in self.rules:
            hit = rule.matches(effect, params)
            lines.append(
                f"{rule.label} ({rule.action}): {'MATCH' if hit else 'no'}: "
                f"{rule.explain(effect, params)}"
            )
            if hit:
                return _guarded(rule.verdict(), rule, protected, lines)
        verdict = default_verdict(reversible)
        lines.append(f"default ({verdict.action}): {verdict.reason}")
        return _guarded(verdict, None, protected, lines)


def _guarded(
    verdict: Verdict, rule: Rule | None, protected: Sequence[str], lines: list[str]
) -> tuple[Verdict, list[str]]:
    """A protected path not named by the deciding rule makes a person decide."""
    unnamed = [p for p in protected if rule is None or not rule.names(p)]
    if not unnamed or verdict.action == "deny":
        return verdict, lines
    shown = ", ".join(unnamed[:10]) + (
        f" and {len(unnamed) - 10} more" if len(unnamed) > 10 else ""
    )
    reason = (
        f"the change touches protected paths ({shown}); a person must approve it whatever "
        f"the rules say ({verdict.rule} said {verdict.action})"
    )
    timeout = verdict.timeout_s if verdict.action == "approve" else DEFAULT_TIMEOUT_S
    guarded = replace(
        verdict,
        action="approve",
        rule=f"{verdict.rule}+{PROTECTED_RULE}",
        reason=reason,
        timeout_s=timeout,
        on_timeout="deny",
        batch=False,
        slack_buttons=False,
        slack_buttons_irreversible=False,
    )
    lines.append(f"{PROTECTED_RULE} (approve): {reason}")
    return guarded, lines


def default_verdict(reversible: bool) -> Verdict:
    if reversible:
        return Verdict("auto", "default", "no rule matched; reversible effects apply at once")
    return Verdict(
        "approve",
        "default",
        "no rule matched; irreversible effects wait for a person",
        approvals=1,
        timeout_s=DEFAULT_TIMEOUT_S,
        on_timeout="deny",
    )


def load_policy(
    path: Path | None,
    reversible: Reversibility,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> Policy:
    """Read and check a policy file; a fault names the rule and the key. With the
    registered effects' `schemas`, unknown effects and params are refused too."""
    if path is None:
        return Policy()
    from broker.config import read_toml

    data = read_toml(path, PolicyError, "policy file")
    return parse_policy(data, reversible, str(path), schemas)


def parse_policy(
    data: Mapping[str, Any],
    reversible: Reversibility,
    source: str,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> Policy:
    extra = set(data) - {"rules"}
    if extra:
        raise PolicyError(f"{source}: unknown top-level key {sorted(extra)[0]!r}")
    raw_rules = data.get("rules", [])
    if not isinstance(raw_rules, list):
        raise PolicyError(f"{source}: 'rules' must be an array of tables ([[rules]])")
    rules = tuple(_rule(i, raw, reversible, source) for i, raw in enumerate(raw_rules))
    if schemas is None:
        return Policy(rules, source)
    from broker.policy_check import check_rules

    return Policy(rules, source, tuple(check_rules(rules, schemas, source)))


def _rule(i: int, raw: Any, reversible: Reversibility, source: str) -> Rule:
    where = f"{source}: rules[{i}]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: must be a table")
    unknown = set(raw) - RULE_KEYS
    if unknown:
        raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    effect = raw.get("effect")
    if not isinstance(effect, str) or not effect:
        raise PolicyError(f"{where}.effect: required, a glob on the effect name")
    action = raw.get("action")
    if action not in ACTIONS:
        raise PolicyError(f"{where}.action: must be one of auto, approve, deny; got {action!r}")
    reason = raw.get("reason", f"{action} by {where.split(': ')[-1]}")
    if not isinstance(reason, str):
        raise PolicyError(f"{where}.reason: must be a string")
    when = raw.get("when", {})
    if not isinstance(when, dict):
        raise PolicyError(f"{where}.when: must be a table of param = value, glob or list")
    for key, value in when.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(
            isinstance(v, (str, int, float, bool)) and not isinstance(v, dict) for v in values
        ):
            raise PolicyError(f"{where}.when.{key}: must be a value, a glob or a list of them")
    protected = _protected_paths(where, raw, action)
    if action != "approve":
        for key in ("approvals", "timeout", "on_timeout", *SURFACE_KEYS):
            if key in raw:
                raise PolicyError(f"{where}.{key}: only an 'approve' rule takes {key}")
        return Rule(i, effect, action, reason, when, protected_paths=protected)
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
    surfaces = _surfaces(where, raw, effect, reversible)
    return Rule(
        i, effect, action, reason, when, approvals, timeout_s, on_timeout, *surfaces, protected
    )


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


def slack_buttons(verdict: Mapping[str, Any] | None, reversible: bool | None) -> bool:
    """Whether a recorded verdict lets Slack carry Approve/Deny buttons for this request:
    only when its rule says so, and on an irreversible request only when it says that too."""
    terms = verdict or {}
    if terms.get("action") != "approve" or terms.get("slack_buttons") is not True:
        return False
    return reversible is True or terms.get("slack_buttons_irreversible") is True


def batch_allowed(verdict: Mapping[str, Any] | None) -> bool:
    """Whether a recorded verdict lets a person decide the request within a selection."""
    return (verdict or {}).get("batch", True) is not False


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
