"""`broker run --runtime podman` end to end on a real Podman (rootful): the same run as
on Docker (tests/sandbox/test_run.py): applied, exit code, cleanup, Ctrl-C, detach."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from broker.hosting import images, sandbox
from broker.hosting.runtimes.podman import PodmanRuntime

BROKER = str(Path(sys.executable).parent / "broker")
AGENT = """
import outbox
r = outbox.request("files.write", {"path": "out.txt", "content": "from podman"}, timeout=60)
print("AGENT", r["status"], r["output"]["bytes"])
"""


@pytest.fixture
def host(tmp_path: Path, podman_runtime: PodmanRuntime) -> Path:
    """A broker.toml with a files export root; the agent image in Podman's store."""
    podman_runtime.ensure_image(images.DEFAULT_IMAGE)
    (tmp_path / "exports").mkdir()
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\nstate_dir = "state"\n'
        f'[integrations.files]\nroot = "{tmp_path / "exports"}"\nper_sandbox = false\n'
    )
    return config


def broker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BROKER, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def podman_run(host: Path, name: str) -> list[str]:
    """`broker run` on Podman with this test's config, as sandbox `name`."""
    return ["run", "--runtime", "podman", "--config", str(host), "--name", name]


def mine(runtime: PodmanRuntime, name: str) -> list[object]:
    return [c for c in runtime.leftovers() if c.labels.get(sandbox.LABEL) == name]


def test_agent_request_is_applied_and_container_removed(
    host: Path, podman_runtime: PodmanRuntime
) -> None:
    """`broker run --runtime podman`: the agent's request is applied, the run summarises,
    and the container is gone."""
    name = f"pm-{uuid.uuid4().hex[:8]}"
    done = broker(
        *podman_run(host, name),
        "--",
        "python3",
        "-c",
        AGENT,
    )

    assert done.returncode == 0, done.stderr
    assert "AGENT applied 11" in done.stderr
    assert f"sandbox {name} exited with 0: 1 applied" in done.stderr
    assert (host.parent / "exports" / "out.txt").read_text() == "from podman"
    assert mine(podman_runtime, name) == []


def test_sandbox_runtime_in_broker_toml_and_the_exit_code(
    host: Path, podman_runtime: PodmanRuntime
) -> None:
    """`[sandbox] runtime = "podman"` chooses Podman without the flag; the agent's exit
    code is the run's."""
    with host.open("a") as config:
        config.write('[sandbox]\nruntime = "podman"\n')
    name = f"pm-{uuid.uuid4().hex[:8]}"

    done = broker(
        "run",
        "--config",
        str(host),
        "--name",
        name,
        "--",
        "python3",
        "-c",
        "import sys; sys.exit(7)",
    )

    assert done.returncode == 7, done.stderr
    assert f"sandbox {name} exited with 7" in done.stderr
    assert mine(podman_runtime, name) == []


def test_unknown_runtime_is_one_line(host: Path) -> None:
    """A runtime the broker does not know is refused in one line naming the choices."""
    done = broker("run", "--runtime", "lxc", "--config", str(host), "--", "true")

    assert done.returncode == 2
    assert "unknown sandbox runtime 'lxc'; choose one of docker, podman" in done.stderr
    assert "Traceback" not in done.stderr


def test_sigint_removes_the_container(host: Path, podman_runtime: PodmanRuntime) -> None:
    """Ctrl-C during a Podman run removes the container and exits 130."""
    name = f"pm-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [
            BROKER,
            *podman_run(host, name),
            "--",
            "python3",
            "-c",
            "import time; print('up', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not mine(podman_runtime, name):
        time.sleep(0.2)
    assert mine(podman_runtime, name), "the sandbox never started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 130, err
    assert mine(podman_runtime, name) == []


def test_detached_sandbox_is_listed_and_removed(host: Path, podman_runtime: PodmanRuntime) -> None:
    """`run --detach` on Podman, then `broker sandbox ls|rm --runtime podman`."""
    name = f"pm-{uuid.uuid4().hex[:8]}"
    done = broker(
        *podman_run(host, name),
        "--detach",
        "--",
        "sleep",
        "60",
    )
    assert done.returncode == 0, done.stderr

    listed = broker("sandbox", "ls", "--runtime", "podman", "--tsv")
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    row = next(r for r in rows if r[0] == name)
    removed = broker("sandbox", "rm", "--runtime", "podman", name)

    assert rows[0] == ["sandbox", "container", "name", "status"]
    assert row[2] == f"broker-{name}" and row[3] == "running"
    assert "removed 1 container(s)" in removed.stdout
    assert mine(podman_runtime, name) == []
