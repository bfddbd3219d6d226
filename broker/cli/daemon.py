"""The one start of the commands that serve, `broker serve` and `broker run`.

    with daemon(args) as d:                  # logging, config, registry, policy, notifier
        ...                                  # the command's own checks; build what serves
        d.observe(broker)                    # the request log, metrics, traces
        d.start(wake=broker.wake, banner=…)  # signals, the web inbox, metrics, what serves
        ...                                  # serve until stopped
                                             # leaving: the web inbox stops, traces flush

Every fault on the way is one line on stderr and exit 2, before anything is served.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.cli.common import assemble, err, fail, guarded
from broker.config import Config
from broker.masking import mask_logs
from broker.observability.logformat import FORMATS, install
from broker.observability.telemetry import Telemetry
from broker.policy.ruleset import Policy
from broker.registry import Registry

if TYPE_CHECKING:
    from broker.approval.notify import Notifier
    from broker.loop.pipeline import Broker
    from broker.web.server import WebServer

ListenOpt = Annotated[
    str | None,
    typer.Option(help="also serve the web inbox and /api/v1 on HOST:PORT (e.g. 127.0.0.1:8700)"),
]
InsecureOpt = Annotated[
    bool, typer.Option("--insecure-listen", help="allow --listen beyond loopback without TLS")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="log DEBUG lines too")]
LogFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        metavar="text|json",
        help="the log's form: text lines, or one JSON object per line "
        "(default: [broker] log_format, else text)",
    ),
]


@dataclass(frozen=True, kw_only=True)
class DaemonArgs:
    """The options `serve` and `run` share."""

    config: Path | None
    state: Path | None
    policy: Path | None
    listen: str | None
    insecure_listen: bool
    verbose: bool
    log_format: str | None = None


@dataclass
class Daemon:
    """What a serving command runs with; `stop` is set by SIGINT or SIGTERM."""

    args: DaemonArgs
    cfg: Config
    registry: Registry
    policy: Policy
    notifier: Notifier | None
    stop: threading.Event = field(default_factory=threading.Event)
    web: WebServer | None = None

    telemetry: Telemetry | None = None

    def observe(self, broker: Broker) -> None:
        """Log each request event of `broker` (`broker.requests`, INFO); keep its metrics
        and traces when broker.toml asks for them."""
        if self.telemetry is not None:
            self.telemetry.attach(broker)

    def start(
        self,
        *,
        wake: Callable[[], None] | None = None,
        interrupt: bool = False,
        banner: str | None = None,
    ) -> None:
        """Take SIGINT and SIGTERM, start the web inbox when asked for, say what serves.

        A signal sets `stop` and calls `wake`; with `interrupt` it also raises
        KeyboardInterrupt in the main thread, for a command whose main thread waits on
        something other than `stop` (`run` waits on its container).
        """
        _on_signals(self.stop, wake, interrupt)
        self.web = guarded(lambda: _start_web(self))
        told: list[str] = []
        telemetry, insecure = self.telemetry, self.args.insecure_listen
        if telemetry is not None:
            told = guarded(lambda: telemetry.start(insecure=insecure))  # the metrics port
        if banner is not None:
            err.print(banner)
        if self.web is not None:
            err.print(f"broker: web inbox on {self.web.url}")
        for line in told:
            err.print(line)


@contextmanager
def daemon(args: DaemonArgs, *, quiet: bool = False) -> Iterator[Daemon]:
    """Logging (warnings only when `quiet`, unless --verbose), the config, registry,
    policy and notifier; on the way out, the web inbox stops."""
    if args.log_format not in (None, *FORMATS):
        fail(f"--log-format {args.log_format!r}: expected text or json")
    cfg, registry, pol = assemble(args.config, args.state, args.policy)
    _logging(args.verbose, quiet, args.log_format or cfg.log_format)
    mask_logs(cfg.secret_values())  # no secret in any log line, from the web or a notifier
    d = Daemon(args, cfg, registry, pol, guarded(lambda: notifier_for(cfg)))
    d.telemetry = guarded(lambda: Telemetry.from_config(cfg, registry))
    try:
        yield d
    finally:
        if d.web is not None:
            d.web.stop()
        d.telemetry.close()


def notifier_for(cfg: Config) -> Notifier | None:
    """What [notify] asks for (webhooks, Slack); None when it asks for nothing."""
    from broker.approval.notify import notifier_from

    return notifier_from(cfg)


def _start_web(d: Daemon) -> WebServer | None:
    if not (d.args.listen or d.cfg.web):
        return None  # no inbox asked for: fastapi and uvicorn are not even imported
    from broker.web.server import start_web

    metrics = d.telemetry.web_metrics if d.telemetry is not None else None
    return start_web(
        d.cfg, d.registry, d.args.listen, insecure=d.args.insecure_listen, metrics=metrics
    )


def _logging(verbose: bool, quiet: bool, fmt: str) -> None:
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    install(fmt, level)


def _on_signals(stop: threading.Event, wake: Callable[[], None] | None, interrupt: bool) -> None:
    def handler(signum: int, frame: Any) -> None:
        stop.set()
        if wake is not None:
            wake()
        if interrupt:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
