"""`broker policy check | explain`: what a policy file says, and which rule decides;
`replay` and the proposals' commands are in broker.cli.rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from broker.cli import rules
from broker.cli.common import (
    ConfigOpt,
    JsonOpt,
    PolicyOpt,
    StateOpt,
    assemble,
    fail,
    guarded,
    out,
    print_json,
)
from broker.policy.ruleset import load_policy
from broker.registry import default_registry
from broker.untrusted import terminal

app = typer.Typer(
    help="Check, explain and replay policy files; review proposed rules.", no_args_is_help=True
)


@app.command("check")
def check(file: Path, config: ConfigOpt = None, state: StateOpt = None) -> None:
    """Load a policy file and say whether it is valid."""
    registry = guarded(default_registry)
    pol = guarded(lambda: load_policy(file, registry.reversibility(), registry.schemas()))
    limits = f", {len(pol.limits)} limit(s)" if pol.limits else ""
    out.print(f"{terminal(str(file))}: ok, {len(pol.rules)} rule(s){limits}")
    for warning in pol.warnings:
        out.print(f"  [yellow]warning:[/] {terminal(warning)}")
    for rule in pol.rules:
        cond = f" when {dict(rule.when)}" if rule.when else ""
        extra = ""
        if rule.action == "approve":
            extra = (
                f" (approvals={rule.approvals}, timeout={rule.timeout_s:g}s, "
                f"on_timeout={rule.on_timeout})"
            )
        after = " after " + " or ".join(a.describe() for a in rule.after) if rule.after else ""
        what = terminal(rule.effect + cond + after)
        out.print(f"  {rule.label}: {what} → {rule.action}{extra}: {terminal(rule.reason)}")
    for limit in pol.limits:
        terms = [f"max {limit.max} per sandbox"] if limit.max is not None else []
        terms += [f"rate {limit.rate_text}"] if limit.rate is not None else []
        out.print(
            f"  {limit.label}: {terminal(limit.effect)} {', '.join(terms)} → beyond: "
            f"{limit.action}" + (f": {terminal(limit.reason)}" if limit.reason else "")
        )


@app.command("explain")
def explain(
    request: Annotated[Path, typer.Argument(help="a request file (JSON)")],
    policy: PolicyOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
    json_out: JsonOpt = False,
    sandbox: Annotated[
        str | None,
        typer.Option("--sandbox", help="count quotas and history as for this sandbox"),
    ] = None,
) -> None:
    """Say what the broker would decide for a request, and why: its canonical params,
    its reversibility and protected paths as the handler assesses them, the kill
    switches and remembered rules in the ledger, every rule tried."""
    from broker.review.explain import explain as explained
    from broker.store.factory import open_store, store_exists

    cfg, registry, pol = assemble(config, state, policy)
    ledger = guarded(lambda: open_store(cfg)) if store_exists(cfg) else None
    if sandbox is not None and ledger is None:
        fail(f"no ledger in {cfg.state_dir} yet: there is no history for sandbox {sandbox!r}")
    found = guarded(
        lambda: explained(Path(request).read_bytes(), cfg, registry, pol, ledger, sandbox)
    )
    if json_out:
        print_json(found.to_json())
        return
    out.print(f"policy: {terminal(pol.source)}")
    if found.verdict is None:
        out.print(f"→ [bold]{terminal(str(found.outcome))}[/] (before any rule is consulted)")
        return
    for line in found.trace:
        out.print(f"  {terminal(line)}")
    out.print(f"  params (canonical): {terminal(json.dumps(found.params, ensure_ascii=False))}")
    out.print(f"  reversible (this request): {'yes' if found.reversible else 'no'}")
    if found.protected:
        out.print(f"  protected paths touched: {terminal(', '.join(found.protected))}")
    verdict = found.verdict
    out.print(f"→ [bold]{verdict.action}[/] by {verdict.rule}: {terminal(verdict.reason)}")


# what a policy change would do, and the rules reviewers proposed (broker.cli.rules)
app.command("replay")(rules.replay)
app.command("proposals")(rules.proposals)
app.command("accept")(rules.accept)
app.command("reject")(rules.reject)
app.command("withdraw")(rules.withdraw)
