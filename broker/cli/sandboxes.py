"""`broker image build` and `broker sandbox ls | rm`: the agent image and the sandbox
containers of a runtime (Docker, Podman): --runtime, else [sandbox] runtime, else docker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from broker.cli.common import ConfigOpt, JsonOpt, config_only, err, fail, guarded, out, print_json
from broker.cli.listing import Column, TsvOpt, choose, show

if TYPE_CHECKING:
    from broker.hosting.runtimes.base import Runtime

image_app = typer.Typer(help="Build the sandbox image.", no_args_is_help=True)
sandbox_app = typer.Typer(help="List and remove sandbox containers.", no_args_is_help=True)

COLUMNS = ("sandbox", "container", "name", "status")
RuntimeOpt = Annotated[
    str | None,
    typer.Option("--runtime", help="docker or podman (default: [sandbox] runtime, else docker)"),
]
T = TypeVar("T")


def chosen_runtime(chosen: str | None, config: ConfigOpt) -> str:
    """--runtime, else [sandbox] runtime of broker.toml, else docker."""
    from broker.hosting.runtimes import runtime_name

    return chosen or runtime_name(config_only(config, None))


def on_runtime(chosen: str | None, config: ConfigOpt, fn: Callable[[Runtime], T]) -> T:
    """``fn`` on the runtime chosen; a failure is one line and exit 2."""
    from broker.hosting.runtimes import open_runtime

    name = chosen_runtime(chosen, config)

    def call() -> T:
        runtime = open_runtime(name)
        try:
            return fn(runtime)
        finally:
            runtime.close()

    return guarded(call)


@image_app.command("build")
def image_build(
    tag: Annotated[str | None, typer.Option(help="the image tag")] = None,
    force: Annotated[bool, typer.Option(help="rebuild even if it is current")] = False,
    runtime: RuntimeOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Build the agent image (from python:3.12-slim, or from Debian packages offline)."""
    from broker.hosting import images

    def build(rt: Runtime) -> str:
        return rt.ensure_image(tag or images.DEFAULT_IMAGE, force=force, log=err.print)

    out.print(f"image ready: {on_runtime(runtime, config, build)}")


@sandbox_app.command("ls")
def sandbox_ls(
    json_out: JsonOpt = False,
    tsv: TsvOpt = False,
    runtime: RuntimeOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Sandbox containers on this engine (left behind by a crash, or detached)."""
    choose(json_out, tsv)
    rows = on_runtime(runtime, config, _listing)
    if json_out:
        print_json(rows)
        return
    if not rows and not tsv:
        out.print(f"no sandbox containers on this {chosen_runtime(runtime, config).title()} engine")
        return
    show(
        [Column(k, lead=k == "sandbox") for k in COLUMNS],
        [[row[k] for k in COLUMNS] for row in rows],
        tsv=tsv,
    )


def _listing(rt: Runtime) -> list[dict[str, str]]:
    from broker.hosting.runtimes.spec import LABEL
    from broker.hosting.warm import WARM_LABEL

    return [
        {
            "sandbox": c.labels.get(LABEL, "?"),
            "container": c.short_id,
            "name": str(c.name),
            "status": c.status + (" (warm pool)" if WARM_LABEL in c.labels else ""),
        }
        for c in rt.leftovers()
    ]


@sandbox_app.command("rm")
def sandbox_rm(
    ids: Annotated[list[str] | None, typer.Argument(help="sandbox ids (default: none)")] = None,
    all_: Annotated[bool, typer.Option("--all", help="remove every sandbox container")] = False,
    runtime: RuntimeOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Remove sandbox containers (their ledger history and results are kept)."""
    from broker.hosting.runtimes.spec import LABEL

    if not ids and not all_:
        fail("name the sandbox ids to remove, or --all")

    def remove(rt: Runtime) -> int:
        count = 0
        for c in rt.leftovers():
            if all_ or c.labels.get(LABEL) in (ids or []):
                rt.remove(c)
                count += 1
        return count

    out.print(f"removed {on_runtime(runtime, config, remove)} container(s)")


@sandbox_app.command("prepare")
def sandbox_prepare(
    sandbox_id: Annotated[str, typer.Argument(help="the sandbox id")],
    root: Annotated[
        Path | None, typer.Option(help="the root `serve --root` serves (default: the state dir)")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Make <root>/sandboxes/ID/{outbox,results} for a sandbox someone else starts (a
    Kubernetes pod, a runtime of your own): the outbox uid 10001's, the results the broker's."""
    from broker.hosting import sandbox

    base = root if root is not None else config_only(config, None).state_dir
    paths = guarded(lambda: sandbox.prepare_dirs(base, sandbox_id))
    out.print(f"prepared {paths.root}: outbox {paths.outbox} (rw), results {paths.results} (ro)")
