"""`broker serve`: outboxes until stopped, started by broker.cli.daemon (`broker run`,
one sandbox until it exits, has a light path of its own: broker.cli.run)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from broker.cli.common import ConfigOpt, PolicyOpt, StateOpt, fail, guarded
from broker.cli.daemon import (
    Daemon,
    DaemonArgs,
    InsecureOpt,
    ListenOpt,
    LogFormatOpt,
    VerboseOpt,
    daemon,
)
from broker.untrusted import terminal

if TYPE_CHECKING:
    from broker.config import Config
    from broker.hosting.run_service import RunService
    from broker.hosting.warm_keeper import WarmPool
    from broker.integrations.github_cards import PrCards
    from broker.loop.pipeline import Broker

ClaimOpt = Annotated[
    Path | None,
    typer.Option(
        help="with --outbox: the broker's private claim dir, on the outbox's file system "
        "and out of the sandbox's sight (default: <state>/claimed/<sandbox>)"
    ),
]
RootOpt = Annotated[
    Path | None,
    typer.Option(help="serve every <root>/sandboxes/<id>/outbox (default root: the state dir)"),
]
StagedOpt = Annotated[
    bool,
    typer.Option(
        "--staged",
        help="staged mode for every effect: validate, classify and preview each request, "
        "apply nothing (as [broker] staged = true)",
    ),
]


def serve(
    outbox: Annotated[Path | None, typer.Option(help="an outbox to serve (attach mode)")] = None,
    results: Annotated[Path | None, typer.Option(help="where its results go (attach mode)")] = None,
    sandbox: Annotated[str, typer.Option(help="the sandbox id for --outbox")] = "default",
    claim: ClaimOpt = None,
    root: RootOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
    policy: PolicyOpt = None,
    listen: ListenOpt = None,
    insecure_listen: InsecureOpt = False,
    verbose: VerboseOpt = False,
    log_format: LogFormatOpt = None,
    staged: StagedOpt = False,
) -> None:
    """Watch outboxes and answer every request until stopped (Ctrl-C)."""
    args = DaemonArgs(
        config=config,
        state=state,
        policy=policy,
        listen=listen,
        insecure_listen=insecure_listen,
        verbose=verbose,
        log_format=log_format,
    )
    with daemon(args) as d:
        if (outbox is None) != (results is None):
            fail("--outbox and --results go together")
        if claim is not None and outbox is None:
            fail("--claim goes with --outbox")
        if staged:
            from broker.staged import EVERY

            d.cfg = d.cfg._replace(staged=EVERY)
        broker, cards = guarded(lambda: _broker(d, outbox, results, sandbox, root, claim))
        from broker.hosting.warm_keeper import keeper_for

        pool = guarded(lambda: keeper_for(d.cfg))  # [sandbox] warm = N: N sandboxes ready
        runs = _runs(d, broker, pool)
        served = ", ".join(sorted(broker.outboxes)) or "none yet"
        d.start(
            wake=broker.wake,
            banner=f"broker: serving sandboxes: {terminal(served)}; "
            f"state in {d.cfg.state_dir}; Ctrl-C stops{_staged_note(d.cfg)}",
        )
        try:
            guarded(lambda: broker.serve(d.stop))
        finally:
            runs.close()
            if pool is not None:
                pool.close()
            if cards is not None:  # after the broker: its last observers have run
                cards.close()


def _runs(d: Daemon, broker: Broker, pool: WarmPool | None) -> RunService:
    """`broker run`s this broker runs for their clients (its lock names what it checked)."""
    from broker.hosting.run_service import RunService

    runs = RunService(d.cfg, broker.events, broker.lock.checked, pool)
    broker.runs = runs
    return runs


def _staged_note(cfg: Config) -> str:
    if not cfg.staged:
        return ""
    return f"; STAGED MODE for {terminal(cfg.staged.describe())}: nothing of it is applied"


def _broker(
    d: Daemon,
    outbox: Path | None,
    results: Path | None,
    sandbox: str,
    root: Path | None,
    claim: Path | None,
) -> tuple[Broker, PrCards | None]:
    """A broker on the attach-mode outbox and/or the sandboxes under the root, and its
    pull request cards when [integrations.github] approve_in_pr is set."""
    from broker.approval.notify import attach as notify
    from broker.inputs import digest
    from broker.intake.outbox import attach
    from broker.integrations.github_cards import attach_pr_cards
    from broker.loop.pipeline import Broker

    broker = Broker(d.cfg, d.registry, d.policy)
    try:
        # one owner per state dir (else one line), which runs `broker run`s checked alike
        inputs = digest(d.cfg.state_dir, d.cfg.source, d.cfg.policy_path)
        broker.lock.acquire("broker serve", checked=inputs)
    except BaseException:
        broker.ledger.close()
        raise
    if outbox is not None and results is not None:
        broker.add(attach(sandbox, outbox, results, d.cfg.state_dir, claim))
    if root is not None or outbox is None:
        broker.serve_root((root or d.cfg.state_dir) / "sandboxes")
    notify(broker, d.cfg, d.notifier)  # webhooks and Slack, as [notify] says
    cards = attach_pr_cards(broker, d.cfg)  # the pull request as the card (approve_in_pr)
    d.observe(broker)  # the request log; metrics and traces when broker.toml asks
    return broker, cards
