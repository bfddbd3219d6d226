"""The AutoGen executor with `[sandbox] warm = 1`: its container comes from the
process's warm pool, the reaper handed over as PID 1, and its blocks run there."""

from __future__ import annotations

import asyncio
import threading

import docker
import pytest
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.code_executors._common import CommandLineCodeResult

from broker.config import load_config
from broker.hosting import images, warm
from broker.integrations import autogen_warm
from broker.integrations.autogen import SandboxCodeExecutor
from tests.integrations.conftest import Host

pytestmark = pytest.mark.docker

BLOCK = """\
import os
print("pid1:", open("/proc/1/cmdline", "rb").read().split(b"\\0")[:2])
print("cwd:", os.getcwd(), "uid:", os.getuid())
with open(os.path.join(os.environ["OUTBOX_DIR"], ".probe"), "w") as f:
    f.write("x")
print("outbox: writable")
"""


def test_an_executor_takes_its_container_from_the_warm_pool(
    host: Host, agent_image: str, engine: docker.DockerClient
) -> None:
    """With a pool filled beforehand, the executor's sandbox is the pooled one; its block
    runs under the reaper; close_pools leaves no pooled container or thread."""
    with host.config.open("a") as f:
        f.write("[sandbox]\nwarm = 1\n")
    cfg = load_config(host.config)
    pool = autogen_warm.pool_for(cfg, images.DEFAULT_IMAGE)
    assert pool is not None
    try:
        assert pool.wait_full(60)
        [entry] = pool.idle()

        async def run() -> tuple[str, CommandLineCodeResult]:
            async with SandboxCodeExecutor(host.config) as executor:
                result = await executor.execute_code_blocks(
                    [CodeBlock(code=BLOCK, language="python")], CancellationToken()
                )
                return executor.sandbox_id, result

        sandbox_id, result = asyncio.run(run())
        assert sandbox_id == entry.name
        assert result.exit_code == 0, result.output
        output = result.output
        assert "pid1: [b'python3', b'-c']" in output
        assert "cwd: /workspace uid: 10001" in output
        assert "outbox: writable" in output
        assert pool.wait_full(60)  # refilled after the take
    finally:
        autogen_warm.close_pools()
    found = engine.containers.list(all=True, filters={"label": f"{warm.WARM_LABEL}={pool.key}"})
    assert found == []  # the executor's removed at its stop, the idle one at close
    assert not [t for t in threading.enumerate() if t.name == "warm-pool"]
