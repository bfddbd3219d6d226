"""`outbox mcp` as a host process in attach mode (no Docker): the official `mcp` SDK
client against a real `broker serve --outbox --results` process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integrations import mcp_scenarios as scenario
from tests.integrations.conftest import CLIENT, Host

SERVER = [sys.executable, str(CLIENT), "mcp"]


@pytest.fixture
def attached(host: Host, serve: Callable[..., subprocess.Popen[str]]) -> dict[str, str]:
    """A broker serving one attach-mode outbox under the scenarios' policy; the
    environment that points the in-sandbox client at it."""
    host.policy(scenario.POLICY)
    outbox, results = host.base / "outbox", host.base / "results"
    outbox.mkdir()
    serve("--outbox", str(outbox), "--results", str(results), "--sandbox", "agent")
    return scenario.client_env(outbox, results)


def test_initialize(attached: dict[str, str]) -> None:
    """initialize: the SDK's handshake revision, the server's name, the tools capability."""
    asyncio.run(scenario.initializes(SERVER, attached))


def test_tools_list_matches_broker_effects(attached: dict[str, str], host: Host) -> None:
    """tools/list names every effect `broker effects` lists, with its schema and policy."""

    async def run() -> None:
        async with scenario.session(SERVER, attached) as client:
            await scenario.lists_the_catalogue(client, host)

    asyncio.run(run())


def test_call_that_applies(attached: dict[str, str], host: Host) -> None:
    """A reversible effect is applied and the tool result says so."""

    async def run() -> None:
        async with scenario.session(SERVER, attached) as client:
            await scenario.applies(client, host)

    asyncio.run(run())


def test_call_waits_for_approval_from_the_cli(attached: dict[str, str], host: Host) -> None:
    """A gated call reports progress while pending and completes once approved."""

    async def run() -> None:
        async with scenario.session(SERVER, attached) as client:
            await scenario.waits_then_approved(client, host)

    asyncio.run(run())


def test_progress_counts_the_approvals_so_far(
    host: Host, serve: Callable[..., subprocess.Popen[str]]
) -> None:
    """notifications/progress carries the approvals given, the quorum and the deadline."""
    host.policy(scenario.QUORUM)
    outbox, results = host.base / "outbox", host.base / "results"
    outbox.mkdir()
    serve("--outbox", str(outbox), "--results", str(results), "--sandbox", "agent")

    async def run() -> None:
        async with scenario.session(SERVER, scenario.client_env(outbox, results)) as client:
            await scenario.progress_counts_approvals(client, host)

    asyncio.run(run())


def test_a_cancelled_call_withdraws_its_waiting_request(
    attached: dict[str, str], host: Host
) -> None:
    """notifications/cancelled once the broker holds the request: denied, withdrawn."""

    async def run() -> None:
        async with scenario.session(SERVER, attached) as client:
            await scenario.cancelled_while_waiting(client, host, Path(attached["RESULTS_DIR"]))

    asyncio.run(run())


def test_denied_call_carries_the_reason(attached: dict[str, str], host: Host) -> None:
    """A denied call is isError with the policy's reason."""

    async def run() -> None:
        async with scenario.session(SERVER, attached) as client:
            await scenario.denied(client, host)

    asyncio.run(run())


def test_invalid_call_lists_the_schema_errors(attached: dict[str, str]) -> None:
    """An invalid call is isError with every schema error."""

    async def run() -> None:
        async with scenario.session(SERVER, attached) as client:
            await scenario.invalid(client)
            await scenario.unknown_tool(client)

    asyncio.run(run())


def test_malformed_json_rpc_gets_errors_not_a_crash(attached: dict[str, str]) -> None:
    """Broken lines are answered with JSON-RPC errors and the server keeps serving."""
    scenario.answers_malformed(SERVER, attached)


def test_auto_mode_client_falls_back_to_the_handshake(attached: dict[str, str]) -> None:
    """The SDK's default `Client` (which probes server/discover first) still connects."""
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    async def run() -> list[str]:
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=attached)
        async with Client(params) as client:
            return [t.name for t in (await client.list_tools()).tools]

    assert "files.write" in asyncio.run(run())


def test_no_catalogue_is_a_clear_error(tmp_path: Path) -> None:
    """Without a broker serving the outbox, tools/list fails with a sentence saying so."""
    (tmp_path / "o").mkdir()
    (tmp_path / "r").mkdir()
    env = scenario.client_env(tmp_path / "o", tmp_path / "r")
    line = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}\n'
    import json

    done = subprocess.run(
        SERVER, input=line, capture_output=True, timeout=60, env={**env, "PATH": ""}
    )
    reply = json.loads(done.stdout)
    assert reply["error"]["code"] == -32603
    assert "no broker serves this sandbox yet" in reply["error"]["message"]


def test_a_staged_call_is_an_error_that_says_nothing_was_applied(
    host: Host, serve: Callable[..., subprocess.Popen[str]]
) -> None:
    """`broker serve --staged`: the SDK client gets isError, the reason says nothing was
    applied and what the policy would have done, the preview is in the structured result;
    no file is written. The banner says staged mode is on."""
    host.policy(scenario.POLICY)
    outbox, results = host.base / "outbox", host.base / "results"
    outbox.mkdir()
    serve("--staged", "--outbox", str(outbox), "--results", str(results), "--sandbox", "agent")
    env = scenario.client_env(outbox, results)

    async def run() -> None:
        async with scenario.session(SERVER, env) as client:
            result = await client.call_tool("files.write", {"path": "a.txt", "content": "one"})
            assert result.is_error is True
            text = scenario.text_of(result)
            assert text.startswith("staged: staged: this host runs in staged mode"), text
            assert "the policy would apply it automatically" in text
            out = (result.structured_content or {})["output"]
            assert out["staged"] is True and out["verdict"]["action"] == "auto"
            assert out["preview"]["body"] == "one"

    asyncio.run(run())
    assert list(host.exports.rglob("a.txt")) == []
    banner = (host.base / "serve-0.log").read_text()
    assert "STAGED MODE for every effect: nothing of it is applied" in banner


def test_titles_annotations_output_schema_and_logging(attached: dict[str, str], host: Host) -> None:
    asyncio.run(scenario.spec_features(SERVER, attached, host))
