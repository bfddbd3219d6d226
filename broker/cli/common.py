"""What every command shares: the consoles, one-line errors, the common options, and
loading the config, registry, policy, ledger and the person's name.

Light on purpose: nothing here imports the pipeline, the web app or a handler's library.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console

from broker.cli.assembly import HELP
from broker.config import Config, load_config
from broker.errors import BrokerError
from broker.policy.ruleset import Policy
from broker.registry import Registry
from broker.untrusted import terminal

if TYPE_CHECKING:
    from broker.store.base import Store

# no emoji codes: an agent's ":white_check_mark: approved" must print as written
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

ConfigOpt = Annotated[Path | None, typer.Option("--config", help=HELP["config"])]
StateOpt = Annotated[Path | None, typer.Option("--state", help=HELP["state"])]
PolicyOpt = Annotated[Path | None, typer.Option("--policy", help=HELP["policy"])]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]

T = TypeVar("T")


def print_json(data: Any) -> None:
    """JSON for scripts: ASCII only, so no control or bidi character reaches a terminal."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit `code`."""
    err.print(f"[bold red]error:[/] {terminal(message)}")
    raise typer.Exit(code)


def guarded(fn: Callable[[], T]) -> T:
    """Run `fn`; a BrokerError or OSError becomes one line on stderr and exit 2."""
    try:
        return fn()
    except BrokerError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))


def config_only(config: Path | None, state: Path | None) -> Config:
    """broker.toml alone, for the commands that read the state dir."""
    return guarded(lambda: load_config(config, state_dir=state))


def assemble(
    config: Path | None, state: Path | None, policy: Path | None
) -> tuple[Config, Registry, Policy]:
    """The config, the registry checked against it, and the policy; or one line."""

    from broker.cli.assembly import assemble as load

    cfg, registry, pol, warnings = guarded(lambda: load(config, state, policy))
    for warning in warnings:
        err.print(f"[yellow]warning:[/] {terminal(warning)}")
    return cfg, registry, pol


def open_ledger(cfg: Config) -> Store:
    """The configured store; one line when it does not answer, or when no broker has
    made a SQLite ledger in the state dir yet."""
    from broker.store.factory import open_store, store_exists

    if not store_exists(cfg):
        fail(
            f"no broker has used the state dir {cfg.state_dir} yet (it has no "
            f"{cfg.ledger_path.name}); name the right one with --state or --config, "
            "or set BROKER_CONFIG"
        )
    return guarded(lambda: open_store(cfg))


def identity(as_: str | None, cfg: Config) -> str:
    """Who decides: the account of the effective uid (the password database, never
    $USER), or the approver whose `os_user` it is, or `--as NAME` where the host allows
    it; normalised (broker.identity)."""
    from broker.identity import approver_name, os_user
    from broker.people import People

    if as_ is not None:
        if not cfg.allow_as:
            fail("--as is not allowed on this host (set allow_as = true under [broker])")
        return guarded(lambda: approver_name(as_))
    account = guarded(os_user)
    return guarded(lambda: People.of(cfg.approvers).of_os_user(account))


def age(seconds: float | None) -> str:
    """A duration as people read it in a table: 42s, 3m07s, 2h05m."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
