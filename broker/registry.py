"""Effect name → handler. Built-ins and plugins are found the same way: the
`broker.effects` entry-point group; every handler is checked when it registers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any

from broker.errors import ConfigError, DuplicateEffect, RegistryError, UnknownEffect
from broker.typing import EffectHandler
from broker.validation import compile_schema

ENTRY_POINT_GROUP = "broker.effects"
EFFECT_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*){1,2}")
_FLAGS = ("reversible", "idempotent")
_METHODS = ("check_config", "check", "reversible_for", "preview", "apply")


class Registry:
    """A dict of handlers keyed by effect name, each verified on registration."""

    def __init__(self) -> None:
        self._handlers: dict[str, EffectHandler] = {}
        self._origins: dict[str, str] = {}

    def register(self, handler: Any, origin: str = "(code)") -> EffectHandler:
        """Verify `handler` against the contract and add it; errors name the origin."""
        name = getattr(handler, "name", None)
        if not isinstance(name, str) or not EFFECT_NAME.fullmatch(name):
            raise RegistryError(
                f"{origin}: handler name {name!r} is not <integration>.<verb> "
                "or <integration>.<object>.<verb> in lower case"
            )
        for flag in _FLAGS:
            if not isinstance(getattr(handler, flag, None), bool):
                raise RegistryError(f"{origin}: {name}.{flag} must be True or False")
        if not isinstance(getattr(handler, "undo", None), str):
            raise RegistryError(f"{origin}: {name}.undo must be a sentence saying how to undo it")
        for method in _METHODS:
            if not callable(getattr(handler, method, None)):
                raise RegistryError(f"{origin}: {name} has no {method}() method")
        try:
            schema = handler.schema
        except FileNotFoundError as exc:
            raise RegistryError(f"{origin}: {name} has no schema: {exc}") from exc
        if not isinstance(schema, Mapping):
            raise RegistryError(f"{origin}: {name}.schema must be a JSON Schema object")
        compile_schema(schema, f"{origin}: {name}.schema")
        if name in self._handlers:
            raise DuplicateEffect(
                f"effect {name} is registered twice: by {self._origins[name]} and by {origin}"
            )
        self._handlers[name] = handler
        self._origins[name] = origin
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
        try:
            return self._handlers[name]
        except KeyError:
            raise UnknownEffect(f"no effect named {name!r} is registered") from None

    def origin(self, name: str) -> str:
        return self._origins[name]

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def __iter__(self) -> Iterator[EffectHandler]:
        return iter(sorted(self._handlers.values(), key=lambda h: h.name))

    def __len__(self) -> int:
        return len(self._handlers)

    def schemas(self) -> dict[str, Mapping[str, Any]]:
        return {name: h.schema for name, h in self._handlers.items()}

    def reversibility(self) -> dict[str, bool]:
        return {name: h.reversible for name, h in self._handlers.items()}

    def check_config(self, integrations: Mapping[str, Mapping[str, Any]]) -> None:
        """Let each handler check its integration's settings; refuse unknown sections."""
        served = {h.name.split(".", 1)[0] for h in self}
        for section in integrations:
            if section not in served:
                raise ConfigError(
                    f"integrations.{section}: no registered effect belongs to it "
                    f"(known: {', '.join(sorted(served))})"
                )
        for handler in self:
            handler.check_config(integrations.get(handler.name.split(".", 1)[0], {}))


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
