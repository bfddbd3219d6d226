"""code.execute: a person (or the policy) lets code blocks run inside their sandbox.

Nothing happens on the host: "applied" means "approved to run in the sandbox that
asked". The request is filed by a host-side integration (AutoGen's `approval_func`,
see broker.integrations.autogen) before the code runs; what leaves the sandbox
afterwards goes through the outbox like anything else. The reviewer sees the literal
code, block by block, and the conversation that led to it marked as the agents' words.

No settings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context, Handler


def fenced(blocks: Sequence[Mapping[str, Any]]) -> str:
    """The blocks as the reviewer reads them: each in a fence naming its language."""
    parts = []
    for block in blocks:
        code = str(block["code"])
        fence = "```"
        while fence in code:  # a block holding ``` gets a longer fence
            fence += "`"
        parts.append(f"{fence}{block['language']}\n{code.rstrip(chr(10))}\n{fence}")
    return "\n\n".join(parts)


class CodeExecute(Handler):
    """Approve code blocks to run inside the sandbox that asked; nothing runs on the host."""

    name = "code.execute"
    reversible = False  # what the code does inside its sandbox is not undone by anyone
    idempotent = True  # apply records nothing and calls nothing
    inline = True
    undo = (
        "nothing on the host to undo: the approval only lets the code run inside its "
        "sandbox, and whatever it asks of the world goes through the outbox"
    )

    def preview(self, params: Params, ctx: Context) -> Preview:
        blocks: list[Mapping[str, Any]] = list(params["blocks"])
        code = fenced(blocks)
        languages = ", ".join(dict.fromkeys(str(b["language"]) for b in blocks))
        lines = sum(len(str(b["code"]).splitlines()) for b in blocks)
        body = code
        context = list(params.get("context") or [])
        if context:
            said = "\n".join(f"[{m['source']}] {str(m['content']).strip()}" for m in context)
            body += "\n\n--- the conversation so far (the agents' words, not checked) ---\n" + said
        return Preview(
            title=f"run {len(blocks)} code block(s) ({languages}, {lines} lines) in sandbox "
            f"{ctx.sandbox}",
            target=f"code: sandbox {ctx.sandbox} (no network, no credentials)",
            body=body,
            body_kind="text",
            facts=(
                ("blocks", str(len(blocks))),
                ("languages", languages),
                ("sha256 of the code", hashlib.sha256(code.encode("utf-8")).hexdigest()),
            ),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        blocks = params["blocks"]
        return {
            "approved_blocks": len(blocks),
            "languages": list(dict.fromkeys(str(b["language"]) for b in blocks)),
        }
