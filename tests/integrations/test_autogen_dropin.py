"""SandboxCodeExecutor as a drop-in for AutoGen's DockerCommandLineCodeExecutor, tried
through AutoGen's documented executor interface (execute_code_blocks, CommandLineCodeResult,
`# filename:`, the keyword arguments, component config, stopping at exit) with the real
autogen packages and the real Docker engine. One executor serves most checks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import docker
import pytest
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock, CodeExecutor
from autogen_ext.code_executors._common import CommandLineCodeResult

from broker.hosting import sandbox
from broker.integrations.autogen import SandboxCodeExecutor
from broker.integrations.autogen_compat import EXECUTOR_LABEL, code_filename, workspace_user
from tests.integrations.conftest import BROKER, Host

pytestmark = pytest.mark.docker


def test_a_caller_made_work_dir_and_autogen_results(
    host: Host, agent_image: str, engine: docker.DockerClient, tmp_path: Path
) -> None:
    """A tempfile dir owned by root (mode 0700) works; results are CommandLineCodeResult
    with code_file, the code written there; `# filename:` is honoured inside the work dir
    and an error result outside it; a read-only extra volume is readable, not writable;
    init_command ran; the container is labelled and `broker sandbox rm` removes it; the
    work dir's owner and mode are as before afterwards."""
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("input")
    before = work.stat()

    async def run() -> None:
        executor = SandboxCodeExecutor(
            host.config,
            work_dir=work,
            extra_volumes={str(data): {"bind": "/data", "mode": "ro"}},
            init_command="echo ready > inited",
        )
        async with executor:
            assert (work / "inited").read_text() == "ready\n"
            one = await executor.execute_code_blocks(
                [CodeBlock("print(open('/data/in.txt').read())\n", "python")], CancellationToken()
            )
            assert isinstance(one, CommandLineCodeResult)
            assert (one.exit_code, one.output) == (0, "input\n")
            assert one.code_file is not None and Path(one.code_file).parent == work
            assert Path(one.code_file).read_text() == "print(open('/data/in.txt').read())\n"
            named = "# filename: sub/hello.py\nprint('hello')\nopen('/data/x', 'w')\n"
            two = await executor.execute_code_blocks(
                [CodeBlock(named, "python")], CancellationToken()
            )
            assert two.exit_code == 1 and "Read-only file system" in two.output
            assert two.code_file == str(work / "sub" / "hello.py")
            assert (work / "sub" / "hello.py").read_text() == named
            for outside in ("../escape.py", "/etc/evil.py"):
                bad = f"# filename: {outside}\nopen('ran', 'w')\n"
                three = await executor.execute_code_blocks(
                    [CodeBlock(bad, "python")], CancellationToken()
                )
                assert (three.exit_code, three.output) == (1, "Filename is not in the workspace")
            assert not (work / "ran").exists() and not (tmp_path / "escape.py").exists()
            [container] = engine.containers.list(
                filters={"label": f"{sandbox.LABEL}={executor.sandbox_id}"}
            )
            assert container.labels[EXECUTOR_LABEL].endswith(f":{os.getpid()}")
            rm = subprocess.run(
                [BROKER, "sandbox", "rm", executor.sandbox_id], capture_output=True, text=True
            )
            assert rm.stdout.strip() == "removed 1 container(s)", rm.stderr
        assert not engine.containers.list(all=True, filters={"id": container.id})

    asyncio.run(run())
    after = work.stat()
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)


def test_component_config_round_trips() -> None:
    """dump_component / load_component, as an AutoGen Studio or JSON team config does."""
    executor = SandboxCodeExecutor(
        "/etc/broker.toml",
        timeout=30,
        work_dir="/srv/work",
        delete_tmp_files=True,
        extra_volumes={"/srv/ref": {"bind": "/ref", "mode": "ro"}},
        init_command="true",
    )
    model = executor.dump_component()
    assert model.provider == "broker.integrations.autogen.SandboxCodeExecutor"
    assert model.component_type == "code_executor"
    again = CodeExecutor.load_component(model.model_dump())
    assert isinstance(again, SandboxCodeExecutor)
    assert again.dump_component().config == model.config
    assert again.timeout == 30 and model.config["extra_volumes"]["/srv/ref"]["mode"] == "ro"


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"extra_volumes": {"/srv": {"bind": "/srv", "mode": "rw"}}}, "only read-only volumes"),
        ({"extra_hosts": {"db": "10.0.0.2"}}, "the sandbox has no network"),
        ({"functions": [print]}, "needs the network the sandbox does not have"),
        ({"auto_remove": False}, "a stopped sandbox is always removed"),
        ({"bind_dir": "/x"}, "the sandbox mounts its own dirs"),
    ],
)
def test_what_the_sandbox_refuses_by_design_says_why(kwargs: dict[str, object], said: str) -> None:
    with pytest.raises(ValueError, match="refused by design") as raised:
        SandboxCodeExecutor(**kwargs)  # type: ignore[arg-type]
    assert said in str(raised.value)


def test_filename_is_decided_on_the_text_alone(tmp_path: Path) -> None:
    assert code_filename("# filename: a/b.py\nx", tmp_path) == "a/b.py"
    assert code_filename(f"# filename: {tmp_path}/c.py\nx", tmp_path) == "c.py"
    assert code_filename("# filename: /workspace/d.sh\nx", tmp_path) == "d.sh"
    assert code_filename("print(1)\n# filename: e.py", tmp_path) is None
    for outside in ("../x.py", "a/../../x.py", "/tmp/x.py", f"{tmp_path}/../x.py"):
        with pytest.raises(ValueError):
            code_filename(f"# filename: {outside}\n", tmp_path)


def test_a_users_own_work_dir_is_used_with_that_users_rights(
    host: Host, agent_image: str, tmp_path: Path
) -> None:
    """A dir owned by an ordinary user (mode 0700): blocks run as that user (their files
    are that user's, and `import outbox` still files requests), and the dir is not
    changed at all (no chown, no wider mode)."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    os.chown(mine, 1000, 1000)
    assert workspace_user(mine) == ("1000:1000", None)
    block = (
        "import os, outbox\nopen('made', 'w').write('x')\nprint(os.getuid())\n"
        "print(outbox.request('files.write', {'path': 'u.txt', 'content': 'u'})['status'])\n"
    )

    async def run() -> str:
        async with SandboxCodeExecutor(host.config, work_dir=mine) as executor:
            done = await executor.execute_code_blocks(
                [CodeBlock(block, "python")], CancellationToken()
            )
            assert done.exit_code == 0, done.output
            return done.output

    assert asyncio.run(run()) == "1000\napplied\n"
    assert (mine / "made").stat().st_uid == 1000
    assert (mine.stat().st_uid, mine.stat().st_mode & 0o777) == (1000, 0o700)


EXITING = """
import asyncio, os, signal, sys
from broker.integrations.autogen import SandboxCodeExecutor

async def main():
    executor = SandboxCodeExecutor(sys.argv[1])
    await executor.start()
    print(executor.sandbox_id, flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def test_the_container_goes_at_exit_and_orphans_are_reaped(
    host: Host, agent_image: str, engine: docker.DockerClient
) -> None:
    """Never stopped: the container is removed when the interpreter exits. Killed
    before it could: the container stays, and the next executor's start reaps it."""

    def run(how: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(EXITING), str(host.config), how],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done.stdout.strip()

    def containers(sandbox_id: str) -> list[object]:
        return engine.containers.list(all=True, filters={"label": f"{sandbox.LABEL}={sandbox_id}"})

    killed = run("kill")
    assert len(containers(killed)) == 1
    exited = run("exit")
    assert exited and containers(exited) == []
    assert containers(killed) == []
