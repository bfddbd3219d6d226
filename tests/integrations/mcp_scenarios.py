"""What an MCP client sees from `outbox mcp`, driven by the official `mcp` SDK client.

Shared by the attach-mode tests (the server as a host process) and the Docker tests
(the server inside a real sandbox, reached through `docker exec -i`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.integrations.conftest import Host
from tests.support import eventually

if TYPE_CHECKING:  # the SDK (~0.6 s) loads when a session starts, not at collection
    from mcp import ClientSession

POLICY = """
[[rules]]
effect = "files.write"
when = { overwrite = true }
action = "approve"
timeout = "10m"
reason = "an overwrite destroys the old file"

[[rules]]
effect = "files.write"
when = { path = "secret/*" }
action = "deny"
reason = "secret/ is off limits; write under notes/ instead"
"""


@asynccontextmanager
async def session(
    command: Sequence[str], env: dict[str, str] | None = None
) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session with the server `command` starts."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        yield client


def text_of(result: Any) -> str:
    import mcp_types

    return "\n".join(c.text for c in result.content if isinstance(c, mcp_types.TextContent))


async def initializes(command: Sequence[str], env: dict[str, str] | None = None) -> None:
    """initialize negotiates the SDK's newest handshake revision and names the server."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp_types.version import LATEST_HANDSHAKE_VERSION

    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        init = await client.initialize()
        assert init.protocol_version == LATEST_HANDSHAKE_VERSION
        assert init.server_info.name == "outbox"
        assert init.capabilities.tools is not None
        assert "no network" in (init.instructions or "")
        assert (await client.send_ping()) is not None


async def lists_the_catalogue(client: ClientSession, host: Host) -> None:
    """tools/list is exactly `broker effects`: names, params schemas, flags in words."""
    tools = (await client.list_tools()).tools
    effects = json.loads(host.cli("effects", "--json").stdout)
    assert [t.name for t in tools] == [e["effect"] for e in effects]
    by_name = {t.name: t for t in tools}
    for effect in effects:
        tool = by_name[effect["effect"]]
        assert tool.input_schema == effect["schema"]
        assert tool.annotations is not None
        assert tool.annotations.destructive_hint is (not effect["reversible"])
        assert tool.annotations.idempotent_hint is effect["idempotent"]
    files = by_name["files.write"].description or ""
    assert "Reversible" in files
    assert "when overwrite = true: waits for 1 person to approve (up to 10m, then denied)" in files
    assert 'when path = "secret/*": denied' in files


async def applies(client: ClientSession, host: Host) -> None:
    """A reversible call is applied at once: the file exists, the result says applied."""
    result = await client.call_tool("files.write", {"path": "notes/a.txt", "content": "one"})
    assert result.is_error is False, text_of(result)
    assert text_of(result).startswith("applied: applied automatically")
    assert result.structured_content is not None
    assert result.structured_content["output"]["bytes"] == 3
    assert (host.exports / "notes" / "a.txt").read_text() == "one"


async def waits_then_approved(client: ClientSession, host: Host) -> None:
    """An overwrite waits (progress says so), a person approves it from the CLI, it applies."""
    first = await client.call_tool("files.write", {"path": "b.txt", "content": "old"})
    assert first.is_error is False, text_of(first)
    told: list[str] = []
    waiting = asyncio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        told.append(message or "")
        waiting.set()

    call = asyncio.ensure_future(
        client.call_tool(
            "files.write",
            {"path": "b.txt", "content": "new", "overwrite": True},
            progress_callback=progress,
        )
    )
    await asyncio.wait_for(waiting.wait(), 60)
    assert not call.done()
    assert "pending: waiting for 1 approval(s): an overwrite destroys the old file" in told[0]
    assert (host.exports / "b.txt").read_text() == "old"
    [row] = host.wait_pending("files.write")
    await asyncio.to_thread(
        host.cli, "approve", row["ref"], "--as", "ops-oncall", "--reason", "fine, replace it"
    )
    result = await asyncio.wait_for(call, 60)
    assert result.is_error is False, text_of(result)
    assert "approved by ops-oncall: fine, replace it" in text_of(result)
    assert (host.exports / "b.txt").read_text() == "new"


QUORUM = """
[[rules]]
effect = "files.write"
action = "approve"
approvals = 2
timeout = "10m"
reason = "two people read every file"
"""


async def progress_counts_approvals(client: ClientSession, host: Host) -> None:
    """Under a quorum of two, progress says 0 of 2, then 1 of 2 once alice approved, with
    the deadline each time; bob's approval applies it."""
    told: list[str] = []
    heard = asyncio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        told.append(message or "")
        heard.set()

    async def said(words: str) -> str:
        while not any(words in t for t in told):
            heard.clear()
            await asyncio.wait_for(heard.wait(), 60)
        return next(t for t in told if words in t)

    call = asyncio.ensure_future(
        client.call_tool(
            "files.write", {"path": "q.txt", "content": "x"}, progress_callback=progress
        )
    )
    first = await said("0 of 2 approval(s) so far")
    assert "waiting for 2 approval(s): two people read every file" in first
    assert "at the latest" in first  # the deadline
    [row] = host.wait_pending("files.write")
    await asyncio.to_thread(host.cli, "approve", row["ref"], "--as", "alice", "--reason", "ok")
    assert "at the latest" in await said("1 of 2 approval(s) so far")
    assert not call.done()
    await asyncio.to_thread(host.cli, "approve", row["ref"], "--as", "bob", "--reason", "ok")
    result = await asyncio.wait_for(call, 60)
    assert result.is_error is False, text_of(result)
    assert (host.exports / "q.txt").read_text() == "x"


async def cancelled_while_waiting(client: ClientSession, host: Host, results: Path) -> None:
    """A call cancelled while its request waits for a person (the broker has claimed
    it): the SDK sends notifications/cancelled, the server writes a withdrawal, and the
    request ends denied, withdrawn by the agent, with one terminal result."""
    await client.call_tool("files.write", {"path": "c.txt", "content": "old"})
    waiting = asyncio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        waiting.set()

    call = asyncio.ensure_future(
        client.call_tool(
            "files.write",
            {"path": "c.txt", "content": "new", "overwrite": True},
            progress_callback=progress,
        )
    )
    await asyncio.wait_for(waiting.wait(), 60)
    [row] = host.wait_pending("files.write")
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    path = results / f"{row['id']}.json"

    def denied() -> dict[str, Any] | None:
        """the cancelled call's request is denied"""
        found = json.loads(path.read_text())
        return found if found["status"] == "denied" else None

    result = await asyncio.to_thread(eventually, denied)
    assert result["reason"] == "withdrawn by the agent: the MCP client cancelled the call"
    assert result["decided_by"] == "agent"
    assert host.pending("files.write") == []
    assert (host.exports / "c.txt").read_text() == "old"
    assert (await client.send_ping()) is not None  # the session goes on


async def denied(client: ClientSession, host: Host) -> None:
    """A call the policy denies is an error result carrying the policy's reason."""
    result = await client.call_tool("files.write", {"path": "secret/k.txt", "content": "x"})
    assert result.is_error is True
    assert "denied by policy (rules[1]): secret/ is off limits; write under notes/ instead" in (
        text_of(result)
    )
    assert not (host.exports / "secret").exists()


async def invalid(client: ClientSession) -> None:
    """Arguments that break the schema come back as an error result listing each problem."""
    result = await client.call_tool("files.write", {"path": 7, "mode": "x"})
    assert result.is_error is True
    text = text_of(result)
    assert text.startswith("invalid: ")
    assert "- /params/content: 'content' is required (required)" in text
    assert "- /params/path: 7 is not of type 'string' (type)" in text
    assert result.structured_content is not None
    paths = {e["path"] for e in result.structured_content["errors"]}
    assert {"/params/content", "/params/path"} <= paths


async def unknown_tool(client: ClientSession) -> None:
    """A tool that is not in the catalogue is a protocol error naming it, not a request."""
    from mcp.shared.exceptions import MCPError

    try:
        await client.call_tool("files.delete_everything", {})
    except MCPError as exc:
        assert "Unknown tool: files.delete_everything" in str(exc)
    else:
        raise AssertionError("an unknown tool was accepted")


MALFORMED = [
    b"{not json\n",
    b'["jsonrpc", "2.0"]\n',
    b'{"jsonrpc": "2.0", "id": 1}\n',
    b'{"jsonrpc": "1.0", "id": 2, "method": "ping"}\n',
    b'{"jsonrpc": "2.0", "id": 3, "method": "no/such/method"}\n',
    b'{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": []}\n',
    b'{"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"x": NaN}}\n',
    b"\xff\xfe\n",
    b'{"jsonrpc": "2.0", "id": 6, "method": "ping"}\n',
]


def answers_malformed(command: Sequence[str], env: dict[str, str] | None = None) -> None:
    """Every malformed line gets a JSON-RPC error; the server stays up and answers a ping."""
    done = subprocess.run(
        list(command), input=b"".join(MALFORMED), capture_output=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    codes = [r.get("error", {}).get("code") for r in replies]
    assert codes == [-32700, -32600, -32600, -32600, -32601, -32602, -32700, -32700, None]
    assert replies[-1] == {"jsonrpc": "2.0", "id": 6, "result": {}}
    assert [r["id"] for r in replies] == [None, None, 1, 2, 3, 4, None, None, 6]


def client_env(outbox: Path, results: Path) -> dict[str, str]:
    return {"OUTBOX_DIR": str(outbox), "RESULTS_DIR": str(results)}


async def spec_features(command: Sequence[str], env: dict[str, str], host: Host) -> None:
    """Tool titles and annotations from the effect's flags, an outputSchema the SDK
    checks every successful result against, and log messages once the client asks."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.shared.exceptions import MCPDeprecationWarning

    said: list[Any] = []

    async def on_log(params: Any) -> None:
        said.append(params)

    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=env)
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, logging_callback=on_log) as client,
    ):
        await client.initialize()
        tools = {t.name: t for t in (await client.list_tools()).tools}
        code, files = tools["code.execute"], tools["files.write"]
        assert code.annotations is not None and code.annotations.destructive_hint is True
        assert files.annotations is not None and files.annotations.destructive_hint is False
        assert files.title and files.title.startswith("files.write — ")
        assert files.output_schema is not None and "status" in files.output_schema["required"]
        with warnings.catch_warnings():  # deprecated from the 2026-07-28 revision on; in ours
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.set_logging_level("info")
        result = await client.call_tool("files.write", {"path": "logged.txt", "content": "x"})
        assert result.is_error is False  # and the SDK validated it against outputSchema
        assert result.structured_content is not None
        assert result.structured_content["status"] == "applied"
        texts = [str(p.data) for p in said]
        assert any(t.startswith("files.write: filed as request") for t in texts), texts
        assert any(t.endswith(" applied") for t in texts), texts
        assert (host.exports / "logged.txt").read_text() == "x"
