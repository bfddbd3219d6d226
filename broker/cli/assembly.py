"""What the serving commands load before they serve, free of typer and rich.

`broker serve` (through broker.cli.daemon) and `broker run` (broker.cli.run, on its
own light path) start from here, so the same fault stops both with the same line:
the config, the registry checked against it, the policy, the notifier; logging, and
the signals that stop them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `broker run` beside an owner takes HELP alone: no config's validation
    from broker.approval.notify import Notifier
    from broker.config import Config
    from broker.policy.ruleset import Policy
    from broker.registry import Registry

__all__ = [
    "HELP",
    "Checked",
    "assemble",
    "check",
    "install_logging",
    "notifier_for",
    "on_signals",
]

HELP = {
    "config": "broker.toml (default: $BROKER_CONFIG, else <state>/broker.toml)",
    "state": "the state dir (ledger, audit log)",
    "policy": "the policy file (TOML)",
    "listen": "also serve the web inbox and /api/v1 on HOST:PORT (e.g. 127.0.0.1:8700)",
    "insecure_listen": "allow --listen beyond loopback without TLS",
    "verbose": "log DEBUG lines too",
    "log_format": "the log's form: text lines, or one JSON object per line "
    "(default: [broker] log_format, else text)",
    "workspace": "a directory mounted read-write at /workspace",
}
"""The help of the options the serving commands share, typer's and argparse's alike."""


def assemble(
    config: Path | None, state: Path | None, policy: Path | None
) -> tuple[Config, Registry, Policy, list[str]]:
    """The config, the registry checked against it, the policy and its warnings;
    a BrokerError names the first fault."""
    from broker.config import load_config

    return check(load_config(config, state_dir=state, policy=policy))


def check(cfg: Config) -> tuple[Config, Registry, Policy, list[str]]:
    """`assemble` of a config already loaded."""
    from broker.audit.checkpoints import audit_settings
    from broker.policy.ruleset import load_policy
    from broker.registry import default_registry

    audit_settings(cfg)  # a broken [audit] stops the start, naming the key
    registry = default_registry()
    registry.check_config(cfg.integrations, cfg.base_dir)
    cfg.staged.check(registry.names())  # a glob naming no effect would stage nothing
    pol = load_policy(cfg.policy_path, registry.reversibility(), registry.schemas())
    return cfg, registry, pol, [f"{pol.source}: {warning}" for warning in pol.warnings]


class Checked:
    """A config's registry and policy, its start-up check passed: checked already, or
    (inputs a check passed before: broker.cli.passed) checked when first asked for,
    which is when a broker is built; a fault then is the check's BrokerError."""

    def __init__(
        self,
        cfg: Config,
        done: tuple[Registry, Policy] | None = None,
        on_fault: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self._done = done
        self._on_fault = on_fault  # a check put off failed: e.g. forget that it passed
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        """Whether the check has been made (now, or when a broker was built)."""
        return self._done is not None

    def get(self) -> tuple[Registry, Policy]:
        with self._lock:
            if self._done is None:
                try:
                    _, registry, policy, _ = check(self.cfg)
                except BaseException:
                    if self._on_fault is not None:
                        self._on_fault()
                    raise
                self._done = registry, policy
            return self._done


def notifier_for(cfg: Config) -> Notifier | None:
    """What [notify] asks for (webhooks, Slack); None when it asks for nothing."""
    if cfg.notify == {}:  # nothing to tell anyone: not even the notifier's modules
        return None
    from broker.approval.notify import notifier_from

    return notifier_from(cfg)


def install_logging(verbose: bool, quiet: bool, fmt: str) -> None:
    """DEBUG with --verbose; else WARNING when `quiet` (run), INFO (serve)."""
    import logging

    from broker.observability.logformat import install

    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    install(fmt, level)


def on_signals(stop: threading.Event, wake: Callable[[], None] | None, interrupt: bool) -> None:
    """SIGINT and SIGTERM set `stop` and call `wake`; with `interrupt` they also raise
    KeyboardInterrupt in the main thread (for one that waits on something else)."""

    def handler(signum: int, frame: Any) -> None:
        stop.set()
        if wake is not None:
            wake()
        if interrupt:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
