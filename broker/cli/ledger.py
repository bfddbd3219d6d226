"""`broker ledger migrate --to postgresql://…`: move this host's SQLite ledger into a new
PostgreSQL ledger shared by a fleet (broker/hosting/migrate.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from broker.cli.common import ConfigOpt, StateOpt, config_only, fail, guarded, out
from broker.untrusted import terminal

if TYPE_CHECKING:
    from broker.hosting.migrate import Migrated

app = typer.Typer(help="The ledger's own commands.", no_args_is_help=True)


@app.command("migrate")
def migrate(
    to: Annotated[str, typer.Option("--to", help="postgresql://user@host:port/dbname")],
    password_env: Annotated[
        str | None, typer.Option(help="the environment variable holding its password")
    ] = None,
    password_file: Annotated[Path | None, typer.Option(help="a file holding its password")] = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Copy the SQLite ledger and audit chain (hashes intact) into an empty PostgreSQL."""
    from broker.settings import resolve_secret

    cfg = config_only(config, state)
    if cfg.shared_ledger:
        fail("this configuration already names a PostgreSQL ledger: nothing to migrate")
    url = guarded(lambda: _checked(to))
    refs = dict(cfg.ledger_refs)
    if password_env or password_file:
        refs = {"ledger_password_env": password_env} if password_env else {}
        if password_file:
            refs["ledger_password_file"] = str(password_file.absolute())
    password = guarded(lambda: resolve_secret(refs, "ledger_password", "broker", cfg.base_dir))

    def run() -> Migrated:
        from broker.hosting.migrate import migrate as copy

        return copy(cfg, url, password)

    done = guarded(run)
    out.print(
        f"migrated {done.requests} request(s), {done.decisions} decision(s) and "
        f"{done.events} audit event(s) of host {terminal(done.host)} into {terminal(url)}"
    )
    out.print(f'now set ledger = "{terminal(url)}" (and its password reference) under [broker]')


def _checked(url: str) -> str:
    from broker.config import ledger_url

    checked = ledger_url({"ledger": url})
    assert checked is not None
    return checked
