"""A new sandbox's outbox before anything is written (broker.hosting.serving): a run whose
agent writes nothing builds no broker; one that writes, early (the looks) or late (the
inotify watch), is served, its request applied; a write just before the exit is not lost."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from broker.config import Config, load_config
from broker.hosting import serving
from broker.hosting.serving import Serving
from broker.policy.ruleset import load_policy
from broker.registry import default_registry
from tests.support import eventually


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    (tmp_path / "exports").mkdir()
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\nstate_dir = "state"\n[integrations.files]\nroot = "{tmp_path / "exports"}"\n'
    )
    loaded = load_config(config)
    (loaded.sandboxes_dir / "sb1" / "outbox").mkdir(parents=True)
    return loaded


def serving_of(cfg: Config) -> Serving:
    """sb1's serving side as `broker run` makes it, its config's check passed."""
    registry = default_registry()
    registry.check_config(cfg.integrations, cfg.base_dir)
    policy = load_policy(None, {})
    return Serving(cfg, lambda: (registry, policy), "sb1", say=lambda _: None)


@contextmanager
def started(s: Serving) -> Iterator[threading.Thread]:
    """`s` started for a new sandbox on its own thread, as `broker run` starts it; told
    that the sandbox exited, then finished, at the end."""
    thread = threading.Thread(target=s.start, kwargs={"when_written": True}, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        s.exited()
        thread.join(30)
        s.finish()


def write(cfg: Config, rid: str) -> None:
    doc = {"version": 1, "id": rid, "effect": "files.write"}
    doc["params"] = {"path": f"{rid}.txt", "content": rid}
    (cfg.sandboxes_dir / "sb1" / "outbox" / f"{rid}.json").write_text(json.dumps(doc))


def result(cfg: Config, rid: str) -> dict[str, object] | None:
    path = cfg.sandboxes_dir / "sb1" / "results" / f"{rid}.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_nothing_written_builds_no_broker(cfg: Config) -> None:
    s = serving_of(cfg)
    with started(s) as thread:
        s.exited()
        thread.join(30)
        assert not thread.is_alive() and not s.owner and not s.engaged


def test_an_early_write_is_served(cfg: Config) -> None:
    s = serving_of(cfg)
    with started(s):
        write(cfg, "r1")
        eventually(lambda: result(cfg, "r1") is not None, 30)
        assert s.owner and (cfg.base_dir / "exports" / "sb1" / "r1.txt").read_text() == "r1"


def test_a_write_after_the_looks_is_seen_by_the_watch(
    cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving, "LOOK_FOR_S", 0.05)
    s = serving_of(cfg)
    with started(s):
        eventually(lambda: "broker-inotify" in {t.name for t in threading.enumerate()}, 10)
        write(cfg, "r2")
        eventually(lambda: result(cfg, "r2") is not None, 30)
        assert s.owner and (cfg.base_dir / "exports" / "sb1" / "r2.txt").read_text() == "r2"


def test_a_write_just_before_the_exit_is_served(cfg: Config) -> None:
    s = serving_of(cfg)
    write(cfg, "r3")
    s.exited()  # the sandbox wrote, then exited, before its serving started to look
    s.start(when_written=True)
    try:
        assert s.owner
    finally:
        s.finish()
    assert result(cfg, "r3") is not None
