"""The keeper of a warm pool: keeps N proven, started, waiting sandboxes of one key.

`broker serve` keeps one when ``[sandbox] warm = N`` (N > 0); the AutoGen executor
keeps its own. The keeper's thread starts with :meth:`WarmPool.start` and is joined by
:meth:`WarmPool.close`, which removes every idle sandbox of the pool. Each pass it
removes entries of another key (the config changed) and entries whose container has
gone (a crashed keeper's, or one removed behind its back), and claimed entries a taker
never handed a command to, then creates what is missing, one at a time.

A take's refill waits while the run that took it starts and ends (:meth:`WarmPool.settled`),
for at most REFILL_HOLD_S: a refill's create and start are a quarter of a second of
the engine's work, which slowed that run's exit by 20–30 ms when they shared it.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from broker.clock import REAL, Clock
from broker.config import Config
from broker.errors import SandboxError
from broker.hosting.runtimes.base import Runtime
from broker.hosting.runtimes.spec import LABEL, SANDBOX_UID, prepare_dirs, sandbox_spec
from broker.hosting.warm import (
    CLAIMED,
    FIFO,
    LAUNCHER,
    WARM_LABEL,
    Settings,
    Warm,
    claim,
    discard,
    usable,
)

__all__ = ["STALE_CLAIM_S", "WarmPool", "create", "keeper_for"]

log = logging.getLogger("broker.warm")

STALE_CLAIM_S = 120.0
"""A claimed entry this old was never handed a command (its taker died): removed."""

REFILL_HOLD_S = 1.0
"""How long after a take its refill may wait for the taker's run to settle; a taker
that never says (the AutoGen executor, whose container lives on) lets it go then."""


def create(
    runtime: Runtime,
    state_dir: Path,
    found: Settings,
    root: Path,
    *,
    workspace: bool = False,
    labels: Mapping[str, str] | None = None,
    clock: Clock = REAL,
) -> Warm:
    """One new pooled sandbox: dirs, FIFO, a proven and started launcher, its entry."""
    sandbox_id = f"sb-{secrets.token_hex(4)}"
    paths = prepare_dirs(state_dir, sandbox_id, runtime.agent_uid())
    try:
        fifo = paths.results / FIFO
        os.mkfifo(fifo, 0o644)
        fifo.chmod(0o644)  # readable by the sandbox's uid, writable by the broker alone
        where = paths.root / "workspace" if workspace else None
        if where is not None:
            where.mkdir(mode=0o755)
            os.chown(where, SANDBOX_UID, SANDBOX_UID)
        spec = sandbox_spec(
            paths,
            found.image,
            LAUNCHER,
            limits=found.limits,
            env=found.env,
            workspace=where,
            name=f"broker-{sandbox_id}",
            labels={**(labels or {}), WARM_LABEL: found.key},
        )
        entrypoint = runtime.image_entrypoint(found.image)
        image_id = runtime.image_id(found.image) or ""  # (rebuilt later: this one is stale)
        handle = runtime.start(spec._replace(entrypoint=("/bin/sh",)))
    except BaseException:
        _rmtree(paths.root)
        raise
    entry = root / found.key / sandbox_id
    warm = Warm(
        found.key, sandbox_id, str(handle.id), entrypoint, clock.time(), paths, entry, image_id
    )
    try:
        entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temp = entry.parent / f".{sandbox_id}.tmp"
        temp.write_text(_json(warm))
        os.replace(temp, entry)
    except BaseException:
        discard(warm, runtime, handle)
        raise
    return warm


def _json(warm: Warm) -> str:
    import json

    return json.dumps(warm.to_json())


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


class WarmPool:
    """N waiting sandboxes of one key, kept by a thread; blocking calls, thread-safe."""

    def __init__(
        self,
        runtime: Runtime,
        state_dir: Path,
        found: Settings,
        size: int,
        *,
        root: Path | None = None,
        workspace: bool = False,
        labels: Mapping[str, str] | None = None,
        clock: Clock = REAL,
        interval: float = 10.0,
        own_runtime: bool = False,
        hold: float = REFILL_HOLD_S,
    ) -> None:
        self.runtime = runtime
        self._own_runtime = own_runtime  # closed with the pool (keeper_for opened it)
        self.state_dir = state_dir
        self.settings = found
        self.size = size
        self.root = root or state_dir / "warm"
        self._workspace = workspace
        self._labels = dict(labels or {})
        self._clock = clock
        self._interval = interval
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._filled = threading.Condition()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one pass at a time: the thread's, or a caller's
        self._hold = hold
        self._holds: dict[str, float] = {}  # sandbox id taken -> until when its refill waits
        self._holds_lock = threading.RLock()
        self._taking = 0  # takes under way
        self._settle = threading.Event()

    @property
    def key(self) -> str:
        return self.settings.key

    def idle(self) -> list[Path]:
        """The idle entries of this pool's key, oldest name first."""
        try:
            return sorted(p for p in (self.root / self.key).iterdir() if p.name[0] != ".")
        except FileNotFoundError:
            return []

    def start(self) -> None:
        """Start the keeper's thread (once); it fills the pool in the background."""
        if self._thread is None and self.size > 0:
            self._thread = threading.Thread(target=self._run, name="warm-pool", daemon=True)
            self._thread.start()

    def take(self) -> Warm | None:
        """A claimed sandbox whose container is running, made from the image its tag
        names now, or None; the keeper refills, once the run settles (:meth:`settled`)
        or REFILL_HOLD_S have passed."""
        with self._holds_lock:
            self._taking += 1  # the keeper holds from the claim on, not from the return
        try:
            while True:
                warm = claim(self.root, self.key, self.state_dir)
                if warm is None:
                    return None
                if usable(warm, self.runtime, self.settings.image):
                    with self._holds_lock:
                        self._holds[warm.sandbox_id] = self._clock.monotonic() + self._hold
                    return warm
        finally:
            with self._holds_lock:
                self._taking -= 1
            self._wake.set()
            self._settle.set()

    def settled(self, sandbox_id: str) -> None:
        """The run that took `sandbox_id` has ended (its container removed) or has
        failed to start: its refill need not wait any more."""
        with self._holds_lock:
            self._holds.pop(sandbox_id, None)
        self._settle.set()

    def wait_full(self, timeout: float) -> bool:
        """Until the pool holds its N (a test's, a bench's wait); whether it does."""
        deadline = self._clock.monotonic() + timeout
        with self._filled:
            while len(self.idle()) < self.size:
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    return False
                self._filled.wait(min(left, 0.5))
        return True

    def close(self) -> None:
        """Stop the thread, then remove every idle sandbox of the pool."""
        self._stop.set()
        self._wake.set()
        self._settle.set()
        if self._thread is not None:
            self._thread.join(120)
            self._thread = None
        try:
            with self._lock:
                for key_dir in self._keys():
                    self._drain(key_dir, keep=None)
        finally:
            if self._own_runtime:
                self.runtime.close()

    def _run(self) -> None:
        reaped = False
        while not self._stop.is_set():
            self._wake.clear()
            self._wait_for_takers()
            try:  # the engine may be down or come back: every step is retried next pass
                if not reaped:
                    self._image()
                    with self._lock:
                        self.reap()
                    reaped = True
                self.keep()
            except Exception as exc:
                log.warning("warm pool: %s", exc)
            self._clock.wait(self._wake, self._interval)

    def _wait_for_takers(self) -> None:
        """Until every run that took a sandbox has settled, or its hold has passed."""
        while not self._stop.is_set():
            with self._holds_lock:
                left = self._held()
                self._settle.clear()
            if left <= 0:
                return
            self._clock.wait(self._settle, left)

    def _held(self) -> float:
        """For how much longer a taker's run holds the refill (0: none does)."""
        with self._holds_lock:
            if self._taking:
                return self._hold  # until the take returns (it sets _settle)
            now = self._clock.monotonic()
            self._holds = {k: until for k, until in self._holds.items() if until > now}
            return max(self._holds.values(), default=now) - now

    def _image(self) -> None:
        """The default image, built when missing (as `broker run` builds it)."""
        from broker.hosting import images

        if self.settings.image == images.DEFAULT_IMAGE:
            self.runtime.ensure_image(self.settings.image, log=log.info)

    def keep(self) -> None:
        """One pass: sweep what must go, then create up to N (stopping when closed)."""
        with self._lock:
            self.sweep()
            while len(self.idle()) < self.size and not self._stop.is_set() and not self._held():
                create(
                    self.runtime,
                    self.state_dir,
                    self.settings,
                    self.root,
                    workspace=self._workspace,
                    labels=self._labels,
                    clock=self._clock,
                )
                with self._filled:
                    self._filled.notify_all()

    def sweep(self) -> None:
        """Remove other keys' entries, entries whose container is gone or whose image
        was rebuilt since, stale claims."""
        image_id = self.runtime.image_id(self.settings.image)
        for key_dir in self._keys():
            self._drain(key_dir, keep=self.key, image_id=image_id)
            if key_dir.name != self.key:
                _rmdir(key_dir)
        now = self._clock.time()
        claimed = self.root / CLAIMED
        for entry in sorted(claimed.iterdir()) if claimed.is_dir() else ():
            try:
                stale = now - entry.stat().st_mtime > STALE_CLAIM_S
                warm = Warm.read(entry, self.state_dir)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if stale and (warm.paths.results / FIFO).exists():
                discard(warm, self.runtime)
            elif stale:  # handed over, its entry left: the run owns the container
                entry.unlink(missing_ok=True)

    def reap(self) -> None:
        """Remove this pool's containers that have no entry and still wait for their
        command (a keeper that died between starting one and writing its entry)."""
        claimed = self.root / CLAIMED
        known = {p.name for p in self.idle()}
        known |= {p.name for p in claimed.iterdir()} if claimed.is_dir() else set()
        for handle in self.runtime.leftovers():
            sandbox_id = handle.labels.get(LABEL, "")
            if handle.labels.get(WARM_LABEL) != self.key or sandbox_id in known:
                continue
            root = self.state_dir / "sandboxes" / sandbox_id
            if not (root / "results" / FIFO).exists():  # handed over: a run's now
                continue
            log.info("warm pool: removing %s, left without its entry", sandbox_id)
            self.runtime.remove(handle)
            _rmtree(root)

    def _keys(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in sorted(self.root.iterdir()) if p.is_dir() and p.name[0] != "."]

    def _drain(self, key_dir: Path, keep: str | None, image_id: str | None = None) -> None:
        """Remove the entries of ``key_dir``; of the key ``keep``, only the dead ones
        and those made from another image than ``image_id``."""
        for entry in sorted(key_dir.iterdir()):
            if entry.name[0] == ".":
                continue
            try:
                warm = Warm.read(entry, self.state_dir)
            except FileNotFoundError:  # taken meanwhile
                continue
            except (OSError, ValueError, KeyError, TypeError):
                entry.unlink(missing_ok=True)
                continue
            handle = None
            if key_dir.name == keep:
                handle = self.runtime.get(warm.container_id)
                if handle is not None and handle.status == "running" and not warm.stale(image_id):
                    continue
            mine = self.root / CLAIMED / entry.name
            try:  # claimed first: a taker may be after it too
                mine.parent.mkdir(mode=0o700, exist_ok=True)
                os.rename(entry, mine)
            except FileNotFoundError:
                continue
            try:
                discard(replace(warm, entry=mine), self.runtime, handle)
            except SandboxError as exc:
                log.warning("warm pool: %s", exc)


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:  # not empty: a keeper of that key is filling it
        pass


def keeper_for(config: Config) -> WarmPool | None:
    """`broker serve`'s pool when [sandbox] warm = N > 0, started; None when N is 0."""
    from broker.hosting import warm
    from broker.hosting.runtimes import open_runtime, runtime_name

    size = warm.count(config)
    if size == 0:
        return None
    name = runtime_name(config)
    runtime = open_runtime(name)
    pool = WarmPool(runtime, config.state_dir, warm.settings(config, name), size, own_runtime=True)
    pool.start()
    log.info("warm pool: keeping %d %s sandboxes ready", size, name)
    return pool
