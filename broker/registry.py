"""Effect name → handler. Built-ins and plugins are found the same way: the
`broker.effects` entry-point group; every handler is checked against the contract
in `effects.base` when it registers, and its optional members resolved once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, TypeVar

from broker.errors import ConfigError, DuplicateEffect, RegistryError, UnknownEffect
from broker.models import Preview
from broker.settings import Settings
from broker.typing import JSON, Params
from broker.validation import check_schema, did_you_mean
from effects.base import (
    OPTIONAL_FLAGS,
    OPTIONAL_METHODS,
    REQUIRED_FLAGS,
    REQUIRED_METHODS,
    Context,
    EffectHandler,
    Handler,
)

ENTRY_POINT_GROUP = "broker.effects"
EFFECT_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*){1,2}")
V = TypeVar("V")


@dataclass(frozen=True)
class Effect:
    """A registered handler as the broker calls it: optional members resolved to the
    handler's own or to the contract's default, so no caller probes for them."""

    handler: EffectHandler
    origin: str
    schema: Mapping[str, Any]

    @property
    def name(self) -> str:
        return self.handler.name

    @property
    def integration(self) -> str:
        return self.handler.name.split(".", 1)[0]

    @property
    def reversible(self) -> bool:
        return self.handler.reversible

    @property
    def idempotent(self) -> bool:
        return self.handler.idempotent

    @property
    def undo(self) -> str:
        return self.handler.undo

    @property
    def inline(self) -> bool:
        return bool(getattr(self.handler, "inline", False))

    @property
    def assess_inline(self) -> bool:
        """Whether `reversible_for` and `protected_for` may run on the loop: the handler
        says so, or it has neither of its own (the defaults read a flag, or nothing)."""
        kind = type(self.handler)
        own = [
            getattr(kind, name, None) not in (None, getattr(Handler, name))
            for name in ("reversible_for", "protected_for")
        ]
        return bool(getattr(self.handler, "assess_inline", False) or self.inline or not any(own))

    @property
    def protects(self) -> bool:
        """Whether the handler has a `protected_for` of its own."""
        own = getattr(type(self.handler), "protected_for", None)
        return own not in (None, Handler.protected_for)

    @property
    def revertible(self) -> bool:
        return callable(getattr(self.handler, "revert", None))

    def check_config(self, settings: Mapping[str, Any]) -> None:
        if getattr(self.handler, "check_config", None) is not None:
            self.handler.check_config(settings)  # type: ignore[attr-defined]

    def canonical(self, params: Params, ctx: Context) -> Params:
        """The handler's one form of `params` (the params themselves by default)."""
        own = getattr(self.handler, "canonical", None)
        if own is None:
            return params
        found = own(params, ctx)
        if not isinstance(found, Mapping):
            raise TypeError(f"{self.name}.canonical returned {type(found).__name__}, not params")
        return found

    def check(self, params: Params, ctx: Context) -> None:
        if getattr(self.handler, "check", None) is not None:
            self.handler.check(params, ctx)  # type: ignore[attr-defined]

    def reversible_for(self, params: Params, ctx: Context) -> bool:
        own = getattr(self.handler, "reversible_for", None)
        return bool(own(params, ctx)) if own is not None else self.reversible

    def protected_for(self, params: Params, ctx: Context) -> tuple[str, ...]:
        """The protected paths this request touches (none by default), sorted."""
        own = getattr(self.handler, "protected_for", None)
        return tuple(sorted({str(p) for p in own(params, ctx)})) if own is not None else ()

    def idempotent_for(self, params: Params, ctx: Context) -> bool:
        own = getattr(self.handler, "idempotent_for", None)
        return bool(own(params, ctx)) if own is not None else self.idempotent

    def returns(self, settings: Mapping[str, Any]) -> dict[str, str]:
        """What of an answer returns to the sandbox, per target ({} by default)."""
        own = getattr(self.handler, "returns", None)
        return {str(k): str(v) for k, v in own(settings).items()} if own is not None else {}

    @property
    def identifying(self) -> tuple[str, ...] | None:
        """The params a drafted rule names (None: every param)."""
        found = getattr(self.handler, "identifying", None)
        return tuple(found) if found is not None else None

    def preview(self, params: Params, ctx: Context) -> Preview:
        return self.handler.preview(params, ctx)

    def apply(self, params: Params, ctx: Context) -> JSON:
        return self.handler.apply(params, ctx)

    def revert_preview(self, output: Params, ctx: Context) -> Preview:
        result: Preview = self.handler.revert_preview(output, ctx)  # type: ignore[attr-defined]
        return result

    def revert(self, output: Params, ctx: Context) -> JSON:
        result: JSON = self.handler.revert(output, ctx)  # type: ignore[attr-defined]
        return result


class Registry:
    """A dict of handlers keyed by effect name, each verified on registration.

    An entry point named for its effect (`files.write = "effects.files:FilesWrite"`) is
    loaded the first time that effect is asked for, so a broker imports only the
    handlers (and their libraries) it uses; one with another name (a list of handlers)
    is loaded at once. Listing every effect loads them all.
    """

    def __init__(self) -> None:
        self._effects: dict[str, Effect] = {}
        self._lazy: dict[str, EntryPoint] = {}
        self._entry: dict[str, EntryPoint] = {}  # every one named for its effect, kept

    def register(self, handler: Any, origin: str = "(code)") -> EffectHandler:
        """Verify `handler` against the contract and add it; errors name the origin."""
        name = _verify(handler, origin)
        try:
            schema = handler.schema
        except FileNotFoundError as exc:
            raise RegistryError(f"{origin}: {name} has no schema: {exc}") from exc
        if not isinstance(schema, Mapping):
            raise RegistryError(f"{origin}: {name}.schema must be a JSON Schema object")
        check_schema(schema, f"{origin}: {name}.schema")
        if name in self._effects or name in self._lazy:
            first = (
                self._effects[name].origin if name in self._effects else _origin(self._lazy[name])
            )
            raise DuplicateEffect(f"effect {name} is registered twice: by {first} and by {origin}")
        self._effects[name] = Effect(handler, origin, schema)
        return handler  # type: ignore[no-any-return]

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Register every handler that an installed distribution declares."""
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            if not EFFECT_NAME.fullmatch(ep.name):
                self._load(ep)
                continue
            self._entry.setdefault(ep.name, ep)
            if ep.name in self._effects or ep.name in self._lazy:
                first = self._lazy.get(ep.name)
                was = _origin(first) if first else self._effects[ep.name].origin
                raise DuplicateEffect(
                    f"effect {ep.name} is registered twice: by {was} and by {_origin(ep)}"
                )
            self._lazy[ep.name] = ep

    def _load(self, ep: EntryPoint, expect: str | None = None) -> None:
        origin = _origin(ep)
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin names itself and stops the start
            raise RegistryError(f"{origin}: cannot be imported: {exc}") from exc
        for handler in _handlers_of(obj, origin):
            if expect is not None and getattr(handler, "name", None) != expect:
                raise RegistryError(
                    f"{origin}: its handler is named {getattr(handler, 'name', None)!r}; an "
                    "entry point named for an effect must give that effect"
                )
            self.register(handler, origin)

    def get(self, name: str) -> EffectHandler:
        """The handler object itself, as its author wrote it."""
        return self.effect(name).handler

    def effect(self, name: str) -> Effect:
        """The handler as the broker calls it (optional members resolved)."""
        if name not in self._effects and name in self._lazy:
            self._load(self._lazy.pop(name), expect=name)
        try:
            return self._effects[name]
        except KeyError:
            hint = did_you_mean(name, self.names())
            raise UnknownEffect(f"no effect named {name!r} is registered{hint}") from None

    def origin(self, name: str) -> str:
        return self.effect(name).origin

    def names(self) -> list[str]:
        """Every registered effect's name, without loading any handler."""
        return sorted({*self._effects, *self._lazy})

    def fingerprint(self, name: str) -> str | None:
        """What changes when the handler behind an entry-point effect may have changed
        (the entry point, its distribution's version, its module's files), without
        importing it; None for a handler registered in code."""
        ep = self._lazy.get(name)
        if ep is None:
            effect = self._effects.get(name)
            if effect is None or not effect.origin.startswith("entry point "):
                return None
            ep = self._entry.get(name)  # scanning every distribution again costs ~10 ms
            if ep is None:
                return None
        return _fingerprint(ep)

    def __contains__(self, name: object) -> bool:
        return name in self._effects or name in self._lazy

    def __iter__(self) -> Iterator[EffectHandler]:
        return iter(e.handler for e in self.effects())

    def effects(self) -> list[Effect]:
        """Every effect, loaded."""
        for name in list(self._lazy):
            self.effect(name)
        return sorted(self._effects.values(), key=lambda e: e.name)

    def __len__(self) -> int:
        return len(self.names())

    def schema(self, name: str) -> Mapping[str, Any] | None:
        """An effect's params schema, or None when no such effect is registered."""
        return self.effect(name).schema if name in self else None

    def schemas(self) -> Mapping[str, Mapping[str, Any]]:
        """Each effect's params schema; a handler loads when its schema is read (a
        policy reads those of the effects its `when` conditions name)."""
        return _View(self, lambda e: e.schema)

    def reversibility(self) -> Mapping[str, bool]:
        """Each effect's `reversible` flag; a handler loads when its flag is read."""
        return _View(self, lambda e: e.reversible)

    def check_config(
        self, integrations: Mapping[str, Mapping[str, Any]], base_dir: Path | None = None
    ) -> None:
        """Let each configured integration's handlers check its settings (as `Settings`,
        whose secrets resolve beside broker.toml, `base_dir`); refuse unknown sections."""
        served = {name.split(".", 1)[0] for name in self.names()}
        for section in integrations:
            if section not in served:
                raise ConfigError(
                    f"integrations.{section}: no registered effect belongs to it "
                    f"(known: {', '.join(sorted(served))})"
                )
        for name in self.names():
            section = name.split(".", 1)[0]
            if section in integrations or name in self._effects:
                effect = self.effect(name)
                where = f"integrations.{section}"
                effect.check_config(Settings(integrations.get(section, {}), where, base_dir))


class _View(Mapping[str, V]):
    """A read-only view of one fact of every effect, loading its handler on lookup."""

    def __init__(self, registry: Registry, fact: Callable[[Effect], V]) -> None:
        self._registry = registry
        self._fact = fact

    def __getitem__(self, name: str) -> V:
        if name not in self._registry:
            raise KeyError(name)
        return self._fact(self._registry.effect(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry.names())

    def __len__(self) -> int:
        return len(self._registry.names())


def _fingerprint(ep: EntryPoint) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(ep.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    origin = Path(spec.origin)
    files = sorted(origin.parent.glob("*.py")) if origin.name == "__init__.py" else [origin]
    try:
        stamps = [f"{f.name}:{f.stat().st_mtime_ns}:{f.stat().st_size}" for f in files]
    except OSError:
        return None
    version = ep.dist.version if ep.dist is not None else ""
    return "|".join([ep.value, version, *stamps])


def _origin(ep: EntryPoint) -> str:
    origin = f"entry point {ep.name} = {ep.value}"
    return origin + (f" (from {ep.dist.name})" if ep.dist is not None else "")


def _verify(handler: Any, origin: str) -> str:
    """The handler's name, once every member the contract names is what it must be."""
    name = getattr(handler, "name", None)
    if not isinstance(name, str) or not EFFECT_NAME.fullmatch(name):
        raise RegistryError(
            f"{origin}: handler name {name!r} is not <integration>.<verb> "
            "or <integration>.<object>.<verb> in lower case"
        )
    for flag in REQUIRED_FLAGS:
        if not isinstance(getattr(handler, flag, None), bool):
            raise RegistryError(f"{origin}: {name}.{flag} must be True or False")
    if not isinstance(getattr(handler, "undo", None), str):
        raise RegistryError(f"{origin}: {name}.undo must be a sentence saying how to undo it")
    for method in REQUIRED_METHODS:
        if not callable(getattr(handler, method, None)):
            raise RegistryError(f"{origin}: {name} has no {method}() method")
    for method in OPTIONAL_METHODS:
        if hasattr(handler, method) and not callable(getattr(handler, method)):
            raise RegistryError(f"{origin}: {name}.{method} must be a {method}() method")
    for flag in OPTIONAL_FLAGS:
        if hasattr(handler, flag) and not isinstance(getattr(handler, flag), bool):
            raise RegistryError(f"{origin}: {name}.{flag} must be True or False")
    if hasattr(handler, "revert") != hasattr(handler, "revert_preview"):
        raise RegistryError(f"{origin}: {name} must have both revert() and revert_preview()")
    return name


def _handlers_of(obj: Any, origin: str) -> Iterable[Any]:
    if isinstance(obj, type):
        return [obj()]
    if isinstance(obj, (list, tuple)):
        return [o() if isinstance(o, type) else o for o in obj]
    if hasattr(obj, "name"):
        return [obj]
    raise RegistryError(f"{origin}: must point at a handler, a handler class or a list of them")


def default_registry() -> Registry:
    registry = Registry()
    registry.load_entry_points()
    return registry
