"""Warm sandboxes: created, proven and started ahead of a run, waiting for its command.

`[sandbox] warm = N` keeps N of them (broker.hosting.warm_keeper). Each is a normal
hardened sandbox (the spec of broker.hosting.runtimes.spec, proven before it starts)
whose command is a launcher: POSIX sh, blocked reading a FIFO in its read-only
/results, then exec'ing what the host writes there, so the agent's command becomes
PID 1 (its exit code and signals are as for a cold start). A run hands its command
over (:func:`launch`) instead of creating and starting a container. A container serves
one run and is removed after it: the pool only moves the creation earlier.

On disk, beside the sandbox's usual ``<state>/sandboxes/<id>/{outbox,results}``::

    <state>/warm/<key>/<sandbox id>      an idle one (Warm.to_json)
    <state>/warm/.claimed/<sandbox id>   taken, its command not yet handed over

``key`` hashes what the container was created with (runtime, image, limits, env) and
the state dir: a run takes only one made as it would make its own, and the key, also
the containers' WARM_LABEL value, names one pool on an engine shared by state dirs.
Taking is a rename into .claimed/: exactly one taker wins, across processes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from broker.clock import REAL, Clock
from broker.config import Config
from broker.errors import ConfigError, SandboxError
from broker.hosting.runtimes.base import Handle, Runtime
from broker.hosting.runtimes.spec import LABEL, SandboxLimits, SandboxPaths

__all__ = [
    "FIFO",
    "LABEL",
    "LAUNCHER",
    "WARM_LABEL",
    "Settings",
    "Warm",
    "claim",
    "count",
    "discard",
    "launch",
    "pool_root",
    "settings",
    "take",
    "usable",
]

WARM_LABEL = "io.sandbox-broker.hosting.warm"
"""Label key on every pooled container (besides the sandbox LABEL); its value the pool key."""

FIFO = ".warm-argv"
"""The launcher's FIFO, in the sandbox's results dir (read-only inside)."""

LAUNCHER = ("-c", f'cmd=$(cat /results/{FIFO}) && [ -n "$cmd" ] && eval "exec $cmd"')
"""/bin/sh's arguments: wait for the command line, then become it."""

CLAIMED = ".claimed"


def count(config: Config) -> int:
    """[sandbox] warm: how many containers to keep ready (0: no pool)."""
    value = config.sandbox.get("warm", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"sandbox.warm: expected a whole number >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """What a pooled container is created with, and the key that names them."""

    runtime: str
    image: str
    limits: SandboxLimits
    env: Mapping[str, str]
    extra: Mapping[str, Any]  # what else a pool's owner varies (the AutoGen workspace)

    @property
    def key(self) -> str:
        blob = json.dumps(
            [self.runtime, self.image, self.limits._asdict(), dict(self.env), dict(self.extra)],
            sort_keys=True,
        )
        return "k" + hashlib.sha256(blob.encode()).hexdigest()[:15]


def settings(config: Config, runtime_name: str, **extra: Any) -> Settings:
    """The settings `broker run` would start a sandbox with under ``config``."""
    from broker.hosting import images
    from broker.hosting.runtimes import extra_env, limits_from

    image = str(config.sandbox.get("image", images.DEFAULT_IMAGE))
    extra = {"state_dir": str(config.state_dir), **extra}  # a pool's label names its own
    return Settings(runtime_name, image, limits_from(config), extra_env(config), extra)


def pool_root(config: Config) -> Path:
    return config.state_dir / "warm"


@dataclass(frozen=True)
class Warm:
    """One pooled sandbox: its container, its dirs, and where its entry is on disk."""

    key: str
    sandbox_id: str
    container_id: str
    entrypoint: tuple[str, ...]  # the image's, put before the command handed over
    created_at: float
    paths: SandboxPaths
    entry: Path
    image_id: str = ""  # the image's id when it was made ("": not known, never stale)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "sandbox_id": self.sandbox_id,
            "container_id": self.container_id,
            "entrypoint": list(self.entrypoint),
            "created_at": self.created_at,
            "image_id": self.image_id,
        }

    @classmethod
    def read(cls, entry: Path, state_dir: Path) -> Warm:
        data = json.loads(entry.read_text())
        sid = str(data["sandbox_id"])
        root = state_dir / "sandboxes" / sid
        return cls(
            key=str(data["key"]),
            sandbox_id=sid,
            container_id=str(data["container_id"]),
            entrypoint=tuple(str(part) for part in data["entrypoint"]),
            created_at=float(data["created_at"]),
            paths=SandboxPaths(sid, root, root / "outbox", root / "results"),
            entry=entry,
            image_id=str(data.get("image_id", "")),
        )

    def stale(self, image_id: str | None) -> bool:
        """Made from another image than the tag names now (it was rebuilt since)."""
        return bool(self.image_id) and self.image_id != image_id


def claim(root: Path, key: str, state_dir: Path) -> Warm | None:
    """Take one idle entry of ``key`` for this process (a rename: one taker wins)."""
    claimed = root / CLAIMED
    try:
        names = sorted(os.listdir(root / key))
    except FileNotFoundError:
        return None
    claimed.mkdir(mode=0o700, exist_ok=True)
    for name in names:
        if name.startswith("."):
            continue
        mine = claimed / name
        try:
            os.rename(root / key / name, mine)
        except FileNotFoundError:  # another taker won it
            continue
        try:
            return Warm.read(mine, state_dir)
        except (OSError, ValueError, KeyError, TypeError):
            mine.unlink(missing_ok=True)  # a torn entry: its container is swept by label
    return None


def take(
    config: Config,
    runtime_name: str,
    *,
    runtime: Runtime | None = None,
    image: str | None = None,
    root: Path | None = None,
    key: str | None = None,
) -> Warm | None:
    """A pooled sandbox made as `broker run` would make one, claimed; None: none ready
    (or [sandbox] warm is 0). ``image``: the run's, when not [sandbox] image's.

    Works in any process, with or without a keeper in it. With ``runtime``, one whose
    container has gone or stopped is discarded and the next tried; without, `launch`
    finds that out. Workspace and named runs are never served from the pool: their
    caller does not ask."""
    if count(config) == 0:
        return None
    root = root or pool_root(config)
    found = settings(config, runtime_name)
    if image:
        found = replace(found, image=image)
    while True:
        warm = claim(root, key or found.key, config.state_dir)
        if warm is None or runtime is None:
            return warm
        if usable(warm, runtime, found.image):
            return warm


def usable(warm: Warm, runtime: Runtime, image: str) -> bool:
    """Whether a claimed sandbox may run: its container running, made from the image
    ``image`` names now; else it is discarded (the caller takes the next, or goes cold)."""
    handle = runtime.get(warm.container_id)
    if (
        handle is not None
        and handle.status == "running"
        and not warm.stale(runtime.image_id(image))
    ):
        return True
    discard(warm, runtime, handle)
    return False


def launch(
    warm: Warm,
    command: Sequence[str],
    runtime: Runtime,
    *,
    clock: Clock = REAL,
    timeout: float = 5.0,
) -> Handle:
    """Hand ``command`` to a claimed sandbox's launcher; its container, now running it.

    The caller streams its logs, waits for it and removes it as for a cold start. A
    container gone, or a launcher not reading within ``timeout`` seconds: SandboxError,
    and the sandbox is removed."""
    handle = runtime.get(warm.container_id)
    if handle is None or handle.status != "running":
        discard(warm, runtime, handle)
        raise SandboxError(f"warm sandbox {warm.sandbox_id}: its container has gone")
    line = shlex.join([*warm.entrypoint, *command]).encode()
    fifo = warm.paths.results / FIFO
    try:
        _hand_over(fifo, line, clock, timeout)
    except OSError as exc:
        discard(warm, runtime, handle)
        raise SandboxError(
            f"warm sandbox {warm.sandbox_id}: cannot hand its command over ({exc})"
        ) from exc
    fifo.unlink(missing_ok=True)
    warm.entry.unlink(missing_ok=True)
    return handle


def _hand_over(fifo: Path, line: bytes, clock: Clock, timeout: float) -> None:
    """Write ``line`` into the FIFO once its reader has it open (ENXIO until then)."""
    deadline = clock.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or clock.monotonic() >= deadline:
                raise
            clock.sleep(0.002)
    try:
        os.set_blocking(fd, True)
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def discard(warm: Warm, runtime: Runtime, handle: Handle | None = None) -> None:
    """Remove a pooled sandbox that will never run: its container, dirs and entry."""
    try:
        handle = handle or runtime.get(warm.container_id)
        if handle is not None:
            runtime.remove(handle)
    finally:
        shutil.rmtree(warm.paths.root, ignore_errors=True)
        warm.entry.unlink(missing_ok=True)
