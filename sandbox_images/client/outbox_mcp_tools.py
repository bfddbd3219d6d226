"""What ``outbox mcp`` sends about tools: a catalogue entry as an MCP tool, an outbox
result as a tools/call result (with the shapes the negotiated revision allows).

Standard library only, like outbox.py (Python >= 3.8).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import outbox

__all__ = [
    "RESULT_SCHEMA",
    "call_result",
    "effect_name",
    "error_result",
    "pending_text",
    "portable_name",
    "still_pending",
    "tool",
]

PORTABLE_MAX = 64  # OpenAI's function names: ^[a-zA-Z0-9_-]{1,64}$


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


def portable_name(effect: str) -> str:
    """An effect's name as a tool name of [A-Za-z0-9_-]{1,64} (OpenAI's rule): each dot
    becomes a hyphen (``github.pull_request.create`` is ``github-pull_request-create``).
    Effect names never hold a hyphen, so the mapping is reversed exactly; an underscore
    would not be (``pull_request`` has one already). A name past 64 characters keeps 55
    and ends in ``-`` and 8 hex digits of its sha256, found again by catalogue lookup."""
    name = effect.replace(".", "-")
    if len(name) <= PORTABLE_MAX:
        return name
    return f"{name[:55]}-{hashlib.sha256(effect.encode()).hexdigest()[:8]}"


def effect_name(tool_name: str, effects: list[str]) -> str | None:
    """The effect a tool name calls (its own name, or its portable name), or None."""
    if tool_name in effects:
        return tool_name
    for effect in effects:
        if portable_name(effect) == tool_name:
            return effect
    return None


def tool(effect: dict[str, Any], *, plain: bool = False, portable: bool = False) -> dict[str, Any]:
    """One catalogue entry as an MCP tool (`plain`: the 2024-11-05 fields only;
    `portable`: named by portable_name, the effect's own name in its title)."""
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
    name = str(effect.get("name"))
    found: dict[str, Any] = {
        "name": portable_name(name) if portable else name,
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
