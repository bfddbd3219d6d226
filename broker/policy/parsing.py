"""A `[[rules]]` table of the policy file → a `Rule`, every key checked, with a fault
naming the rule and the key (`where`)."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from broker.clock import parse_duration
from broker.errors import PolicyError
from broker.policy.deciders import DECIDER_KEYS, parse_approvers, parse_notify, parse_step_up
from broker.policy.rules import (
    ACTIONS,
    AFTER_KEYS,
    DEFAULT_TIMEOUT_S,
    RULE_KEYS,
    SURFACE_KEYS,
    After,
    Reversibility,
    Rule,
)

__all__ = ["checked_table", "effect_glob", "parse_rule"]


def parse_rule(
    i: int, raw: Any, reversible: Reversibility, source: str, kind: str = "rules"
) -> Rule:
    where = f"{source}: {kind}[{i}]"
    raw = checked_table(where, raw, RULE_KEYS)
    effect = effect_glob(where, raw, "the effect name")
    action = raw.get("action")
    if action not in ACTIONS:
        raise PolicyError(f"{where}.action: must be one of auto, approve, deny; got {action!r}")
    reason = _reason(where, raw, action)
    when = _when(f"{where}.when", raw.get("when", {}))
    unset = _unset(f"{where}.unset", raw.get("unset", []))
    protected = _protected_paths(where, raw, action)
    after = _after(f"{where}.after", raw.get("after"))
    if action != "approve":
        _no_gate_keys(where, raw)
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


def _reason(where: str, raw: Mapping[str, Any], action: str) -> str:
    reason = raw.get("reason", f"{action} by {where.split(': ')[-1]}")
    if not isinstance(reason, str):
        raise PolicyError(f"{where}.reason: must be a string")
    return reason


def _no_gate_keys(where: str, raw: Mapping[str, Any]) -> None:
    for key in ("approvals", "timeout", "on_timeout", *SURFACE_KEYS, *DECIDER_KEYS):
        if key in raw:
            raise PolicyError(f"{where}.{key}: only an 'approve' rule takes {key}")


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
