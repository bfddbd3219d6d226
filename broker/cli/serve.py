"""`broker serve` (outboxes until stopped) and `broker run` (one sandbox until it exits),
both started by broker.cli.daemon."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.cli.common import ConfigOpt, PolicyOpt, StateOpt, err, fail, guarded
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
    from broker.cli.prompt import Prompt
    from broker.config import Config
    from broker.hosting.runner import RunOptions
    from broker.integrations.github_cards import PrCards
    from broker.loop.pipeline import Broker

# `broker run -- CMD ARGS`: everything after the options is the sandbox's command
RUN_SETTINGS: dict[str, Any] = {"allow_extra_args": True, "ignore_unknown_options": True}


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
WorkspaceOpt = Annotated[
    Path | None, typer.Option(help="a directory mounted read-write at /workspace")
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

            d.cfg = dataclasses.replace(d.cfg, staged=EVERY)
        broker, cards = guarded(lambda: _broker(d, outbox, results, sandbox, root, claim))
        from broker.hosting.warm_keeper import keeper_for

        pool = guarded(lambda: keeper_for(d.cfg))  # [sandbox] warm = N: N sandboxes ready
        served = ", ".join(sorted(broker.outboxes)) or "none yet"
        d.start(
            wake=broker.wake,
            banner=f"broker: serving sandboxes: {terminal(served)}; "
            f"state in {d.cfg.state_dir}; Ctrl-C stops{_staged_note(d.cfg)}",
        )
        try:
            guarded(lambda: broker.serve(d.stop))
        finally:
            if pool is not None:
                pool.close()
            if cards is not None:  # after the broker: its last observers have run
                cards.close()


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
    from broker.intake.outbox import attach
    from broker.integrations.github_cards import attach_pr_cards
    from broker.loop.pipeline import Broker

    broker = Broker(d.cfg, d.registry, d.policy)
    try:
        broker.lock.acquire("broker serve")  # one owner per state dir: else one line
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


def run(
    ctx: typer.Context,
    image: Annotated[str | None, typer.Option(help="the agent image (default: built-in)")] = None,
    name: Annotated[str | None, typer.Option(help="the sandbox id (default: random)")] = None,
    workspace: WorkspaceOpt = None,
    detach: Annotated[bool, typer.Option(help="start and leave it to `broker serve`")] = False,
    runtime: Annotated[
        str | None, typer.Option(help="docker or podman (default: [sandbox] runtime, else docker)")
    ] = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
    policy: PolicyOpt = None,
    listen: ListenOpt = None,
    insecure_listen: InsecureOpt = False,
    verbose: VerboseOpt = False,
    log_format: LogFormatOpt = None,
) -> None:
    """Run CMD in a new sandbox and serve its outbox until it exits: broker run -- CMD ARGS."""
    from broker.hosting.runner import run as run_sandbox

    command = list(ctx.args)
    if not command:
        fail("give the command to run after --, e.g. broker run -- python3 agent.py")
    args = DaemonArgs(
        config=config,
        state=state,
        policy=policy,
        listen=listen,
        insecure_listen=insecure_listen,
        verbose=verbose,
        log_format=log_format,
    )
    with daemon(args, quiet=True) as d:
        options, prompt = _run_options(d, command, image, name, workspace, detach)
        options.runtime = runtime
        d.start(interrupt=True)
        try:
            code = guarded(lambda: run_sandbox(d.cfg, d.registry, d.policy, options))
        except KeyboardInterrupt:
            if prompt is not None:
                prompt.close()
            err.print("interrupted: the sandbox was removed")
            raise typer.Exit(130) from None
        if prompt is not None:
            prompt.close()
    raise typer.Exit(code)


def _run_options(
    d: Daemon,
    command: list[str],
    image: str | None,
    name: str | None,
    workspace: Path | None,
    detach: bool,
) -> tuple[RunOptions, Prompt | None]:
    """What `broker run` asks of the runner, and the terminal's prompt about what waits
    (when stdin is one and the run is not detached)."""
    from broker.cli.prompt import Prompt
    from broker.hosting.runner import RunOptions
    from broker.integrations.github_cards import on_broker

    if workspace is not None and not workspace.is_dir():
        fail(f"--workspace {workspace}: not a directory")
    prompt = Prompt(d.cfg, d.registry) if sys.stdin.isatty() and not detach else None
    options = RunOptions(
        command=command,
        image=image,
        name=name,
        workspace=workspace.absolute() if workspace else None,
        detach=detach,
        on_pending=prompt,
        notifier=d.notifier,
        say=lambda text: err.print(terminal(text), highlight=False),
        on_broker=on_broker(d.cfg),  # GitHub's threads, when approve_in_pr is set
    )
    return options, prompt
