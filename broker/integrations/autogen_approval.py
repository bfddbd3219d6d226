"""AutoGen's `approval_func` on the broker: each proposed execution is a `code.execute`
request the policy decides or a person approves, filed where the code will run.

Re-exported by broker.integrations.autogen, where it is documented.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from autogen_agentchat.agents import ApprovalRequest, ApprovalResponse
from autogen_core.code_executor import CodeBlock

from broker.config import Config, load_config
from broker.errors import BrokerError, SandboxError
from broker.hosting import sandbox
from broker.integrations import autogen_gate as gate
from broker.integrations import embedded as hosting
from broker.loop import lockfile


class SandboxCodeExecutor(Protocol):
    """What the gate needs of the executor it approves for (broker.integrations.autogen)."""

    @property
    def running(self) -> bool: ...

    @property
    def config(self) -> Config: ...

    @property
    def served_paths(self) -> sandbox.SandboxPaths: ...

    def require_approval(self) -> None: ...

    def allow(self, blocks: Sequence[CodeBlock]) -> None: ...


__all__ = ["ApprovalFunc", "approval_func", "context_of", "parse_blocks"]

ApprovalFunc = Callable[[ApprovalRequest], Awaitable[ApprovalResponse]]
CONTEXT_MESSAGES = 10
_FENCE = re.compile(r"```([^\n`]*)\n(.*?)\n```", re.S)
_SANDBOX_ID = re.compile(r"[^A-Za-z0-9_.-]+")


def approval_func(
    config: str | os.PathLike[str] | None = None,
    *,
    executor: SandboxCodeExecutor | None = None,
    sandbox_id: str | None = None,
) -> ApprovalFunc:
    """An async `approval_func` for `CodeExecutorAgent` that asks the broker.

    Each call files the code (and the conversation's last messages) as a
    `code.execute` request: in `executor`'s sandbox when given (and then that executor
    runs only code approved this way), else in `sandbox_id`, else in a sandbox named
    for the agent, which a running `broker serve` must serve. It returns
    `ApprovalResponse(approved, reason)` with the reviewer's reason, the policy's on an
    automatic decision, or the expiry's. If the agent's run is cancelled meanwhile, the
    request is withdrawn: it ends `denied`, and the audit log says why.
    """
    if executor is not None and sandbox_id is not None:
        raise ValueError("give approval_func an executor or a sandbox_id, not both")
    if executor is not None:
        executor.require_approval()
    cfg = None if executor is not None else load_config(Path(config) if config else None)

    async def approve(request: ApprovalRequest) -> ApprovalResponse:
        blocks = parse_blocks(request.code)
        try:
            where = await asyncio.to_thread(_where, executor, cfg, sandbox_id, request)
        except BrokerError as exc:
            return ApprovalResponse(approved=False, reason=f"denied: {exc}; nothing ran")
        runs_in = "sandbox" if executor is not None else "host"
        decision = await gate.ask(
            where[0], where[1], blocks, context_of(request.context), runs_in=runs_in
        )
        if decision.approved and executor is not None:
            executor.allow([CodeBlock(code=b["code"], language=b["language"]) for b in blocks])
        return ApprovalResponse(approved=decision.approved, reason=decision.reason)

    return approve


def _where(
    executor: SandboxCodeExecutor | None,
    cfg: Config | None,
    sandbox_id: str | None,
    request: ApprovalRequest,
) -> tuple[Config, sandbox.SandboxPaths]:
    """The configuration and served sandbox a request is filed in."""
    if executor is not None:
        if not executor.running:
            raise SandboxError("the executor has not started")
        return executor.config, executor.served_paths
    assert cfg is not None
    if not lockfile.served(cfg.state_dir):
        raise SandboxError(
            f"no broker serves {cfg.state_dir}; start one with `broker serve` "
            "(or pass approval_func the executor)"
        )
    name = sandbox_id or _agent_sandbox(request)
    return cfg, hosting.served_by_running(cfg, name).detach().paths


def parse_blocks(code: str) -> list[dict[str, str]]:
    """The blocks in an ApprovalRequest's code (AutoGen joins them as fenced blocks)."""
    blocks = [
        {"language": m.group(1).strip() or "text", "code": m.group(2)}
        for m in _FENCE.finditer(code)
    ]
    return blocks or [{"language": "text", "code": code}]


def context_of(messages: Sequence[Any], limit: int = CONTEXT_MESSAGES) -> list[dict[str, str]]:
    """The conversation's last messages, as a reviewer reads them (system prompt left out)."""
    said = []
    for message in messages:
        if type(message).__name__ == "SystemMessage":
            continue
        source = getattr(message, "source", None) or type(message).__name__
        content = message.content if isinstance(message.content, str) else str(message.content)
        said.append({"source": str(source)[:200], "content": content[:20000]})
    return said[-limit:]


def _agent_sandbox(request: ApprovalRequest) -> str:
    sources = [getattr(m, "source", None) for m in request.context]
    name = next((s for s in reversed(sources) if isinstance(s, str) and s), "autogen")
    cleaned = _SANDBOX_ID.sub("-", name).strip("-.")[:64]
    return cleaned if cleaned[:1].isalnum() else f"agent-{cleaned}"[:64]
