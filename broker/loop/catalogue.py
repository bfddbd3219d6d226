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
import os
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from broker.config import Config
from broker.intake.outbox import Served
from broker.models import PROTOCOL_VERSIONS
from broker.policy.ruleset import Policy, Rule, default_verdict
from broker.registry import Registry
from effects.base import EffectHandler

__all__ = [
    "CATALOGUE_NAME",
    "VERSION",
    "build",
    "effect_facts",
    "facts_cache",
    "publish",
    "render",
]

CATALOGUE_NAME = ".effects.json"
VERSION = 1
log = logging.getLogger("broker.loop.catalogue")


def facts_cache() -> Path | None:
    """Where what the handlers declare is kept: the user's cache dir
    (`$XDG_CACHE_HOME/broker`, else `~/.cache/broker`), shared by every state dir of
    this user, since the facts depend on the installed code alone (each entry is keyed
    by its entry point's fingerprint). None (nothing kept) for a user without a home."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:
            return None
    return Path(base) / "broker" / "effect-facts.json"


Sections = Mapping[str, Mapping[str, Any]]


def build(
    registry: Registry, policy: Policy, cache: Path | None = None, settings: Sections | None = None
) -> dict[str, Any]:
    """The catalogue as a JSON object: one entry per registered effect, by name. With
    `cache` (a file in the state dir), what each handler declares is kept there, so a
    broker does not import every handler to publish it. With `settings` (the
    `[integrations.*]` tables), each configured effect says what of an answer returns."""
    entries = [_entry(facts, policy) for facts in effect_facts(registry, cache)]
    for entry in entries:
        returns = _returns(registry, entry["name"], settings or {})
        if returns:
            entry["returns"] = returns
    return {"version": VERSION, "protocol_versions": list(PROTOCOL_VERSIONS), "effects": entries}


def _returns(registry: Registry, name: str, settings: Sections) -> dict[str, str]:
    """What the handler says returns to the sandbox, per target (only for an effect
    whose integration the host configured: no other handler is imported)."""
    section = settings.get(name.split(".", 1)[0])
    if not section:
        return {}
    try:
        return registry.effect(name).returns(section)
    except Exception as exc:  # never fatal: the catalogue is a courtesy
        log.debug("%s: cannot say what returns to the sandbox: %s", name, exc)
        return {}


def render(
    registry: Registry, policy: Policy, cache: Path | None = None, settings: Sections | None = None
) -> bytes:
    """The catalogue's bytes, as published (computed once per broker)."""
    data = build(registry, policy, cache, settings)
    return json.dumps(data, indent=1, ensure_ascii=False).encode() + b"\n"


def effect_facts(registry: Registry, cache: Path | None = None) -> list[dict[str, Any]]:
    """What every effect's handler declares (name, flags, undo, schema, description),
    from `cache` where the entry point behind it has not changed since."""
    kept: dict[str, Any] = {}
    if cache is not None:
        try:
            kept = json.loads(cache.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            kept = {}
    found, changed = [], False
    for name in registry.names():
        key = registry.fingerprint(name)
        hit = kept.get(name) if isinstance(kept, dict) else None
        if key is not None and isinstance(hit, dict) and hit.get("key") == key:
            found.append(hit["facts"])
            continue
        facts = _facts(registry.get(name))
        if key is not None:
            kept[name] = {"key": key, "facts": facts}
            changed = True
        found.append(facts)
    if changed and cache is not None:
        _keep(cache, kept)
    return found


def _facts(handler: EffectHandler) -> dict[str, Any]:
    schema = dict(handler.schema)
    return {
        "name": handler.name,
        "description": _description(handler, schema),
        "reversible": handler.reversible,
        "idempotent": handler.idempotent,
        "undo": handler.undo,
        "params_schema": schema,
        "varies": _varies(handler),
    }


def _keep(cache: Path, kept: dict[str, Any]) -> None:
    try:
        cache.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept), encoding="utf-8")
        os.replace(tmp, cache)
    except OSError as exc:  # a cache: the next start builds it again
        log.debug("cannot keep the effect facts in %s: %s", cache, exc)


def served(
    config: Config, registry: Registry, policy: Policy, host: str | None
) -> tuple[bytes, Served]:
    """The catalogue, and the outboxes it is published into (with a shared store, each
    named HOST.SANDBOX). What the handlers declare is kept (`facts_cache`), so a start
    imports only the handlers it uses."""
    document = render(registry, policy, facts_cache(), config.integrations)
    boxes = Served(
        config.state_dir / "control",
        lambda box: publish(box.results_fd, document, box.sandbox),
        host=host,
    )
    return document, boxes


def publish(results_fd: int, data: bytes, sandbox: str = "?") -> bool:
    """Write the catalogue into the results dir `results_fd`; False (logged) on failure.

    Never fatal: a sandbox without a catalogue still has the whole outbox protocol.
    """
    from broker.lifecycle.results import write_bytes

    try:
        write_bytes(results_fd, CATALOGUE_NAME, data)
    except OSError as exc:
        log.warning("sandbox %s: cannot publish the effect catalogue: %s", sandbox, exc)
        return False
    return True


def _entry(facts: Mapping[str, Any], policy: Policy) -> dict[str, Any]:
    rules = list(_approval(facts, policy))
    return {
        "name": facts["name"],
        "description": facts["description"],
        "reversible": facts["reversible"],
        "idempotent": facts["idempotent"],
        "undo": facts["undo"],
        "params_schema": facts["params_schema"],
        "approval": {"summary": _summary(rules), "rules": rules},
    }


def _description(handler: EffectHandler, schema: Mapping[str, Any]) -> str:
    title = schema.get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()
    doc = (type(handler).__doc__ or "").strip().splitlines()
    return doc[0] if doc else handler.name


def _approval(facts: Mapping[str, Any], policy: Policy) -> Iterable[dict[str, Any]]:
    """The rules that may decide this effect, in order; the default if one may be reached."""
    for rule in policy.rules:
        if not fnmatchcase(facts["name"], rule.effect):
            continue
        yield _rule(rule)
        if not rule.when:
            return  # an unconditional rule: nothing after it is ever reached
    defaults = [facts["reversible"]]
    if facts["reversible"] and facts["varies"]:
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
