"""How `broker serve` starts (`broker run` starts from the same broker.cli.assembly on
a light path of its own: broker.cli.run).

    with daemon(args) as d:                  # logging, config, registry, policy, notifier
        ...                                  # the command's own checks; build what serves
        d.observe(broker)                    # the request log, metrics, traces
        d.start(wake=broker.wake, banner=…)  # signals, the web inbox, metrics, what serves
        ...                                  # serve until stopped
                                             # leaving: the web inbox stops, traces flush

Every fault on the way is one line on stderr and exit 2, before anything is served.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from broker.cli.assembly import HELP, install_logging, notifier_for, on_signals
from broker.cli.common import assemble, err, fail, guarded
from broker.config import Config
from broker.masking import mask_logs
from broker.observability.logformat import FORMATS
from broker.observability.telemetry import Telemetry
from broker.policy.ruleset import Policy
from broker.registry import Registry

if TYPE_CHECKING:
    from broker.approval.notify import Notifier
    from broker.loop.pipeline import Broker
    from broker.web.server import WebServer

ListenOpt = Annotated[
    str | None,
    typer.Option(help=HELP["listen"]),
]
InsecureOpt = Annotated[bool, typer.Option("--insecure-listen", help=HELP["insecure_listen"])]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help=HELP["verbose"])]
LogFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        metavar="text|json",
        help=HELP["log_format"],
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
        banner: str | None = None,
    ) -> None:
        """Take SIGINT and SIGTERM (they set `stop` and call `wake`), start the web inbox
        when asked for, say what serves."""
        on_signals(self.stop, wake, interrupt=False)
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
def daemon(args: DaemonArgs) -> Iterator[Daemon]:
    """Logging (INFO, DEBUG with --verbose), the config, registry, policy and notifier;
    on the way out, the web inbox stops."""
    if args.log_format not in (None, *FORMATS):
        fail(f"--log-format {args.log_format!r}: expected text or json")
    cfg, registry, pol = assemble(args.config, args.state, args.policy)
    install_logging(args.verbose, False, args.log_format or cfg.log_format)
    mask_logs(cfg.secret_values())  # no secret in any log line, from the web or a notifier
    d = Daemon(args, cfg, registry, pol, guarded(lambda: notifier_for(cfg)))
    d.telemetry = guarded(lambda: Telemetry.from_config(cfg, registry))
    try:
        yield d
    finally:
        if d.web is not None:
            d.web.stop()
        d.telemetry.close()


def _start_web(d: Daemon) -> WebServer | None:
    if not (d.args.listen or d.cfg.web):
        return None  # no inbox asked for: fastapi and uvicorn are not even imported
    from broker.web.server import start_web

    metrics = d.telemetry.web_metrics if d.telemetry is not None else None
    return start_web(
        d.cfg, d.registry, d.args.listen, insecure=d.args.insecure_listen, metrics=metrics
    )
