"""JSON for what the broker writes and reads back itself (ledger columns, the audit
queue, result files): orjson, which is several times faster than the stdlib, with the
stdlib as the fallback for what orjson refuses (integers beyond 64 bits, lone
surrogates). Not for what a sandbox wrote (broker.intake.strict_json) nor for the canonical
bytes approvals bind (broker.models.canonical_json): those keep the stdlib's exact rules."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """Compact JSON text, non-ASCII kept as is."""
    return dump_bytes(value).decode("utf-8")


def dump_bytes(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # beyond orjson (a huge int, a lone surrogate): the stdlib's rules
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass"
        )


def loads(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # written by the fallback above
        return json.loads(data)
