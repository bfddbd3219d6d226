"""AutoGen's CodeExecutorAgent on the broker, against the real autogen packages, the
real Docker engine and real brokers (a `broker serve` process, or the executor's own).

The model is AutoGen's own ReplayChatCompletionClient: scripted replies, no network.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from autogen_agentchat.agents import CodeExecutorAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.messages import CodeExecutionEvent
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.models.replay import ReplayChatCompletionClient

from broker.integrations.autogen import SandboxCodeExecutor, approval_func
from tests.integrations.conftest import Host

pytestmark = pytest.mark.docker

AUTO_PYTHON = """
[[rules]]
effect = "code.execute"
when = { "blocks.language" = "python" }
action = "auto"
reason = "python blocks run in a sandbox with no network"
"""

PROBE = """\
import os, outbox
print("interfaces:", sorted(os.listdir("/sys/class/net")))
try:
    open("/etc/probe", "w")
except OSError as exc:
    print("root:", exc.strerror)
answer = outbox.request("files.write", {"path": "report.txt", "content": "from the sandbox"})
print("report:", answer["status"])
"""


def fenced(code: str, language: str = "python") -> str:
    return f"Here is the code.\n```{language}\n{code}```"


def agent(executor: SandboxCodeExecutor, *replies: str, gate: Any = None) -> CodeExecutorAgent:
    """A CodeExecutorAgent whose model replies with `replies`, gated by the broker."""
    return CodeExecutorAgent(
        "executor",
        code_executor=executor,
        model_client=ReplayChatCompletionClient(list(replies)),
        approval_func=gate or approval_func(executor=executor),
    )


async def run_agent(a: CodeExecutorAgent, task: str, **kw: Any) -> list[Any]:
    """Everything the run yields (events, messages, the TaskResult last)."""
    return [item async for item in a.run_stream(task=task, **kw)]


def executions(items: list[Any]) -> list[str]:
    return [m.result.output for m in items if isinstance(m, CodeExecutionEvent)]


def last_reply(items: list[Any]) -> str:
    result = items[-1]
    assert isinstance(result, TaskResult)
    return result.messages[-1].to_text()


def decide_when_pending(host: Host, verdict: str, who: str, reason: str) -> threading.Thread:
    """A person at another terminal: waits for the code.execute card, then decides."""

    def run() -> None:
        [row] = host.wait_pending("code.execute")
        host.cli("show", row["ref"])
        host.cli(verdict, row["ref"], "--as", who, "--reason", reason)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_approved_block_runs_sandboxed_and_its_request_is_applied(
    host: Host, serve: Callable[..., subprocess.Popen[str]], agent_image: str
) -> None:
    """Approved from the CLI, the block runs with only `lo` and a read-only root, its
    outbox request is applied, and the audit log shows who approved the code."""
    serve()

    async def run() -> tuple[list[Any], SandboxCodeExecutor]:
        async with SandboxCodeExecutor(host.config) as executor:
            assert executor._served is not None and not executor._served.own_broker
            person = decide_when_pending(host, "approve", "alice", "reads fine")
            result = await run_agent(
                agent(executor, fenced(PROBE), "The report is written."), "write the report"
            )
            await asyncio.to_thread(person.join, 60)
            return result, executor

    result, executor = asyncio.run(run())
    [output] = executions(result)
    assert "interfaces: ['lo']" in output
    assert "root: Read-only file system" in output
    assert "report: applied" in output
    assert (host.exports / "report.txt").read_text() == "from the sandbox"
    assert last_reply(result) == "The report is written."
    events = [e for e in host.audit() if e.get("effect") == "code.execute"]
    decision = next(e for e in events if e["event"] == "decision")
    assert (decision["by"], decision["verdict"], decision["surface"]) == ("alice", "approve", "cli")
    assert decision["sandbox"] == executor.sandbox_id
    assert "by=alice" in host.cli("audit", "tail", "-n", "50").stdout


def test_denied_block_never_runs_and_the_reason_reaches_the_agent(
    host: Host, serve: Callable[..., subprocess.Popen[str]], agent_image: str
) -> None:
    """Denied from the CLI: nothing runs, and the reviewer's reason is in the conversation."""
    serve()
    code = "import pathlib\npathlib.Path('ran').write_text('yes')\n"

    async def run() -> tuple[list[Any], Path]:
        async with SandboxCodeExecutor(host.config) as executor:
            person = decide_when_pending(host, "deny", "bob", "no writes today; print instead")
            result = await run_agent(
                agent(executor, fenced(code), "I will print instead."), "save a marker"
            )
            await asyncio.to_thread(person.join, 60)
            assert not (executor.work_dir / "ran").exists()
            return result, executor.work_dir

    result, _ = asyncio.run(run())
    [output] = executions(result)
    assert output == (
        "Code execution was not approved. Reason: denied by bob: no writes today; print instead"
    )
    denied = [e for e in host.audit() if e["event"] == "denied"]
    assert denied and denied[-1]["by"] == "bob"


def test_nobody_deciding_in_time_is_a_denial(host: Host, agent_image: str) -> None:
    """With the executor's own broker: a request nobody decides expires, and the agent
    reads that nobody decided in time."""
    host.policy('[[rules]]\neffect = "code.execute"\naction = "approve"\ntimeout = "1s"\n')

    async def run() -> tuple[list[Any], bool]:
        async with SandboxCodeExecutor(host.config) as executor:
            assert executor._served is not None and executor._served.own_broker
            result = await run_agent(
                agent(executor, fenced("open('ran', 'w')\n"), "Nobody answered."), "mark"
            )
            return result, (executor.work_dir / "ran").exists()

    result, ran = asyncio.run(run())
    assert not ran
    [output] = executions(result)
    assert output.startswith("Code execution was not approved. Reason: expired: nobody decided")
    assert "within 1s" in output
    assert [e["event"] for e in host.audit() if e["event"] == "expired"] == ["expired"]


def test_cancelling_the_run_mid_approval_withdraws_the_request(
    host: Host, serve: Callable[..., subprocess.Popen[str]], agent_image: str
) -> None:
    """Cancelling the agent's run (its task) while the code waits: the request ends
    denied, saying why, in the ledger and the audit log, and the code never runs."""
    serve()

    async def run() -> Path:
        async with SandboxCodeExecutor(host.config) as executor:
            coder = agent(executor, fenced("open('ran', 'w')\n"), "unused")
            running = asyncio.ensure_future(coder.run(task="go"))
            await asyncio.to_thread(host.wait_pending, "code.execute")
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            await asyncio.to_thread(_wait_event, host, "denied")
            return executor.work_dir / "ran"

    marker = asyncio.run(run())
    assert not marker.exists()
    [denied] = [e for e in host.audit() if e["event"] == "denied"]
    assert denied["by"] == "agent" and denied["withdrawn"] is True
    assert denied["reason"].startswith(
        "withdrawn by the agent: the agent's run was cancelled before anyone decided"
    )
    assert host.pending("code.execute") == []


def _wait_event(host: Host, kind: str) -> None:
    import time

    end = time.monotonic() + 60
    while not any(e["event"] == kind for e in host.audit()):
        assert time.monotonic() < end, f"no {kind} event within 60s"
        time.sleep(0.1)


def test_cancelling_mid_execution_kills_that_block_and_nothing_else(
    host: Host, agent_image: str, engine: docker.DockerClient
) -> None:
    """The token kills the running block (its processes are gone) while another process
    in the same sandbox lives on, and the next block runs."""
    block = (
        "import pathlib, subprocess, time\n"
        "subprocess.Popen(['sleep', '301'])\n"
        "pathlib.Path('started').touch()\n"
        "time.sleep(300)\n"
        "pathlib.Path('finished').touch()\n"
    )
    alive = (
        "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "print([open(f'/proc/{p}/cmdline').read().replace(chr(0), ' ') for p in pids])\n"
    )

    async def run() -> tuple[str, Path]:
        async with SandboxCodeExecutor(host.config) as executor:
            container = engine.containers.get(executor._container.id)  # type: ignore[union-attr]
            container.exec_run(["sleep", "302"], detach=True, user="10001:10001")
            token = CancellationToken()
            running = asyncio.ensure_future(
                executor.execute_code_blocks([CodeBlock(block, "python")], token)
            )
            while not (executor.work_dir / "started").exists():
                assert not running.done(), running.result()
                await asyncio.sleep(0.05)
            token.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            after = await executor.execute_code_blocks(
                [CodeBlock(alive, "python")], CancellationToken()
            )
            assert after.exit_code == 0, after.output
            return after.output, executor.work_dir

    processes, work_dir = asyncio.run(run())
    assert "sleep 302" in processes
    assert "sleep 301" not in processes
    assert "sleep 300" not in processes and "time.sleep" not in processes
    assert not (work_dir / "finished").exists()


def test_a_block_past_its_timeout_is_stopped(host: Host, agent_image: str) -> None:
    """A block over the per-block timeout gets exit code 124 and a Timeout line; the
    sandbox runs the next block."""

    async def run() -> tuple[Any, Any]:
        async with SandboxCodeExecutor(host.config, timeout=2) as executor:
            slow = await executor.execute_code_blocks(
                [CodeBlock("echo before; sleep 60; echo after\n", "sh")], CancellationToken()
            )
            quick = await executor.execute_code_blocks(
                [CodeBlock("print(6 * 7)\n", "python")], CancellationToken()
            )
            return slow, quick

    slow, quick = asyncio.run(run())
    assert slow.exit_code == 124
    assert slow.output == "before\n\nTimeout: the block ran longer than 2s and was stopped"
    assert (quick.exit_code, quick.output) == (0, "42\n")


def test_unknown_language_and_unapproved_code_get_a_result_not_an_exception(
    host: Host, agent_image: str
) -> None:
    """A language the executor does not run, or code its approval_func never approved,
    is a CodeResult saying so; nothing runs."""

    async def run() -> tuple[Any, Any]:
        async with SandboxCodeExecutor(host.config) as executor:
            ruby = await executor.execute_code_blocks(
                [CodeBlock("puts 1", "ruby")], CancellationToken()
            )
            approval_func(executor=executor)
            sneaky = await executor.execute_code_blocks(
                [CodeBlock("open('ran', 'w')\n", "python")], CancellationToken()
            )
            assert not (executor.work_dir / "ran").exists()
            return ruby, sneaky

    ruby, sneaky = asyncio.run(run())
    assert ruby.exit_code == 1 and ruby.output.startswith("unsupported language 'ruby'")
    assert sneaky.exit_code == 1 and sneaky.output.startswith("not approved:")


def test_async_run_streams_while_a_person_decides_on_the_same_loop(
    host: Host, agent_image: str
) -> None:
    """An async run (run_stream) waits for approval without blocking its event loop: the
    approval itself comes from a task on that same loop."""
    host.policy("")  # code.execute defaults to a person's approval

    async def approve_on_this_loop() -> None:
        while not (rows := await asyncio.to_thread(host.pending, "code.execute")):
            await asyncio.sleep(0.1)
        proc = await asyncio.create_subprocess_exec(
            *_cli(host, "approve", rows[0]["ref"], "--as", "carol", "--reason", "ok"),
            stdout=asyncio.subprocess.DEVNULL,
        )
        assert await proc.wait() == 0

    async def run() -> list[str]:
        async with SandboxCodeExecutor(host.config) as executor:
            person = asyncio.ensure_future(approve_on_this_loop())
            seen = []
            async for item in agent(executor, fenced("print('streamed')\n"), "Done.").run_stream(
                task="print"
            ):
                if isinstance(item, CodeExecutionEvent):
                    seen.append(item.result.output)
            await person
            return seen

    assert asyncio.run(run()) == ["streamed\n"]


def test_sync_run_from_plain_code(host: Host, agent_image: str) -> None:
    """A synchronous caller (asyncio.run in a plain function) gets the auto-approved
    block's output; the policy's reason is the approval's."""
    host.policy(AUTO_PYTHON)
    reasons: list[str] = []

    def sync_caller() -> tuple[TaskResult, list[str]]:
        async def main() -> tuple[TaskResult, list[str]]:
            async with SandboxCodeExecutor(host.config) as executor:
                gate = approval_func(executor=executor)

                async def recording(request: Any) -> Any:
                    response = await gate(request)
                    reasons.append(response.reason)
                    return response

                coder = agent(executor, fenced("print(2 + 2)\n"), "It is 4.", gate=recording)
                result = await coder.run(task="add")
                said = [str(m.content) for m in await coder.model_context.get_messages()]
                return result, said

        return asyncio.run(main())

    result, said = sync_caller()
    assert result.messages[-1].to_text() == "It is 4."
    assert "4\n" in said  # the block's output, as the model read it
    assert reasons == [
        "applied automatically (rules[0]): python blocks run in a sandbox with no network"
    ]


def test_approval_func_alone_files_in_a_sandbox_named_for_the_agent(
    host: Host, serve: Callable[..., subprocess.Popen[str]]
) -> None:
    """Without an executor, requests go to a sandbox named for the agent, served by the
    running broker, and say the code runs in the caller's own process on the host: the
    sandboxed-python rule does not decide them, a rule naming runs_in = "host" does; a
    shell block waits, and its card shows where it runs, the code and the conversation."""
    from autogen_agentchat.agents import ApprovalRequest
    from autogen_core.models import AssistantMessage, UserMessage

    host.policy(
        AUTO_PYTHON + '[[rules]]\neffect = "code.execute"\naction = "auto"\nreason = "fine"\n'
        'when = { runs_in = "host", "blocks.language" = "python" }\n'
    )
    serve()
    gate = approval_func(host.config)

    def ask(code: str) -> Any:
        context = [
            UserMessage(content="count the files", source="user"),
            AssistantMessage(content=code, source="analyst"),
        ]
        return asyncio.run(gate(ApprovalRequest(code=code, context=context)))

    python = ask("```python\nprint(1)\n```")
    assert (python.approved, python.reason) == (
        True,
        "applied automatically (rules[1]): fine",
    )
    cards: list[str] = []

    def person() -> None:
        [row] = host.wait_pending("code.execute")
        assert row["sandbox"] == "analyst"
        cards.append(host.cli("show", row["ref"]).stdout)
        host.cli("deny", row["ref"], "--as", "dana", "--reason", "use python, not sh")

    thread = threading.Thread(target=person)
    thread.start()
    shell = ask("```sh\nls -la /workspace\n```")
    thread.join(60)
    assert (shell.approved, shell.reason) == (False, "denied by dana: use python, not sh")
    assert "ls -la /workspace" in cards[0] and "count the files" in cards[0]
    assert "the caller's own process on the host, with its rights" in cards[0]


def _requests(host: Host) -> list[dict[str, Any]]:
    events = [e for e in host.audit() if e["event"] == "received"]
    return [{**e, "ref": f"{e['sandbox']}/{e['id']}"} for e in events]


def _cli(host: Host, *args: str) -> list[str]:
    from tests.integrations.conftest import BROKER

    return [BROKER, *args, "--config", str(host.config)]
