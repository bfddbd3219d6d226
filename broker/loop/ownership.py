"""One owner per state dir. The process that serves it (`serve`, `run`, the inbox's
broker) holds an exclusive lock on `<state>/broker.lock` for its whole life; a second
one never runs a second pipeline. Other processes on the host talk to the owner
through `<state>/control/broker.sock` (owner-only): `broker run` hands it a sandbox
and waits for it like any served sandbox. Reading the ledger and taking decisions
need no lock. With a shared store (PostgreSQL), the owner also holds its host's lease
there (store/leases.py), taken after the state dir's lock and given back before it.

The control protocol is JSON lines over that socket:

    → {"op": "serve", "sandbox": ID}      ← {"ok": true} | {"ok": false, "error": …}
    ← {"event": "pending", "id": RID}     (for each request of ID that starts waiting)
    → {"op": "release"}                   ← {"ok": true, "released": true} once drained

`broker serve` also runs sandboxes for `broker run` (broker.hosting.run_service): the
run's whole life on the owner's side, with its warm pool and its engine connection, the
client left to print what it is told and exit with the sandbox's code:

    → {"op": "run", "command": [ARG…], "image": IMAGE|null, "runtime": NAME|null,
       "inputs": {"state_dir": PATH, "config": PATH|null, "policy": PATH|null}}
    ← {"event": "started", "sandbox": ID, "container": SHORT_ID, "image": IMAGE}
    ← {"event": "say", "text": LINE}       (a line to print: the agent's output, neutralised
                                           here and again by the client, or the owner's)
    ← {"event": "pending", "id": RID}
    → {"op": "stop"}                      (Ctrl-C: the container is removed)
    ← {"event": "exited", "code": N, "summary": TEXT}
    ← {"ok": false, "error": …}           (refused: nothing was started)

The owner runs it only when the digest of those inputs as they are now
(broker.inputs.digest: the broker's version, the paths and the files' bytes) is the one
its own start-up check passed, which its lock file names (`Owner.checked`; a client
reads no more than that it names one). A run whose inputs differ, or that asks for
another runtime, is refused and runs on its own path, checked as usual.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker import clock
from broker.errors import LeaseLost, StateBusy
from broker.loop.lockfile import (
    MAX_LINE,
    read_owner,
    socket_path,
    unix_address,
)

if TYPE_CHECKING:  # `broker run`'s client reads the lock and the socket alone
    from broker.events import Event
    from broker.store.base import Lease

log = logging.getLogger("broker.loop.ownership")


class StateLock:
    """The state dir's exclusive lock, held for the owner's lifetime (flock: the kernel
    drops it when the process dies, kill -9 included)."""

    def __init__(self, state_dir: Path, lease: Lease | None = None) -> None:
        self.state_dir = state_dir
        self.path = state_dir / "broker.lock"
        self.lease = lease
        self.checked: str | None = None  # the digest the lock file names (acquire's)
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self, command: str, checked: str | None = None) -> None:
        """Take the lock or raise StateBusy naming the process that has it; `checked`:
        the digest of the start-up check this owner passed (it runs `broker run`s)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            owner = read_owner(self.state_dir)
            who = f" ({owner})" if owner else ""
            raise StateBusy(
                f"another broker{who} serves {self.state_dir}; stop it first, or use "
                "`broker run`, which hands its sandbox to the running broker"
            ) from None
        if self.lease is not None:
            try:
                self.lease.acquire(command)  # StateBusy naming the holder, or the store's error
            except BaseException:
                os.close(fd)
                raise
        info = {"pid": os.getpid(), "command": command, "since": clock.iso(clock.now())}
        if checked is not None:
            info["checked"] = checked
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode() + b"\n", 0)
        self._fd = fd
        self.checked = checked

    def check(self) -> None:
        """Raise LeaseLost if another broker took this host's lease meanwhile."""
        if self._fd >= 0 and self.lease is not None and self.lease.lost.is_set():
            raise LeaseLost(
                f"another broker took the lease of this host in the shared ledger; "
                f"{self.state_dir} is no longer served"
            )

    def release(self) -> None:
        if self._fd >= 0 and self.lease is not None:
            self.lease.release()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the fd drops the flock
            self._fd = -1


# -- the owner's side -------------------------------------------------------------------


class Connection:
    """One client of the control socket; `send` may be called from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self.closed = False

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\n"
        with self._lock:
            if self.closed:
                return
            try:
                self._sock.sendall(data)
            except OSError:
                self.closed = True

    def close(self) -> None:
        with self._lock:
            self.closed = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()


Runs = Callable[[dict[str, Any], "Connection", Iterator[Any]], None]
"""Who runs a `run` op: its message, the client's connection, the client's next messages
(they end when the client goes): broker.hosting.run_service."""


class ControlServer:
    """Accepts connections on the control socket and turns each request into a Control
    event on the broker's queue; the loop answers through the event's reply."""

    def __init__(
        self, state_dir: Path, events: queue.Queue[Event], runs: Runs | None = None
    ) -> None:
        self.path = socket_path(state_dir)
        self._events = events
        self._runs = runs
        self._sock: socket.socket | None = None
        self._connections: set[Connection] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path.parent, 0o700)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a dead owner's: the state lock says we are the owner
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            with unix_address(self.path) as address:
                sock.bind(address)
        finally:
            os.umask(old)
        sock.listen(16)
        self._sock = sock
        threading.Thread(target=self._accept, name="broker-control", daemon=True).start()

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
            with contextlib.suppress(OSError):
                self.path.unlink()
        with self._lock:
            connections, self._connections = self._connections, set()
        for conn in connections:
            conn.close()

    def _accept(self) -> None:
        while self._sock is not None:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            conn = Connection(sock)
            with self._lock:
                self._connections.add(conn)
            threading.Thread(
                target=self._serve, args=(sock, conn), name="broker-control-conn", daemon=True
            ).start()

    def _serve(self, sock: socket.socket, conn: Connection) -> None:
        from broker.events import Control

        sandbox = ""
        try:
            messages = lines(sock)
            for message in messages:
                op = message.get("op") if isinstance(message, dict) else None
                if op == "run" and not sandbox:  # the run's whole life, on this thread
                    if self._runs is None:
                        conn.send({"ok": False, "error": "this broker runs no sandboxes"})
                    else:
                        self._runs(message, conn, messages)
                    return
                if op == "serve" and isinstance(message.get("sandbox"), str):
                    sandbox = message["sandbox"]
                if op not in ("serve", "release") or not sandbox:
                    conn.send({"ok": False, "error": "expected serve, then release"})
                    continue
                self._events.put(Control(str(op), sandbox, conn.send, conn))
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()


def lines(sock: socket.socket) -> Iterator[Any]:
    """JSON messages, one per line, from a client; a line that is not JSON ends it."""
    buffer = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                yield json.loads(line)
            except ValueError:
                return
        if len(buffer) > MAX_LINE:
            return
