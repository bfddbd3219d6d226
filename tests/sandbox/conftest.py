"""Fixtures for the sandbox tests: the in-sandbox client, a fake broker, real runtimes.

`sandbox_host` runs each sandbox property test on every runtime (RUNTIMES): Docker,
Podman rootful, Podman rootless. A runtime that is absent skips its tests, saying
why; under CI an absent Docker or Podman fails them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import docker
import pytest

from broker.errors import SandboxError
from broker.hosting import images, sandbox
from broker.hosting.runtimes.base import Runtime
from broker.hosting.runtimes.docker import DockerRuntime
from broker.hosting.runtimes.podman import Podman, PodmanRuntime
from broker.hosting.runtimes.proof import Observed
from broker.hosting.runtimes.spec import SandboxSpec, sandbox_spec

CLIENT = Path(__file__).resolve().parents[2] / "sandbox_images" / "client" / "outbox.py"


@pytest.fixture
def outbox_client() -> ModuleType:
    """The in-sandbox client module, loaded from its file as the image installs it."""
    spec = importlib.util.spec_from_file_location("outbox", CLIENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def outbox_dir(tmp_path: Path, results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh outbox directory, named by OUTBOX_DIR (and RESULTS_DIR set beside it)."""
    path = tmp_path / "outbox"
    path.mkdir()
    monkeypatch.setenv("OUTBOX_DIR", str(path))
    return path


@pytest.fixture
def results_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh results directory, named by RESULTS_DIR."""
    path = tmp_path / "results"
    path.mkdir()
    monkeypatch.setenv("RESULTS_DIR", str(path))
    return path


def write_result(results: Path, result: dict[str, Any]) -> None:
    """Write a result file the way the broker does: a temporary name, then a rename."""
    temp = results / f".{result['id']}.json.tmp"
    temp.write_text(json.dumps(result))
    temp.chmod(0o644)
    os.replace(temp, results / f"{result['id']}.json")


@pytest.fixture
def result_writer(outbox_dir: Path, results_dir: Path) -> Callable[[dict[str, Any]], None]:
    """Writes result files into the results directory, as the broker does."""
    return lambda result: write_result(results_dir, result)


@dataclass
class FakeBroker:
    """Answers the first request in an outbox from a thread, one status after another."""

    outbox: Path
    results: Path
    steps: list[tuple[float, str]]
    request: dict[str, Any] | None = None
    thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 30
        while self.request is None and time.monotonic() < deadline:
            for path in self.outbox.glob("[!.]*.json"):
                self.request = json.loads(path.read_text())
                break
            time.sleep(0.01)
        if self.request is None:
            return
        for delay, status in self.steps:
            time.sleep(delay)
            write_result(
                self.results,
                {
                    "version": 1,
                    "id": self.request["id"],
                    "effect": self.request["effect"],
                    "status": status,
                    "reason": f"{status} by the fake broker",
                    "output": {"params": self.request["params"]},
                    "errors": [],
                },
            )

    def join(self) -> None:
        self.thread.join(timeout=30)


@pytest.fixture
def fake_broker(outbox_dir: Path, results_dir: Path) -> Iterator[Callable[..., FakeBroker]]:
    """Start fake brokers answering with (delay, status) steps; joined at teardown."""
    started: list[FakeBroker] = []

    def make(*steps: tuple[float, str]) -> FakeBroker:
        broker = FakeBroker(outbox_dir, results_dir, list(steps))
        started.append(broker)
        return broker

    yield make
    for broker in started:
        broker.join()


@pytest.fixture(scope="session")
def engine() -> Iterator[docker.DockerClient]:
    """A real Docker engine: skipped when none answers, a failure under CI."""
    try:
        client = sandbox.engine()
    except SandboxError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a Docker engine (run scripts/docker-up.sh first): {exc}")
        pytest.skip(f"no Docker engine ({exc})")
    yield client
    client.close()


@pytest.fixture(scope="session")
def agent_image(engine: docker.DockerClient) -> str:
    """The agent image, built once per session (or reused when it is current)."""
    return images.ensure_image(engine)


ROOTLESS_USER = os.environ.get("PODMAN_USER", "broker-rootless")
"""The unprivileged user scripts/podman-up.sh makes for rootless Podman."""
RUNTIMES = ["docker", "podman", "podman-rootless"]


def _podman(user: str | None) -> PodmanRuntime:
    """Podman as root, or as ``user``: skipped when absent, a failure under CI (rootful)."""
    try:
        return PodmanRuntime(Podman(user))
    except (SandboxError, KeyError) as exc:
        if os.environ.get("CI") and user is None:
            pytest.fail(f"CI needs Podman (run scripts/podman-up.sh first): {exc}")
        pytest.skip(f"no Podman{' for ' + user if user else ''} ({exc})")


@pytest.fixture(scope="session")
def podman_runtime() -> PodmanRuntime:
    """Rootful Podman (this process is root)."""
    return _podman(None)


@pytest.fixture(scope="session", params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> Runtime:
    """Each runtime in turn, with the agent image in its store."""
    if request.param == "docker":
        request.getfixturevalue("engine")  # skips (or fails in CI) without an engine
        found: Runtime = DockerRuntime()
    elif request.param == "podman":
        found = request.getfixturevalue("podman_runtime")
    else:
        found = rootless_usable(_podman(ROOTLESS_USER))
    found.ensure_image(images.DEFAULT_IMAGE)
    return found


class LimitsWaived(PodmanRuntime):
    """Rootless Podman on cgroup v1 with the limits' proof waived, FOR TESTS ONLY: the
    broker refuses such a sandbox (its inspect shows the limits as 0; test_proof.py);
    this shows that every other property holds there, and (test_container.py's limits
    test) that the limits really are not applied."""

    waived = True
    asked: SandboxSpec | None = None

    def start(self, spec: SandboxSpec) -> Any:
        self.asked = spec
        return super().start(spec)

    def observe(self, container: Any) -> Observed:
        seen = super().observe(container)
        assert self.asked is not None and (seen.pids, seen.memory) == (0, 0)
        limits = self.asked.limits
        return seen._replace(pids=limits.pids, memory=self.asked.memory, nano_cpus=limits.nano_cpus)


def rootless_usable(runtime: Runtime) -> Runtime:
    """Rootless Podman as the tests run it: as is on cgroup v2, else limits waived."""
    assert isinstance(runtime, PodmanRuntime) and runtime.rootless
    if runtime.cgroups == "v2":
        return runtime
    return LimitsWaived(runtime.podman)


def rootless_user(runtime: Runtime) -> str | None:
    user: str | None = getattr(getattr(runtime, "podman", None), "user", None)
    return user


@contextmanager
def state_base(runtime: Runtime, tmp_path: Path) -> Iterator[Path]:
    """Where a test's state dir goes: tmp_path, or for a rootless Podman user a fresh
    dir in that user's home (the outbox on the user's own file system; root's
    /tmp/pytest-of-root is closed to them)."""
    user = rootless_user(runtime)
    if user is None:
        yield tmp_path
        return
    base = Path(f"~{user}").expanduser() / f"test-{uuid.uuid4().hex[:12]}"
    base.mkdir(mode=0o700)
    os.chown(base, runtime.agent_uid(), runtime.agent_uid())
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def prepare(runtime: Runtime, state_dir: Path, sandbox_id: str) -> sandbox.SandboxPaths:
    """The sandbox's dirs, owned as the runtime needs: a rootless Podman user (driven
    from this root process) owns the whole tree, as it would running the broker itself."""
    paths = sandbox.prepare_dirs(state_dir, sandbox_id, runtime.agent_uid())
    if rootless_user(runtime) is not None:
        uid = runtime.agent_uid()
        for path in (state_dir, state_dir / "sandboxes", paths.root, paths.results):
            os.chown(path, uid, uid)
    return paths


@dataclass
class Run:
    """What one sandbox run left behind."""

    exit_code: int
    stdout: str
    stderr: str


@dataclass
class SandboxHost:
    """The host side of one sandbox: its state dir and directories, and a way to run in it."""

    runtime: Runtime
    image: str
    state_dir: Path
    paths: sandbox.SandboxPaths
    containers: list[Any] = field(default_factory=list)
    brokers: list[FakeBroker] = field(default_factory=list)

    def answer(self, *steps: tuple[float, str]) -> FakeBroker:
        """Answer the sandbox's first request with (delay, status) steps, from a thread."""
        broker = FakeBroker(self.paths.outbox, self.paths.results, list(steps))
        self.brokers.append(broker)
        return broker

    def start(self, command: list[str], **kwargs: Any) -> Any:
        """Start ``command`` in this sandbox; removed at teardown."""
        spec = sandbox_spec(self.paths, self.image, command, **kwargs)
        container = self.runtime.start(spec)
        self.containers.append(container)
        return container

    def python(self, script: str, **kwargs: Any) -> Run:
        """Run a Python script in this sandbox and wait (at most a minute) for it to end."""
        container = self.start(["python3", "-c", script], **kwargs)
        status = container.wait(timeout=60)
        return Run(
            exit_code=status["StatusCode"],
            stdout=container.logs(stdout=True, stderr=False).decode(),
            stderr=container.logs(stdout=False, stderr=True).decode(),
        )


@pytest.fixture
def sandbox_host(runtime: Runtime, tmp_path: Path) -> Iterator[SandboxHost]:
    """A fresh sandbox on each runtime, beside host state that must stay out of its reach."""
    with state_base(runtime, tmp_path) as base:
        yield from _sandbox_host(runtime, base)


def _sandbox_host(runtime: Runtime, base: Path) -> Iterator[SandboxHost]:
    state_dir = base / "state"
    state_dir.mkdir(mode=0o700)
    token = uuid.uuid4().hex
    (state_dir / f"ledger-{token}.sqlite3").write_text(f"ledger {token}")
    (state_dir / f"audit-{token}.jsonl").write_text(f'{{"audit": "{token}"}}\n')
    host = SandboxHost(
        runtime,
        images.DEFAULT_IMAGE,
        state_dir,
        prepare(runtime, state_dir, f"t-{uuid.uuid4().hex[:12]}"),
    )
    yield host
    for container in host.containers:
        runtime.remove(container)
    for broker in host.brokers:
        broker.join()
