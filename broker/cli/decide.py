"""What a person does about requests: `pending`, `show`, `approve`, `deny`, and for
applied or `unknown` ones `undo` and `reconcile`.

Each runs beside a serving broker (or none): it reads and writes the state dir's
ledger and audit log, then nudges the broker.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.cli.common import (
    ConfigOpt,
    JsonOpt,
    StateOpt,
    age,
    assemble,
    config_only,
    fail,
    guarded,
    identity,
    open_ledger,
    out,
    print_json,
)
from broker.cli.listing import Column, TsvOpt, choose
from broker.cli.listing import show as show_rows
from broker.cli.prompt import print_card
from broker.registry import default_registry
from broker.untrusted import neutralize, terminal

if TYPE_CHECKING:
    from broker.models import Record
    from broker.store.base import Store

RefArg = Annotated[
    str, typer.Argument(help="the request's id, or SANDBOX/ID; a unique prefix of the id will do")
]
ShaOpt = Annotated[
    str | None, typer.Option("--sha256", help="the request sha256 you saw (at least 12 hex digits)")
]
AsOpt = Annotated[str | None, typer.Option("--as", help="decide as this name (if allow_as)")]


EffectFilter = Annotated[
    str | None, typer.Option("--effect", help="only this effect (a glob: files.*)")
]
SandboxFilter = Annotated[str | None, typer.Option("--sandbox", help="only this sandbox")]
WatchOpt = Annotated[
    bool, typer.Option("--watch", "-w", help="list again whenever the ledger changes (Ctrl-C ends)")
]


def pending(
    effect: EffectFilter = None,
    sandbox: SandboxFilter = None,
    watch: WatchOpt = False,
    json_out: JsonOpt = False,
    tsv: TsvOpt = False,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """What waits for a person, oldest first."""
    choose(json_out, tsv)
    cfg = config_only(config, state)
    ledger = open_ledger(cfg)
    mark = ledger.change_mark()  # before the list: a change while it prints is listed again
    _list_pending(ledger, str(cfg.state_dir), effect, sandbox, json_out, tsv)
    if watch:
        _watch(
            mark,
            lambda: _list_pending(ledger, str(cfg.state_dir), effect, sandbox, json_out, tsv),
            ledger,
        )


def _list_pending(
    ledger: Store, where: str, effect: str | None, sandbox: str | None, json_out: bool, tsv: bool
) -> None:
    from fnmatch import fnmatchcase

    from broker.approval.decisions import card
    from broker.clock import now, parse_iso

    rows = []
    for record in ledger.in_states(["pending"]):
        if effect and not fnmatchcase(record.effect or "", effect):
            continue
        if sandbox and record.sandbox != sandbox:
            continue
        c = card(ledger, record)
        received = parse_iso(record.received_at)
        c["age_s"] = round((now() - received).total_seconds(), 1) if received else None
        rows.append(c)
    if json_out:
        print_json(rows)
    elif not rows and not tsv:
        narrowed = " matching --effect/--sandbox" if effect or sandbox else ""
        out.print(f"nothing{narrowed} waits for a decision in {terminal(where)}")
    else:
        show_rows(PENDING, [_pending_row(c) for c in rows], tsv=tsv)


def _watch(seen: int, again: Callable[[], None], ledger: Store) -> None:
    """List again after each committed change since mark `seen`, as `kubectl get -w`
    does; Ctrl-C ends it.

    Ctrl-C sets a flag the loop reads between steps rather than raising
    KeyboardInterrupt wherever the main thread happens to be: raised inside rich's
    rendering or a generator being finalised, the exception can be swallowed and the
    watch would go on.
    """
    import signal

    from broker.clock import REAL, iso

    asked: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: asked.append(signum))
    try:
        while not asked:
            REAL.sleep(1.0)  # a signal cuts it short (PEP 475 resumes it: at most 1 s)
            mark = ledger.change_mark()
            if mark != seen and not asked:
                seen = mark
                out.print(f"\n[dim]-- {iso(REAL.now())} --[/]")
                again()
    finally:
        signal.signal(signal.SIGINT, previous)


PENDING = (
    Column("ref", lead=True),  # what people copy into `broker approve`: never cut
    Column("effect", lead=True),
    Column("what", wrap=True),
    Column("age", right=True),
    Column("time left", right=True),
    Column("then"),
    Column("approvals", right=True),
)


def _pending_row(c: dict[str, Any]) -> list[str]:
    left = c["if_nobody_answers"]["seconds_left"]
    return [
        c["ref"],
        c["effect"] or "-",
        c["what"]["title"] or "-",
        age(c["age_s"]),
        age(left),
        c["if_nobody_answers"]["on_timeout"] or "-",
        f"{len(c['approvals']['have'])}/{c['approvals']['needed']}",
    ]


def show(
    ref: RefArg, json_out: JsonOpt = False, config: ConfigOpt = None, state: StateOpt = None
) -> None:
    """The approval card of one request: what, where, why it stopped, what happens next."""
    from broker.approval.decisions import card

    ledger = open_ledger(config_only(config, state))
    record = guarded(lambda: ledger.find(ref))
    registry = guarded(default_registry)
    c = card(ledger, record, registry)
    if json_out:
        print_json(c)
        return
    print_card(c)


YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="at a terminal: decide without showing the card first")
]


ProposeOpt = Annotated[
    bool,
    typer.Option(
        "--propose",
        help="also propose the narrowest rule that would auto-apply requests like it "
        "(it takes effect once someone runs `broker policy accept N`)",
    ),
]


def approve(
    ref: RefArg,
    reason: Annotated[str | None, typer.Option(help="why; shown to the agent")] = None,
    as_: AsOpt = None,
    sha256: ShaOpt = None,
    yes: YesOpt = False,
    propose: ProposeOpt = False,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Approve a pending request (one of its approvals, under a quorum rule). At a
    terminal it shows the request's card and asks first."""
    ledger, who = _decide(ref, "approve", reason, as_, sha256, yes, config, state)
    if propose:
        from broker.cli.rules import propose_from

        propose_from(config, state, ledger, ref, who)


def deny(
    ref: RefArg,
    reason: Annotated[str, typer.Option(help="why, and what to do instead: the agent reads it")],
    as_: AsOpt = None,
    sha256: ShaOpt = None,
    yes: YesOpt = False,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Deny a pending request; the reason goes back to the agent. At a terminal it
    shows the request's card and asks first."""
    _decide(ref, "deny", reason, as_, sha256, yes, config, state)


def _decide(
    ref: str,
    verdict: str,
    reason: str | None,
    as_: str | None,
    sha256: str | None,
    yes: bool,
    config: Path | None,
    state: Path | None,
) -> tuple[Store, str]:
    from broker.approval.decisions import Ballot, decide_and_wake

    cfg = config_only(config, state)
    ledger = open_ledger(cfg)
    who = identity(as_, cfg)
    if not yes and sys.stdin.isatty() and sys.stdout.isatty():
        sha256 = _confirm(ledger, ref, verdict, reason, sha256)
    ballot = Ballot(ref, verdict, who, reason, "cli", sha256)
    result = guarded(lambda: decide_and_wake(cfg, ledger, ballot))
    ref_text = terminal(f"{result.record.sandbox}/{result.record.id}")
    if not result.settled:
        out.print(
            f"{ref_text}: approval {result.approvals} of {result.needed} recorded; waiting for more"
        )
    elif verdict == "approve":
        by = terminal(str(result.record.decided_by))
        out.print(f"{ref_text}: approved by {by}; {_what_follows(ledger, result.record)}")
    else:
        out.print(f"{ref_text}: denied; the agent reads: {terminal(str(result.record.reason))}")
    return ledger, who


def _what_follows(ledger: Store, record: Record) -> str:
    """What the broker does with an approved request: apply it, unless its effect was
    switched off meanwhile (the kill switch holds over approvals: it is denied)."""
    from broker.policy.controls import LiveControls

    controls = LiveControls(ledger)
    controls.refresh()
    switch = controls.disabled(record.effect or "")
    if switch is None:
        return "the broker applies it"
    return terminal(
        f"but {record.effect} is switched off (by {switch.by}: {switch.reason}), so the "
        f"broker denies it instead of applying it; `broker effects enable {switch.glob}` "
        "first, and the agent asks again"
    )


def _confirm(
    ledger: Store, ref: str, verdict: str, reason: str | None, sha256: str | None
) -> str | None:
    """Show the card of a pending request and ask; the decision then binds to the
    sha256 shown (unless --sha256 named one: that is checked as given)."""
    import click

    from broker.approval.decisions import card

    record = guarded(lambda: ledger.find(ref))
    if record.state != "pending":
        return sha256  # not waiting: the decision is refused with its reason
    print_card(card(ledger, record, guarded(default_registry)))
    if verdict == "deny":
        out.print(f"[bold]THE AGENT WILL READ[/]  denied by you: {terminal(str(reason))}")
    question = f"{verdict} {record.sandbox}/{record.id} ({record.effect})?"
    try:
        confirmed = typer.confirm(neutralize(question), default=False)
    except click.exceptions.Abort:
        confirmed = False
    if not confirmed:
        fail("nothing recorded", code=1)
    return sha256 or record.sha256


def undo(
    ref: RefArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    as_: AsOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Reverse an applied effect, when its handler can; shows what it will do first."""
    from broker.audit.checkpoints import audit_log
    from broker.audit.log import flush
    from broker.lifecycle import undo as undo_mod

    cfg, registry, _ = assemble(config, state, None)
    ledger = open_ledger(cfg)
    chosen = guarded(lambda: undo_mod.plan(ledger, registry, cfg, ref))
    preview = chosen.preview
    out.print(f"[bold]UNDO[/] {terminal(preview.title)}")
    out.print(f"[bold]WHERE[/] {terminal(preview.target)}")
    for key, value in preview.facts:
        out.print(f"      {terminal(key)}: {terminal(value)}")
    if preview.body:
        out.print(neutralize(preview.body, keep_newlines=True), markup=False)
    if not yes:
        _confirm_undo()
    who = identity(as_, cfg)
    record = guarded(lambda: undo_mod.execute(ledger, cfg, chosen, who))
    guarded(lambda: flush(ledger, audit_log(cfg)))
    if record.state != "applied":
        fail(f"undo failed: {record.reason}", code=1)
    out.print(f"undone: {terminal(ref)} (recorded as {record.sandbox}/{terminal(record.id)})")


def _confirm_undo() -> None:
    if not sys.stdin.isatty():
        fail("confirm with --yes when not at a terminal")
    if not typer.confirm("apply this undo?", default=False):
        fail("not undone", code=1)


def reconcile(
    ref: RefArg,
    applied: Annotated[
        bool | None,
        typer.Option("--applied/--not-applied", help="what you found at the service"),
    ] = None,
    reason: Annotated[str | None, typer.Option(help="how you checked")] = None,
    as_: AsOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Settle a request that ended `unknown`: say whether the effect happened."""
    from broker.audit.checkpoints import audit_log
    from broker.audit.log import flush
    from broker.lifecycle import undo as undo_mod

    if applied is None:
        fail("say what you found: --applied or --not-applied")
    cfg = config_only(config, state)
    ledger = open_ledger(cfg)
    who = identity(as_, cfg)
    record = guarded(lambda: undo_mod.reconcile(ledger, ref, bool(applied), who, reason))
    guarded(lambda: flush(ledger, audit_log(cfg)))
    found = "applied" if applied else "not applied"
    out.print(f"{terminal(record.sandbox)}/{terminal(record.id)}: recorded as {found} by {who}")
