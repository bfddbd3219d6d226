"""`broker policy replay | proposals | accept | reject | withdraw`: what a policy change
would do to past requests, and the rules reviewers proposed from their approvals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.cli.common import (
    ConfigOpt,
    JsonOpt,
    StateOpt,
    assemble,
    config_only,
    fail,
    guarded,
    identity,
    open_ledger,
    out,
    print_json,
)
from broker.untrusted import terminal

if TYPE_CHECKING:
    from broker.review.replay import Report
    from broker.store.base import Store

SHOWN = 50  # changes listed per section; --json lists them all
NumberArg = Annotated[str, typer.Argument(help="the proposal's number")]
AsOpt = Annotated[str | None, typer.Option("--as", help="act as this name (if allow_as)")]


def replay(
    file: Annotated[Path, typer.Argument(help="the new policy file (TOML)")],
    since: Annotated[
        str | None, typer.Option("--since", help="only requests received in this window, e.g. 30d")
    ] = None,
    sandbox: Annotated[str | None, typer.Option("--sandbox", help="only this sandbox")] = None,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Run every past request in the ledger through FILE and say what would change.
    Exits 0 when nothing would be loosened, 3 when anything would be (a request that
    would apply without a person, or wait for fewer of them), 2 on bad input."""
    from datetime import timedelta

    from broker.clock import now, parse_duration
    from broker.policy.ruleset import load_policy
    from broker.review.replay import replay as replayed
    from broker.review.replay import replay_controls

    start = None
    if since is not None:
        try:
            start = now() - timedelta(seconds=parse_duration(since))
        except (ValueError, OverflowError):
            fail(f"--since {since!r}: expected a duration like 24h or 30d")
    cfg, registry, _ = assemble(config, state, None)
    pol = guarded(lambda: load_policy(file, registry.reversibility(), registry.schemas()))
    ledger = open_ledger(cfg)
    report = guarded(
        lambda: replayed(
            pol,
            ledger.all(),
            controls=replay_controls(ledger),
            since=start,
            sandbox=sandbox,
        )
    )
    if json_out:
        print_json(report.to_json())
    else:
        print_report(report)
    raise typer.Exit(report.exit_code)


def print_report(report: Report) -> None:
    data = report.to_json()
    if data["warning"]:  # first and loudest: people said no to these
        out.print(f"[bold red reverse] {terminal(data['warning']).upper()} [/]")
        _rows([c for c in data["changes"] if c["people_denied"] and c["unattended"]])
    where = f", sandbox {terminal(report.sandbox)}" if report.sandbox else ""
    window = f" received since {report.since}" if report.since else ""
    out.print(
        f"replayed {data['replayed']} request(s){window}{where} through "
        f"{terminal(report.policy)}: {data['changed']} would change, "
        f"{data['unchanged']} would not"
    )
    if data["skipped"]:
        said = ", ".join(f"{n} {why}" for why, n in data["skipped"].items())
        out.print(f"skipped (never reached the policy): {said}")
    if data["without_facts"]:
        out.print(
            f"[yellow]note:[/] {data['without_facts']} request(s) were recorded before facts "
            "were stored; replayed as touching no protected path"
        )
    loose = [c for c in data["changes"] if c["direction"] == "loosened"]
    unattended = [c for c in loose if c["unattended"]]
    if unattended:
        out.print(f"[bold red]WOULD APPLY WITHOUT A PERSON[/]: {len(unattended)} request(s)")
        _rows(unattended)
    rest = [c for c in loose if not c["unattended"]]
    if rest:
        out.print(f"[bold yellow]LOOSENED[/] (fewer people, or deny → approve): {len(rest)}")
        _rows(rest)
    tight = [c for c in data["changes"] if c["direction"] == "tightened"]
    if tight:
        out.print(f"[bold]TIGHTENED[/]: {len(tight)}")
        _rows(tight)
    if data["by_effect"]:
        out.print("[bold]by effect[/]:")
        for effect, counts in data["by_effect"].items():
            said = ", ".join(f"{arrow} {n}" for arrow, n in counts.items())
            out.print(f"  {terminal(effect)}: {terminal(said)}")
    rate = data["approval_rate"]
    out.print(
        f"approval rate (needs a person): {_pct(rate['before'])} "
        f"({rate['before_count']}) → {_pct(rate['after'])} ({rate['after_count']})"
    )
    if report.exit_code:
        out.print(f"exit {report.exit_code}: this policy loosens what the broker lets through")


def _rows(changes: list[dict[str, Any]]) -> None:
    for c in changes[:SHOWN]:
        new = c["new"]
        target = ", ".join(f"{k}={v}" for k, v in c["target"].items())
        out.print(
            f"  {terminal(c['ref'])}  {terminal(c['effect'] or '')}  {c['change']}  "
            f"by {terminal(new['rule'])}: {terminal(new['reason'])}"
            f"  [bold]was: {terminal(c['was'])}[/]"
            + (f"  [dim]({terminal(target)})[/]" if target else "")
        )
    if len(changes) > SHOWN:
        out.print(f"  … and {len(changes) - SHOWN} more (--json lists every one)")


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def proposals(json_out: JsonOpt = False, config: ConfigOpt = None, state: StateOpt = None) -> None:
    """The rules reviewers proposed from their approvals, and what became of each; an
    open one's replay says how many past requests it would have let through."""
    from broker.review.proposals import listing

    cfg, _, pol = assemble(config, state, None)
    ledger = open_ledger(cfg)
    found = guarded(lambda: listing(ledger, pol))
    if json_out:
        print_json(found)
        return
    if not found:
        out.print("no rule has been proposed (approve with --propose to propose one)")
        return
    for item in found:
        print_proposal(item)


def print_proposal(item: dict[str, Any]) -> None:
    from broker.review.drafting import rule_toml

    number, state = item["number"], item.get("state")
    said = f"{terminal(str(item.get('proposed_by')))} at {item.get('proposed_at')}"
    out.print(
        f"[bold]proposal {number}[/] [{state}] from {terminal(str(item.get('from')))} by {said}"
    )
    if item.get("decided_by"):
        why = item.get("decision_reason")
        out.print(
            f"  {state} by {terminal(str(item['decided_by']))} at {item.get('decided_at')}"
            + (f": {terminal(str(why))}" if why else "")
        )
    if item.get("withdrawn_by"):
        out.print(f"  withdrawn by {terminal(str(item['withdrawn_by']))}")
    for line in rule_toml(item["rule"]).splitlines():
        out.print(f"  │ {terminal(line)}")
    for note in item.get("notes") or []:
        out.print(f"  [yellow]note:[/] {terminal(str(note))}")
    r = item.get("replay") or {}
    if "would_auto" in r:
        out.print(
            f"  replay: matches {r['matches']} of {r['replayed']} past request(s) of its "
            f"effect; {r['would_auto']} of them would have applied without a person"
        )


def _change(
    config: Path | None,
    state: Path | None,
    as_: str | None,
    act: Callable[[Store, str], dict[str, Any]],
) -> tuple[str, dict[str, Any]]:
    """One person's change to a proposal, audited, with the serving broker woken."""
    from broker.approval.decisions import wake

    cfg = config_only(config, state)
    ledger = open_ledger(cfg)
    who = identity(as_, cfg)
    value = guarded(lambda: act(ledger, who))
    wake(cfg, ledger, "proposal change")
    return who, value


def accept(
    number: NumberArg, as_: AsOpt = None, config: ConfigOpt = None, state: StateOpt = None
) -> None:
    """Accept a proposal: every running broker applies its rule from the next request
    on (a deny rule of the policy file still wins; protected paths stay with people)."""
    from broker.review.proposals import accept as accepted

    who, value = _change(config, state, as_, lambda ledger, by: accepted(ledger, number, by))
    effect = terminal(value["rule"]["effect"])
    out.print(
        f"proposal {terminal(number)} accepted by {terminal(who)}: {effect} requests like it "
        "now apply without a person"
    )


ReasonOpt = Annotated[str | None, typer.Option(help="why (kept with the proposal)")]


def reject(
    number: NumberArg,
    reason: ReasonOpt = None,
    as_: AsOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Reject a proposal: nothing changes."""
    from broker.review.proposals import reject as rejected

    who, _ = _change(config, state, as_, lambda ledger, by: rejected(ledger, number, by, reason))
    out.print(f"proposal {terminal(number)} rejected by {terminal(who)}; nothing changes")


def withdraw(
    number: NumberArg,
    reason: ReasonOpt = None,
    as_: AsOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Withdraw an accepted rule: requests like it wait for people again."""
    from broker.review.proposals import withdraw as withdrawn

    who, _ = _change(config, state, as_, lambda ledger, by: withdrawn(ledger, number, by, reason))
    out.print(
        f"rule of proposal {terminal(number)} withdrawn by {terminal(who)}; requests like "
        "it wait for people again"
    )


def propose_from(
    config: Path | None, state: Path | None, ledger: Store, ref: str, who: str
) -> None:
    """After an approval: draft the narrowest rule for the request, store it as a
    proposal and show it with its replay (the approval stands whatever happens here)."""
    from broker.approval.decisions import wake
    from broker.review.drafting import DraftError
    from broker.review.proposals import propose

    cfg, _, pol = assemble(config, state, None)
    record = guarded(lambda: ledger.find(ref))
    try:
        number, value, new = propose(ledger, pol, record, who)
    except DraftError as exc:
        out.print(f"no rule proposed: {terminal(str(exc))}")
        return
    wake(cfg, ledger, "proposal")
    if not new:
        out.print(f"proposal {number} ({value.get('state')}) already covers requests like it:")
    else:
        out.print(f"proposed as rule {number}; it takes effect once someone accepts it:")
    print_proposal({"number": number, **value})
    if value.get("state") == "proposed":
        out.print(
            f"  accept: broker policy accept {number}    reject: broker policy reject {number}"
        )
