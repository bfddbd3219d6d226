"""code.execute: a person (or the policy) lets code blocks run where the integration
that asks says they will run.

Nothing happens on the host at apply: "applied" means "approved to run". The request is
filed by a host-side integration (AutoGen's `approval_func`, see
broker.integrations.autogen) before the code runs, and it declares where the code runs
(`runs_in`): `sandbox`, the sandbox that asked (an executor bound to it), or `host`, the
caller's own process on the host with its rights (no executor bound). A rule that does
not name `runs_in` never matches a `host` request (broker.policy.rules). The reviewer
sees each block's literal code in a frame its text cannot close, and the conversation
that led to it marked as the agents' words.

No settings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context, Handler

__all__ = ["ALIASES", "CodeExecute", "canonical_language", "framed"]

ALIASES = {"python3": "python", "py": "python", "shell": "sh"}
"""Fence languages that name the same interpreter as another: the policy sees one name."""
SANDBOX, HOST = "sandbox", "host"
FRAME = "│ "  # every line of a block starts with it, so no line of the code reads as outside


def canonical_language(language: str) -> str:
    """The one name policy matches: lower case, aliases resolved (`PY` → `python`)."""
    lowered = language.lower()
    return ALIASES.get(lowered, lowered)


def framed(blocks: Sequence[Mapping[str, Any]]) -> str:
    """The blocks as the reviewer reads them: a header per block giving its language and
    its line count, then each of its lines behind a frame mark. A block's own text can
    print anything (a fence, a copy of a header or of the conversation marker): it stays
    on marked lines, and the count says where the block ends."""
    parts = []
    for n, block in enumerate(blocks, 1):
        lines = str(block["code"]).rstrip("\n").split("\n")
        head = f"block {n} of {len(blocks)}: {block['language']}, {len(lines)} line(s)"
        parts.append("\n".join([head, *(FRAME + line for line in lines)]))
    return "\n\n".join(parts)


def where_it_runs(params: Params, sandbox: str) -> str:
    if params.get("runs_in", SANDBOX) == HOST:
        return "the caller's own process on the host, with its rights (no sandbox)"
    return f"sandbox {sandbox} (no network, no credentials)"


class CodeExecute(Handler):
    """Approve code blocks to run where the integration declares; nothing runs at apply."""

    name = "code.execute"
    reversible = False  # what the code does where it runs is not undone by anyone
    idempotent = True  # apply records nothing and calls nothing
    inline = True
    undo = (
        "nothing on the host to undo: the approval only lets the code run where the "
        "request says (its sandbox, or the caller's process on the host)"
    )

    def canonical(self, params: Params, ctx: Context) -> Params:
        blocks = [
            {**block, "language": canonical_language(str(block["language"]))}
            for block in params["blocks"]
        ]
        return {**params, "blocks": blocks, "runs_in": params.get("runs_in", SANDBOX)}

    def preview(self, params: Params, ctx: Context) -> Preview:
        blocks: list[Mapping[str, Any]] = list(params["blocks"])
        code = framed(blocks)
        languages = ", ".join(dict.fromkeys(str(b["language"]) for b in blocks))
        lines = sum(len(str(b["code"]).splitlines()) for b in blocks)
        body = code
        context = list(params.get("context") or [])
        if context:
            said = "\n".join(
                f"[{m['source']}] " + "\n  ".join(str(m["content"]).strip().split("\n"))
                for m in context
            )
            body += "\n\n--- the conversation so far (the agents' words, not checked) ---\n" + said
        where = where_it_runs(params, ctx.sandbox)
        return Preview(
            title=f"run {len(blocks)} code block(s) ({languages}, {lines} lines) in {where}",
            target=f"code: {where}",
            body=body,
            body_kind="text",
            facts=(
                ("runs in", where),
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
            "runs_in": params.get("runs_in", SANDBOX),
        }
