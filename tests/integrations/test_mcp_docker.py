"""`outbox mcp` inside a real sandbox, reached with `docker exec -i`, served by a real
`broker serve` process: the official `mcp` SDK client on the host side."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import docker
import pytest

from broker.hosting import sandbox
from tests.integrations import mcp_scenarios as scenario
from tests.integrations.conftest import Host

pytestmark = pytest.mark.docker


@pytest.fixture
def server(
    host: Host,
    serve: Callable[..., subprocess.Popen[str]],
    engine: docker.DockerClient,
    agent_image: str,
) -> Iterator[list[str]]:
    """A sandbox container idling under the scenarios' policy; the command that runs
    `outbox mcp` in it over stdio."""
    host.policy(scenario.POLICY)
    paths = sandbox.prepare_dirs(host.state, f"mcp-{uuid.uuid4().hex[:8]}")
    serve()
    container: Any = sandbox.start(engine, paths, agent_image, ["sleep", "infinity"])
    try:
        yield ["docker", "exec", "-i", str(container.id), "outbox", "mcp"]
    finally:
        sandbox.remove(container)


def test_initialize_in_a_sandbox(server: list[str]) -> None:
    """initialize works through docker exec: the SDK's revision, the server's name."""
    asyncio.run(scenario.initializes(server))


def test_tools_list_in_a_sandbox_matches_broker_effects(server: list[str], host: Host) -> None:
    """The catalogue the broker published read-only into /results is the tool list."""

    async def run() -> None:
        async with scenario.session(server) as client:
            await scenario.lists_the_catalogue(client, host)

    asyncio.run(run())


def test_calls_from_a_sandbox(server: list[str], host: Host) -> None:
    """From inside the sandbox: applied, approved from the CLI, denied, invalid."""

    async def run() -> None:
        async with scenario.session(server) as client:
            await scenario.applies(client, host)
            await scenario.waits_then_approved(client, host)
            await scenario.denied(client, host)
            await scenario.invalid(client)

    asyncio.run(run())


def test_malformed_json_rpc_in_a_sandbox(server: list[str]) -> None:
    """Broken lines through docker exec get errors; the server answers the last ping."""
    scenario.answers_malformed(server)


def test_outbox_effects_in_a_sandbox(server: list[str]) -> None:
    """`outbox effects` prints each effect with what approval it may need."""
    command = [*server[:-1], "effects"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "files.write  (reversible, idempotent)" in done.stdout
    assert "approval: when overwrite = true: waits for 1 person to approve" in done.stdout
    one = subprocess.run(
        [*server[:-1], "effects", "code.execute"], capture_output=True, text=True, timeout=60
    )
    assert '"name": "code.execute"' in one.stdout
    assert '"reversible": false' in one.stdout
