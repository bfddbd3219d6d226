"""`broker run` as a client of the serving broker that checked the same inputs.

When `broker serve` owns the state dir and its lock file names the digest of what
this run's start-up check would read (broker.inputs), the run is the owner's to do
(broker.hosting.run_service): this process sends the command and prints what it is
told, with broker.toml located and hashed and a socket, nothing of the config's
validation, the engine or the pipeline. Every other run, and one the owner refuses,
is checked and run by broker.hosting.runner as before; if the owner goes away while
the sandbox runs, this process serves the container to its end itself.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from broker.inputs import Located
from broker.loop.lockfile import MAX_LINE, read_owner, served, socket_path, unix_address

if TYPE_CHECKING:
    from broker.cli.prompt import Prompt

__all__ = ["Left", "through_owner"]

STOP_WAIT_S = 10.0  # after Ctrl-C, how long the owner gets to say the container is gone


class Left(NamedTuple):
    """The owner went away while the sandbox ran: it is this process's to serve now."""

    sandbox_id: str
    container_id: str


def through_owner(
    located: Located,
    command: Sequence[str],
    image: str | None,
    runtime: str | None,
    say: Callable[[str], None],
    prompt: Callable[[], Prompt] | None = None,
) -> int | Left | None:
    """The sandbox's exit code once the owner has run it; Left; or None: no owner
    runs it (none serves, it checked other inputs, or it refused), run it here. The
    owner compares the digest of the inputs this run located with the one its own
    start-up check passed (broker.inputs.digest)."""
    state_dir = located.state_dir
    owner = read_owner(state_dir)
    if owner is None or owner.checked is None or not served(state_dir):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with unix_address(socket_path(state_dir)) as address:
            sock.connect(address)
        ask = {
            "op": "run",
            "command": list(command),
            "image": image,
            "runtime": runtime,
            "inputs": {  # the owner hashes them as its start-up check did (not hashlib here)
                "state_dir": str(state_dir),
                "config": str(located.path) if located.path else None,
                "policy": str(located.policy_path) if located.policy_path else None,
            },
        }
        sock.sendall(json.dumps(ask).encode() + b"\n")
        return _follow(sock, _Asking(prompt), say, command, str(owner))
    except OSError:
        return None  # it stopped listening before the run began: run it here
    finally:
        sock.close()


def _follow(
    sock: socket.socket,
    asking: _Asking,
    say: Callable[[str], None],
    command: Sequence[str],
    owner: str,
) -> int | Left | None:
    started: dict[str, Any] | None = None
    messages = _Lines(sock)
    try:
        while (message := messages.next()) is not None:
            event = message.get("event")
            if event == "started" and started is None:
                started = message
                say(f"broker: handed sandbox {message.get('sandbox')} to {owner}")
                running = " ".join(command)
                say(
                    f"sandbox {message.get('sandbox')}: running {running} in {message.get('image')}"
                )
            elif event == "say":
                say(str(message.get("text", "")))
            elif event == "pending":
                asking.pending(str(message.get("id", "")), str((started or {}).get("sandbox")))
            elif event == "exited":
                say(str(message.get("summary", "")))
                return int(message.get("code", 1))
            elif message.get("ok") is False and started is None:
                return None  # refused before anything started: run it here, checked
    except KeyboardInterrupt:
        _stop(sock, messages)
        raise
    finally:
        asking.close()
    if started is None:
        return None
    return Left(str(started.get("sandbox")), str(started.get("container")))


def _stop(sock: socket.socket, messages: _Lines) -> None:
    """Ctrl-C: ask the owner to remove the container, and give it a moment to (it says
    `exited` once the container is gone)."""
    with contextlib.suppress(OSError):
        sock.sendall(b'{"op": "stop"}\n')
        sock.settimeout(STOP_WAIT_S)
        while (message := messages.next()) is not None:
            if message.get("event") == "exited":
                return


class _Lines:
    """The owner's JSON lines, one object at a time; what was read survives a Ctrl-C
    in the middle of a read (the stop that follows reads on from it)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def next(self) -> dict[str, Any] | None:
        """The next object; None at the end of the connection or of sense (a line
        that is not JSON, or one longer than the protocol allows)."""
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    return None
                if isinstance(message, dict):
                    return message
            if len(self.buffer) > 16 * MAX_LINE:
                return None
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk


class _Asking:
    """The terminal's prompt, built at the first request that waits (rich, the
    registry and the policy are loaded for a person only)."""

    def __init__(self, prompt: Callable[[], Prompt] | None) -> None:
        self.make = prompt
        self.prompt: Prompt | None = None

    def pending(self, request_id: str, sandbox_id: str) -> None:
        if self.make is None:
            return
        from broker.fleet import qualify
        from broker.store.factory import open_store

        if self.prompt is None:
            self.prompt = self.make()
        ledger = open_store(self.prompt.cfg)
        try:
            record = ledger.get(qualify(ledger.host, sandbox_id), request_id)
        finally:
            ledger.close()
        if record is not None:
            self.prompt(record)

    def close(self) -> None:
        if self.prompt is not None:
            self.prompt.close()
