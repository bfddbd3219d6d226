"""`broker run`: one sandbox, served from start to exit, then drained and removed.

The lifecycle only: the sandbox's outbox is served while the container runs (by the
broker that owns the state dir, else by one run here: broker.hosting.serving); when it exits,
what is left in the outbox is processed, a summary is printed and the container
removed (also on Ctrl-C and on errors).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from broker.config import Config
from broker.errors import SandboxError
from broker.hosting import images
from broker.hosting.runtimes import extra_env, limits_from, open_runtime, runtime_name
from broker.hosting.runtimes.base import Handle, Runtime
from broker.hosting.runtimes.spec import SandboxSpec, prepare_dirs, sandbox_spec

if TYPE_CHECKING:
    from broker.approval.notify import Notifier
    from broker.hosting.serving import OnBroker, Serving
    from broker.hosting.warm import Warm
    from broker.models import Record
    from broker.policy.ruleset import Policy
    from broker.registry import Registry


class RunOptions(NamedTuple):
    """How one `broker run` goes (a NamedTuple: broker.hosting.runtimes.spec says why)."""

    command: Sequence[str]
    image: str | None = None
    name: str | None = None
    on_broker: OnBroker | None = None  # observers for the broker run starts (GitHub threads)
    workspace: Path | None = None
    detach: bool = False
    on_pending: Callable[[Record], None] | None = None
    notifier: Notifier | None = None  # [notify] webhooks, as `broker serve` tells them
    runtime: str | None = None  # docker or podman; default: [sandbox] runtime, else docker
    say: Callable[[str], None] = print
    adopt: str | None = None  # a running container of sandbox `name` to serve to its end
    prepare: Callable[[], None] | None = None
    """Called first on the serving thread, while the engine starts the container, before
    anything there may log: `broker run` installs its log format and masks there."""


def new_sandbox_id(name: str | None) -> str:
    return name or f"sb-{os.urandom(4).hex()}"  # secrets.token_hex's bytes, without its imports


Checked = Callable[[], "tuple[Registry, Policy]"]
"""The registry and the policy, the config's start-up check passed (broker.cli.assembly's
Checked.get): asked for when a broker is built, which a run that writes nothing skips."""


def run(config: Config, checked: Checked, options: RunOptions) -> int:
    """Start the sandbox, serve it until it exits, drain, summarise; return its exit code."""
    runtime = open_runtime(runtime_name(config, options.runtime))
    try:
        return _run(config, checked, options, runtime)
    finally:
        runtime.close()


def _run(config: Config, checked: Checked, options: RunOptions, runtime: Runtime) -> int:
    image = options.image or str(config.sandbox.get("image", images.DEFAULT_IMAGE))
    taken = _take_warm(config, options, runtime, image)
    if options.adopt is not None and options.name is not None:  # its broker went away
        sandbox_id, fresh = options.name, False
        start: Callable[[], Handle] = partial(_adopted, runtime, options.adopt, sandbox_id)
    elif taken is not None:  # made, proven and started ahead: only its command is handed over
        sandbox_id = taken.sandbox_id
        fresh = True
        from broker.hosting.warm import launch

        start = partial(launch, taken, options.command, runtime)
    else:
        sandbox_id = new_sandbox_id(options.name)
        fresh = not (config.sandboxes_dir / sandbox_id).exists()  # nothing of it in the ledger
        spec = cold_spec(config, options, runtime, sandbox_id, image)
        if options.detach:
            detached = runtime.start(spec)
            options.say(
                f"sandbox {sandbox_id} started (container {detached.short_id}); "
                "serve it with: broker serve"
            )
            return 0
        start = partial(runtime.start, spec)
    life = _Life(runtime, partial(_serving, config, checked, sandbox_id, options), fresh)
    starting = threading.Thread(target=life.serve, name="broker-serving-start", daemon=True)
    starting.start()  # a broker is built, if at all, while the engine runs the container
    try:
        code = _attached(start, sandbox_id, image, options, life)
    finally:
        life.exited()
        starting.join()
        if life.failure is None:
            life.finish()
    if life.failure is not None:
        raise life.failure
    options.say(summary(config, sandbox_id, code, asked=life.engaged or not fresh))
    return code


def _take_warm(config: Config, options: RunOptions, runtime: Runtime, image: str) -> Warm | None:
    """A pooled sandbox ([sandbox] warm = N, kept by `broker serve`) made as this run
    would make its own; never for a detached, named or workspace run (their container
    or mounts are fixed at creation)."""
    if options.detach or options.name is not None or options.workspace is not None:
        return None  # (an adopted run is named)
    if not config.sandbox.get("warm", 0):
        return None  # no pool: its module is not even imported
    from broker.hosting.warm import take

    return take(config, runtime.name, runtime=runtime, image=image)


def _adopted(runtime: Runtime, container_id: str, sandbox_id: str) -> Handle:
    handle = runtime.get(container_id)
    if handle is None:
        raise SandboxError(f"sandbox {sandbox_id}: its container has gone")
    return handle


def cold_spec(
    config: Config, options: RunOptions, runtime: Runtime, sandbox_id: str, image: str
) -> SandboxSpec:
    """A new sandbox's dirs and spec, the built-in image built first when missing."""
    if image == images.DEFAULT_IMAGE:
        runtime.ensure_image(image, log=options.say)
    paths = prepare_dirs(config.state_dir, sandbox_id, runtime.agent_uid())
    return sandbox_spec(
        paths,
        image,
        options.command,
        limits=limits_from(config),
        env=extra_env(config),
        workspace=options.workspace,
        name=f"broker-{sandbox_id}",
    )


def _serving(config: Config, checked: Checked, sandbox_id: str, options: RunOptions) -> Serving:
    """The run's serving side, made on its own thread: what it imports (the control
    client, the ownership, logging) is imported there while the engine works."""
    if options.prepare is not None:
        options.prepare()
    from broker.hosting.serving import Serving

    return Serving(
        config,
        checked,
        sandbox_id,
        on_broker=options.on_broker,
        on_pending=options.on_pending,
        notifier=options.notifier,
        say=options.say,
    )


class _Life:
    """One run's container and its serving side, made and started beside it: a start
    that fails ends the container (nothing would answer what it writes), whichever of
    the two comes first."""

    def __init__(self, runtime: Runtime, make: Callable[[], Serving], fresh: bool) -> None:
        self.runtime = runtime
        self.failure: BaseException | None = None
        self._make = make
        self._fresh = fresh  # nothing of it in the ledger: a broker is built when it writes
        self._serving: Serving | None = None
        self._made = threading.Event()
        self._container: Handle | None = None
        self._lock = threading.Lock()

    def serve(self) -> None:
        try:
            self._serving = self._make()
            self._made.set()
            self._serving.start(when_written=self._fresh)
        except BaseException as exc:
            with self._lock:
                self.failure = exc
                container = self._container
            if container is not None:
                self.runtime.remove(container)  # its wait returns; the run raises `exc`
        finally:
            self._made.set()

    def started(self, container: Handle) -> None:
        with self._lock:
            self._container = container
            failure = self.failure
        if failure is not None:
            raise failure

    def exited(self) -> None:
        """The container's processes are gone (Serving.exited), once the side is made."""
        self._made.wait()
        if self._serving is not None:
            self._serving.exited()

    def finish(self) -> None:
        if self._serving is not None:
            self._serving.finish()

    @property
    def engaged(self) -> bool:
        """Whether anything (the owner, or this process) served the sandbox."""
        return self._serving is not None and self._serving.engaged


def _attached(
    start: Callable[[], Handle],
    sandbox_id: str,
    image: str,
    options: RunOptions,
    life: _Life,
) -> int:
    """Run the container to its end, its output streamed; it is removed in every case.
    `life` is told as soon as its processes are gone (nothing more can be written
    into its outbox), so the serving side winds down while its output ends and the
    engine removes it."""
    container: Handle | None = None
    runtime = life.runtime
    try:
        container = start()
        life.started(container)
        options.say(f"sandbox {sandbox_id}: running {' '.join(options.command)} in {image}")
        output = threading.Thread(
            target=stream_logs, args=(container, options.say), name="sandbox-logs", daemon=True
        )
        output.start()
        outcome = container.wait()
        life.exited()
        output.join(5)
        return int(outcome.get("StatusCode", 1))
    finally:
        if container is not None:
            runtime.remove(container)


def summary(config: Config, sandbox_id: str, code: int, *, asked: bool = True) -> str:
    """What the sandbox's requests came to; `asked` False: it never wrote one."""
    counts: dict[str, int] = {}
    if asked:
        from broker.fleet import qualify
        from broker.store.factory import open_store

        ledger = open_store(config)
        try:
            counts = ledger.counts(qualify(ledger.host, sandbox_id))
        finally:
            ledger.close()
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no requests"
    return f"sandbox {sandbox_id} exited with {code}: {parts}"


def stream_logs(container: Any, say: Callable[[str], None]) -> None:
    """The agent's output, line by line, neutralised: it is untrusted text."""
    from broker.untrusted import neutralize

    pending = b""
    try:
        for chunk in container.logs(stream=True, follow=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                say("  │ " + neutralize(line.decode("utf-8", "replace")))
    except Exception:  # the agent's output is a courtesy; the run goes on
        import logging

        logging.getLogger("broker.run").debug("log stream ended", exc_info=True)
    if pending:
        say("  │ " + neutralize(pending.decode("utf-8", "replace")))
