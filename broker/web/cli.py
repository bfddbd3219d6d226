"""`broker web …`: set up who may decide in the web inbox.

Mounted by broker.cli as `app.add_typer(web_app, name="web")`.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from broker.web.auth import APPROVER_NAME, config_lines, hash_token, new_token

app = typer.Typer(
    help="The web inbox (served by `broker serve --listen`): approvers' tokens.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def web() -> None:
    """Keeps `token` a subcommand when this app runs on its own."""


@app.command("token")
def token(
    name: Annotated[str, typer.Argument(help="the approver's name, recorded on decisions")],
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Print a new token for NAME and the broker.toml lines that accept it."""
    if not APPROVER_NAME.fullmatch(name):
        typer.echo("error: an approver's name is letters, digits and _.@- (at most 64)", err=True)
        raise typer.Exit(2)
    secret = new_token()
    if json_out:
        typer.echo(
            json.dumps({"approver": name, "token": secret, "token_sha256": hash_token(secret)})
        )
        return
    typer.echo(f"A new token for {name}; give it to them, it is shown only this once:\n")
    typer.echo(f"    {secret}\n")
    typer.echo(
        "Add these lines to broker.toml (only the hash is stored), then restart the broker:\n"
    )
    typer.echo(config_lines(name, secret))
