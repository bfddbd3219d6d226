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
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.audit import verify as audit_verify
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
from broker.cli.listing import Column, TsvOpt, choose, show
from broker.config import Config
from broker.untrusted import terminal

if TYPE_CHECKING:
    from broker.store.base import Store

app = typer.Typer(help="Read and verify the audit log.", no_args_is_help=True)

# shown on every line already, or of no use to a person reading the tail
QUIET_KEYS = ("at", "event", "sandbox", "id", "effect", "prev", "hash", "seq", "sha256")


CheckpointsOpt = Annotated[
    Path | None,
    typer.Option(
        "--checkpoints",
        help="exported checkpoints (the checkpoint file, or syslog or webhook lines) to check",
    ),
]


@app.command("verify")
def verify(
    config: ConfigOpt = None, state: StateOpt = None, checkpoints: CheckpointsOpt = None
) -> None:
    """Check the hash chain (keyed with the host's audit key) of the whole audit log and,
    given exported checkpoints, that the log still holds each; name the first fault."""
    from broker.audit.checkpoints import audit_settings
    from broker.store.sqlite import Ledger

    cfg = config_only(config, state)
    key = guarded(lambda: audit_settings(cfg)).key
    if cfg.shared_ledger:
        _verify_fleet(cfg, key)
        return
    path = cfg.audit_path
    head = keyed_from = None
    if cfg.ledger_path.exists():
        ledger = guarded(lambda: Ledger(cfg.ledger_path))
        head, keyed_from = ledger.audit_head(), ledger.audit_keyed_from()
        ledger.close()
    if not path.exists():
        fail(f"no audit log at {path}: is --state (or the config's state_dir) right?", code=1)
    report = audit_verify.check(path, head, key, keyed_from)
    if report.fault is not None:
        where = f"line {report.fault.line}" if report.fault.line else "the ledger"
        fail(f"{path}: {where}: {report.fault.problem}", code=1)
    if (
        checkpoints is None
        and key is not None
        and keyed_from is None
        and report.count
        and report.unkeyed == report.count
    ):
        fail(
            f"{path}: no line is keyed though this host has an audit key, and the ledger "
            "records no keyed start: a log re-chained without the key looks so; if the key "
            f"was configured just now, let the broker write an event first; "
            f"{audit_verify.CHECKPOINTS_HINT}",
            code=1,
        )
    checked = "" if checkpoints is None else _checked(checkpoints, report.hashes, key)
    keyed = "keyed" if key is not None else "not keyed: no \\[audit] key on this host"
    out.print(f"{path}: ok, {report.count} event(s), chain intact ({keyed}){checked}")
    if key is not None and report.unkeyed:
        out.print(
            f"note: the first {report.unkeyed} line(s) predate the audit key and are only "
            "hash-chained"
        )


def _checked(checkpoints: Path, hashes: dict[int, str], key: bytes | None) -> str:
    """That each exported checkpoint is still in the log (one line, or the first fault)."""
    from broker.audit.checkpoints import check_checkpoints, read_checkpoints

    if key is None:
        fail("--checkpoints: checkpoints are checked with the audit key ([audit] key_file)")
    points = guarded(lambda: read_checkpoints(checkpoints))
    fault = check_checkpoints(points, hashes, key)
    if fault is not None:
        fail(f"{checkpoints}: line {fault.line}: {fault.problem}", code=1)
    if not points:
        fail(f"{checkpoints}: holds no checkpoint", code=1)
    return f"; {len(points)} checkpoint(s) match"


@app.command("tail")
def tail(
    lines: Annotated[int, typer.Option("-n", "--lines", help="how many events")] = 20,
    config: ConfigOpt = None,
    state: StateOpt = None,
    json_out: JsonOpt = False,
    tsv: TsvOpt = False,
) -> None:
    """Show the last events of the audit log."""
    choose(json_out, tsv)
    cfg = config_only(config, state)
    path = cfg.audit_path
    events = list(_events(cfg))
    events = events[-lines:] if lines > 0 else []
    if json_out:
        for event in events:
            sys.stdout.write(json.dumps(event) + "\n")  # ASCII: nothing hides in it
    elif tsv:
        show(TAIL, [_cells(event) for event in events], tsv=True)
    elif not events:
        where = "no audit log at" if not path.exists() else "no audit events in"
        out.print(f"{where} {terminal(str(path))}" if not cfg.shared_ledger else "no audit events")
    else:
        for event in events:  # one line each, as a log reads, never cut
            at, kind, sandbox, rid, effect, detail = (terminal(c) for c in _cells(event))
            out.print(f"{at} {kind} {sandbox}/{rid} {effect} {detail}".rstrip())


TAIL = tuple(Column(t) for t in ("at", "event", "sandbox", "id", "effect", "detail"))


def _cells(event: dict[str, Any]) -> list[str]:
    detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in QUIET_KEYS)
    keys = ("at", "event", "sandbox", "id")
    return [*(str(event.get(k, "?")) for k in keys), str(event.get("effect") or "-"), detail]


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
    path = cfg.audit_path
    cutoff = _cutoff(since) if since else None
    if not cfg.shared_ledger and not path.exists():  # stdout stays the (empty) stream
        err.print(f"no audit log at {terminal(str(path))}")
    for event in _events(cfg):
        if cutoff is None or str(event.get("at", "")) >= cutoff:
            sys.stdout.write(json.dumps(event) + "\n")


def _events(cfg: Config) -> Iterator[dict[str, Any]]:
    """The audit events: this state dir's log, or every host's chain in the shared
    ledger, in time order."""
    if not cfg.shared_ledger:
        yield from (e for _, e, _ in audit_verify.read_events(cfg.audit_path) if e is not None)
        return
    store = open_ledger(cfg)
    events = [e for _, e, _ in audit_verify.parse_lines(guarded(lambda: list(store.audit_lines())))]
    found = [e for e in events if e is not None]
    yield from sorted(found, key=lambda e: (str(e.get("at", "")), str(e.get("host", ""))))


def _verify_fleet(cfg: Config, key: bytes | None) -> None:
    """Every host's chain in the shared ledger, then this host's local copy."""
    store = open_ledger(cfg)
    chains = guarded(store.audit_chains)
    if not chains:
        fail("the shared ledger holds no audit chain yet: has a broker run on it?", code=1)
    broken = False
    for host, head in chains.items():
        lines = guarded(partial(_lines, store, host))
        count, fault = audit_verify.verify_lines(audit_verify.parse_lines(lines), head, key)
        if fault is not None:
            err.print(
                f"[bold red]error:[/] host {terminal(host)}: line {fault.line}: {fault.problem}"
            )
            broken = True
        else:
            out.print(f"host {terminal(host)}: ok, {count} event(s), chain intact")
    broken = _verify_copy(cfg, store, key) or broken
    if broken:
        raise typer.Exit(1)


def _lines(store: Store, host: str) -> list[str]:
    return list(store.audit_lines(host))


def _verify_copy(cfg: Config, store: Store, key: bytes | None) -> bool:
    """Whether this host's local copy is broken (it may lag behind its chain)."""
    path, host = cfg.audit_path, cfg.host_id()
    if not path.exists():
        return False
    count, fault = audit_verify.verify_lines(audit_verify.read_events(path), None, key)
    if fault is None:
        chain = guarded(partial(_lines, store, host))
        for number, (_, _, raw) in enumerate(audit_verify.read_events(path), 1):
            if number > len(chain) or chain[number - 1] != raw:
                fault = audit_verify.Fault(number, f"it is not the line host {host}'s chain holds")
                break
    if fault is not None:
        err.print(f"[bold red]error:[/] local copy {path}: line {fault.line}: {fault.problem}")
        return True
    out.print(f"local copy {path}: ok, {count} event(s) of host {terminal(host)}'s chain")
    return False


def _cutoff(since: str) -> str | None:
    """--since as an ISO time: a duration ago, or a date/time (UTC when it names no zone)."""
    from datetime import datetime, timedelta

    from broker.clock import iso, now, parse_duration

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
