"""`broker run` end to end against the real engine: apply, answer, clean up, ask."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import docker
import pexpect
import pytest

from broker.audit import verify as audit
from broker.hosting import sandbox
from broker.hosting.runtimes.docker import DockerRuntime
from tests.support import Hook, approve_at_the_prompt, at_a_terminal, eventually

BROKER = str(Path(sys.executable).parent / "broker")


@pytest.fixture
def host(tmp_path: Path, agent_image: str) -> Path:
    """A broker.toml with a files export root and a policy gating overwrites."""
    (tmp_path / "exports").mkdir()
    (tmp_path / "policy.toml").write_text(
        '[[rules]]\neffect = "files.write"\nwhen = { overwrite = true }\naction = "approve"\n'
        'timeout = "2m"\nreason = "an overwrite destroys the old file"\n'
    )
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\nstate_dir = "state"\npolicy = "policy.toml"\n'
        f'[integrations.files]\nroot = "{tmp_path / "exports"}"\nper_sandbox = false\n'
    )
    return config


def run(config: Path, name: str, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BROKER, "run", "--config", str(config), "--name", name, "--", "python3", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        **kw,  # type: ignore[call-overload]
    )


# Sandbox ids (container names) unique to this run: suites of other checkouts may share
# the Docker engine, and a container name is the engine's, not the test's.
INT = f"int-{uuid.uuid4().hex[:8]}"
DET = f"det-{uuid.uuid4().hex[:8]}"
TTY = f"tty-{uuid.uuid4().hex[:8]}"
OK, BAD, TERM, NOTE, HAND, LAST = (
    f"{n}-{uuid.uuid4().hex[:8]}" for n in ("ok", "bad", "term", "note", "hand", "last")
)


def containers(name: str) -> list[object]:
    return [c for c in DockerRuntime().leftovers() if c.labels.get(sandbox.LABEL) == name]


AGENT = """
import outbox
r = outbox.request("files.write", {"path": "out.txt", "content": "from the sandbox"}, timeout=60)
print("AGENT", r["status"], r["output"]["bytes"])
"""


def test_agent_request_is_applied_and_container_removed(
    host: Path, engine: docker.DockerClient
) -> None:
    """The agent writes through the client, reads `applied`; the run summarises and cleans up."""
    done = run(host, OK, AGENT)
    assert done.returncode == 0, done.stderr
    assert "AGENT applied 16" in done.stderr
    assert f"sandbox {OK} exited with 0: 1 applied" in done.stderr
    assert (host.parent / "exports" / "out.txt").read_text() == "from the sandbox"
    assert containers(OK) == []


LAST_WORDS = """
import json, os
request = {"version": 1, "id": "last-words", "effect": "files.write",
           "params": {"path": "last.txt", "content": "written as it exits"}}
with open("/outbox/.last.tmp", "w") as f:
    json.dump(request, f)
os.rename("/outbox/.last.tmp", "/outbox/last-words.json")
"""


def test_a_request_written_as_the_agent_exits_is_still_applied(
    host: Path, engine: docker.DockerClient
) -> None:
    """An agent that writes a request and exits at once, before any broker could have
    answered (the run builds its broker only once the sandbox writes), still has it
    applied and answered: the run drains what the sandbox left."""
    done = run(host, LAST, LAST_WORDS)
    assert done.returncode == 0, done.stderr
    assert f"sandbox {LAST} exited with 0: 1 applied" in done.stderr
    assert (host.parent / "exports" / "last.txt").read_text() == "written as it exits"
    results = host.parent / "state" / "sandboxes" / LAST / "results"
    assert '"applied"' in (results / "last-words.json").read_text()
    assert containers(LAST) == []


def test_failing_agent_exit_code_is_returned_and_container_removed(
    host: Path, engine: docker.DockerClient
) -> None:
    """A crashing agent's exit code is the run's, and its container is gone."""
    done = run(host, BAD, "import sys; sys.exit(7)")
    assert done.returncode == 7
    assert "exited with 7" in done.stderr
    assert containers(BAD) == []


def test_sigint_removes_the_container(host: Path, engine: docker.DockerClient) -> None:
    """Ctrl-C (SIGINT) during a run removes the container and exits 130."""
    proc = subprocess.Popen(
        [
            BROKER,
            "run",
            "--config",
            str(host),
            "--name",
            INT,
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
    while time.monotonic() < deadline and not containers(INT):
        time.sleep(0.2)
    assert containers(INT), "the sandbox never started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert containers(INT) == []


def test_detached_sandbox_is_served_by_serve_root(
    host: Path, engine: docker.DockerClient, tmp_path: Path
) -> None:
    """`run --detach` leaves the sandbox to `serve`, which answers it; `sandbox rm` cleans up."""
    done = subprocess.run(
        [
            BROKER,
            "run",
            "--config",
            str(host),
            "--name",
            DET,
            "--detach",
            "--",
            "python3",
            "-c",
            AGENT,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    serve = subprocess.Popen([BROKER, "serve", "--config", str(host)], stderr=subprocess.DEVNULL)
    try:
        result = tmp_path / "state" / "sandboxes" / DET / "results"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(result.glob("*.json")):
            time.sleep(0.2)
        assert any(result.glob("*.json")), "serve did not answer the detached sandbox"
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(30)
    listed = subprocess.run([BROKER, "sandbox", "ls"], capture_output=True, text=True)
    assert DET in listed.stdout
    tsv = subprocess.run([BROKER, "sandbox", "ls", "--tsv"], capture_output=True, text=True)
    rows = [line.split("\t") for line in tsv.stdout.splitlines()]
    assert rows[0] == ["sandbox", "container", "name", "status"]
    row = next(r for r in rows if r[0] == DET)
    assert len(row) == 4 and row[2] == f"broker-{DET}"
    subprocess.run([BROKER, "sandbox", "rm", DET], check=True, capture_output=True)
    assert containers(DET) == []


def test_terminal_prompt_approves_a_gated_request(host: Path, engine: docker.DockerClient) -> None:
    """At a terminal, `broker run` shows the card of a gated request and takes the answer."""
    agent = (
        "import outbox\n"
        "outbox.request('files.write', {'path': 'g.txt', 'content': 'one'}, timeout=60)\n"
        "r = outbox.request('files.write', {'path': 'g.txt', 'content': 'two', "
        "'overwrite': True}, reason='update it', timeout=90)\n"
        "print('AGENT', r['status'], r['reason'])\n"
    )
    child = at_a_terminal("run", "--config", str(host), "--name", TTY, "--", "python3", "-c", agent)
    approve_at_the_prompt(child, "an overwrite destroys the old file", "looked at the diff")
    child.expect("AGENT applied approved by .*: looked at the diff")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert (host.parent / "exports" / "g.txt").read_text() == "two"
    assert containers(TTY) == []


@contextmanager
def running(
    host: Path, engine: docker.DockerClient, log: Path, name: str, *command: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`broker run --name NAME -- COMMAND` in the background, its stderr into `log`; if
    it is still running at the end, it is killed and its container removed."""
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [BROKER, "run", "--config", str(host), "--name", name, "--", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
            with suppress(docker.errors.NotFound):
                engine.containers.get(f"broker-{name}").remove(force=True)


def test_sigterm_removes_the_container_as_ctrl_c_does(
    host: Path, engine: docker.DockerClient, tmp_path: Path
) -> None:
    """SIGTERM (a service manager stopping the run) removes the container and exits 130."""
    log = tmp_path / "run.log"
    with running(host, engine, log, TERM, "sleep", "60") as proc:
        # the start (image check, container create) has no bound under load: wait for it
        eventually(
            lambda: f"sandbox {TERM}: running" in log.read_text() or proc.poll() is not None, 90
        )
        assert proc.poll() is None, log.read_text()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    err = log.read_text()
    assert proc.returncode == 130, err
    assert "interrupted: the sandbox was removed" in err
    assert "Traceback" not in err
    assert containers(TERM) == []


def test_run_tells_the_notify_webhooks_and_the_person_told_decides(
    host: Path, engine: docker.DockerClient, hook: Hook, tmp_path: Path
) -> None:
    """[notify] webhooks hear of a gated request in `broker run`, as in `serve`; the
    person notified approves with the command the message gives, and the agent reads it."""
    with host.open("a") as config:
        config.write(f'[[notify.webhooks]]\nurl = "{hook.url("/pending")}"\n')
    agent = (
        "import outbox\n"
        "outbox.request('files.write', {'path': 'n.txt', 'content': 'one'}, timeout=60)\n"
        "r = outbox.request('files.write', {'path': 'n.txt', 'content': 'two', "
        "'overwrite': True}, reason='update it', timeout=90)\n"
        "print('AGENT', r['status'])\n"
    )
    log = tmp_path / "run.log"
    with running(host, engine, log, NOTE, "python3", "-c", agent) as proc:
        eventually(lambda: bool(hook.calls("/pending")) or proc.poll() is not None, 90)
        assert hook.calls("/pending"), log.read_text()
        message = hook.calls("/pending")[0]["body"]
        assert message["type"] == "approval.pending"
        assert (message["sandbox"], message["effect"]) == (NOTE, "files.write")
        assert "an overwrite destroys the old file" in message["why"]
        command = message["decide"]["approve"].split()  # broker approve SANDBOX/ID
        decided = subprocess.run(
            [BROKER, *command[1:], "--config", str(host)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert decided.returncode == 0, decided.stderr
        proc.wait(90)
    err = log.read_text()
    assert proc.returncode == 0, err
    assert "AGENT applied" in err
    assert (host.parent / "exports" / "n.txt").read_text() == "two"
    assert len(hook.calls("/pending")) == 1
    assert containers(NOTE) == []


def test_run_beside_a_serving_broker_hands_it_the_sandbox(
    host: Path, engine: docker.DockerClient, tmp_path: Path
) -> None:
    """With `broker serve` owning the state dir (attach mode only, so it would never find
    the sandbox by itself), `broker run` hands its sandbox over and is answered once."""
    own = tmp_path / "own"
    (own / "outbox").mkdir(parents=True)
    log = (tmp_path / "serve.log").open("w")
    attach = ["--outbox", str(own / "outbox"), "--results", str(own / "results")]
    serve = subprocess.Popen(
        [BROKER, "serve", "--config", str(host), *attach],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        eventually(lambda: "serving" in (tmp_path / "serve.log").read_text(), 30)
        done = run(host, HAND, AGENT)
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(30)
        log.close()
    served = (tmp_path / "serve.log").read_text()
    assert done.returncode == 0, done.stderr
    assert "AGENT applied 16" in done.stderr
    assert f"handed sandbox {HAND} to pid {serve.pid}, `broker serve`" in done.stderr
    assert f"serving sandbox {HAND} for another process" in served
    assert f"sandbox {HAND} exited with 0: 1 applied" in done.stderr
    events = [e for _, e, _ in audit.read_events(host.parent / "state" / "audit.jsonl") if e]
    mine = [e["event"] for e in events if e["sandbox"] == HAND]
    assert mine.count("received") == 1 and mine.count("applied") == 1, mine
    assert containers(HAND) == []
