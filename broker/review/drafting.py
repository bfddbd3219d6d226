"""The narrowest rule that matches one request: what a reviewer proposes when they
approve something they would approve every time ("approve, and propose a rule").

The rule names the exact effect and, in `when`, the params that identify the request's
target (a small choice per effect; for others, its short top-level scalars), each as a
literal (glob characters escaped). Never a body, a content or a diff; never the
protected paths the request touched (the rule has no `protected_paths`, so requests
that touch them still wait for a person, and the draft says so). Pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from broker.errors import PolicyError

__all__ = ["Draft", "DraftError", "draft_rule", "escape_glob", "rule_toml", "target_of"]

# effect glob -> the params that identify what a request of it touches (first match wins)
IDENTIFYING: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("http.request", ("destination", "method")),
    ("github.pull_request.create", ("repo", "base")),
    ("github.*", ("repo",)),
    ("s3.*", ("bucket", "key")),
    ("email.send", ("to",)),
    ("webhook.post", ("target",)),
    ("files.write", ("path",)),
    ("git.push", ("remote", "branch")),
)
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


def _identifying(effect: str, params: Mapping[str, Any]) -> tuple[str, ...]:
    if effect == "http.request" and "destination" not in params:
        return ("url", "method")
    for glob, keys in IDENTIFYING:
        if fnmatchcase(effect, glob):
            return keys
    scalars = [k for k in sorted(params) if k not in NEVER and _scalar(params[k])]
    return tuple(scalars[:MAX_FALLBACK_KEYS])


def _scalar(value: Any) -> bool:
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
        when[key] = escape_glob(value) if isinstance(value, str) else value
    if not when:
        raise DraftError(
            f"nothing in this {effect} request names its target in a short value; "
            "no rule is proposed (a rule on the effect alone would allow all of it)"
        )
    notes = []
    if protected:
        shown = ", ".join(list(protected)[:10])
        notes.append(
            f"the request touched protected paths ({shown}); the rule does not name them, "
            "so requests touching them still wait for a person"
        )
    if not reversible:
        notes.append(f"{effect} cannot be undone: requests like this would apply unseen")
    rule = {"effect": effect, "when": when, "action": "auto", "reason": reason}
    return Draft(rule, tuple(notes))


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
    lines.append(f"action = {_toml_string(str(rule['action']))}")
    if "reason" in rule:
        lines.append(f"reason = {_toml_string(str(rule['reason']))}")
    return "\n".join(lines) + "\n"
