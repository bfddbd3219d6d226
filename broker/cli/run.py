"""`broker run -- CMD ARGS`: one sandbox, served until it exits, on a path of its own.

Every agent run pays for this command's start before its first line, so it parses
with argparse and imports neither typer, rich nor docker-py (the engine's API is a
few calls: broker.hosting.runtimes.engine). It starts like `broker serve` all the
same (broker.cli.assembly): the same fault is the same one line, exit 2, before a
sandbox exists. The pipeline is imported and the broker built on a thread of their
own while the engine creates and starts the container (broker.hosting.runner).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from broker.cli.assembly import HELP, on_signals
from broker.errors import BrokerError
from broker.untrusted import neutralize

if TYPE_CHECKING:
    from broker.cli.assembly import Checked
    from broker.cli.prompt import Prompt
    from broker.cli.run_client import Left
    from broker.config import Config
    from broker.loop.pipeline import Broker
    from broker.models import Record
    from broker.observability.telemetry import Telemetry
    from broker.registry import Registry
    from broker.web.server import WebServer

__all__ = ["main", "parser"]

DESCRIPTION = (
    "Run CMD in a new sandbox and serve its outbox until it exits: broker run -- CMD ARGS."
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as every other command's
        fail(f"{message} (see: broker run --help)")


class _Formatter(argparse.HelpFormatter):
    """argparse's own, told the terminal's width: left to find it, it imports shutil
    (and with it bz2 and lzma, ~2 ms) for every option added, help or not."""

    def __init__(self, prog: str) -> None:
        try:
            width = int(os.environ.get("COLUMNS", "")) or os.get_terminal_size(1).columns
        except (ValueError, OSError):
            width = 80
        super().__init__(prog, width=width - 2)


def parser() -> argparse.ArgumentParser:
    """`broker run`'s options, as `broker serve` names the ones they share."""
    p = _Parser(
        prog="broker run",
        usage="broker run [OPTIONS] -- CMD [ARGS]...",
        description=DESCRIPTION,
        formatter_class=_Formatter,
    )
    p.add_argument("--image", help="the agent image (default: built-in)")
    p.add_argument("--name", help="the sandbox id (default: random)")
    p.add_argument("--workspace", type=Path, help=HELP["workspace"])
    p.add_argument(
        "--detach",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="start and leave it to `broker serve`",
    )
    p.add_argument("--runtime", help="docker or podman (default: [sandbox] runtime, else docker)")
    p.add_argument("--config", type=Path, help=HELP["config"])
    p.add_argument("--state", type=Path, help=HELP["state"])
    p.add_argument("--policy", type=Path, help=HELP["policy"])
    p.add_argument("--listen", metavar="HOST:PORT", help=HELP["listen"])
    p.add_argument("--insecure-listen", action="store_true", help=HELP["insecure_listen"])
    p.add_argument("-v", "--verbose", action="store_true", help=HELP["verbose"])
    p.add_argument("--log-format", metavar="text|json", help=HELP["log_format"])
    p.add_argument("command", nargs=argparse.REMAINDER, help="what runs in the sandbox")
    return p


def say(text: str) -> None:
    """A line on stderr, neutralised: much of what `run` says comes from the sandbox."""
    sys.stderr.write(neutralize(text) + "\n")
    sys.stderr.flush()


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit `code` (the line `broker serve` gives)."""
    say(f"error: {message}")
    raise SystemExit(code)


def main(argv: Sequence[str]) -> int:
    """`broker run`'s whole life; its exit code is the sandbox's (130 on Ctrl-C)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before the sandbox exists; after, _run says more
        say("interrupted")
        return 130


def _main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        fail("give the command to run after --, e.g. broker run -- python3 agent.py")
    if args.log_format not in (None, "text", "json"):
        fail(f"--log-format {args.log_format!r}: expected text or json")
    if args.workspace is not None and not args.workspace.is_dir():
        fail(f"--workspace {args.workspace}: not a directory")
    try:
        return _run(args, command)
    except BrokerError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))


def _run(args: argparse.Namespace, command: list[str]) -> int:
    from broker.inputs import locate

    located = locate(args.config, args.state, args.policy)
    left = None
    if _handable(args):  # a serving broker that checked the same inputs runs it
        from broker.cli.run_client import through_owner

        on_signals(threading.Event(), None, interrupt=True)  # SIGTERM too: the owner stops it
        asking = partial(_owner_prompt, args) if sys.stdin.isatty() else None
        try:
            handed = through_owner(located, command, args.image, args.runtime, say, asking)
        except KeyboardInterrupt:
            say("interrupted: the sandbox was removed")
            return 130
        if isinstance(handed, int):
            return handed
        left = handed
    return _run_here(args, command, left)


def _handable(args: argparse.Namespace) -> bool:
    """Whether a serving broker may run it: none of what only this process can do (a
    named, workspace or detached sandbox; an inbox of its own)."""
    return not (args.name or args.workspace or args.detach or args.listen)


def _owner_prompt(args: argparse.Namespace) -> Prompt:
    """The terminal's prompt for what the owner's sandbox waits on (loaded then only)."""
    from broker.cli.assembly import check
    from broker.config import load_config

    cfg = load_config(args.config, state_dir=args.state, policy=args.policy)
    return _prompt(*check(cfg)[:2])


def _run_here(args: argparse.Namespace, command: list[str], left: Left | None) -> int:
    """The run in this process: checked as `broker serve` checks (or, inputs that
    passed before, when a broker is first built: broker.cli.passed), then served here
    or by the serving broker (broker.hosting.runner); `left`: the container to adopt."""
    from broker.cli.assembly import notifier_for
    from broker.config import load_config
    from broker.hosting.runner import RunOptions, run

    cfg = load_config(args.config, state_dir=args.state, policy=args.policy)
    logs = partial(_logs, cfg, args.verbose, args.log_format or cfg.log_format)
    extras = args.listen or cfg.web or cfg.metrics is not None or cfg.tracing is not None
    early = bool(extras or args.verbose)
    if early:
        logs()
    checked, warnings = _checked(cfg, remembered=not extras, before=None if early else logs)
    for warning in warnings:
        say(f"warning: {warning}")
    prompt = _Prompting(checked) if sys.stdin.isatty() and not args.detach else None
    options = RunOptions(
        command=command,
        image=args.image,
        name=left.sandbox_id if left else args.name,
        adopt=left.container_id if left else None,
        workspace=args.workspace.absolute() if args.workspace else None,
        detach=args.detach,
        on_pending=prompt,
        notifier=notifier_for(cfg),
        runtime=args.runtime,
        say=say,
        on_broker=_pr_threads(cfg),
        prepare=None if early or checked.done else logs,
    )
    on_signals(threading.Event(), None, interrupt=True)
    if left is not None:
        say(f"broker: the serving broker went away; serving {left.sandbox_id} here")
    telemetry, web = _observed(cfg, checked, args) if extras else (None, None)
    try:
        return run(cfg, checked.get, options)
    except KeyboardInterrupt:
        say("interrupted: the sandbox was removed")
        return 130
    finally:
        if prompt is not None:
            prompt.close()
        if web is not None:
            web.stop()
        if telemetry is not None:
            telemetry.close()


def _checked(
    cfg: Config, *, remembered: bool, before: Callable[[], None] | None
) -> tuple[Checked, list[str]]:
    """The config checked now, or, `remembered` and its inputs known to pass, when a
    broker is first built (a fault then forgets the pass); and the check's warnings.
    `before`, if given, is called before a check made now (which may log)."""
    from broker.cli.assembly import Checked, check
    from broker.cli.passed import forget, passed_before, remember

    warnings = passed_before(cfg) if remembered else None
    if warnings is not None:
        return Checked(cfg, on_fault=partial(forget, cfg)), warnings
    if before is not None:
        before()
    cfg, registry, policy, warnings = check(cfg)
    remember(cfg, warnings)
    return Checked(cfg, (registry, policy)), warnings


def _logs(cfg: Config, verbose: bool, fmt: str) -> None:
    """The run's log format and level, and its secrets masked in every log line (from the
    web, a notifier, a broker built later). Installed once, before anything may log:
    here when this thread may (a check made now, the inbox, --verbose), else on the
    serving thread while the engine starts the container (logging's imports: ~5 ms)."""
    from broker.cli.assembly import install_logging

    install_logging(verbose, True, fmt)
    if secrets := cfg.secret_values():
        from broker.masking import mask_logs

        mask_logs(secrets)


class _Prompting:
    """The terminal's prompt, built when a request first waits (rich, the registry and
    the policy are loaded for a person only)."""

    def __init__(self, checked: Checked) -> None:
        self.checked = checked
        self.prompt: Prompt | None = None

    def __call__(self, record: Record) -> None:
        if self.prompt is None:
            self.prompt = _prompt(self.checked.cfg, self.checked.get()[0])
        self.prompt(record)

    def close(self) -> None:
        if self.prompt is not None:
            self.prompt.close()


def _observed(
    cfg: Config, checked: Checked, args: argparse.Namespace
) -> tuple[Telemetry, WebServer | None]:
    """[metrics], [tracing] and the inbox, started (the config was checked first)."""
    from broker.observability.telemetry import Telemetry

    registry = checked.get()[0]
    telemetry = Telemetry.from_config(cfg, registry)
    web = _web(cfg, registry, args, telemetry)
    for line in telemetry.start(insecure=args.insecure_listen):
        say(line)
    return telemetry, web


def _prompt(cfg: Config, registry: Registry) -> Prompt:
    """The terminal's prompt about what waits (rich is imported for a person only)."""
    from broker.cli.prompt import Prompt

    return Prompt(cfg, registry)


def _pr_threads(cfg: Config) -> Callable[[Broker], Callable[[], None] | None]:
    """GitHub's threads when approve_in_pr is set, imported on the serving thread."""

    def attach(broker: Broker) -> Callable[[], None] | None:
        from broker.integrations.github_cards import on_broker

        return on_broker(cfg)(broker)

    return attach


def _web(
    cfg: Config, registry: Registry, args: argparse.Namespace, telemetry: Telemetry
) -> WebServer | None:
    if not (args.listen or cfg.web):
        return None  # no inbox asked for: fastapi and uvicorn are not even imported
    from broker.web.server import start_web

    server = start_web(
        cfg,
        registry,
        args.listen,
        insecure=args.insecure_listen,
        metrics=telemetry.web_metrics,
    )
    if server is not None:
        say(f"broker: web inbox on {server.url}")
    return server
