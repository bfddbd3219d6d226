"""The no-op effect the benchmark measures the broker with: nothing but the pipeline."""

from __future__ import annotations

from typing import Any

from broker.models import Preview

NOOP_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"value": {"type": ["string", "integer"]}},
    "additionalProperties": False,
}


class Noop:
    """bench.noop: reversible, idempotent, returns at once (the handler costs nothing)."""

    name = "bench.noop"
    reversible = True
    idempotent = True
    inline = True  # returns at once: applied in the request's own commit
    undo = "nothing to undo: the effect does nothing"
    schema = NOOP_SCHEMA

    def check_config(self, settings: Any) -> None:
        return None

    def check(self, params: Any, ctx: Any) -> None:
        return None

    def reversible_for(self, params: Any, ctx: Any) -> bool:
        return True

    def preview(self, params: Any, ctx: Any) -> Preview:
        return Preview(title="nothing", target="bench: noop", body="{}", body_kind="json")

    def apply(self, params: Any, ctx: Any) -> dict[str, Any]:
        return {}
