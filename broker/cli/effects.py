"""`broker effects`: the registered effects, their flags, schemas and origins; and the
kill switch (`broker effects disable|enable`), which holds on a running broker at once
(and, on a shared store, on every broker of the fleet)."""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from broker.cli.common import (
    ConfigOpt,
    JsonOpt,
    StateOpt,
    config_only,
    fail,
    guarded,
    identity,
    open_ledger,
    out,
    print_json,
)
from broker.cli.listing import Column, TsvOpt, choose, show
from broker.registry import Registry, default_registry
from broker.untrusted import terminal

if TYPE_CHECKING:
    from broker.policy.controls import Switch

app = typer.Typer(help="The registered effects, and the kill switch.", invoke_without_command=True)
GlobArg = Annotated[str, typer.Argument(help="an effect name, or a glob such as 'github.*'")]
AsOpt = Annotated[str | None, typer.Option("--as", help="act as this name (if allow_as)")]


@app.callback()
def effects(
    ctx: typer.Context,
    json_out: JsonOpt = False,
    tsv: TsvOpt = False,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """List the registered effects with their flags, schemas, and whether they are disabled."""
    if ctx.invoked_subcommand is not None:
        return
    choose(json_out, tsv)
    registry = guarded(default_registry)
    off = _switches(config, state)
    held = _credentials(config, state)
    if json_out:
        print_json(_rows(registry, off, held))
        return
    rows = [
        [
            h.name,
            "yes" if h.reversible else "no",
            "yes" if h.idempotent else "no",
            h.undo,
            registry.origin(h.name),
            held(h.name),
            _off(h.name, off),
        ]
        for h in registry
    ]
    show(COLUMNS, rows, tsv=tsv)


@app.command("disable")
def disable(
    glob: GlobArg,
    reason: Annotated[str, typer.Option("--reason", help="why: agents read it")] = "",
    as_: AsOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Deny every new request for these effects, at once, until `enable`."""
    from broker.approval.decisions import wake
    from broker.policy.controls import disable as switch_off

    cfg = config_only(config, state)
    registry = guarded(default_registry)
    names = [h.name for h in registry if fnmatchcase(h.name, glob)]
    if not names:
        fail(f"no registered effect matches {glob!r} (`broker effects` lists them)")
    by = identity(as_, cfg)
    ledger = open_ledger(cfg)
    switch = guarded(lambda: switch_off(ledger, glob, reason, by))
    wake(cfg, ledger, f"kill switch for {glob}")
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    out.print(f"disabled {terminal(glob)} ({terminal(shown)}) by {terminal(switch.by)}")


@app.command("enable")
def enable(
    glob: GlobArg, as_: AsOpt = None, config: ConfigOpt = None, state: StateOpt = None
) -> None:
    """Lift a kill switch (name it as it was disabled)."""
    from broker.approval.decisions import wake
    from broker.policy.controls import enable as switch_on

    cfg = config_only(config, state)
    by = identity(as_, cfg)
    ledger = open_ledger(cfg)
    guarded(lambda: switch_on(ledger, glob, by))
    wake(cfg, ledger, f"kill switch for {glob}")
    out.print(f"enabled {terminal(glob)} by {terminal(by)}")


def _switches(config: Path | None, state: Path | None) -> list[Switch]:
    """The kill switches in the ledger ([] when no broker has used the state dir)."""
    from broker.policy.controls import switches
    from broker.store.factory import open_store, store_exists

    cfg = config_only(config, state)
    if not store_exists(cfg):
        return []
    return switches(guarded(lambda: open_store(cfg)))


def _off(name: str, off: list[Switch]) -> str:
    hit = next((s for s in off if s.covers(name)), None)
    return f"DISABLED ({hit.glob}): {hit.reason}" if hit else ""


COLUMNS = (
    Column("effect", lead=True),
    Column("reversible"),
    Column("idempotent"),
    Column("undo", wrap=True),
    Column("from", wrap=True),
    Column("credential", wrap=True),
    Column("switch", wrap=True),
)


def _credentials(config: Path | None, state: Path | None) -> Callable[[str], str]:
    """Effect name → what it applies with on this host (minted, standing, none)."""
    from broker.grants import kind_of_credential

    cfg = config_only(config, state)
    return lambda name: kind_of_credential(cfg.integration(name.split(".", 1)[0]), cfg.credentials)


def _rows(
    registry: Registry, off: list[Switch], held: Callable[[str], str]
) -> list[dict[str, object]]:
    return [
        {
            "effect": h.name,
            "integration": h.name.split(".", 1)[0],
            "reversible": h.reversible,
            "idempotent": h.idempotent,
            "undo": h.undo,
            "origin": registry.origin(h.name),
            "credential": held(h.name),
            "schema": h.schema,
            "disabled": next((s.to_json() for s in off if s.covers(h.name)), None),
        }
        for h in registry
    ]
