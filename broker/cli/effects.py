"""`broker effects`: the registered effects, their flags, schemas and origins."""

from __future__ import annotations

from broker.cli.common import ConfigOpt, JsonOpt, StateOpt, guarded, print_json
from broker.cli.listing import Column, TsvOpt, choose, show
from broker.registry import Registry, default_registry


def effects(
    json_out: JsonOpt = False, tsv: TsvOpt = False, config: ConfigOpt = None, state: StateOpt = None
) -> None:
    """List the registered effects with their flags and schemas."""
    choose(json_out, tsv)
    registry = guarded(default_registry)
    if json_out:
        print_json(_rows(registry))
        return
    rows = [
        [
            h.name,
            "yes" if h.reversible else "no",
            "yes" if h.idempotent else "no",
            h.undo,
            registry.origin(h.name),
        ]
        for h in registry
    ]
    show(COLUMNS, rows, tsv=tsv)


COLUMNS = (
    Column("effect", lead=True),
    Column("reversible"),
    Column("idempotent"),
    Column("undo", wrap=True),
    Column("from", wrap=True),
)


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
