"""The agent integrations, measured: a trivial Python block through SandboxCodeExecutor
(an auto rule) beside the same block through AutoGen's DockerCommandLineCodeExecutor on
the same image, and an MCP tools/call of bench.noop through `outbox mcp`.

Both executors run in this process on the agent image, alternating start by start and
block by block, so that one round holds their ratio; start-up is timed apart from the
blocks. The MCP server is the in-sandbox client as a host process
(attach mode) on a broker in a thread with bench.noop registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.handlers import Noop

CLIENT = Path(__file__).resolve().parents[1] / "sandbox_images" / "client" / "outbox.py"
BLOCK = "print(6 * 7)\n"
AUTO = '[[rules]]\neffect = "code.execute"\naction = "auto"\nreason = "bench"\n'


def executors(cells: Path, blocks: int, starts: int = 3) -> dict[str, Any]:
    """Start-up seconds (each executor started `starts` times after one warm-up start,
    which pays this process's first imports) and per-block seconds of both, the two
    alternating start by start and block by block (which goes first alternates too)."""
    import docker.errors
    from autogen_core import CancellationToken
    from autogen_core.code_executor import CodeBlock
    from autogen_ext.code_executors.docker import DockerCommandLineCodeExecutor

    from broker.hosting import images, sandbox
    from broker.integrations.autogen import SandboxCodeExecutor

    base = Path(tempfile.mkdtemp(prefix="agents-", dir=cells))
    (base / "policy.toml").write_text(AUTO)
    config = base / "broker.toml"
    config.write_text('[broker]\nstate_dir = "state"\npolicy = "policy.toml"\n')
    engine = sandbox.engine()
    image = images.ensure_image(engine, log=lambda text: None)

    async def stop(executor: Any) -> None:
        """Stop (not timed). AutoGen's stop is `docker stop`, which waits its 10 s for
        the container's shell to ignore SIGTERM; killing it first spares the bench that."""
        if isinstance(executor, DockerCommandLineCodeExecutor):
            with contextlib.suppress(docker.errors.DockerException):
                engine.containers.get(executor.container_name).kill()
        await executor.stop()

    work = base / "autogen"
    work.mkdir()
    os.chmod(work, 0o777)  # AutoGen's container runs as the image's uid 10001
    makers = (
        lambda: SandboxCodeExecutor(config),
        lambda: DockerCommandLineCodeExecutor(image=image, work_dir=work),
    )

    def order(n: int) -> tuple[int, int]:  # ours first in even turns, theirs in odd
        return (0, 1) if n % 2 == 0 else (1, 0)

    async def both() -> tuple[tuple[list[float], list[float]], tuple[list[float], list[float]]]:
        started: tuple[list[float], list[float]] = ([], [])
        each: tuple[list[float], list[float]] = ([], [])
        running: list[Any] = [None, None]
        try:
            for n in range(starts + 1):
                for side in order(n):
                    executor = makers[side]()
                    t0 = time.perf_counter()
                    await executor.start()
                    if n:
                        started[side].append(time.perf_counter() - t0)
                    if n < starts:
                        await stop(executor)
                    else:
                        running[side] = executor
            for i in range(blocks):
                for side in order(i):
                    t = time.perf_counter()
                    done = await running[side].execute_code_blocks(
                        [CodeBlock(BLOCK, "python")], CancellationToken()
                    )
                    each[side].append(time.perf_counter() - t)
                    assert done.exit_code == 0 and done.output.strip() == "42", done.output
        finally:
            for executor in running:
                if executor is not None:
                    await stop(executor)
        return started, each

    try:
        (ours_start, theirs_start), (ours_block, theirs_block) = asyncio.run(both())
    finally:
        engine.close()
    return {
        "ours_start_s": ours_start,
        "ours_block_s": ours_block,
        "autogen_start_s": theirs_start,
        "autogen_block_s": theirs_block,
    }


def ratios(found: dict[str, Any]) -> dict[str, float]:
    """Ours against AutoGen's: the median block, the median start-up."""
    import statistics

    return {
        "block_ratio": statistics.median(found["ours_block_s"])
        / statistics.median(found["autogen_block_s"]),
        "start_ratio": statistics.median(found["ours_start_s"])
        / statistics.median(found["autogen_start_s"]),
    }


def mcp_calls(cells: Path, calls: int) -> list[float]:
    """Seconds per tools/call of bench.noop, one JSON-RPC line at a time."""
    from broker.testing import BrokerHarness

    with BrokerHarness(cells / "mcp", handlers=[Noop()]) as harness:
        env = {
            **os.environ,
            "OUTBOX_DIR": str(harness.outbox),
            "RESULTS_DIR": str(harness.results),
        }
        server = subprocess.Popen(
            [sys.executable, str(CLIENT), "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert server.stdin is not None and server.stdout is not None

        def ask(rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
            line = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
            server.stdin.write(json.dumps(line).encode() + b"\n")  # type: ignore[union-attr]
            server.stdin.flush()  # type: ignore[union-attr]
            while True:
                reply: dict[str, Any] = json.loads(server.stdout.readline())  # type: ignore[union-attr]
                if reply.get("id") == rid:
                    return reply

        try:
            ask(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
            ask(1, "tools/list", {})
            took = []
            for n in range(calls):
                t = time.perf_counter()
                reply = ask(n + 2, "tools/call", {"name": "bench.noop", "arguments": {}})
                took.append(time.perf_counter() - t)
                assert reply["result"]["isError"] is False, reply
        finally:
            server.stdin.close()
            server.wait(30)
    return took
