"""Effect name → handler. Built-ins and plugins are found the same way: the
`broker.effects` entry-point group; every handler is checked against the contract
in `effects.base` when it registers, and its optional members resolved once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from broker.config import Settings
from broker.errors import ConfigError, DuplicateEffect, RegistryError, UnknownEffect
from broker.models import Preview
from broker.typing import JSON, Params
from broker.validation import compile_schema
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
    """A dict of handlers keyed by effect name, each verified on registration."""

    def __init__(self) -> None:
        self._effects: dict[str, Effect] = {}

    def register(self, handler: Any, origin: str = "(code)") -> EffectHandler:
        """Verify `handler` against the contract and add it; errors name the origin."""
        name = _verify(handler, origin)
        try:
            schema = handler.schema
        except FileNotFoundError as exc:
            raise RegistryError(f"{origin}: {name} has no schema: {exc}") from exc
        if not isinstance(schema, Mapping):
            raise RegistryError(f"{origin}: {name}.schema must be a JSON Schema object")
        compile_schema(schema, f"{origin}: {name}.schema")
        if name in self._effects:
            raise DuplicateEffect(
                f"effect {name} is registered twice: by {self._effects[name].origin} "
                f"and by {origin}"
            )
        self._effects[name] = Effect(handler, origin, schema)
        return handler  # type: ignore[no-any-return]

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Register every handler that an installed distribution declares."""
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            origin = f"entry point {ep.name} = {ep.value}"
            if ep.dist is not None:
                origin += f" (from {ep.dist.name})"
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plugin names itself and stops the start
                raise RegistryError(f"{origin}: cannot be imported: {exc}") from exc
            for handler in _handlers_of(obj, origin):
                self.register(handler, origin)

    def get(self, name: str) -> EffectHandler:
        """The handler object itself, as its author wrote it."""
        return self.effect(name).handler

    def effect(self, name: str) -> Effect:
        """The handler as the broker calls it (optional members resolved)."""
        try:
            return self._effects[name]
        except KeyError:
            raise UnknownEffect(f"no effect named {name!r} is registered") from None

    def origin(self, name: str) -> str:
        return self._effects[name].origin

    def __contains__(self, name: object) -> bool:
        return name in self._effects

    def __iter__(self) -> Iterator[EffectHandler]:
        return iter(e.handler for e in self.effects())

    def effects(self) -> list[Effect]:
        return sorted(self._effects.values(), key=lambda e: e.name)

    def __len__(self) -> int:
        return len(self._effects)

    def schemas(self) -> dict[str, Mapping[str, Any]]:
        return {name: e.schema for name, e in self._effects.items()}

    def reversibility(self) -> dict[str, bool]:
        return {name: e.reversible for name, e in self._effects.items()}

    def check_config(
        self, integrations: Mapping[str, Mapping[str, Any]], base_dir: Path | None = None
    ) -> None:
        """Let each handler check its integration's settings (as `Settings`, whose
        secrets resolve beside broker.toml, `base_dir`); refuse unknown sections."""
        served = {e.integration for e in self._effects.values()}
        for section in integrations:
            if section not in served:
                raise ConfigError(
                    f"integrations.{section}: no registered effect belongs to it "
                    f"(known: {', '.join(sorted(served))})"
                )
        for effect in self.effects():
            where = f"integrations.{effect.integration}"
            effect.check_config(Settings(integrations.get(effect.integration, {}), where, base_dir))


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
