"""The `broker` command table (typer), in the order `broker --help` lists it.

One module per command group. Importing it stays light: the pipeline, the web app and
the handlers' libraries are imported by the commands that use them. `broker run` is
listed here but parsed by broker.cli.run, which the console script calls directly.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from broker.cli import audit, decide, effects, k8s, ledger, policy, sandboxes, serve, stats
from broker.cli import run as run_cli
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


# `broker run` has a parser of its own (broker.cli.run): typer hands it every argument
RUN_SETTINGS: dict[str, Any] = {"allow_extra_args": True, "ignore_unknown_options": True}


def run(ctx: typer.Context) -> None:
    raise typer.Exit(run_cli.main(ctx.args))


app.command()(serve.serve)
app.command()(decide.pending)
app.command()(decide.show)
app.command()(decide.approve)
app.command()(decide.deny)
app.command()(stats.stats)
app.command()(decide.undo)
app.command()(decide.reconcile)
app.command(context_settings=RUN_SETTINGS, add_help_option=False, help=run_cli.DESCRIPTION)(run)
app.add_typer(effects.app, name="effects")
app.add_typer(policy.app, name="policy")
app.add_typer(sandboxes.image_app, name="image")
app.add_typer(sandboxes.sandbox_app, name="sandbox")
app.add_typer(k8s.app, name="k8s")
app.add_typer(web_app, name="web")
app.add_typer(audit.app, name="audit")
app.add_typer(ledger.app, name="ledger")


def main() -> None:
    """Every command but `run`: Ctrl-C anywhere is one line and exit 130."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        raise SystemExit(130) from None
