"""A policy checked against the registered effects: a rule that can never match is an
error, not a silent no-op.

- an `effect` glob that matches no registered effect (`files.writ`) is refused, with a
  "did you mean" among the registered names;
- a `when` key that is no param of any effect the rule matches (`overwrte`) is refused,
  with a "did you mean" among that effect's params (dotted keys walk nested objects and
  arrays; an object open to any key accepts any key below it);
- a rule that an earlier rule always decides for (its effects and conditions cover it)
  is reported as shadowed: a warning, since the policy still means something.

`broker policy check` and every command that serves use it (`load_policy(...,
schemas=...)`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from broker.errors import PolicyError

__all__ = ["check_limits", "check_rules", "shadowed"]

Schemas = Mapping[str, Mapping[str, Any]]


def check_rules(rules: Sequence[Any], schemas: Schemas, source: str) -> list[str]:
    """Refuse rules naming unknown effects or params (in `when` and in `after`); return
    warnings (shadowed rules)."""
    names = sorted(schemas)
    for rule in rules:
        where = f"{source}: {rule.label}"
        matched = _effects(f"{where}.effect", rule.effect, names)
        _check_when(f"{where}.when", rule.when, matched, schemas)
        _check_when(f"{where}.unset", dict.fromkeys(rule.unset), matched, schemas)
        for n, after in enumerate(rule.after):
            here = f"{where}.after" + (f"[{n}]" if len(rule.after) > 1 else "")
            earlier = _effects(f"{here}.effect", after.effect, names)
            _check_when(f"{here}.when", after.when, earlier, schemas)
    return [line for line in shadowed(rules, names)]


def check_limits(limits: Sequence[Any], schemas: Schemas, source: str) -> None:
    """Refuse a limit whose effect glob matches no registered effect."""
    for limit in limits:
        _effects(f"{source}: {limit.label}.effect", limit.effect, sorted(schemas))


def _effects(where: str, glob: str, names: Sequence[str]) -> list[str]:
    matched = [n for n in names if fnmatchcase(n, glob)]
    if not matched:
        raise PolicyError(
            f"{where}: no registered effect matches {glob!r}"
            + _hint(glob, names)
            + " (`broker effects` lists them)"
        )
    return matched


def _check_when(
    where: str, when: Mapping[str, Any], matched: Sequence[str], schemas: Schemas
) -> None:
    for key in when:
        if not any(_has(schemas[n], key.split("."), schemas[n]) for n in matched):
            known = sorted({k for n in matched for k in _keys(schemas[n], key)})
            last = key.rsplit(".", 1)[-1]
            raise PolicyError(
                f"{where}.{key}: {', '.join(matched[:3])} has no param {key!r}"
                + _hint(last, known)
                + "; the rule would never match"
            )


def _hint(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _resolve(node: Any, root: Mapping[str, Any]) -> Any:
    """Follow a local `$ref` (`#/$defs/x`), as far as it goes."""
    seen = 0
    while isinstance(node, Mapping) and isinstance(node.get("$ref"), str) and seen < 16:
        ref = node["$ref"]
        if not ref.startswith("#/"):
            return {}
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, Mapping) else {}
        node, seen = target, seen + 1
    return node


def _branches(node: Mapping[str, Any], root: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = [node]
    for word in ("anyOf", "oneOf", "allOf"):
        for branch in node.get(word, []) or []:
            branch = _resolve(branch, root)
            if isinstance(branch, Mapping):
                found.extend(_branches(branch, root))
    return found


def _open(node: Mapping[str, Any]) -> bool:
    """A schema that lets any key below it: no shape given at all (`json`), or an object
    taking any additional key without saying what it holds."""
    shaped = {"properties", "items", "type", "enum", "const", "anyOf", "oneOf", "allOf"}
    return not (shaped & set(node)) or node.get("additionalProperties") is True


def _has(node: Any, parts: list[str], root: Mapping[str, Any]) -> bool:
    node = _resolve(node, root)
    if not parts:
        return True
    if not isinstance(node, Mapping):
        return False
    if _open(node):
        return True
    for branch in _branches(node, root):
        items = _resolve(branch.get("items"), root)
        if isinstance(items, Mapping) and _has(items, parts, root):
            return True  # a path through a list: each item's key
        props = branch.get("properties") or {}
        if parts[0] in props and _has(props[parts[0]], parts[1:], root):
            return True
        extra = branch.get("additionalProperties")
        if isinstance(extra, Mapping) and parts[0] not in props and _has(extra, parts[1:], root):
            return True
    return False


def _keys(schema: Mapping[str, Any], key: str) -> set[str]:
    """The param names at the level `key` points into, for a hint."""
    node: Any = _resolve(schema, schema)
    for part in key.split(".")[:-1]:
        if not isinstance(node, Mapping):
            return set()
        items = _resolve(node.get("items"), schema)
        if isinstance(items, Mapping):
            node = items
        node = _resolve((node.get("properties") or {}).get(part, {}), schema)
    if isinstance(node, Mapping) and isinstance(node.get("items"), Mapping):
        node = _resolve(node["items"], schema)
    return set(node.get("properties") or {}) if isinstance(node, Mapping) else set()


# -- shadowed rules -------------------------------------------------------------------------


def shadowed(rules: Sequence[Any], names: Sequence[str]) -> list[str]:
    """One warning per rule that an earlier rule always decides for."""
    warnings = []
    for j, later in enumerate(rules):
        theirs = {n for n in names if fnmatchcase(n, later.effect)}
        for earlier in rules[:j]:
            mine = {n for n in names if fnmatchcase(n, earlier.effect)}
            if (
                theirs
                and theirs <= mine
                and _covers(earlier.when, later.when)
                and (not earlier.after or earlier.after == later.after)
            ):
                warnings.append(
                    f"{later.label} never decides: {earlier.label} comes first and matches "
                    "every request it matches; move it up or remove it"
                )
                break
    return warnings


def _covers(first: Mapping[str, Any], then: Mapping[str, Any]) -> bool:
    """Whether every request meeting `then`'s conditions meets `first`'s."""
    for key, expected in first.items():
        if key not in then:
            return False
        values = then[key] if isinstance(then[key], list) else [then[key]]
        for value in values:
            if isinstance(value, str) and any(c in value for c in "*?["):
                if not ((isinstance(expected, str) and expected == "*") or expected == value):
                    return False
            elif not _matches(expected, value):
                return False
    return True


def _matches(expected: Any, value: Any) -> bool:
    """A rule's condition against one literal value (as `broker.policy.ruleset` matches them)."""
    if isinstance(expected, list):
        return any(_matches(e, value) for e in expected)
    if isinstance(expected, str):
        return isinstance(value, str) and fnmatchcase(value, expected)
    return type(expected) is type(value) and expected == value
