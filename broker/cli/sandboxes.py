"""`broker image build` and `broker sandbox ls | rm`: the agent image and the sandbox
containers on this Docker engine."""

from __future__ import annotations

from typing import Annotated

import typer

from broker.cli.common import JsonOpt, err, fail, guarded, out, print_json
from broker.cli.listing import Column, TsvOpt, choose, show

image_app = typer.Typer(help="Build the sandbox image.", no_args_is_help=True)
sandbox_app = typer.Typer(help="List and remove sandbox containers.", no_args_is_help=True)

COLUMNS = ("sandbox", "container", "name", "status")


@image_app.command("build")
def image_build(
    tag: Annotated[str | None, typer.Option(help="the image tag")] = None,
    force: Annotated[bool, typer.Option(help="rebuild even if it is current")] = False,
) -> None:
    """Build the agent image (from python:3.12-slim, or from Debian packages offline)."""
    from broker.hosting import images, sandbox

    def build() -> str:
        return images.ensure_image(
            sandbox.engine(), tag or images.DEFAULT_IMAGE, force=force, log=err.print
        )

    out.print(f"image ready: {guarded(build)}")


@sandbox_app.command("ls")
def sandbox_ls(json_out: JsonOpt = False, tsv: TsvOpt = False) -> None:
    """Sandbox containers on this engine (left behind by a crash, or detached)."""
    choose(json_out, tsv)
    rows = guarded(_listing)
    if json_out:
        print_json(rows)
        return
    if not rows and not tsv:
        out.print("no sandbox containers on this Docker engine")
        return
    show(
        [Column(k, lead=k == "sandbox") for k in COLUMNS],
        [[row[k] for k in COLUMNS] for row in rows],
        tsv=tsv,
    )


def _listing() -> list[dict[str, str]]:
    from broker.hosting import sandbox

    return [
        {
            "sandbox": c.labels.get(sandbox.LABEL, "?"),
            "container": c.short_id,
            "name": str(c.name),
            "status": c.status,
        }
        for c in sandbox.leftovers(sandbox.engine())
    ]


@sandbox_app.command("rm")
def sandbox_rm(
    ids: Annotated[list[str] | None, typer.Argument(help="sandbox ids (default: none)")] = None,
    all_: Annotated[bool, typer.Option("--all", help="remove every sandbox container")] = False,
) -> None:
    """Remove sandbox containers (their ledger history and results are kept)."""
    from broker.hosting import sandbox

    if not ids and not all_:
        fail("name the sandbox ids to remove, or --all")

    def remove() -> int:
        count = 0
        for c in sandbox.leftovers(sandbox.engine()):
            if all_ or c.labels.get(sandbox.LABEL) in (ids or []):
                sandbox.remove(c)
                count += 1
        return count

    out.print(f"removed {guarded(remove)} container(s)")
