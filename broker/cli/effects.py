"""`broker effects`: the registered effects, their flags, schemas and origins."""

from __future__ import annotations

from rich.table import Table

from broker.cli.common import ConfigOpt, JsonOpt, StateOpt, guarded, out, print_json
from broker.registry import Registry, default_registry
from broker.render import terminal


def effects(json_out: JsonOpt = False, config: ConfigOpt = None, state: StateOpt = None) -> None:
    """List the registered effects with their flags and schemas."""
    registry = guarded(default_registry)
    if json_out:
        print_json(_rows(registry))
        return
    table = Table("effect", "reversible", "idempotent", "undo", "from")
    for h in registry:
        table.add_row(
            h.name,
            "yes" if h.reversible else "no",
            "yes" if h.idempotent else "no",
            terminal(h.undo),
            terminal(registry.origin(h.name)),
        )
    out.print(table)


def _rows(registry: Registry) -> list[dict[str, object]]:
    return [
        {
            "effect": h.name,
            "integration": h.name.split(".", 1)[0],
            "reversible": h.reversible,
            "idempotent": h.idempotent,
            "undo": h.undo,
            "origin": registry.origin(h.name),
            "schema": h.schema,
        }
        for h in registry
    ]
