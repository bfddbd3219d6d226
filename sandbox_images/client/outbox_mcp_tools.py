"""What ``outbox mcp`` sends about tools: a catalogue entry as an MCP tool, an outbox
result as a tools/call result (with the shapes the negotiated revision allows).

Standard library only, like outbox.py (Python >= 3.8).
"""

from __future__ import annotations

import json
from typing import Any

import outbox

__all__ = ["RESULT_SCHEMA", "call_result", "error_result", "pending_text", "still_pending", "tool"]


RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "status"],
    "properties": {
        "version": {"type": "integer"},
        "id": {"type": "string"},
        "effect": {"type": ["string", "null"]},
        "status": {"type": "string", "enum": sorted(outbox.TERMINAL | {"pending"})},
        "reason": {"type": ["string", "null"]},
        "output": {"type": ["object", "null"]},
        "errors": {"type": "array", "items": {"type": "object"}},
        "request_sha256": {"type": ["string", "null"]},
        "decided_by": {"type": ["string", "null"]},
        "expires_at": {"type": ["string", "null"]},
        "approvals": {"type": "object"},
    },
}
"""A tool's outputSchema: the outbox result (PROTOCOL.md), as structuredContent carries it."""


def tool(effect: dict[str, Any], *, plain: bool = False) -> dict[str, Any]:
    """One catalogue entry as an MCP tool (`plain`: the 2024-11-05 fields only)."""
    reversible = bool(effect.get("reversible"))
    idempotent = bool(effect.get("idempotent"))
    approval = (effect.get("approval") or {}).get("summary") or "as the host's policy says"
    undo = effect.get("undo") or ""
    description = (
        f"{effect.get('description') or effect.get('name')}. "
        f"{'Reversible' if reversible else 'Irreversible'}: {undo}. "
        f"Approval: {approval}."
    )
    schema = effect.get("params_schema")
    found: dict[str, Any] = {
        "name": effect.get("name"),
        "description": description,
        "inputSchema": schema if isinstance(schema, dict) else {"type": "object"},
    }
    if plain:
        return found
    title = _title(effect)
    return {
        **found,
        "title": title,
        "outputSchema": RESULT_SCHEMA,
        "annotations": {
            "title": title,
            "readOnlyHint": False,
            "destructiveHint": not reversible,
            "idempotentHint": idempotent,
            "openWorldHint": True,
        },
    }


def _title(effect: dict[str, Any]) -> str:
    """`files.write: write one file below …` → `files.write — write one file below …`."""
    name = str(effect.get("name"))
    said = str(effect.get("description") or "")
    said = (said[len(name) + 1 :] if said.startswith(name + ":") else said).strip()
    return f"{name} — {said}"[:120] if said else name


def call_result(result: dict[str, Any], *, plain: bool = False) -> dict[str, Any]:
    """A terminal outbox result as an MCP tools/call result."""
    status = str(result.get("status"))
    lines = [f"{status}: {result.get('reason') or status}"]
    for issue in result.get("errors") or []:
        if isinstance(issue, dict):
            lines.append(f"- {issue.get('path')}: {issue.get('message')} ({issue.get('code')})")
    content = [{"type": "text", "text": "\n".join(lines)}]
    content.append({"type": "text", "text": json.dumps(result, indent=2, ensure_ascii=False)})
    answer = {"content": content, "isError": status != "applied"}
    return answer if plain else {**answer, "structuredContent": result}


def error_result(reason: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": f"failed: {reason}"}], "isError": True}


def still_pending(request_id: str, timeout: float, last: dict[str, Any] | None) -> dict[str, Any]:
    where = pending_text(last) if last else "no result yet"
    return {
        "version": outbox.VERSION,
        "id": request_id,
        "status": "pending",
        "reason": (
            f"still pending after {timeout:g}s ({where}); "
            f"check later with: outbox result {request_id}"
        ),
    }


def pending_text(result: dict[str, Any]) -> str:
    """What a pending result says: the reason, the approvals so far (a version 2
    result), the deadline."""
    text = f"pending: {result.get('reason') or 'waiting for a decision'}"
    approvals = result.get("approvals")
    if isinstance(approvals, dict) and "given" in approvals and "needed" in approvals:
        text += f"; {approvals['given']} of {approvals['needed']} approval(s) so far"
    if result.get("expires_at"):
        text += f" (decided by {result['expires_at']} at the latest)"
    return text
