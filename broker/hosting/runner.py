"""`broker run`: one sandbox, served from start to exit, then drained and removed.

The lifecycle only: the sandbox's outbox is served while the container runs (by the
broker that owns the state dir, else by one run here: broker.hosting.serving); when it exits,
what is left in the outbox is processed, a summary is printed and the container
removed (also on Ctrl-C and on errors).
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.config import Config
from broker.hosting import images
from broker.hosting.runtimes import open_runtime
from broker.hosting.runtimes.base import Handle, Runtime
from broker.hosting.runtimes.spec import SandboxLimits, SandboxSpec, prepare_dirs, sandbox_spec
from broker.hosting.serving import OnBroker, Serving

if TYPE_CHECKING:
    from broker.approval.notify import Notifier
    from broker.models import Record
    from broker.policy.ruleset import Policy
    from broker.registry import Registry

log = logging.getLogger("broker.run")


@dataclass
class RunOptions:
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


def new_sandbox_id(name: str | None) -> str:
    return name or f"sb-{secrets.token_hex(4)}"


def limits_from(config: Config) -> SandboxLimits:
    """[sandbox] pids, memory, cpus, tmpfs from broker.toml, over sane defaults."""
    section = config.sandbox
    base = SandboxLimits()
    cpus = section.get("cpus")
    return SandboxLimits(
        pids=int(section.get("pids", base.pids)),
        memory=str(section.get("memory", base.memory)),
        nano_cpus=int(float(cpus) * 1e9) if cpus is not None else base.nano_cpus,
        tmpfs_size=str(section.get("tmpfs", base.tmpfs_size)),
    )


def extra_env(config: Config) -> dict[str, str]:
    """Only what [sandbox] env explicitly lists: names whose values come from the host."""
    import os

    names = config.sandbox.get("env", [])
    return {name: os.environ[name] for name in names if name in os.environ}


def runtime_name(config: Config, chosen: str | None = None) -> str:
    """--runtime, else [sandbox] runtime, else docker."""
    return chosen or str(config.sandbox.get("runtime", "docker"))


def run(config: Config, registry: Registry, policy: Policy, options: RunOptions) -> int:
    """Start the sandbox, serve it until it exits, drain, summarise; return its exit code."""
    runtime = open_runtime(runtime_name(config, options.runtime))
    try:
        return _run(config, registry, policy, options, runtime)
    finally:
        runtime.close()


def _run(
    config: Config, registry: Registry, policy: Policy, options: RunOptions, runtime: Runtime
) -> int:
    image = options.image or str(config.sandbox.get("image", images.DEFAULT_IMAGE))
    if image == images.DEFAULT_IMAGE:
        runtime.ensure_image(image, log=options.say)
    sandbox_id = new_sandbox_id(options.name)
    fresh = not (config.sandboxes_dir / sandbox_id).exists()  # nothing of it in the ledger
    paths = prepare_dirs(config.state_dir, sandbox_id, runtime.agent_uid())
    spec = sandbox_spec(
        paths,
        image,
        options.command,
        limits=limits_from(config),
        env=extra_env(config),
        workspace=options.workspace,
        name=f"broker-{sandbox_id}",
    )
    if options.detach:
        detached = runtime.start(spec)
        options.say(
            f"sandbox {sandbox_id} started (container {detached.short_id}); "
            "serve it with: broker serve"
        )
        return 0
    serving = Serving(
        config,
        registry,
        policy,
        sandbox_id,
        on_broker=options.on_broker,
        on_pending=options.on_pending,
        notifier=options.notifier,
        say=options.say,
    )
    life = _Life(runtime)
    starting = threading.Thread(
        target=life.serve, args=(serving, fresh), name="broker-serving-start", daemon=True
    )
    starting.start()  # a broker is built, if at all, while the engine runs the container
    try:
        code = _attached(spec, runtime, options, life)
    finally:
        serving.exited()
        starting.join()
        if life.failure is None:
            serving.finish()
    if life.failure is not None:
        raise life.failure
    options.say(summary(config, sandbox_id, code, asked=serving.engaged or not fresh))
    return code


class _Life:
    """One run's container and the serving start beside it: a start that fails ends the
    container (nothing would answer what it writes), whichever of the two comes first."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.failure: BaseException | None = None
        self._container: Handle | None = None
        self._lock = threading.Lock()

    def serve(self, serving: Serving, fresh: bool) -> None:
        try:
            serving.start(when_written=fresh)
        except BaseException as exc:
            with self._lock:
                self.failure = exc
                container = self._container
            if container is not None:
                self.runtime.remove(container)  # its wait returns; the run raises `exc`

    def started(self, container: Handle) -> None:
        with self._lock:
            self._container = container
            failure = self.failure
        if failure is not None:
            raise failure


def _attached(spec: SandboxSpec, runtime: Runtime, options: RunOptions, life: _Life) -> int:
    """Run the container to its end, its output streamed; it is removed in every case."""
    container: Handle | None = None
    try:
        container = runtime.start(spec)
        life.started(container)
        options.say(
            f"sandbox {spec.sandbox_id}: running {' '.join(options.command)} in {spec.image}"
        )
        output = threading.Thread(
            target=_stream_logs, args=(container, options.say), name="sandbox-logs", daemon=True
        )
        output.start()
        outcome = container.wait()
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


def _stream_logs(container: Any, say: Callable[[str], None]) -> None:
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
        log.debug("log stream ended", exc_info=True)
    if pending:
        say("  │ " + neutralize(pending.decode("utf-8", "replace")))
