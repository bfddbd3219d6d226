"""A sandbox's directories, served: by the broker already serving the state dir, or by
one run here (in a thread, as `broker run` does) for as long as the sandbox lives.

A running broker is told through its control socket (broker.loop.ownership); it answers
once it serves the sandbox, its effect catalogue published.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from broker.config import Config
from broker.errors import BrokerError, SandboxError
from broker.hosting import sandbox
from broker.loop import lockfile

__all__ = ["Served", "serve", "served_by_running"]

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
    _client: Any = None  # the control connection to the owner, when it serves us
    _cards: Any = None  # the GitHub threads' observer (broker.integrations.github_cards)

    @property
    def own_broker(self) -> bool:
        """True when this process runs the broker (False: a running one serves it)."""
        return self._thread is not None

    def detach(self) -> Served:
        """Leave the sandbox to the broker that serves it, for good (no release)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        return self

    def close(self) -> None:
        """Stop our broker, if we run one, after it has drained the outbox; else release
        the sandbox to the broker that serves it, once it has processed what is left."""
        if self._client is not None:
            try:
                self._client.release()
            except BrokerError as exc:
                log.warning("sandbox %s: %s", self.paths.sandbox_id, exc)
            self._client.close()
            self._client = None
        if self._stop is None or self._thread is None:
            return
        self._stop.set()
        if self._broker is not None:
            self._broker.wake()
        if self._web is not None:
            self._web.stop()
        self._thread.join(120)
        self._thread = None
        if self._cards is not None:  # after the broker: its last observers have run
            self._cards.close()
            self._cards = None


def serve(config: Config, sandbox_id: str) -> Served:
    """Make `sandbox_id`'s directories and see that a broker serves them."""
    if lockfile.served(config.state_dir):
        return served_by_running(config, sandbox_id)
    paths = sandbox.prepare_dirs(config.state_dir, sandbox_id)
    return _own_broker(config, paths)


def served_by_running(config: Config, sandbox_id: str) -> Served:
    """Hand `sandbox_id` to the broker that owns the state dir (its control socket); it
    serves it from its answer on, and follows it until `close` releases it."""
    from broker.loop.control_client import connect

    paths = sandbox.prepare_dirs(config.state_dir, sandbox_id)
    client = connect(config.state_dir, on_pending=lambda request_id: None)
    if client is None:
        raise SandboxError(
            f"a broker owns {config.state_dir} but does not answer on its control socket"
        )
    try:
        client.serve(sandbox_id)
    except BrokerError as exc:
        client.close()
        raise SandboxError(f"the broker serving {config.state_dir}: {exc}") from exc
    return Served(config, paths, _client=client)


def _own_broker(config: Config, paths: sandbox.SandboxPaths) -> Served:
    """Serve this one sandbox from a thread, with the host's registry, policy and
    notifications (and the web inbox, when [web] listen says so)."""
    from broker.approval.notify import attach as attach_notifier
    from broker.intake.outbox import from_layout
    from broker.integrations.github_cards import attach_pr_cards
    from broker.loop.pipeline import Broker
    from broker.policy.ruleset import load_policy
    from broker.registry import default_registry
    from broker.web.server import start_web

    registry = default_registry()
    registry.check_config(config.integrations, config.base_dir)
    policy = load_policy(config.policy_path, registry.reversibility(), registry.schemas())
    broker = Broker(config, registry, policy)
    broker.add(from_layout(config.sandboxes_dir, paths.sandbox_id))
    attach_notifier(broker, config)
    cards = attach_pr_cards(broker, config)  # GitHub threads, when approve_in_pr is set
    served = Served(config, paths, threading.Event(), _broker=broker, _cards=cards)
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
