"""`broker stats`: outcomes per effect, approval rate, time to decision; rubber stamps."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from broker.cli.common import (
    ConfigOpt,
    JsonOpt,
    StateOpt,
    age,
    config_only,
    fail,
    open_ledger,
    out,
    print_json,
)
from broker.render import terminal

COUNTS = ("auto", "approved", "denied", "expired", "invalid", "failed")


def stats(
    json_out: JsonOpt = False,
    since: Annotated[
        str | None, typer.Option(help="only requests received in this window, e.g. 7d")
    ] = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Outcomes per effect, approval rate and time to decision; flags rubber-stamping."""
    from datetime import timedelta

    from broker.clock import parse_duration
    from broker.models import now
    from broker.stats import summarize

    cfg = config_only(config, state)
    cutoff = None
    if since:
        try:
            cutoff = now() - timedelta(seconds=parse_duration(since))
        except ValueError:
            fail(f"--since {since!r}: expected a duration like 24h or 7d")
    ledger = open_ledger(cfg)
    summary = summarize(ledger.all(), cutoff)
    if json_out:
        print_json(summary)
        return
    out.print(_table(summary))
    for name, row in summary["effects"].items():
        if row["rubber_stamp"]:
            out.print(f"[yellow]⚠ {terminal(name)}[/]: {row['advice']}")


def _table(summary: dict[str, Any]) -> Table:
    table = Table("effect", *COUNTS, "approval rate", "median wait", "p90 wait")
    for name, row in [*summary["effects"].items(), ("(all)", summary["overall"])]:
        n = row["counts"]
        rate = row["approval_rate"]
        table.add_row(
            terminal(name),
            *(str(n[k]) for k in COUNTS),
            "-" if rate is None else f"{rate:.0%}",
            age(row["median_time_to_decision_s"]),
            age(row["p90_time_to_decision_s"]),
        )
    return table
