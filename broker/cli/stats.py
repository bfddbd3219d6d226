"""`broker stats`: outcomes per effect, approval rate, time to decision; rubber stamps."""

from __future__ import annotations

from typing import Annotated, Any

import typer

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
from broker.cli.listing import Column, TsvOpt, choose, show
from broker.untrusted import terminal

COUNTS = ("auto", "approved", "denied", "expired", "invalid", "failed")


def stats(
    json_out: JsonOpt = False,
    tsv: TsvOpt = False,
    since: Annotated[
        str | None, typer.Option(help="only requests received in this window, e.g. 7d")
    ] = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Outcomes per effect, approval rate and time to decision; flags rubber-stamping."""
    from datetime import timedelta

    from broker.clock import now, parse_duration
    from broker.observability.stats import summarize

    choose(json_out, tsv)
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
    if not summary["effects"] and not tsv:
        window = f" in the last {since}" if since else ""
        out.print(f"no requests recorded{window} in {terminal(str(cfg.state_dir))}")
        return
    rows = [*summary["effects"].items(), ("(all)", summary["overall"])]
    counts = (*COUNTS, "staged") if summary["overall"]["counts"]["staged"] else COUNTS
    show(_columns(counts), [_row(name, row, counts) for name, row in rows], tsv=tsv)
    if tsv:
        return
    for name, row in summary["effects"].items():
        if row["rubber_stamp"]:
            out.print(f"[yellow]⚠ {terminal(name)}[/]: {row['advice']}")


def _columns(counts: tuple[str, ...]) -> tuple[Column, ...]:
    """The table's columns; `staged` among the counts only when something was staged."""
    return (
        Column("effect", lead=True),  # files.delete and files.write: never cut to "file…"
        *(Column(k, right=True) for k in counts),
        Column("approval rate", right=True),
        Column("median wait", right=True),
        Column("p90 wait", right=True),
    )


def _row(name: str, row: dict[str, Any], counts: tuple[str, ...]) -> list[str]:
    n = row["counts"]
    rate = row["approval_rate"]
    return [
        name,
        *(str(n[k]) for k in counts),
        "-" if rate is None else f"{rate:.0%}",
        age(row["median_time_to_decision_s"]),
        age(row["p90_time_to_decision_s"]),
    ]
