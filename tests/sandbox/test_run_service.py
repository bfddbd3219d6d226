"""`broker run` beside a `broker serve` that checked the same config: the owner runs the
sandbox (broker.hosting.run_service) and the run is its client (broker.cli.run_client),
on the real engine: exit codes, output, answers, Ctrl-C, refusals, and an owner that
dies while the sandbox runs."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pexpect
import pytest

from broker.config import load_config
from broker.hosting import sandbox, warm
from broker.hosting.runtimes.docker import DockerRuntime
from broker.inputs import locate
from broker.loop.lockfile import socket_path, unix_address
from tests.support import approve_at_the_prompt, at_a_terminal, eventually

pytestmark = pytest.mark.docker

BROKER = str(Path(sys.executable).parent / "broker")
AGENT = """
import outbox, sys
r = outbox.request("files.write", {"path": sys.argv[1], "content": "by the owner"}, timeout=60)
print("AGENT", r["status"])
sys.exit(3)
"""
# broker.cli.run's main, then the modules it loaded: what a run costs before its start
WRAPPED = (
    "import sys\nfrom broker.cli.run import main\ncode = main(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write('\\n'.join(sorted(sys.modules)))\nsys.exit(code)\n"
)


def write_config(base: Path, extra: str = "") -> Path:
    exports = base / "exports"
    exports.mkdir(exist_ok=True)
    path = base / "broker.toml"
    path.write_text(
        f'[broker]\nstate_dir = "state"\n[sandbox]\nwarm = 1\n'
        f'[integrations.files]\nroot = "{exports}"\nper_sandbox = false\n{extra}'
    )
    return path


def start_serve(config: Path) -> subprocess.Popen[bytes]:
    with (config.parent / "serve.log").open("w") as log:  # the child keeps its own copy
        serve = subprocess.Popen(
            [BROKER, "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    cfg = load_config(config)
    key = warm.settings(cfg, "docker").key

    def full() -> list[Path]:
        """the pool holds its sandbox, and the owner listens"""
        assert serve.poll() is None, (config.parent / "serve.log").read_text()
        if not socket_path(cfg.state_dir).exists():
            return []
        return sorted((cfg.state_dir / "warm" / key).glob("sb-*"))

    eventually(full, timeout=60)
    return serve


def stop_serve(serve: subprocess.Popen[bytes], config: Path) -> None:
    serve.send_signal(signal.SIGINT)
    assert serve.wait(60) == 0, (config.parent / "serve.log").read_text()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, agent_image: str) -> Iterator[Path]:
    """broker.toml, served by a `broker serve` keeping one warm sandbox."""
    config = write_config(tmp_path_factory.mktemp("served"))
    serve = start_serve(config)
    yield config
    stop_serve(serve, config)


def containers(name: str) -> list[Any]:
    return [c for c in DockerRuntime().leftovers() if c.labels.get(sandbox.LABEL) == name]


def sandbox_of(stderr: str) -> str:
    return stderr.split("handed sandbox ", 1)[1].split(" ", 1)[0]


def test_the_owner_runs_it_and_the_run_loads_no_engine_or_pipeline(
    served: Path, engine: docker.DockerClient, tmp_path: Path
) -> None:
    """The agent's request is applied, its exit code is the run's, its output and the
    summary are printed; the container is gone; the run itself loaded none of the
    config's validation, the engine's client, the pipeline, the registry or logging
    (that is what makes it fast)."""
    modules = tmp_path / "modules.txt"
    argv = [sys.executable, "-c", WRAPPED, str(modules), "--config", str(served), "--"]
    done = subprocess.run(
        [*argv, "python3", "-c", AGENT, "owner.txt"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 3, done.stderr
    sandbox_id = sandbox_of(done.stderr)
    assert "  │ AGENT applied" in done.stderr
    assert f"sandbox {sandbox_id} exited with 3: 1 applied" in done.stderr
    assert (served.parent / "exports" / "owner.txt").read_text() == "by the owner"
    assert containers(sandbox_id) == []
    loaded = set(modules.read_text().split())
    heavy_modules = ("broker.config", "broker.hosting.runtimes.engine", "broker.loop.pipeline")
    for heavy in (*heavy_modules, "broker.loop.ownership", "broker.registry", "logging", "hashlib"):
        assert heavy not in loaded, heavy


def test_an_image_outside_the_pool_is_started_cold_by_the_owner(
    served: Path, engine: docker.DockerClient, agent_image: str
) -> None:
    """An image the pool does not hold: the owner creates, proves and starts it."""
    other = "broker-sandbox:run-service"
    engine.images.get(agent_image).tag(other)
    try:
        done = subprocess.run(
            [BROKER, "run", "--config", str(served), "--image", other, "--", "sh", "-c", "echo hi"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    finally:
        engine.images.remove(other)
    assert done.returncode == 0, done.stderr
    sandbox_id = sandbox_of(done.stderr)
    assert f"sandbox {sandbox_id}: running sh -c echo hi in {other}" in done.stderr
    assert "  │ hi" in done.stderr
    assert f"sandbox {sandbox_id} exited with 0: no requests" in done.stderr
    assert containers(sandbox_id) == []


def test_a_config_the_owner_did_not_check_is_checked_here(served: Path) -> None:
    """Another broker.toml on the same state dir, with a fault: the run checks it
    itself and stops with the one line, and no sandbox is made for it."""
    broken = served.parent / "broken.toml"
    broken.write_text(served.read_text() + "[integrations.nosuch]\nx = 1\n")
    before = set((served.parent / "state" / "sandboxes").iterdir())
    done = subprocess.run(
        [BROKER, "run", "--config", str(broken), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and "nosuch" in line, line
    assert set((served.parent / "state" / "sandboxes").iterdir()) == before


def test_ctrl_c_has_the_owner_remove_the_container(
    served: Path, engine: docker.DockerClient
) -> None:
    run = subprocess.Popen(
        [BROKER, "run", "--config", str(served), "--", "sh", "-c", "echo up; sleep 60"],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stderr is not None
    seen = ""
    while "│ up" not in seen:
        line = run.stderr.readline()
        assert line, seen
        seen += line
    sandbox_id = sandbox_of(seen)
    assert containers(sandbox_id)
    run.send_signal(signal.SIGINT)
    rest = run.stderr.read()
    run.stderr.close()
    assert run.wait(30) == 130, seen + rest
    assert "interrupted: the sandbox was removed" in rest
    assert containers(sandbox_id) == []


def ask(config: Path, message: dict[str, Any]) -> dict[str, Any]:
    """One message to the owner's control socket, its first answer."""
    cfg = load_config(config)
    with socket.socket(socket.AF_UNIX) as sock:
        with unix_address(socket_path(cfg.state_dir)) as address:
            sock.connect(address)
        sock.settimeout(30)
        sock.sendall(json.dumps(message).encode() + b"\n")
        answer: dict[str, Any] = json.loads(sock.makefile().readline())
        return answer


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ({"command": []}, "command"),
        ({"command": ["true", 1]}, "command"),
        ({"command": ["a\0b"]}, "command"),
        ({"command": ["true"], "image": 7}, "image"),
        ({"command": ["true"]}, "inputs"),
        ({"command": ["true"], "inputs": {"state_dir": 1}}, "inputs"),
        ({"command": ["true"], "inputs": {"state_dir": "/nowhere"}}, "changed"),
        ({"command": ["true"], "inputs": "OTHER CONFIG"}, "changed"),
        ({"command": ["true"], "runtime": 1, "inputs": "OWN"}, "runtime"),
        ({"command": ["true"], "runtime": "podman", "inputs": "OWN"}, "runs docker"),
    ],
)
def test_the_owner_refuses_a_run_it_cannot_vouch_for(
    served: Path, engine: docker.DockerClient, message: dict[str, Any], says: str
) -> None:
    """A malformed run op, one naming other inputs than the owner checked, or one
    asking for a runtime it does not run: refused with a reason, nothing started."""
    state = served.parent / "state"
    before = started_for(state)
    if message.get("inputs") in ("OWN", "OTHER CONFIG"):  # the owner's, or a copy elsewhere
        located = locate(served)
        config = located.path
        if message["inputs"] == "OTHER CONFIG":  # the same bytes at another path
            assert config is not None
            config = served.parent / "copy.toml"
            config.write_bytes(served.read_bytes())
        message = {
            **message,
            "inputs": {
                "state_dir": str(located.state_dir),
                "config": str(config),
                "policy": str(located.policy_path) if located.policy_path else None,
            },
        }
    answer = ask(served, {"op": "run", **message})
    assert answer["ok"] is False and says in answer["error"], answer
    assert started_for(state) <= before


def started_for(state: Path) -> set[str]:
    """The containers of runs on `state` (its pool's, refilled meanwhile, aside; other
    tests' containers on the same engine are not this state dir's)."""
    return {
        c.id
        for c in DockerRuntime().leftovers()
        if warm.WARM_LABEL not in c.labels
        and any(m.get("Source", "").startswith(f"{state}/") for m in c.attrs.get("Mounts", []))
    }


def test_an_owner_that_dies_leaves_the_sandbox_to_the_run(
    tmp_path: Path, engine: docker.DockerClient, agent_image: str
) -> None:
    """kill -9 of `broker serve` while its client's sandbox runs: the run serves the
    container to its end itself, answers the agent, exits with its code, removes it."""
    config = write_config(tmp_path)
    serve = start_serve(config)
    agent = f"import time; time.sleep(3)\n{AGENT}"
    run = subprocess.Popen(
        [BROKER, "run", "--config", str(config), "--", "python3", "-c", agent, "left.txt"],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stderr is not None
    seen = run.stderr.readline() + run.stderr.readline()
    assert "running python3" in seen, seen
    serve.kill()
    serve.wait(30)
    rest = run.stderr.read()
    run.stderr.close()
    try:
        assert run.wait(120) == 3, seen + rest
        sandbox_id = sandbox_of(seen)
        assert f"the serving broker went away; serving {sandbox_id} here" in rest
        assert "AGENT applied" in rest
        assert (tmp_path / "exports" / "left.txt").read_text() == "by the owner"
        assert containers(sandbox_id) == []
    finally:  # the dead keeper's refilled pool
        for left in DockerRuntime().leftovers():
            if left.labels.get(warm.WARM_LABEL) == warm.settings(load_config(config), "docker").key:
                DockerRuntime().remove(left)


GATED = """
import outbox
outbox.request("files.write", {"path": "g.txt", "content": "one"}, timeout=60)
r = outbox.request("files.write", {"path": "g.txt", "content": "two", "overwrite": True},
                   reason="update it", timeout=90)
print("AGENT", r["status"], r["reason"])
"""


def test_at_a_terminal_the_run_asks_about_what_the_owners_sandbox_waits_on(
    tmp_path: Path, engine: docker.DockerClient, agent_image: str
) -> None:
    """The owner runs the sandbox; a gated request's card is shown at the run's
    terminal, and the answer given there decides it."""
    config = write_config(tmp_path)
    (tmp_path / "policy.toml").write_text(
        '[[rules]]\neffect = "files.write"\nwhen = { overwrite = true }\naction = "approve"\n'
        'timeout = "2m"\nreason = "an overwrite destroys the old file"\n'
    )
    policy = '[broker]\npolicy = "policy.toml"\n'
    config.write_text(config.read_text().replace("[broker]\n", policy))
    serve = start_serve(config)
    try:
        child = at_a_terminal("run", "--config", str(config), "--", "python3", "-c", GATED)
        child.expect("handed sandbox (sb-[0-9a-f]+) to")
        sandbox_id = child.match.group(1)
        approve_at_the_prompt(child, "an overwrite destroys the old file", "looked at the diff")
        child.expect("AGENT applied approved by .*: looked at the diff")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        assert (tmp_path / "exports" / "g.txt").read_text() == "two"
        assert containers(sandbox_id) == []
    finally:
        stop_serve(serve, config)
