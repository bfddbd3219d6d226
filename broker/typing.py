"""The contracts other code plugs into, as Protocols, and the aliases they use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from broker.models import Preview
    from effects.base import Context

JSON = dict[str, Any]
Params = Mapping[str, Any]


@runtime_checkable
class EffectHandler(Protocol):
    """One effect. `effects.base.Handler` documents the rules and gives defaults."""

    name: str
    schema: Mapping[str, Any]
    reversible: bool
    idempotent: bool
    undo: str

    def check_config(self, settings: Mapping[str, Any]) -> None: ...

    def check(self, params: Params, ctx: Context) -> None: ...

    def reversible_for(self, params: Params, ctx: Context) -> bool: ...

    def preview(self, params: Params, ctx: Context) -> Preview: ...

    def apply(self, params: Params, ctx: Context) -> JSON: ...


@runtime_checkable
class Revertible(Protocol):
    """A handler `broker undo` can use: it reverses what `apply` returned."""

    def revert_preview(self, output: Params, ctx: Context) -> Preview: ...

    def revert(self, output: Params, ctx: Context) -> JSON: ...
