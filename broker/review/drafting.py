"""The narrowest rule that matches one request: what a reviewer proposes when they
approve something they would approve every time ("approve, and propose a rule").

The rule names the exact effect and, in `when`, every param that picks the request's
target or its data, as its handler declares them (`identifying`: source and
destination for a copy, the path at a destination, the issue and labels, head and
base, the recipients; for an effect that declares none, its short top-level scalars),
each as a literal (glob characters escaped; a list of short values as the list of
them, which a request matches only when each of its items is one of them). Never a
body, a content or a diff; never the protected paths the request touched (the rule has
no `protected_paths`, so requests that touch them still wait for a person, and the
draft says so). Pure functions, but for the declared params read from the registry.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.errors import PolicyError

__all__ = ["Draft", "DraftError", "draft_rule", "escape_glob", "rule_toml", "target_of"]

# never part of a rule, whatever the effect: what a request says rather than where it goes
NEVER = frozenset(
    {
        "body",
        "body_b64",
        "blocks",
        "bundle",
        "commit_message",
        "content",
        "context",
        "diff",
        "files",
        "headers",
        "html",
        "json",
        "message",
        "metadata",
        "payload",
        "query",
        "text",
        "title",
    }
)
MAX_VALUE = 200  # a longer string says something rather than naming a target
MAX_FALLBACK_KEYS = 4
MAX_LIST = 50


class DraftError(PolicyError):
    """No rule narrow enough can be drafted for this request; the message says why."""


@dataclass(frozen=True)
class Draft:
    """A proposed `[[rules]]` table and what a reviewer should know about it."""

    rule: dict[str, Any]
    notes: tuple[str, ...] = field(default_factory=tuple)


def escape_glob(text: str) -> str:
    """`text` as a glob that matches only itself (policy strings are globs)."""
    return re.sub(r"([*?\[])", r"[\1]", text)


@functools.cache
def declared(effect: str) -> tuple[str, ...] | None:
    """The params the registered handler of `effect` says identify a request."""
    from broker.registry import default_registry

    try:
        return default_registry().effect(effect).identifying
    except Exception:  # an unknown or broken effect: the fallback below
        return None


def _identifying(effect: str, params: Mapping[str, Any]) -> tuple[str, ...]:
    keys = declared(effect)
    if keys is not None:
        return keys
    scalars = [k for k in sorted(params) if k not in NEVER and _scalar(params[k])]
    return tuple(scalars[:MAX_FALLBACK_KEYS])


def _scalar(value: Any) -> bool:
    if isinstance(value, list):
        return (
            bool(value)
            and len(value) <= MAX_LIST
            and all(_scalar(v) and not isinstance(v, list) for v in value)
        )
    if isinstance(value, str):
        return 0 < len(value) <= MAX_VALUE and "\n" not in value
    return isinstance(value, (bool, int))


def target_of(effect: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The identifying params of a request (as recorded), for a line in a report."""
    return {k: params[k] for k in _identifying(effect, params) if k in params}


def draft_rule(
    effect: str,
    params: Mapping[str, Any],
    protected: Sequence[str],
    *,
    reason: str,
    reversible: bool,
) -> Draft:
    """The narrowest auto rule matching a request of `effect` with (canonical) `params`
    that touched `protected`; DraftError when its target cannot be pinned down."""
    when: dict[str, Any] = {}
    for key in _identifying(effect, params):
        if key not in params:
            continue
        value = params[key]
        if not _scalar(value):
            raise DraftError(
                f"params.{key} of this {effect} request is not a single short value, "
                "which a rule cannot match exactly; write a rule by hand if you want one"
            )
        when[key] = _literal(value)
    if not when:
        raise DraftError(
            f"nothing in this {effect} request names its target in a short value; "
            "no rule is proposed (a rule on the effect alone would allow all of it)"
        )
    notes = []
    unset = [k for k in _identifying(effect, params) if k not in params]
    if unset and declared(effect) is not None:
        notes.append(f"the rule matches only requests without {', '.join(unset)}")
    if protected:
        shown = ", ".join(list(protected)[:10])
        notes.append(
            f"the request touched protected paths ({shown}); the rule does not name them, "
            "so requests touching them still wait for a person"
        )
    if not reversible:
        notes.append(f"{effect} cannot be undone: requests like this would apply unseen")
    rule: dict[str, Any] = {"effect": effect, "when": when, "action": "auto", "reason": reason}
    if unset and declared(effect) is not None:
        rule["unset"] = unset  # a request adding one (a query, overwrite) is another request
    return Draft(rule, tuple(notes))


def _literal(value: Any) -> Any:
    if isinstance(value, list):
        return [_literal(v) for v in value]
    return escape_glob(value) if isinstance(value, str) else value


def _toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_string(str(value))


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def rule_toml(rule: Mapping[str, Any]) -> str:
    """A rule as the `[[rules]]` table a reviewer would paste into a policy file."""
    lines = ["[[rules]]", f"effect = {_toml_string(str(rule['effect']))}"]
    when = rule.get("when") or {}
    if when:
        pairs = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in when.items())
        lines.append(f"when = {{ {pairs} }}")
    if rule.get("unset"):
        lines.append(f"unset = {_toml_value(list(rule['unset']))}")
    lines.append(f"action = {_toml_string(str(rule['action']))}")
    if "reason" in rule:
        lines.append(f"reason = {_toml_string(str(rule['reason']))}")
    return "\n".join(lines) + "\n"
