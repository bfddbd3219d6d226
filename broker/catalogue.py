"""The effect catalogue: what the broker offers a sandbox, published read-only into it.

When the broker starts serving an outbox it writes ``<results>/.effects.json``
(``/results/.effects.json`` in a sandbox): every registered effect with its params
schema, its reversible/idempotent flags, its undo note, and what approval the policy
may ask for it (the matching rules in order, then the default). The in-sandbox client
reads it for ``outbox effects`` and ``outbox mcp``.

The name starts with a dot, so it can never be a result file (``<id>.json``, id in
``[A-Za-z0-9_-]``) and globs for results skip it. It is written like a result: a
temporary name, then a rename, mode 0644, never following a link.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from broker.policy import Policy, Rule, default_verdict
from broker.registry import Registry
from effects.base import EffectHandler

__all__ = ["CATALOGUE_NAME", "VERSION", "build", "description", "publish", "render"]

CATALOGUE_NAME = ".effects.json"
VERSION = 1
log = logging.getLogger("broker.catalogue")


def build(registry: Registry, policy: Policy) -> dict[str, Any]:
    """The catalogue as a JSON object: one entry per registered effect, by name."""
    return {
        "version": VERSION,
        "effects": [_entry(handler, policy) for handler in registry],
    }


def render(registry: Registry, policy: Policy) -> bytes:
    """The catalogue's bytes, as published (computed once per broker)."""
    return json.dumps(build(registry, policy), indent=1, ensure_ascii=False).encode() + b"\n"


def publish(results_fd: int, data: bytes, sandbox: str = "?") -> bool:
    """Write the catalogue into the results dir `results_fd`; False (logged) on failure.

    Never fatal: a sandbox without a catalogue still has the whole outbox protocol.
    """
    from broker.results import write_bytes

    try:
        write_bytes(results_fd, CATALOGUE_NAME, data)
    except OSError as exc:
        log.warning("sandbox %s: cannot publish the effect catalogue: %s", sandbox, exc)
        return False
    return True


def _entry(handler: EffectHandler, policy: Policy) -> dict[str, Any]:
    schema = handler.schema
    rules = list(_approval(handler, policy))
    return {
        "name": handler.name,
        "description": _description(handler, schema),
        "reversible": handler.reversible,
        "idempotent": handler.idempotent,
        "undo": handler.undo,
        "params_schema": schema,
        "approval": {"summary": _summary(rules), "rules": rules},
    }


def description(handler: EffectHandler) -> str:
    """One line saying what the effect does (its schema's title, else its docstring)."""
    return _description(handler, handler.schema)


def _description(handler: EffectHandler, schema: Mapping[str, Any]) -> str:
    title = schema.get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()
    doc = (type(handler).__doc__ or "").strip().splitlines()
    return doc[0] if doc else handler.name


def _approval(handler: EffectHandler, policy: Policy) -> Iterable[dict[str, Any]]:
    """The rules that may decide this effect, in order; the default if one may be reached."""
    for rule in policy.rules:
        if not fnmatchcase(handler.name, rule.effect):
            continue
        yield _rule(rule)
        if not rule.when:
            return  # an unconditional rule: nothing after it is ever reached
    defaults = [handler.reversible]
    if handler.reversible and _varies(handler):
        defaults.append(False)  # some requests of this effect cannot be undone
    for reversible in defaults:
        verdict = default_verdict(reversible)
        yield {
            "rule": "default",
            "when": {} if len(defaults) == 1 else {"reversible": reversible},
            "action": verdict.action,
            "reason": verdict.reason,
            **_gate(verdict.action, verdict.approvals, verdict.timeout_s, verdict.on_timeout),
        }


def _rule(rule: Rule) -> dict[str, Any]:
    return {
        "rule": rule.label,
        "when": dict(rule.when),
        "action": rule.action,
        "reason": rule.reason,
        **_gate(rule.action, rule.approvals, rule.timeout_s, rule.on_timeout),
    }


def _gate(action: str, approvals: int, timeout_s: float, on_timeout: str) -> dict[str, Any]:
    if action != "approve":
        return {}
    return {"approvals": approvals, "timeout_s": timeout_s, "on_timeout": on_timeout}


def _varies(handler: EffectHandler) -> bool:
    """Whether the handler decides reversibility per request (its own reversible_for)."""
    from effects.base import Handler

    own = getattr(type(handler), "reversible_for", None)
    return isinstance(handler, Handler) and own is not Handler.reversible_for


def _summary(rules: list[dict[str, Any]]) -> str:
    """One line an agent can read: what happens to a request, case by case."""
    parts: list[str] = []
    for rule in rules:
        when = rule["when"]
        if "reversible" in when and rule["rule"] == "default":
            case = "when it can be undone" if when["reversible"] else "when it cannot be undone"
        elif when:
            case = "when " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in when.items())
        else:
            case = "otherwise" if parts else "always"
        parts.append(f"{case}: {_action(rule)}")
    return "; ".join(parts)


def _action(rule: Mapping[str, Any]) -> str:
    if rule["action"] == "auto":
        return "applied at once"
    if rule["action"] == "deny":
        return f"denied ({rule['reason']})"
    people = "1 person" if rule["approvals"] == 1 else f"{rule['approvals']} people"
    then = "approved" if rule["on_timeout"] == "approve" else "denied"
    return f"waits for {people} to approve (up to {_duration(rule['timeout_s'])}, then {then})"


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
