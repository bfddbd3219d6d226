"""A sandbox's directories, served: by the broker already serving the state dir, or by
one run here (in a thread, as `broker run` does) for as long as the sandbox lives.

The proof that a sandbox is served is its effect catalogue: a broker publishes
``.effects.json`` into a results dir as soon as it serves it.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker import sandbox, serving
from broker.catalogue import CATALOGUE_NAME
from broker.config import Config
from broker.errors import SandboxError

__all__ = ["PICKUP_S", "Served", "serve", "served_by_running"]

PICKUP_S = 30.0
"""How long a running broker may take to pick up a new sandbox before we say so."""
log = logging.getLogger("broker.integrations")


@dataclass
class Served:
    """A sandbox's directories and, when we run it, the broker serving them."""

    config: Config
    paths: sandbox.SandboxPaths
    _stop: threading.Event | None = None
    _thread: threading.Thread | None = None
    _web: Any = None
    _broker: Any = None
    _failure: list[BaseException] = field(default_factory=list)

    @property
    def own_broker(self) -> bool:
        """True when this process runs the broker (False: a running one serves it)."""
        return self._thread is not None

    def close(self) -> None:
        """Stop our broker, if we run one, after it has drained the outbox."""
        if self._stop is None or self._thread is None:
            return
        self._stop.set()
        if self._broker is not None:
            self._broker.wake()
        if self._web is not None:
            self._web.stop()
        self._thread.join(120)
        self._thread = None


def serve(config: Config, sandbox_id: str) -> Served:
    """Make `sandbox_id`'s directories and see that a broker serves them."""
    if serving.served(config.state_dir):
        return served_by_running(config, sandbox_id)
    paths = sandbox.prepare_dirs(config.state_dir, sandbox_id)
    return _own_broker(config, paths)


def served_by_running(config: Config, sandbox_id: str, wait: float = PICKUP_S) -> Served:
    """File `sandbox_id` into the broker serving the state dir; wait until it serves it."""
    final = config.sandboxes_dir / sandbox_id
    if final.exists():
        paths = sandbox.prepare_dirs(config.state_dir, sandbox_id)
    else:
        paths = _staged(config, sandbox_id)
    if not _await_catalogue(paths.results, wait):
        raise SandboxError(
            f"a broker serves {config.state_dir} but has not picked up sandbox {sandbox_id} "
            f"within {wait:g}s; it must serve the sandboxes root: `broker serve` "
            "(or `broker serve --root`) on that state dir"
        )
    return Served(config, paths)


def _staged(config: Config, sandbox_id: str) -> sandbox.SandboxPaths:
    """Create the dirs out of sight, then rename them into place: a watching broker
    sees one complete sandbox appear (never a sandbox dir without its outbox yet)."""
    staging = config.sandboxes_dir / f".new-{secrets.token_hex(4)}"
    try:
        made = sandbox.prepare_dirs(staging, sandbox_id)
        try:
            os.rename(made.root, config.sandboxes_dir / sandbox_id)
        except OSError as exc:
            raise SandboxError(f"cannot create sandbox {sandbox_id}: {exc.strerror}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sandbox.prepare_dirs(config.state_dir, sandbox_id)


def _await_catalogue(results: Path, wait: float) -> bool:
    from watchfiles import watch

    target = results / CATALOGUE_NAME
    if target.exists():
        return True
    stop = threading.Event()
    end = time.monotonic() + wait
    for _ in watch(
        results,
        stop_event=stop,
        recursive=False,
        rust_timeout=500,
        yield_on_timeout=True,
        debounce=10,
        raise_interrupt=False,
    ):
        if target.exists():
            return True
        if time.monotonic() >= end:
            return False
    return target.exists()


def _own_broker(config: Config, paths: sandbox.SandboxPaths) -> Served:
    """Serve this one sandbox from a thread, with the host's registry, policy and
    notifications (and the web inbox, when [web] listen says so)."""
    from broker.notify import Notifier, webhooks_from
    from broker.outbox import from_layout
    from broker.pipeline import Broker
    from broker.policy import load_policy
    from broker.registry import default_registry
    from broker.web.server import start_web

    registry = default_registry()
    registry.check_config(config.integrations)
    policy = load_policy(config.policy_path, registry.reversibility())
    broker = Broker(config, registry, policy)
    broker.add(from_layout(config.sandboxes_dir, paths.sandbox_id))
    hooks = webhooks_from(config.notify)
    if hooks:
        broker.notify_with(Notifier(hooks, inbox_url=config.notify.get("inbox_url")))
    served = Served(config, paths, threading.Event(), _broker=broker)
    ready = threading.Event()
    stop = served._stop
    assert stop is not None

    def run() -> None:
        try:
            broker.serve(stop, ready=ready.set, drain=True)
        except BaseException as exc:  # surfaced by the caller's next look
            log.exception("the broker serving sandbox %s stopped", paths.sandbox_id)
            served._failure.append(exc)
            ready.set()

    served._thread = threading.Thread(target=run, name=f"broker-{paths.sandbox_id}", daemon=True)
    served._thread.start()
    ready.wait(60)
    if served._failure:
        raise SandboxError(f"the broker could not start: {served._failure[0]}")
    served._web = start_web(config, registry, None)
    return served
