"""One owner per state dir, against real `broker serve` processes and a real receiver:
a second serve refuses with one line naming the first, and across a flood with the
owner killed (kill -9) and replaced, no effect reaches the service twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.loop import control_client, lockfile
from broker.models import TERMINAL
from tests.crash.support import BROKER, Receiver, Site, broker_env, read_results, wait_for

FLOOD = 300
POLICY = '[[rules]]\neffect = "crashtest.send"\naction = "auto"\nreason = "the flood"\n'


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def second_serve(site: Site) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        site.serve_args(),
        capture_output=True,
        text=True,
        timeout=60,
        env=broker_env(site.pythonpath),
    )


def test_second_serve_refuses_naming_the_first(tmp_path: Path, receiver: Receiver) -> None:
    """While one broker serves a state dir, another `broker serve` on it exits 2 with one
    line naming the running process; read-only commands keep working beside it."""
    site = Site(tmp_path / "site", receiver.url)
    first = site.start()
    try:
        wait_for(lambda: "serving" in first.output(), 30, "the first broker")
        assert lockfile.served(site.state)
        done = second_serve(site)
        pending = site.cli("pending")
    finally:
        first.stop()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"another broker (pid {first.pid}, `broker serve`, since " in lines[0]
    assert str(site.state) in lines[0] and "broker run" in lines[0]
    assert pending.returncode == 0 and "nothing waits" in pending.stdout
    assert not lockfile.served(site.state), "the lock is gone with its owner"


def test_flood_with_the_owner_killed_applies_nothing_twice(
    tmp_path: Path, receiver: Receiver
) -> None:
    """300 non-idempotent POSTs; a second serve refused mid-flood; the owner killed -9 and
    a new one started: every request ends with one terminal result, none reached the
    receiver twice, and every `applied` one reached it exactly once."""
    site = Site(tmp_path / "site", receiver.url, policy=POLICY)
    for i in range(FLOOD):
        doc = {"version": 1, "id": f"f{i}", "effect": "crashtest.send", "params": {"value": "x"}}
        (site.outbox / f".f{i}.tmp").write_text(json.dumps(doc))
        os.rename(site.outbox / f".f{i}.tmp", site.outbox / f"f{i}.json")
    owner = site.start()
    wait_for(lambda: len(site.results_now()) >= 50, 60, "the flood to be under way")
    refused = second_serve(site)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(30)
    successor = site.start(log_name="successor.log")
    try:
        wait_for(
            lambda: sum(r["status"] in TERMINAL for r in site.results_now().values()) == FLOOD,
            120,
            "every request answered",
        )
    finally:
        successor.stop()
    results = read_results(site.results)
    statuses = Counter(r["status"] for r in results.values())
    assert refused.returncode == 2 and "another broker" in refused.stderr
    assert set(statuses) <= {"applied", "unknown"}, statuses
    posts = {f"f{i}": receiver.count(f"default/f{i}")[0] for i in range(FLOOD)}
    assert max(posts.values()) == 1, "an effect reached the receiver twice"
    assert all(posts[rid] == 1 for rid, r in results.items() if r["status"] == "applied")
    assert statuses["applied"] >= FLOOD - 10, statuses  # only those caught mid-apply


def test_a_handed_sandbox_is_taken_over_when_its_owner_dies(tmp_path: Path) -> None:
    """`broker run`'s side: its sandbox is served by the owner; when the owner is killed,
    the run's process becomes the owner and serves it on, and releases it at the end."""
    from broker.config import load_config
    from broker.hosting.serving import Serving
    from broker.policy.ruleset import load_policy
    from broker.registry import default_registry
    from tests.support import eventually

    (tmp_path / "exports").mkdir()
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\nstate_dir = "state"\n[integrations.files]\nroot = "{tmp_path / "exports"}"\n'
    )
    own = tmp_path / "own"
    (own / "outbox").mkdir(parents=True)
    box = tmp_path / "state" / "sandboxes" / "sb1"
    (box / "outbox").mkdir(parents=True)
    attach = ["--outbox", str(own / "outbox"), "--results", str(own / "results")]
    owner = subprocess.Popen(
        [str(BROKER), "serve", "--config", str(config), *attach],
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    cfg = load_config(config)
    registry = default_registry()
    registry.check_config(cfg.integrations, cfg.base_dir)
    said: list[str] = []
    policy = load_policy(None, {})
    serving = Serving(cfg, lambda: (registry, policy), "sb1", say=said.append)
    try:
        eventually(lambda: lockfile.served(cfg.state_dir), 30)
        serving.start()
        assert not serving.owner and said and f"to pid {owner.pid}" in said[0]
        write(box, "r1")
        eventually(lambda: "r1" in read_results(box / "results"), 20)
        owner.kill()
        owner.wait(30)
        eventually(lambda: serving.owner, 30)
        write(box, "r2")
        eventually(lambda: "r2" in read_results(box / "results"), 20)
    finally:
        serving.finish()
        if owner.poll() is None:
            owner.kill()
    results = read_results(box / "results")
    assert results["r1"]["status"] == results["r2"]["status"] == "applied"
    assert "went away; serving sb1 here" in said[-1]
    assert not lockfile.served(cfg.state_dir)


def write(box: Path, rid: str) -> None:
    doc = {"version": 1, "id": rid, "effect": "files.write"}
    doc["params"] = {"path": f"{rid}.txt", "content": rid}
    (box / "outbox" / f".{rid}.tmp").write_text(json.dumps(doc))
    os.rename(box / "outbox" / f".{rid}.tmp", box / "outbox" / f"{rid}.json")


def test_a_state_dir_too_deep_for_a_unix_socket_path_is_served(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A state dir whose control socket's path is longer than AF_UNIX's 108 bytes (a
    deep home, a CI runner's work dir) is served all the same: its requests are answered
    and another process reaches the owner through the socket."""
    site = Site(tmp_path / ("d" * 60) / ("e" * 60) / "site", receiver.url, policy=POLICY)
    assert len(os.fsencode(str(lockfile.socket_path(site.state)))) > 108
    owner = site.start()
    try:
        doc = {"version": 1, "id": "deep", "effect": "crashtest.send", "params": {"value": "x"}}
        site.write("deep.json", doc)
        wait_for(lambda: "deep" in site.results_now(), 60, "the request answered")
        client = control_client.connect(site.state, lambda _: None, wait_s=30)
        assert client is not None, "the owner's control socket was not reached"
        client.close()
    finally:
        code = owner.stop()
    assert site.results_now()["deep"]["status"] == "applied"
    assert receiver.count("default/deep")[0] == 1
    assert code == 0, owner.output()
