"""Sandboxes on real runtimes (Docker, Podman rootful and rootless): what an agent inside
can and cannot reach."""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest

from broker.errors import SandboxError
from broker.hosting import images, sandbox
from broker.hosting.runtimes.docker import DockerRuntime

# Reports what the sandbox looks like from inside, as JSON on stdout.
PROBE = r"""
import errno, json, os, socket, subprocess

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))

def write(path):
    with open(path, "w") as f:
        f.write("x")

def connect_loopback():
    with socket.create_connection(("127.0.0.1", 9), timeout=2):
        pass

def run_from_tmp():
    with open("/tmp/hello.sh", "w") as f:
        f.write("#!/bin/sh\necho hello\n")
    os.chmod("/tmp/hello.sh", 0o755)
    assert subprocess.run(["/tmp/hello.sh"], capture_output=True).stdout == b"hello\n"

def readonly(path):
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)

status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines())
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(),
    "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "interfaces": sorted(os.listdir("/sys/class/net")),
    "net_dev": [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]],
    "routes": open("/proc/net/route").read().splitlines()[1:],
    "connect_loopback": attempt(connect_loopback),
    "root_readonly": readonly("/"),
    "write_etc": attempt(lambda: write("/etc/sandbox-was-here")),
    "write_client": attempt(lambda: write("/usr/local/bin/outbox")),
    "results_readonly": readonly("/results"),
    "write_results": attempt(lambda: write("/results/forged.json")),
    "outbox_readonly": readonly("/outbox"),
    "write_tmp_and_run": attempt(run_from_tmp),
    "env": dict(os.environ),
}))
"""


def probe(sandbox_host: Any, **kwargs: Any) -> dict[str, Any]:
    """Run PROBE in the sandbox and return what it saw."""
    run = sandbox_host.python(PROBE, **kwargs)
    assert run.exit_code == 0, run.stderr
    seen: dict[str, Any] = json.loads(run.stdout)
    return seen


@pytest.mark.docker
def test_sandbox_has_only_loopback_and_no_routes(sandbox_host: Any) -> None:
    """Inside, the only interface is lo, there is no route out, loopback has no server."""
    seen = probe(sandbox_host)

    assert seen["interfaces"] == ["lo"]
    assert seen["net_dev"] == ["lo"]
    assert seen["routes"] == []
    assert seen["connect_loopback"] == "ECONNREFUSED"


@pytest.mark.docker
def test_host_environment_and_secrets_stay_outside(
    sandbox_host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secret in the broker's env never reaches the sandbox; only named extras do."""
    secret = f"sekrit-{uuid.uuid4().hex}"
    monkeypatch.setenv("GITHUB_TOKEN", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)

    env = probe(sandbox_host, env={"AGENT_MODE": "review"})["env"]

    assert "GITHUB_TOKEN" not in env
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert not any(secret in value for value in env.values())
    assert env["AGENT_MODE"] == "review"
    assert env["OUTBOX_DIR"] == "/outbox"
    assert env["RESULTS_DIR"] == "/results"
    assert env["SANDBOX_ID"] == sandbox_host.paths.sandbox_id
    allowed = set(sandbox_host.runtime.image_env(sandbox_host.image))
    allowed |= {"OUTBOX_DIR", "RESULTS_DIR", "SANDBOX_ID", "AGENT_MODE", "HOME", "HOSTNAME"}
    assert set(env) <= allowed


@pytest.mark.docker
def test_agent_is_unprivileged(sandbox_host: Any) -> None:
    """The agent runs as SANDBOX_UID, with no capabilities and no way to gain privileges."""
    seen = probe(sandbox_host)

    assert (seen["uid"], seen["gid"], seen["euid"]) == (sandbox.SANDBOX_UID,) * 3
    assert int(seen["cap_eff"], 16) == 0
    assert seen["no_new_privs"] == "1"


@pytest.mark.docker
def test_root_filesystem_is_read_only_but_tmp_is_usable(sandbox_host: Any) -> None:
    """The image (the outbox client included) cannot be changed; /tmp takes files and runs them."""
    seen = probe(sandbox_host)

    assert seen["root_readonly"] is True
    assert seen["write_etc"] in {"EROFS", "EACCES"}
    assert seen["write_client"] in {"EROFS", "EACCES"}
    assert seen["write_tmp_and_run"] == "ok"


@pytest.mark.docker
def test_results_are_readable_but_not_writable(sandbox_host: Any) -> None:
    """A result the host wrote is readable inside; the sandbox cannot forge one."""
    result = {"version": 1, "id": "r1", "status": "applied", "output": {"n": 42}}
    (sandbox_host.paths.results / "r1.json").write_text(json.dumps(result))

    run = sandbox_host.python("print(open('/results/r1.json').read())")
    seen = probe(sandbox_host)

    assert run.exit_code == 0, run.stderr
    assert json.loads(run.stdout) == result
    assert seen["results_readonly"] is True
    assert seen["write_results"] in {"EROFS", "EACCES"}
    assert not (sandbox_host.paths.results / "forged.json").exists()


@pytest.mark.docker
def test_outbox_is_writable_and_the_host_sees_it(sandbox_host: Any) -> None:
    """What the agent writes into /outbox appears on the host, owned by SANDBOX_UID."""
    run = sandbox_host.python("open('/outbox/hello.txt', 'w').write('from inside')")

    written = sandbox_host.paths.outbox / "hello.txt"
    assert run.exit_code == 0, run.stderr
    assert written.read_text() == "from inside"
    assert written.stat().st_uid == sandbox_host.runtime.agent_uid()  # SANDBOX_UID, rootful
    assert probe(sandbox_host)["outbox_readonly"] is False


@pytest.mark.docker
def test_host_state_is_out_of_reach(sandbox_host: Any) -> None:
    """Nothing of the state dir (ledger, audit log) is visible anywhere in the sandbox."""
    names = sorted(p.name for p in sandbox_host.state_dir.iterdir() if p.is_file())
    assert len(names) == 2
    script = f"""
import json, os
names = set({names!r})
found = []
for top, dirs, files in os.walk("/"):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    found += [os.path.join(top, f) for f in files if f in names]
print(json.dumps({{"found": found, "state_dir": os.path.exists({str(sandbox_host.state_dir)!r})}}))
"""

    run = sandbox_host.python(script)

    assert run.exit_code == 0, run.stderr
    assert json.loads(run.stdout) == {"found": [], "state_dir": False}


@pytest.mark.docker
def test_outbox_command_round_trip(sandbox_host: Any) -> None:
    """`outbox request` in the sandbox waits past pending and exits 0 once applied."""
    broker = sandbox_host.answer((0.1, "pending"), (0.3, "applied"))
    container = sandbox_host.start(
        ["outbox", "request", "files.write", "--param", "path=a.txt", "--timeout", "30"]
    )

    status = container.wait(timeout=60)

    output = container.logs(stdout=True, stderr=False).decode()
    assert status["StatusCode"] == 0, container.logs().decode()
    assert json.loads(output)["status"] == "applied"
    assert broker.request["params"] == {"path": "a.txt"}
    assert broker.request["effect"] == "files.write"


@pytest.mark.docker
def test_outbox_module_round_trip_with_attachment(sandbox_host: Any) -> None:
    """`import outbox` works in the sandbox, and attachments reach the host's outbox."""
    broker = sandbox_host.answer((0.1, "denied"))
    script = (
        "import outbox\n"
        "r = outbox.request('git.push', {'bundle': 'b'}, attachments={'b': b'\\x00\\xff'},"
        " reason='ship it', timeout=30)\n"
        "print(r['status'])\n"
    )

    run = sandbox_host.python(script)

    assert run.exit_code == 0, run.stderr
    assert run.stdout.strip() == "denied"
    assert broker.request["attachments"] == ["b"]
    attachment = sandbox_host.paths.outbox / f"{broker.request['id']}.b.bin"
    assert attachment.read_bytes() == b"\x00\xff"


@pytest.mark.docker
def test_limits_are_applied(sandbox_host: Any) -> None:
    """The configured pids and memory ceilings are what the sandbox's cgroup enforces."""
    script = r"""
import json, os
def first(*paths):
    for p in paths:
        if os.path.exists(p):
            return open(p).read().strip()
print(json.dumps({
    "pids": first("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"),
    "memory": first("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"),
}))
"""
    limits = sandbox.SandboxLimits(pids=64, memory="128m")

    run = sandbox_host.python(script, limits=limits)

    assert run.exit_code == 0, run.stderr
    if getattr(sandbox_host.runtime, "waived", False):  # rootless Podman on cgroup v1
        # what makes the broker refuse it (test_proof.py): the limits are not applied
        assert json.loads(run.stdout) != {"pids": "64", "memory": str(128 * 1024 * 1024)}
        return
    assert json.loads(run.stdout) == {"pids": "64", "memory": str(128 * 1024 * 1024)}


@pytest.mark.docker
def test_leftovers_finds_sandboxes_until_removed(sandbox_host: Any) -> None:
    """leftovers() lists labelled containers; remove() deletes them and tolerates repeats."""
    container = sandbox_host.start(["sleep", "60"])

    found = {c.id: c.labels for c in sandbox_host.runtime.leftovers()}
    sandbox_host.runtime.remove(container)
    sandbox_host.runtime.remove(container)
    after = {c.id for c in sandbox_host.runtime.leftovers()}

    assert found[container.id][sandbox.LABEL] == sandbox_host.paths.sandbox_id
    assert container.id not in after


@pytest.mark.docker
def test_start_with_missing_image_says_how_to_build(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    """A missing agent image is a SandboxError naming the build command, not a pull."""
    paths = sandbox.prepare_dirs(tmp_path, "no-image")

    with pytest.raises(SandboxError, match="broker image build"):
        sandbox.start(engine, paths, "broker-sandbox:absent", ["true"])

    assert not [c for c in DockerRuntime().leftovers() if c.labels[sandbox.LABEL] == "no-image"]


@pytest.mark.docker
def test_start_refuses_to_override_protocol_env(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    """Config cannot redirect OUTBOX_DIR and friends through the extra env."""
    paths = sandbox.prepare_dirs(tmp_path, "env-clash")

    with pytest.raises(SandboxError, match="OUTBOX_DIR"):
        sandbox.start(engine, paths, "unused", ["true"], env={"OUTBOX_DIR": "/tmp"})


@pytest.mark.docker
def test_ensure_image_reuses_a_current_image(engine: docker.DockerClient, agent_image: str) -> None:
    """A second ensure_image() finds the image current and builds nothing."""
    said: list[str] = []
    started = time.monotonic()

    assert images.ensure_image(engine, agent_image, log=said.append) == agent_image

    assert said == []
    assert time.monotonic() - started < 5


def test_prepare_dirs_gives_outbox_to_the_agent_only(tmp_path: Path) -> None:
    """The outbox is SANDBOX_UID's alone (0700); results are the broker's (0755) and survive."""
    paths = sandbox.prepare_dirs(tmp_path, "sb-1")
    (paths.results / "kept.json").write_text("{}")
    again = sandbox.prepare_dirs(tmp_path, "sb-1")

    outbox, results = paths.outbox.stat(), paths.results.stat()
    assert again == paths
    assert paths.root == tmp_path / "sandboxes" / "sb-1"
    assert (outbox.st_uid, stat.S_IMODE(outbox.st_mode)) == (sandbox.SANDBOX_UID, 0o700)
    assert (results.st_uid, stat.S_IMODE(results.st_mode)) == (os.getuid(), 0o755)
    assert (paths.results / "kept.json").exists()


@pytest.mark.parametrize("bad", ["", "../escape", "a/b", ".hidden", "x" * 65])
def test_prepare_dirs_refuses_unsafe_ids(tmp_path: Path, bad: str) -> None:
    """A sandbox id that is not a plain name is refused before anything is created."""
    with pytest.raises(SandboxError, match="sandbox id"):
        sandbox.prepare_dirs(tmp_path, bad)

    assert list(tmp_path.iterdir()) == []


def test_engine_unreachable_says_how_to_start_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no engine, engine() raises SandboxError pointing at scripts/docker-up.sh."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")

    with pytest.raises(SandboxError, match=r"scripts/docker-up\.sh"):
        sandbox.engine()
