"""The warm pool on the real Docker engine: proven containers waiting for their command,
each handed out once, refilled, replaced when the config changes, and cleaned up."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from broker.config import Config, load_config
from broker.errors import ConfigError, SandboxError
from broker.hosting import warm
from broker.hosting.runtimes.docker import DockerRuntime
from broker.hosting.runtimes.engine import EngineClient, engine_socket
from broker.hosting.warm_keeper import REFILL_HOLD_S, WarmPool
from broker.testing import BrokerHarness, FakeHandler
from tests.support import eventually

pytestmark = pytest.mark.docker

MakePool = Callable[..., WarmPool]
BROKER = str(Path(sys.executable).parent / "broker")


@pytest.fixture
def runtime(engine: docker.DockerClient, agent_image: str) -> DockerRuntime:
    """Docker, the agent image in its store (`engine`: skipped, or failed in CI, without one)."""
    return DockerRuntime()


def config_for(state: Path, **sandbox: Any) -> Config:
    return Config(state_dir=state, sandbox={"warm": 2, **sandbox})


@pytest.fixture
def make_pool(runtime: DockerRuntime, tmp_path: Path) -> Iterator[MakePool]:
    """Pools on one state dir (not started unless the test starts them); closed after."""
    made: list[WarmPool] = []

    def make(size: int = 2, hold: float = REFILL_HOLD_S, **sandbox: Any) -> WarmPool:
        cfg = config_for(tmp_path / "state", **sandbox)
        pool = WarmPool(runtime, cfg.state_dir, warm.settings(cfg, "docker"), size, hold=hold)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


def warm_containers(engine: docker.DockerClient, key: str) -> list[Any]:
    return engine.containers.list(all=True, filters={"label": f"{warm.WARM_LABEL}={key}"})


def run_to_end(runtime: DockerRuntime, handle: Any) -> tuple[int, str]:
    try:
        code = int(handle.wait(timeout=60)["StatusCode"])
        return code, handle.logs(stdout=True, stderr=True).decode()
    finally:
        runtime.remove(handle)


def test_a_pool_fills_with_proven_hardened_waiting_containers(
    make_pool: MakePool, engine: docker.DockerClient
) -> None:
    """Two entries, each a running launcher with the sandbox's hardening."""
    pool = make_pool(2)
    pool.keep()
    entries = pool.idle()
    assert len(entries) == 2
    for entry in entries:
        info = json.loads(entry.read_text())
        attrs = engine.api.inspect_container(info["container_id"])
        host = attrs["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert attrs["Config"]["User"] == "10001:10001"
        assert attrs["Config"]["Entrypoint"] == ["/bin/sh"]
        assert attrs["Config"]["Labels"][warm.WARM_LABEL] == pool.key
        assert attrs["State"]["Running"] is True


ARGS = ["a b", 'it\'s "quoted"', "$HOME", "two\nlines", "ünïcödé €", ""]
ECHO = "import json, os, sys; print(json.dumps([os.getpid(), *sys.argv[1:]])); sys.exit(3)"


def test_the_command_handed_over_runs_literally_as_pid_1(
    make_pool: MakePool, runtime: DockerRuntime
) -> None:
    """Spaces, quotes, $HOME, a newline, non-ASCII and an empty argument arrive as
    given; the exit code is the command's."""
    pool = make_pool(1)
    pool.keep()
    taken = pool.take()
    assert taken is not None
    handle = warm.launch(taken, ["python3", "-c", ECHO, *ARGS], runtime)
    code, output = run_to_end(runtime, handle)
    assert code == 3
    assert json.loads(output) == [1, *ARGS]
    assert not (taken.paths.results / warm.FIFO).exists()
    assert not taken.entry.exists()


def test_each_container_is_handed_out_once(make_pool: MakePool) -> None:
    """Eight takers racing for two entries: two win, with different ones; then None."""
    pool = make_pool(2)
    pool.keep()
    gate = threading.Barrier(8)
    won: list[warm.Warm | None] = []

    def taker() -> None:
        gate.wait(10)
        won.append(warm.take(config_for(pool.state_dir), "docker"))

    threads = [threading.Thread(target=taker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [w for w in won if w is not None]
    assert len(won) == 8 and len(winners) == 2
    assert len({w.container_id for w in winners}) == 2
    assert pool.take() is None
    for w in winners:  # claimed but never launched: the pool's owner sweeps them
        warm.discard(w, pool.runtime)


def test_the_keeper_refills_after_a_take(make_pool: MakePool, runtime: DockerRuntime) -> None:
    """A take wakes the keeper's thread; it creates a new one, never the taken again."""
    pool = make_pool(2)
    pool.start()
    assert pool.wait_full(60)
    taken = pool.take()
    assert taken is not None
    assert pool.wait_full(60)
    assert taken.sandbox_id not in {p.name for p in pool.idle()}
    code, _ = run_to_end(runtime, warm.launch(taken, ["true"], runtime))
    assert code == 0


def test_the_refill_waits_for_the_run_that_took_one_to_settle(
    make_pool: MakePool, runtime: DockerRuntime, engine: docker.DockerClient
) -> None:
    """While a taken sandbox's run starts and ends, the keeper creates nothing (its
    create and start would share the engine with that run); once the run has settled,
    it refills. (Without a settle, the refill comes REFILL_HOLD_S after the take: the
    test above.)"""
    pool = make_pool(1, hold=120)
    pool.start()
    assert pool.wait_full(60)
    taken = pool.take()
    assert taken is not None
    handle = warm.launch(taken, ["sleep", "1"], runtime)
    assert not pool.wait_full(1.5)  # the run is going on, and for 120 s it may
    assert [c.name for c in warm_containers(engine, pool.key)] == [f"broker-{taken.sandbox_id}"]
    assert run_to_end(runtime, handle)[0] == 0
    pool.settled(taken.sandbox_id)
    assert pool.wait_full(60)
    assert taken.sandbox_id not in {p.name for p in pool.idle()}


def test_a_keeper_started_before_the_engine_answers_fills_once_it_does(
    runtime: DockerRuntime, tmp_path: Path
) -> None:
    """`broker serve` started before Docker's engine: the keeper goes on trying (the
    image, the sweep, the pool) and fills once the engine's socket is there."""
    socket_link = tmp_path / "engine.sock"  # no engine here yet
    late = DockerRuntime(EngineClient(str(socket_link)))
    cfg = config_for(tmp_path / "state")
    pool = WarmPool(late, cfg.state_dir, warm.settings(cfg, "docker"), 1, interval=0.2)
    pool.start()
    try:
        assert not pool.wait_full(1.0)
        socket_link.symlink_to(engine_socket())  # the engine comes up
        assert pool.wait_full(60)
    finally:
        pool.close()
    assert pool.idle() == []


def test_close_leaves_no_container_dir_or_thread(
    make_pool: MakePool, engine: docker.DockerClient
) -> None:
    """Closed: no container with the pool's label, no pooled dirs, no keeper thread."""
    pool = make_pool(2)
    pool.start()
    assert pool.wait_full(60)
    dirs = [pool.state_dir / "sandboxes" / p.name for p in pool.idle()]
    pool.close()
    assert warm_containers(engine, pool.key) == []
    assert not any(d.exists() for d in dirs)
    assert not [t for t in threading.enumerate() if t.name == "warm-pool"]


def test_a_container_removed_behind_the_pools_back_is_skipped_and_cleaned(
    make_pool: MakePool, runtime: DockerRuntime, engine: docker.DockerClient
) -> None:
    """take() passes over an entry whose container has gone, and removes its dirs."""
    pool = make_pool(2)
    pool.keep()
    first, second = (warm.Warm.read(p, pool.state_dir) for p in pool.idle())
    engine.api.remove_container(first.container_id, force=True)
    got = warm.take(config_for(pool.state_dir), "docker", runtime=runtime)
    assert got is not None and got.sandbox_id == second.sandbox_id
    assert not first.paths.root.exists()
    warm.discard(got, runtime)


def test_a_new_keeper_removes_a_crashed_keepers_dead_entries(
    make_pool: MakePool, engine: docker.DockerClient
) -> None:
    """Entries left on disk whose container is gone are removed; live ones are kept."""
    old = make_pool(2)
    old.keep()
    dead, alive = (warm.Warm.read(p, old.state_dir) for p in old.idle())
    engine.api.remove_container(dead.container_id, force=True)
    new = make_pool(2)
    new.sweep()
    assert [p.name for p in new.idle()] == [alive.sandbox_id]
    assert not dead.paths.root.exists()


def test_a_container_left_without_its_entry_is_reaped(
    make_pool: MakePool, engine: docker.DockerClient
) -> None:
    """A keeper that died between starting a container and writing its entry left it
    waiting: the next keeper's reap removes it and its dirs, and nothing else."""
    old = make_pool(2)
    old.keep()
    lost, kept = (warm.Warm.read(p, old.state_dir) for p in old.idle())
    lost.entry.unlink()
    new = make_pool(2)
    new.reap()
    assert [c.labels[warm.LABEL] for c in warm_containers(engine, new.key)] == [kept.sandbox_id]
    assert not lost.paths.root.exists() and kept.paths.root.exists()


class Unproven(DockerRuntime):
    """Docker whose inspect reports a network: the proof must refuse the container."""

    def inspect(self, container: Any) -> Any:
        attrs = dict(super().inspect(container))
        attrs["HostConfig"] = {**attrs["HostConfig"], "NetworkMode": "bridge"}
        return attrs


def test_a_pooled_container_is_proven_before_it_starts(
    engine: docker.DockerClient, agent_image: str, tmp_path: Path
) -> None:
    """One that fails its proof never starts, never enters the pool, leaves nothing."""
    cfg = config_for(tmp_path / "state")
    pool = WarmPool(Unproven(), cfg.state_dir, warm.settings(cfg, "docker"), 1)
    try:
        with pytest.raises(SandboxError, match="network is 'bridge'"):
            pool.keep()
        assert pool.idle() == []
        assert list((cfg.state_dir / "sandboxes").iterdir()) == []
        assert warm_containers(engine, pool.key) == []
    finally:
        pool.close()


def test_a_changed_config_replaces_the_old_entries(
    make_pool: MakePool, engine: docker.DockerClient
) -> None:
    """memory changed: the keeper removes the old key's containers and makes new ones."""
    old = make_pool(1, memory="512m")
    old.keep()
    new = make_pool(1, memory="256m")
    assert new.key != old.key
    new.keep()
    assert old.idle() == [] and warm_containers(engine, old.key) == []
    assert len(new.idle()) == 1
    attrs = engine.api.inspect_container(json.loads(new.idle()[0].read_text())["container_id"])
    assert attrs["HostConfig"]["Memory"] == 256 * 1024**2


@pytest.fixture
def rebuilt_tag(
    engine: docker.DockerClient, agent_image: str
) -> Iterator[tuple[str, Callable[[], str]]]:
    """A tag of the agent image unique to the test, and a way to rebuild it: the tag
    then names a new image (the agent image plus a label), as `docker build` would."""
    tag = f"broker-sandbox:rebuilt-{uuid.uuid4().hex[:8]}"
    engine.images.get(agent_image).tag(tag)

    def rebuild() -> str:
        image, _ = engine.images.build(
            fileobj=io.BytesIO(f"FROM {agent_image}\nLABEL rebuilt={tag}\n".encode()),
            tag=tag,
            rm=True,
        )
        return str(image.id)

    yield tag, rebuild
    engine.images.remove(tag, force=True)


def test_a_rebuilt_image_is_never_run_from_an_older_pooled_container(
    make_pool: MakePool,
    engine: docker.DockerClient,
    rebuilt_tag: tuple[str, Callable[[], str]],
) -> None:
    """The tag is rebuilt after the pool filled: a take gets none of the old image's
    containers (they are removed), and the keeper's next pass fills with the new one."""
    tag, rebuild = rebuilt_tag
    pool = make_pool(2, image=tag)
    pool.keep()
    old = {json.loads(e.read_text())["container_id"] for e in pool.idle()}
    assert len(old) == 2
    new_id = rebuild()
    assert pool.take() is None
    pool.keep()
    made = [json.loads(e.read_text())["container_id"] for e in pool.idle()]
    assert len(made) == 2 and not old & set(made)
    assert {engine.api.inspect_container(c)["Image"] for c in made} == {new_id}
    assert {c.id for c in warm_containers(engine, pool.key)} == set(made)


def opening(engine: docker.DockerClient, container_id: str) -> bool:
    """Whether the launcher's `cat` is in the FIFO's open, waiting for a writer (on
    that FIFO's inode: a FIFO made at the same path later is not the one it waits on)."""
    top = engine.api.top(container_id, ps_args="-o pid")
    for (pid,) in top.get("Processes") or []:
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if argv[0] == b"cat" and wchan == "wait_for_partner":
            return True
    return False


def test_a_launcher_that_does_not_read_fails_the_hand_over_and_is_removed(
    make_pool: MakePool, runtime: DockerRuntime, engine: docker.DockerClient
) -> None:
    """A FIFO nobody reads: SandboxError within the timeout, the container removed."""
    pool = make_pool(1)
    pool.keep()
    taken = pool.take()
    assert taken is not None
    fifo = taken.paths.results / warm.FIFO
    eventually(lambda: opening(engine, taken.container_id), timeout=30)
    fifo.unlink()
    os.mkfifo(fifo, 0o644)  # a new FIFO: the launcher waits on the old one's inode
    try:
        with pytest.raises(SandboxError, match="cannot hand its command over"):
            warm.launch(taken, ["true"], runtime, timeout=0.3)
        assert warm_containers(engine, pool.key) == []
    finally:  # a failed check leaves no container behind for the next test
        warm.discard(taken, runtime)


AGENT = """
import outbox
r = outbox.request("test.record", {"value": "from a warm sandbox"}, timeout=60)
print("AGENT", r["status"], r["output"]["value"])
"""


def test_an_agent_in_a_pooled_sandbox_gets_its_answer(
    make_pool: MakePool, runtime: DockerRuntime
) -> None:
    """The pooled sandbox's /outbox is the one a broker serving that sandbox reads."""
    pool = make_pool(1)
    pool.keep()
    taken = pool.take()
    assert taken is not None
    handler = FakeHandler()
    with BrokerHarness(taken.paths.root, handlers=[handler], sandbox=taken.sandbox_id):
        code, output = run_to_end(runtime, warm.launch(taken, ["python3", "-c", AGENT], runtime))
    assert code == 0, output
    assert "AGENT applied from a warm sandbox" in output
    assert handler.applied == [{"value": "from a warm sandbox"}]


@pytest.mark.parametrize("value", [-1, "2", 1.5, True])
def test_a_bad_warm_setting_is_one_config_error(tmp_path: Path, value: object) -> None:
    """[sandbox] warm must be a whole number >= 0; the error names the key."""
    path = tmp_path / "broker.toml"
    path.write_text(f"[sandbox]\nwarm = {json.dumps(value)}\n")
    with pytest.raises(ConfigError, match=r"sandbox\.warm"):
        load_config(path)


def test_warm_zero_keeps_no_pool(tmp_path: Path) -> None:
    """The default: no keeper at all, and take() looks no further."""
    from broker.hosting.warm_keeper import keeper_for

    assert keeper_for(Config(state_dir=tmp_path)) is None
    assert warm.take(Config(state_dir=tmp_path), "docker") is None
    assert warm.count(config_for(tmp_path, warm=3)) == 3


FILES_AGENT = """
import outbox
r = outbox.request("files.write", {"path": "warm.txt", "content": "warm"}, timeout=60)
print("AGENT", r["status"])
"""


def test_broker_serve_keeps_a_pool_that_another_process_takes_from(
    tmp_path: Path, runtime: DockerRuntime, engine: docker.DockerClient
) -> None:
    """`broker serve` with warm = 1 fills the pool; a run elsewhere takes it (take +
    launch), serve answers the agent; serve refills, `broker run` takes the next one;
    stopping serve removes the pool."""
    exports = tmp_path / "exports"
    exports.mkdir()
    path = tmp_path / "broker.toml"
    path.write_text(
        f'[broker]\nstate_dir = "state"\n[sandbox]\nwarm = 1\n'
        f'[integrations.files]\nroot = "{exports}"\nper_sandbox = false\n'
    )
    cfg = load_config(path)
    log = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(
        [BROKER, "serve", "--config", str(path)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
    )
    try:
        key = warm.settings(cfg, "docker").key

        def ready() -> list[Path]:
            """broker serve's pool holds its one sandbox"""
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            return sorted((cfg.state_dir / "warm" / key).glob("sb-*"))

        eventually(ready, timeout=60)
        taken = warm.take(cfg, "docker", runtime=runtime)
        assert taken is not None
        handle = warm.launch(taken, ["python3", "-c", FILES_AGENT], runtime)
        code, output = run_to_end(runtime, handle)
        assert (code, output.strip()) == (0, "AGENT applied")
        assert (exports / "warm.txt").read_text() == "warm"
        [refilled] = eventually(
            lambda: [p for p in ready() if p.name != taken.sandbox_id], timeout=60
        )
        # and `broker run` takes the refilled one: no container made, only its command given
        agent = FILES_AGENT.replace("warm.txt", "run.txt").replace('"warm"', '"run"')
        done = subprocess.run(
            [BROKER, "run", "--config", str(path), "--", "python3", "-c", agent],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr
        assert f"handed sandbox {refilled.name} to pid {serve.pid}" in done.stderr
        assert "AGENT applied" in done.stderr
        assert f"sandbox {refilled.name} exited with 0: 1 applied" in done.stderr
        assert (exports / "run.txt").read_text() == "run"
        assert engine.containers.list(all=True, filters={"name": f"broker-{refilled.name}"}) == []
        eventually(lambda: [p for p in ready() if p.name != refilled.name], timeout=60)
    finally:
        serve.send_signal(signal.SIGINT)
        assert serve.wait(60) == 0, (tmp_path / "serve.log").read_text()
        log.close()
    assert warm_containers(engine, key) == []


def test_broker_sandbox_ls_and_rm_see_pooled_containers(make_pool: MakePool) -> None:
    """A pooled container is listed as such and removed like any leftover; the
    keeper's next sweep drops its entry and dirs."""
    pool = make_pool(1)
    pool.keep()
    [entry] = pool.idle()
    listed = subprocess.run(
        [BROKER, "sandbox", "ls", "--json"], capture_output=True, text=True, timeout=60
    )
    rows = {row["sandbox"]: row for row in json.loads(listed.stdout)}
    assert rows[entry.name]["status"] == "running (warm pool)"
    removed = subprocess.run(
        [BROKER, "sandbox", "rm", entry.name], capture_output=True, text=True, timeout=60
    )
    assert removed.stdout.strip() == "removed 1 container(s)", removed.stderr
    pool.sweep()
    assert pool.idle() == [] and not (pool.state_dir / "sandboxes" / entry.name).exists()


TAKE = """
import sys
from pathlib import Path
from broker.config import Config
from broker.hosting import warm
taken = warm.take(Config(state_dir=Path(sys.argv[1]), sandbox={"warm": 2}), "docker")
print(taken.sandbox_id if taken else "none")
"""


def test_another_process_takes_one_and_never_the_same(make_pool: MakePool) -> None:
    """A taker in another process claims one entry; this process gets the other; then
    there is none (the keeper is not refilling)."""
    pool = make_pool(2)
    pool.keep()
    ids = {p.name for p in pool.idle()}
    other = subprocess.run(
        [sys.executable, "-c", TAKE, str(pool.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    theirs = other.stdout.strip()
    assert theirs in ids, other.stderr
    mine = pool.take()
    assert mine is not None and {mine.sandbox_id, theirs} == ids
    assert pool.take() is None
    pool.sweep()  # theirs is claimed, never launched: kept until it is stale
    claimed = pool.root / ".claimed" / theirs
    assert claimed.exists()
    warm.discard(mine, pool.runtime)
    warm.discard(warm.Warm.read(claimed, pool.state_dir), pool.runtime)


def test_a_podman_pool_runs_the_command_handed_over(podman_runtime: Any, tmp_path: Path) -> None:
    """The same launcher on rootful Podman (--entrypoint): argv literal, exit code kept."""
    from broker.hosting import images

    podman_runtime.ensure_image(images.DEFAULT_IMAGE)
    cfg = config_for(tmp_path / "state")
    pool = WarmPool(podman_runtime, cfg.state_dir, warm.settings(cfg, "podman"), 1)
    try:
        pool.keep()
        taken = pool.take()
        assert taken is not None
        handle = warm.launch(taken, ["python3", "-c", ECHO, *ARGS], podman_runtime)
        try:
            code = int(handle.wait(timeout=60)["StatusCode"])
            output = handle.logs(stdout=True, stderr=True).decode()
        finally:
            podman_runtime.remove(handle)
        assert code == 3
        assert json.loads(output) == [1, *ARGS]
    finally:
        pool.close()
