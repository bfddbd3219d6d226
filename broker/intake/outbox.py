"""The outboxes the broker serves, and one watcher for all of them.

Each served sandbox has an outbox (the agent writes), a results dir (the broker
writes) and a private claim dir on the same file system: a request is moved there by
rename before it is read, so nothing the sandbox does afterwards (a rewrite, a
symlink swap) can change what the broker reads. File-system events are a
hint: a periodic rescan converges on the real contents when events are lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from broker import fleet
from broker.errors import ConfigError
from broker.events import DirsChanged, Event, FileSeen, Rescan

log = logging.getLogger("broker.intake.outbox")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
SANDBOX_ID = "default"


@dataclass
class Outbox:
    """One sandbox's directories, held open by fd for the broker's lifetime.

    The claim dir is private to the broker and on the outbox's file system: a request
    is renamed into it before it is read, and only what was renamed there is ever
    removed. Where no such place exists the outbox is refused, never read in place.
    """

    sandbox: str
    outbox: Path
    results: Path
    claim: Path
    outbox_fd: int = -1
    results_fd: int = -1
    claim_fd: int = -1

    def open(self, layout_hint: str) -> Outbox:
        try:
            self.outbox_fd = os.open(self.outbox, _DIR)
            self.results.mkdir(parents=True, exist_ok=True)
            self.results_fd = os.open(self.results, _DIR)
            self.claim.mkdir(mode=0o700, parents=True, exist_ok=True)
            if os.stat(self.claim).st_dev != os.fstat(self.outbox_fd).st_dev:
                self.close()
                raise ConfigError(
                    f"sandbox {self.sandbox}: the outbox {self.outbox} is on another file "
                    f"system than its claim dir {self.claim}; the broker claims each request "
                    f"by rename before reading it, so {layout_hint}"
                )
            self.claim_fd = os.open(self.claim, _DIR)
        except OSError as exc:
            self.close()
            raise ConfigError(
                f"sandbox {self.sandbox}: cannot open {exc.filename}: {exc.strerror}"
            ) from exc
        return self

    def close(self) -> None:
        for fd in (self.outbox_fd, self.results_fd, self.claim_fd):
            if fd >= 0:
                os.close(fd)
        self.outbox_fd = self.results_fd = self.claim_fd = -1

    def names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.outbox_fd))
        except OSError:
            return []

    def claimed(self) -> list[str]:
        return sorted(os.listdir(self.claim_fd))


ATTACH_HINT = (
    "put the state dir on the outbox's file system, or pass --claim DIR: a directory "
    "on that file system that the sandbox cannot see"
)
LAYOUT_HINT = (
    "mount the sandbox's own file system at sandboxes/<id>/ (holding outbox/, results/ "
    "and claimed/), not at sandboxes/<id>/outbox/"
)


def attach(
    sandbox: str, outbox: Path, results: Path, state_dir: Path, claim: Path | None = None
) -> Outbox:
    """An orchestrator's own pair of directories (attach mode)."""
    outbox, results = outbox.absolute(), results.absolute()
    if not outbox.is_dir():
        raise ConfigError(f"--outbox {outbox}: not a directory")
    if state_dir.absolute().is_relative_to(outbox):
        raise ConfigError(f"the state dir {state_dir} must not be inside the outbox {outbox}")
    where = claim.absolute() if claim else state_dir.absolute() / "claimed" / sandbox
    if where.is_relative_to(outbox):
        raise ConfigError(f"--claim {where} must not be inside the outbox {outbox}")
    return Outbox(sandbox, outbox, results, where).open(ATTACH_HINT)


def from_layout(root: Path, sandbox: str) -> Outbox:
    """A sandbox under <state>/sandboxes/<id>/ (the layout `broker run` creates)."""
    base = root / sandbox
    if base.is_symlink():  # its results/ and claimed/ would be made in the link's target
        raise ConfigError(
            f"sandbox {sandbox}: {base} is a symbolic link; the broker writes results and "
            "claims only in a real directory under sandboxes/, never through a link"
        )
    return Outbox(sandbox, base / "outbox", base / "results", base / "claimed").open(LAYOUT_HINT)


def discover(sandboxes_dir: Path) -> tuple[list[str], list[str]]:
    """Sandbox ids under <state>/sandboxes/: (those with an outbox, those still without)."""
    try:
        entries = sorted(os.listdir(sandboxes_dir))
    except FileNotFoundError:
        return [], []
    ready: list[str] = []
    waiting: list[str] = []
    for entry in entries:
        if entry.startswith(".") or not (sandboxes_dir / entry).is_dir():
            continue
        (ready if (sandboxes_dir / entry / "outbox").is_dir() else waiting).append(entry)
    return ready, waiting


class Served:
    """The outboxes one broker serves: by sandbox and by directory, and the roots new
    sandboxes are discovered under. A sandbox dir whose outbox is not there yet is
    watched itself, so the outbox is served the moment it appears. With a shared store
    (`host`), every sandbox is known by its id across the fleet, HOST.SANDBOX; its
    directories keep their local names."""

    def __init__(
        self,
        control_dir: Path,
        on_add: Callable[[Outbox], object] | None = None,
        host: str | None = None,
    ) -> None:
        self.on_add = on_add  # e.g. publish the effect catalogue into its results dir
        self.host = host
        self.watcher: Watcher | None = None
        self.boxes: dict[str, Outbox] = {}
        self.by_dir: dict[str, Outbox] = {}
        self.roots: list[Path] = []
        self._control = control_dir
        self._waiting: list[Path] = []
        self._refused: dict[str, str] = {}

    def qualify(self, sandbox: str) -> str:
        """A local sandbox id (a directory's name) as the ledger knows it."""
        return fleet.qualify(self.host, sandbox)

    def add(self, box: Outbox) -> None:
        """Serve `box`, made under its local id."""
        box.sandbox = self.qualify(box.sandbox)
        self.boxes[box.sandbox] = box
        self.by_dir[str(box.outbox)] = box
        if self.on_add is not None:
            self.on_add(box)
        self.rewatch()

    def remove(self, sandbox: str) -> None:
        box = self.boxes.pop(sandbox, None)
        if box is not None:
            self.by_dir.pop(str(box.outbox), None)
            box.close()

    def add_root(self, sandboxes_dir: Path) -> None:
        sandboxes_dir.mkdir(parents=True, exist_ok=True)
        self.roots.append(sandboxes_dir)

    def discover(self) -> list[Outbox]:
        """Serve the sandboxes that appeared under the roots; return the new ones."""
        added = self._discover()
        if self.outbox_appeared():  # before its sandbox dir was watched
            added += self._discover()
        return added

    def _discover(self) -> list[Outbox]:
        added: list[Outbox] = []
        self._waiting = []
        for root in self.roots:
            ready, waiting = discover(root)
            self._waiting.extend(root / w for w in waiting)
            for sandbox in ready:
                if self.qualify(sandbox) in self.boxes:
                    continue
                try:
                    box = from_layout(root, sandbox)
                except ConfigError as exc:
                    if self._refused.get(sandbox) != str(exc):
                        self._refused[sandbox] = str(exc)
                        log.error("%s", exc)
                    continue
                self._refused.pop(sandbox, None)
                self.add(box)
                added.append(box)
        self.rewatch()
        return added

    def outbox_appeared(self) -> bool:
        """Whether a sandbox still waiting for its outbox has one now."""
        return any((w / "outbox").is_dir() for w in self._waiting)

    def dirs(self) -> list[Path]:
        return [b.outbox for b in self.boxes.values()]

    def parents(self) -> list[Path]:
        """What to watch for new sandboxes: the roots, sandboxes still without an outbox,
        and the control dir (nudges from other processes)."""
        self._control.mkdir(parents=True, exist_ok=True)
        return [*self.roots, *self._waiting, self._control]

    # -- the watcher ------------------------------------------------------------------

    def watch(self, events: queue.Queue[Event]) -> None:
        """Start watching every served outbox (and the parents) for the loop."""
        self.watcher = Watcher(events)
        self.rewatch()

    def rewatch(self) -> None:
        if self.watcher is not None:
            self.watcher.sync(self.dirs(), self.parents())

    def watcher_died(self, events: queue.Queue[Event]) -> bool:
        """If the watching thread died, start a new watcher (the caller then rescans)."""
        if self.watcher is None or self.watcher.alive():
            return False
        log.warning("restarting the outbox watcher and rescanning")
        old = self.watcher
        self.watch(events)
        with contextlib.suppress(OSError):
            old.stop()
        return True

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        for box in self.boxes.values():
            box.close()


class Watcher:
    """One watcher for every outbox: raw inotify on Linux, else watchfiles.

    Puts FileSeen for each entry worth reading, DirsChanged when a watched parent (the
    sandboxes root, the control dir) changes, and Rescan when events may have been
    lost. `sync` returns once the watches are in place.
    """

    def __init__(self, events: queue.Queue[Event]) -> None:
        from broker.intake import inotify

        self._events = events
        self._parents: set[str] = set()
        self._native: inotify.Inotify | None = None
        self._fallback: _WatchfilesWatcher | None = None
        if inotify.available():
            self._native = inotify.Inotify(self._sink)
        else:
            self._fallback = _WatchfilesWatcher(events)

    def sync(self, dirs: Iterable[Path], parents: Iterable[Path] = ()) -> None:
        dirs, parents = list(dirs), list(parents)
        self._parents = {str(p) for p in parents}
        if self._fallback is not None:
            self._fallback.watch(dirs, parents)
            return
        assert self._native is not None
        wanted = {str(d) for d in dirs} | self._parents
        for gone in self._native.watched() - wanted:
            self._native.remove(Path(gone))
        for folder in [*parents, *dirs]:
            try:
                self._native.add(folder)
            except OSError as exc:  # a sandbox dir removed meanwhile: the rescan settles it
                log.warning("%s", exc)

    def alive(self) -> bool:
        """False once the watching thread died: the broker replaces the watcher."""
        if self._native is not None:
            return self._native.alive()
        return True

    def stop(self) -> None:
        if self._native is not None:
            self._native.close()
        if self._fallback is not None:
            self._fallback.stop()

    def _sink(self, folder: str, name: str, mask: int) -> None:
        from broker.intake import inotify

        if not folder:
            self._events.put(Rescan())
        elif folder in self._parents:
            self._events.put(DirsChanged())
        elif name.startswith(".") or name.endswith(".tmp"):
            return  # a temporary name: its rename into place is the event that counts
        elif mask & inotify.IN_CREATE and not mask & inotify.IN_ISDIR:
            # a regular file just created is still being written: wait for its close;
            # anything else (a link, FIFO, socket) has no close to wait for
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                return
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                return
            self._events.put(FileSeen(folder, name))
        else:
            self._events.put(FileSeen(folder, name))


class _WatchfilesWatcher:
    """The portable path: watchfiles in a thread, restarted on error or new paths."""

    def __init__(self, events: queue.Queue[Event], step_ms: int = 2) -> None:
        self._events = events
        self._step_ms = step_ms
        self._dirs: list[Path] = []
        self._parents: list[Path] = []
        self._stop = threading.Event()
        self._restart = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def watch(self, dirs: Iterable[Path], parents: Iterable[Path] = ()) -> None:
        with self._lock:
            self._dirs = [Path(d) for d in dirs]
            self._parents = [Path(p) for p in parents]
        self._restart.set()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="broker-watcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._restart.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        from watchfiles import Change, watch

        while not self._stop.is_set():
            self._restart.clear()
            with self._lock:
                dirs, parents = list(self._dirs), list(self._parents)
            paths = [d for d in dirs + parents if d.is_dir()]
            if not paths:
                self._restart.wait(1.0)
                continue
            parent_set = {str(p) for p in parents}
            try:
                for changes in watch(
                    *paths,
                    stop_event=_Either(self._stop, self._restart),
                    debounce=50,
                    step=self._step_ms,
                    rust_timeout=1000,
                    recursive=False,
                    raise_interrupt=False,
                    ignore_permission_denied=True,
                ):
                    for change, path in changes:
                        folder, _, name = path.rpartition("/")
                        if folder in parent_set:
                            self._events.put(DirsChanged())
                        elif change != Change.deleted:
                            self._events.put(FileSeen(folder, name))
            except Exception as exc:  # the watcher is a hint; the rescan keeps us right
                log.warning("watcher failed (%s); restarting it and rescanning", exc)
                self._events.put(Rescan())
                self._stop.wait(0.5)


class _Either:
    """A stop_event for watchfiles that is set when either event is."""

    def __init__(self, a: threading.Event, b: threading.Event) -> None:
        self._a, self._b = a, b

    def is_set(self) -> bool:
        return self._a.is_set() or self._b.is_set()
