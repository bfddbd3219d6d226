"""`broker run`s that `broker serve` runs for its clients: the control socket's run op.

A `broker run` beside a serving broker whose start-up check read the same inputs
(broker.inputs.digest) hands its whole life to that broker: the owner
takes a sandbox from its warm pool or starts one cold (the spec and proof of
broker.hosting.runner), serves it, tells the client what to print, waits, removes the
container, drains what it left and says what it came to. The owner's modules, engine
connection and pool are warm already; the client (broker.cli.run_client) imports
little more than the config, which is what makes a pooled start faster than
`docker run`. The messages are in broker.loop.ownership's docstring.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.config import Config
from broker.errors import BrokerError, SandboxError
from broker.events import Control, Event
from broker.hosting import images, runner, warm
from broker.hosting.runtimes import open_runtime, runtime_name
from broker.hosting.runtimes.base import Handle, Runtime
from broker.inputs import digest
from broker.loop.handover import RELEASE_TIMEOUT_S

if TYPE_CHECKING:
    from broker.hosting.warm_keeper import WarmPool
    from broker.loop.ownership import Connection

__all__ = ["RunRequest", "RunService", "parse"]

log = logging.getLogger("broker.run")
MAX_ARGS = 4096
REPLY_S = 30.0  # the loop answers a serve at once; longer is a stuck broker


@dataclass(frozen=True)
class RunRequest:
    """What a client asks to run: its command and image (None: [sandbox] image)."""

    command: tuple[str, ...]
    image: str | None
    runtime: str | None  # --runtime; None: the broker's own
    inputs: tuple[Path, Path | None, Path | None]  # state dir, broker.toml, policy


def parse(message: Mapping[str, Any]) -> RunRequest:
    """The run op's fields, checked; ValueError names the first that is wrong."""
    command = message.get("command")
    if (
        not isinstance(command, list)
        or not command
        or len(command) > MAX_ARGS
        or not all(isinstance(a, str) and "\0" not in a for a in command)
    ):
        raise ValueError("command: expected a list of 1 to 4096 strings without NUL")
    image = message.get("image")
    if image is not None and (not isinstance(image, str) or not image or "\0" in image):
        raise ValueError("image: expected an image name or null")
    runtime = message.get("runtime")
    if runtime is not None and not isinstance(runtime, str):
        raise ValueError("runtime: expected docker, podman or null")
    inputs = message.get("inputs")
    if not isinstance(inputs, dict):
        raise ValueError("inputs: expected the run's state_dir, config and policy")
    state_dir, config, policy = (inputs.get(key) for key in ("state_dir", "config", "policy"))
    if not (isinstance(state_dir, str) and state_dir and "\0" not in state_dir) or not all(
        p is None or (isinstance(p, str) and p and "\0" not in p) for p in (config, policy)
    ):
        raise ValueError("inputs: expected the paths of state_dir, config and policy")
    named = (Path(state_dir), Path(config) if config else None, Path(policy) if policy else None)
    return RunRequest(tuple(command), image, runtime, named)


@dataclass
class _Run:
    sandbox_id: str
    image: str
    handle: Handle
    removing: threading.Lock  # a stop and the run's own end may both remove it
    removed: bool = False


class RunService:
    """The owner's side: one call per run op, on the connection's thread."""

    def __init__(
        self,
        config: Config,
        events: queue.Queue[Event],
        checked: str | None,
        pool: WarmPool | None = None,
    ) -> None:
        self.config = config
        self.events = events
        self.checked = checked  # None: it vouches for no inputs, so it runs none
        self.pool = pool
        self._runtime: Runtime | None = pool.runtime if pool is not None else None
        self._own_runtime = False
        self._lock = threading.Lock()

    def __call__(self, message: dict[str, Any], conn: Connection, rest: Iterator[Any]) -> None:
        try:
            request = parse(message)
            if self.checked is None or digest(*request.inputs) != self.checked:
                raise BrokerError("broker.toml or the policy changed since this broker started")
            if request.runtime not in (None, runtime_name(self.config)):
                raise BrokerError(f"this broker runs {runtime_name(self.config)} sandboxes")
            run = self._start(request, conn)
        except (ValueError, BrokerError) as exc:
            conn.send({"ok": False, "error": str(exc)})
            return
        life = threading.Thread(
            target=self._life, args=(run, request, conn), name="broker-run-life", daemon=True
        )
        life.start()
        for sent in rest:  # the client's: a stop, or its going, ends the container
            if isinstance(sent, dict) and sent.get("op") == "stop":
                break
        self._remove(run)
        life.join()

    def close(self) -> None:
        if self._own_runtime and self._runtime is not None:
            self._runtime.close()

    # -- how ------------------------------------------------------------------------------

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = open_runtime(runtime_name(self.config))
                self._own_runtime = True
            return self._runtime

    def _start(self, request: RunRequest, conn: Connection) -> _Run:
        """A sandbox running the command, served by this broker from before it starts."""
        runtime = self.runtime()
        image = request.image or str(self.config.sandbox.get("image", images.DEFAULT_IMAGE))
        pool = self.pool
        taken = pool.take() if pool is not None and pool.settings.image == image else None
        if taken is not None:
            sandbox_id = taken.sandbox_id
            start: Callable[[], Handle] = partial(warm.launch, taken, request.command, runtime)
        else:
            sandbox_id = runner.new_sandbox_id(None)
            say = lambda line: conn.send(_say(line))  # noqa: E731
            options = runner.RunOptions(command=request.command, say=say)
            spec = runner.cold_spec(self.config, options, runtime, sandbox_id, image)
            start = partial(runtime.start, spec)
        try:
            served = self._control("serve", sandbox_id, conn)  # its pending requests: to conn
            handle = start()
            try:
                reply = served.get(timeout=REPLY_S)
            except queue.Empty:
                reply = {"ok": False, "error": "the broker's loop did not answer"}
            if not reply.get("ok"):
                runtime.remove(handle)
                raise SandboxError(f"cannot serve sandbox {sandbox_id}: {reply.get('error')}")
        except BaseException:
            self._settled(sandbox_id)
            raise
        return _Run(sandbox_id, image, handle, threading.Lock())

    def _life(self, run: _Run, request: RunRequest, conn: Connection) -> None:
        """Start to summary: what the client prints, and the sandbox's exit code."""
        conn.send(
            {
                "event": "started",
                "sandbox": run.sandbox_id,
                "container": run.handle.short_id,
                "image": run.image,
            }
        )
        say = lambda text: conn.send(_say(text))  # noqa: E731
        output = threading.Thread(
            target=runner.stream_logs, args=(run.handle, say), name="run-logs", daemon=True
        )
        output.start()
        try:
            code = int(run.handle.wait().get("StatusCode", 1))
        except Exception as exc:  # removed under it (a stop), or the engine went
            log.debug("sandbox %s: wait ended: %s", run.sandbox_id, exc)
            code = 137
        output.join(5)
        released = self._control("release", run.sandbox_id, None)  # drained meanwhile
        self._remove(run)
        try:
            released.get(timeout=RELEASE_TIMEOUT_S + REPLY_S)
        except queue.Empty:
            log.warning("sandbox %s: not drained in time", run.sandbox_id)
        text = runner.summary(self.config, run.sandbox_id, code)
        conn.send({"event": "exited", "code": code, "summary": text})

    def _remove(self, run: _Run) -> None:
        """Remove the container once; a second caller returns when it is gone."""
        with run.removing:
            if run.removed:
                return
            run.removed = True
            try:
                self.runtime().remove(run.handle)
            except SandboxError as exc:
                log.warning("sandbox %s: %s", run.sandbox_id, exc)
            finally:
                self._settled(run.sandbox_id)

    def _settled(self, sandbox_id: str) -> None:
        """The pool may refill now: this run no longer needs the engine's attention."""
        if self.pool is not None:
            self.pool.settled(sandbox_id)

    def _control(
        self, op: str, sandbox_id: str, conn: Connection | None
    ) -> queue.Queue[dict[str, Any]]:
        """Ask the loop to serve or release a sandbox; its reply arrives on the queue."""
        replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events.put(Control(op, sandbox_id, replies.put, conn))
        return replies


def _say(text: str) -> dict[str, Any]:
    return {"event": "say", "text": text}
