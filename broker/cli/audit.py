"""`broker audit verify | tail | export`: the audit log, read and checked.

With a shared PostgreSQL ledger the chains are there, one per host: `verify` checks
every host's chain against its recorded head, and this host's local copy against its
chain; `tail` and `export` read the whole fleet's events, in time order."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker import audit as audit_log
from broker.cli.common import (
    ConfigOpt,
    JsonOpt,
    StateOpt,
    config_only,
    err,
    fail,
    guarded,
    open_ledger,
    out,
)
from broker.config import Config
from broker.render import terminal

if TYPE_CHECKING:
    from broker.store.base import Store

app = typer.Typer(help="Read and verify the audit log.", no_args_is_help=True)

# shown on every line already, or of no use to a person reading the tail
QUIET_KEYS = ("at", "event", "sandbox", "id", "effect", "prev", "hash", "seq", "sha256")


@app.command("verify")
def verify(config: ConfigOpt = None, state: StateOpt = None) -> None:
    """Check the hash chain of the whole audit log; name the first broken line."""
    from broker.ledger import Ledger

    cfg = config_only(config, state)
    if cfg.shared_ledger:
        _verify_fleet(cfg)
        return
    path = cfg.audit_path
    head = None
    if cfg.ledger_path.exists():
        ledger = guarded(lambda: Ledger(cfg.ledger_path))
        head = ledger.audit_head()
        ledger.close()
    if not path.exists():
        fail(f"no audit log at {path}: is --state (or the config's state_dir) right?", code=1)
    count, fault = audit_log.verify(path, head)
    if fault is not None:
        fail(f"{path}: line {fault.line}: {fault.problem}", code=1)
    out.print(f"{path}: ok, {count} event(s), chain intact")


@app.command("tail")
def tail(
    lines: Annotated[int, typer.Option("-n", "--lines", help="how many events")] = 20,
    config: ConfigOpt = None,
    state: StateOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show the last events of the audit log."""
    events = list(_events(config_only(config, state)))
    _print_events(events[-lines:] if lines > 0 else [], json_out)


def _print_events(events: list[dict[str, Any]], json_out: bool) -> None:
    for event in events:
        if json_out:
            sys.stdout.write(json.dumps(event) + "\n")  # ASCII: nothing hides in it
            continue
        detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in QUIET_KEYS)
        out.print(
            f"{event.get('at', '?')} {terminal(str(event.get('event')))} "
            f"{terminal(str(event.get('sandbox')))}/{terminal(str(event.get('id')))} "
            f"{terminal(str(event.get('effect') or '-'))} {terminal(detail)}"
        )


@app.command("export")
def export(
    since: Annotated[
        str | None, typer.Option(help="ISO time or duration ago (e.g. 2026-11-01, 24h)")
    ] = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Write the audit events (JSON lines, with their hashes) since a time to stdout."""
    cfg = config_only(config, state)
    cutoff = _cutoff(since) if since else None
    for event in _events(cfg):
        if cutoff is None or str(event.get("at", "")) >= cutoff:
            sys.stdout.write(json.dumps(event) + "\n")


def _events(cfg: Config) -> Iterator[dict[str, Any]]:
    """The audit events: this state dir's log, or every host's chain in the shared
    ledger, in time order."""
    if not cfg.shared_ledger:
        yield from (e for _, e, _ in audit_log.read_events(cfg.audit_path) if e is not None)
        return
    store = open_ledger(cfg)
    events = [e for _, e, _ in audit_log.parse_lines(guarded(lambda: list(store.audit_lines())))]
    found = [e for e in events if e is not None]
    yield from sorted(found, key=lambda e: (str(e.get("at", "")), str(e.get("host", ""))))


def _verify_fleet(cfg: Config) -> None:
    """Every host's chain in the shared ledger, then this host's local copy."""
    store = open_ledger(cfg)
    chains = guarded(store.audit_chains)
    if not chains:
        fail("the shared ledger holds no audit chain yet: has a broker run on it?", code=1)
    broken = False
    for host, head in chains.items():
        lines = guarded(partial(_lines, store, host))
        count, fault = audit_log.verify_lines(audit_log.parse_lines(lines), head)
        if fault is not None:
            err.print(
                f"[bold red]error:[/] host {terminal(host)}: line {fault.line}: {fault.problem}"
            )
            broken = True
        else:
            out.print(f"host {terminal(host)}: ok, {count} event(s), chain intact")
    broken = _verify_copy(cfg, store) or broken
    if broken:
        raise typer.Exit(1)


def _lines(store: Store, host: str) -> list[str]:
    return list(store.audit_lines(host))


def _verify_copy(cfg: Config, store: Store) -> bool:
    """Whether this host's local copy is broken (it may lag behind its chain)."""
    path, host = cfg.audit_path, cfg.host_id()
    if not path.exists():
        return False
    count, fault = audit_log.verify(path)
    if fault is None:
        chain = guarded(partial(_lines, store, host))
        for number, (_, _, raw) in enumerate(audit_log.read_events(path), 1):
            if number > len(chain) or chain[number - 1] != raw:
                fault = audit_log.Fault(number, f"it is not the line host {host}'s chain holds")
                break
    if fault is not None:
        err.print(f"[bold red]error:[/] local copy {path}: line {fault.line}: {fault.problem}")
        return True
    out.print(f"local copy {path}: ok, {count} event(s) of host {terminal(host)}'s chain")
    return False


def _cutoff(since: str) -> str | None:
    """--since as an ISO time: a duration ago, or a date/time (UTC when it names no zone)."""
    from datetime import datetime, timedelta

    from broker.clock import parse_duration
    from broker.models import iso, now

    try:
        return iso(now() - timedelta(seconds=parse_duration(since)))
    except (ValueError, OverflowError):
        pass
    try:
        moment = datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        fail(f"--since {since!r}: expected an ISO date/time or a duration like 24h")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return iso(moment)
