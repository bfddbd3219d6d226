"""docs/mcp.md's recipe: an OpenAI Agents SDK agent whose tools are `outbox mcp
--portable-names` (tool names OpenAI's API accepts: `files-write`), through the SDK's
own stdio client (MCPServerStdio), against a real `broker serve` process.

No model endpoint is reachable here, so the model is a scripted one (the SDK's Model
interface, two turns: call files.write, then answer with what the tool said); the
agent, its tool loop and the MCP client are the real SDK. The server runs as a host
process in attach mode, as the client would inside the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from tests.integrations import mcp_scenarios as scenario
from tests.integrations.conftest import CLIENT, Host

OPENAI_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names


def scripted() -> Any:
    """The scripted model; the SDK (~2 s of imports) loads here, not when the suite is
    collected in every worker."""
    from agents import ModelResponse, Usage
    from agents.models.interface import Model
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class Scripted(Model):
        """Turn 1: call files-write (files.write); turn 2: repeat the tool's first line."""

        def __init__(self) -> None:
            self.seen_tools: list[str] = []

        async def get_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            tools = a[1] if len(a) > 1 else k["tools"]
            self.seen_tools = [t.name for t in tools]
            outputs = [
                i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"
            ]
            if not outputs:
                call = ResponseFunctionToolCall(
                    type="function_call",
                    call_id="c1",
                    name="files-write",
                    arguments=json.dumps({"path": "notes/sdk.txt", "content": "from the agent"}),
                )
                return ModelResponse(output=[call], usage=Usage(), response_id=None)
            said = str(outputs[-1]["output"])
            text = ResponseOutputText(type="output_text", text=said, annotations=[])
            message = ResponseOutputMessage(
                id="m1", type="message", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)

        def stream_response(self, *a: Any, **k: Any) -> Any:
            raise NotImplementedError("the recipe runs the agent without streaming")

    return Scripted()


def test_an_agents_sdk_agent_uses_the_outbox_through_mcp(
    host: Host, serve: Callable[..., subprocess.Popen[str]]
) -> None:
    from agents import Agent, Runner, set_tracing_disabled
    from agents.mcp import MCPServerStdio

    host.policy(scenario.POLICY)
    outbox, results = host.base / "outbox", host.base / "results"
    outbox.mkdir()
    serve("--outbox", str(outbox), "--results", str(results), "--sandbox", "agent")
    model = scripted()
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers

    async def run() -> str:
        params = {
            "command": sys.executable,
            "args": [str(CLIENT), "mcp", "--portable-names"],
            "env": scenario.client_env(outbox, results),
        }
        async with MCPServerStdio(params=params, client_session_timeout_seconds=60) as outbox_mcp:
            agent = Agent(name="writer", model=model, mcp_servers=[outbox_mcp])
            result = await Runner.run(agent, "write a note")
            return str(result.final_output)

    answer = asyncio.run(run())
    assert "files-write" in model.seen_tools and "code-execute" in model.seen_tools
    assert all(OPENAI_NAME.fullmatch(name) for name in model.seen_tools), model.seen_tools
    assert "applied: applied automatically" in answer, answer
    assert (host.exports / "notes" / "sdk.txt").read_text() == "from the agent"
