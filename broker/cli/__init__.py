"""The `broker` command: parses, calls, prints. Every user error is one line.

One module per command group; this one is the command table, in the order
`broker --help` lists it. Importing it stays light: the pipeline, the web app and the
handlers' libraries are imported by the commands that use them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from broker.cli import audit, decide, effects, k8s, ledger, policy, sandboxes, serve, stats
from broker.cli.common import err, out
from broker.web.cli import app as web_app  # light: no fastapi/uvicorn import

__all__ = ["app", "main"]

app = typer.Typer(
    help="Sandbox-outbox effect broker: agents ask, policy and people decide, the host acts.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # click's plain help: no `<bool>` on flags, `[broker]` kept as written
)


def _version(asked: bool) -> None:
    if asked:
        from broker import __version__

        out.print(f"broker {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Sandbox-outbox effect broker: agents ask, policy and people decide, the host acts."""


app.command()(serve.serve)
app.command()(decide.pending)
app.command()(decide.show)
app.command()(decide.approve)
app.command()(decide.deny)
app.command()(stats.stats)
app.command()(decide.undo)
app.command()(decide.reconcile)
app.command(context_settings=serve.RUN_SETTINGS)(serve.run)
app.add_typer(effects.app, name="effects")
app.add_typer(policy.app, name="policy")
app.add_typer(sandboxes.image_app, name="image")
app.add_typer(sandboxes.sandbox_app, name="sandbox")
app.add_typer(k8s.app, name="k8s")
app.add_typer(web_app, name="web")
app.add_typer(audit.app, name="audit")
app.add_typer(ledger.app, name="ledger")


def main() -> None:
    """The console script: Ctrl-C anywhere is one line and exit 130."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        raise SystemExit(130) from None
