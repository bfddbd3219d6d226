"""Code blocks run one at a time in a long-lived sandbox container, and killed alone.

The container is started by :func:`broker.hosting.sandbox.start` (no network, read-only root,
no capabilities, uid 10001, limits, ``/outbox`` and read-only ``/results``) with a
tiny reaper as PID 1. Each block is one ``docker exec``: its code goes in on stdin
(never through a file the sandbox could rewrite between approval and run), into a
memfd the interpreter reads. Every process of a block carries ``BROKER_BLOCK=<token>``
in its environment, so :meth:`Container.kill` finds that block's processes (and their
sessions) and nothing else.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import docker
import docker.errors
from docker.utils.socket import frames_iter as _frames_iter

from broker.clock import REAL
from broker.errors import SandboxError
from broker.hosting import sandbox

__all__ = ["INTERPRETERS", "MAX_OUTPUT", "Container", "Run"]

frames_iter = cast(Callable[[Any, bool], Iterator[tuple[int, bytes]]], _frames_iter)

INTERPRETERS: dict[str, tuple[str, ...]] = {
    "python": ("python3",),
    "python3": ("python3",),
    "py": ("python3",),
    "sh": ("sh",),
    "shell": ("sh",),
    "bash": ("bash",),
}
"""Fence languages → the interpreter that runs them in the sandbox."""

MAX_OUTPUT = 64 * 1024
"""Bytes of a block's output kept: the start and the end, with a note of what was cut."""

# PID 1: reaps orphans (a killed block's children) until the container is removed.
REAPER = """
import os, signal
signal.signal(signal.SIGCHLD, lambda *a: None)
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM})
while True:
    if signal.sigwait({signal.SIGCHLD, signal.SIGTERM}) == signal.SIGTERM:
        os._exit(0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
"""

# One block: code from stdin into a memfd (and a copy into $BROKER_SAVE, written with
# the sandbox's own rights, for AutoGen's code_file), stdin from /dev/null, then the
# interpreter. The memfd, not the copy, runs: the copy can be rewritten meanwhile.
BOOT = """
import os, sys
code = sys.stdin.buffer.read()
save = os.environ.pop("BROKER_SAVE", "")
if save:
    os.makedirs(os.path.dirname(save) or ".", exist_ok=True)
    with open(save, "wb") as f:
        f.write(code)
fd = os.memfd_create("block", 0)
view = memoryview(code)
while view:
    view = view[os.write(fd, view):]
null = os.open("/dev/null", os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
argv = sys.argv[1:] + ["/proc/self/fd/%d" % fd]
os.execvp(argv[0], argv)
"""

# Kill every process marked with this block's token, and every process in their sessions.
KILL = """
import os, signal, sys, time
mark = ("BROKER_BLOCK=" + sys.argv[1]).encode()
me = os.getpid()
def procs():
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (me, 1):
            yield int(name)
for _ in range(100):
    marked, sessions = [], set()
    for pid in procs():
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if mark in f.read().split(b"\\0"):
                    marked.append(pid)
                    sessions.add(os.getsid(pid))
        except OSError:
            pass
    targets = set(marked)
    for pid in procs():
        try:
            if os.getsid(pid) in sessions:
                targets.add(pid)
        except OSError:
            pass
    if not targets:
        break
    # stop them all before killing any: a shell whose child died first would otherwise
    # run the block's next line ("after") before its own SIGKILL lands
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in targets:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    REAL.sleep(0.01)
"""


@dataclass(frozen=True)
class Run:
    """What one block did: its exit code and its output (stdout and stderr, interleaved)."""

    exit_code: int
    output: str


class Container:
    """One long-lived sandbox container that runs blocks; blocking calls, thread-safe."""

    def __init__(
        self,
        client: docker.DockerClient,
        paths: sandbox.SandboxPaths,
        image: str,
        *,
        limits: sandbox.SandboxLimits,
        env: dict[str, str],
        workspace: Any,
        user: str = f"{sandbox.SANDBOX_UID}:{sandbox.SANDBOX_UID}",
        name: str | None = None,
        read_only_mounts: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        self._client = client
        self._user = user
        self._container = sandbox.start(
            client,
            paths,
            image,
            ["python3", "-c", REAPER],
            limits=limits,
            env=env,
            workspace=workspace,
            name=name or f"broker-{paths.sandbox_id}-{int(REAL.time() * 1000) % 10**8}",
            read_only_mounts=read_only_mounts,
            labels=labels,
        )

    @classmethod
    def adopt(cls, client: docker.DockerClient, container: Any, user: str) -> Container:
        """A sandbox container already started with the reaper as PID 1 (a warm pool's)."""
        adopted = cls.__new__(cls)
        adopted._client, adopted._user, adopted._container = client, user, container
        return adopted

    @property
    def id(self) -> str:
        return str(self._container.id)

    def run(self, interpreter: Sequence[str], code: str, token: str, save: str = "") -> Run:
        """Run `code` with `interpreter`; returns when the block's main process ends.
        `save`, a path below /workspace, gets a copy of the code first."""
        api = self._client.api
        try:
            exec_id = api.exec_create(
                self._container.id,
                ["python3", "-c", BOOT, *interpreter],
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                user=self._user,
                workdir="/workspace",
                environment={"BROKER_BLOCK": token, "BROKER_SAVE": save},
            )["Id"]
            stream: Any = api.exec_start(exec_id, socket=True)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot run a block in the sandbox: {exc}") from exc
        raw = getattr(stream, "_sock", None)
        try:
            if not isinstance(raw, socket.socket):
                raise SandboxError("blocks need the Docker engine on a unix or TCP socket")
            raw.sendall(code.encode("utf-8"))
            raw.shutdown(socket.SHUT_WR)
            output = _Capped()
            for _, data in frames_iter(stream, False):
                output.add(data)
        except OSError as exc:
            raise SandboxError(f"lost the block's output: {exc}") from exc
        finally:
            stream.close()
            if isinstance(raw, socket.socket):
                raw.close()  # closing the stream leaves the socket open
        return Run(self._exit_code(exec_id), output.text())

    def kill(self, token: str) -> None:
        """Kill the block marked `token` (every process it started); nothing else."""
        try:
            self._container.exec_run(["python3", "-c", KILL, token], user=self._user)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot stop the block: {exc}") from exc

    def shell(self, command: Sequence[str]) -> tuple[int, str]:
        """Run a short command as the blocks' user (an init command, a file's removal)."""
        try:
            done = self._container.exec_run(list(command), user=self._user, workdir="/workspace")
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot run {command[0]} in the sandbox: {exc}") from exc
        output = done.output if isinstance(done.output, bytes) else b""
        return int(done.exit_code or 0), output.decode("utf-8", "replace")

    def remove(self) -> None:
        """Remove the container (every block with it) and close the engine connection."""
        try:
            sandbox.remove(self._container)
        finally:
            self._client.close()

    def _exit_code(self, exec_id: str) -> int:
        for _ in range(200):  # the stream ends a moment before docker records the exit
            info = self._client.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            REAL.sleep(0.01)
        return -1


class _Capped:
    """Collects output, keeping the first and the last part past MAX_OUTPUT."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.cut = 0

    def add(self, data: bytes) -> None:
        room = MAX_OUTPUT // 4 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        excess = len(self.tail) - (MAX_OUTPUT - MAX_OUTPUT // 4)
        if excess > 0:
            del self.tail[:excess]
            self.cut += excess

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        if not self.cut:
            return head + self.tail.decode("utf-8", "replace")
        note = f"\n[... {self.cut} bytes of output cut ...]\n"
        return head + note + self.tail.decode("utf-8", "replace")
