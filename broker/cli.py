"""The `broker` command: parses, calls, prints. Every user error is one line."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from broker import audit as audit_mod
from broker.config import Config, load_config
from broker.errors import BrokerError
from broker.policy import Policy, load_policy
from broker.registry import Registry, default_registry
from broker.render import terminal

app = typer.Typer(
    help="Sandbox-outbox effect broker: agents ask, policy and people decide, the host acts.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
policy_app = typer.Typer(help="Check and explain policy files.", no_args_is_help=True)
audit_app = typer.Typer(help="Read and verify the audit log.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")
app.add_typer(audit_app, name="audit")
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config", help="broker.toml (default: $BROKER_CONFIG, else <state>/broker.toml)"
    ),
]
StateOpt = Annotated[Path | None, typer.Option("--state", help="the state dir (ledger, audit log)")]
PolicyOpt = Annotated[Path | None, typer.Option("--policy", help="the policy file (TOML)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]

T = TypeVar("T")


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {terminal(message)}")
    raise typer.Exit(code)


def guarded(fn: Callable[[], T]) -> T:
    """Run `fn`; a BrokerError or OSError becomes one line on stderr and exit 2."""
    try:
        return fn()
    except BrokerError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))


def assemble(
    config: Path | None, state: Path | None, policy: Path | None
) -> tuple[Config, Registry, Policy]:
    def build() -> tuple[Config, Registry, Policy]:
        cfg = load_config(config, state_dir=state, policy=policy)
        registry = default_registry()
        registry.check_config(cfg.integrations)
        return cfg, registry, load_policy(cfg.policy_path, registry.reversibility())

    return guarded(build)


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("watchfiles").setLevel(logging.WARNING)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


@app.command()
def serve(
    outbox: Annotated[Path | None, typer.Option(help="an outbox to serve (attach mode)")] = None,
    results: Annotated[Path | None, typer.Option(help="where its results go (attach mode)")] = None,
    sandbox: Annotated[str, typer.Option(help="the sandbox id for --outbox")] = "default",
    root: Annotated[
        Path | None,
        typer.Option(help="serve every <root>/sandboxes/<id>/outbox (default root: the state dir)"),
    ] = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
    policy: PolicyOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Watch outboxes and answer every request until stopped (Ctrl-C)."""
    from broker.outbox import attach
    from broker.pipeline import Broker

    _logging(verbose)
    cfg, registry, pol = assemble(config, state, policy)
    if (outbox is None) != (results is None):
        fail("--outbox and --results go together")

    def start() -> Broker:
        broker = Broker(cfg, registry, pol)
        if outbox is not None and results is not None:
            broker.add(attach(sandbox, outbox, results, cfg.state_dir))
        if root is not None or outbox is None:
            broker.serve_root((root or cfg.state_dir) / "sandboxes")
        return broker

    broker = guarded(start)
    stop = _stop_on_signals()
    served = ", ".join(sorted(broker.outboxes)) or "none yet"
    err.print(
        f"broker: serving sandboxes: {terminal(served)}; state in {cfg.state_dir}; Ctrl-C stops"
    )
    guarded(lambda: broker.serve(stop))


@app.command()
def effects(json_out: JsonOpt = False, config: ConfigOpt = None, state: StateOpt = None) -> None:
    """List the registered effects with their flags and schemas."""
    registry = guarded(default_registry)
    rows = [
        {
            "effect": h.name,
            "integration": h.name.split(".", 1)[0],
            "reversible": h.reversible,
            "idempotent": h.idempotent,
            "undo": h.undo,
            "origin": registry.origin(h.name),
            "schema": h.schema,
        }
        for h in registry
    ]
    if json_out:
        out.print_json(json.dumps(rows))
        return
    table = Table("effect", "reversible", "idempotent", "undo", "from")
    for h in registry:
        table.add_row(
            h.name,
            "yes" if h.reversible else "no",
            "yes" if h.idempotent else "no",
            terminal(h.undo),
            terminal(registry.origin(h.name)),
        )
    out.print(table)


@policy_app.command("check")
def policy_check(file: Path, config: ConfigOpt = None, state: StateOpt = None) -> None:
    """Load a policy file and say whether it is valid."""
    registry = guarded(default_registry)
    pol = guarded(lambda: load_policy(file, registry.reversibility()))
    out.print(f"{terminal(str(file))}: ok, {len(pol.rules)} rule(s)")
    for rule in pol.rules:
        cond = f" when {dict(rule.when)}" if rule.when else ""
        extra = ""
        if rule.action == "approve":
            extra = (
                f" (approvals={rule.approvals}, timeout={rule.timeout_s:g}s, "
                f"on_timeout={rule.on_timeout})"
            )
        what = terminal(rule.effect + cond)
        out.print(f"  {rule.label}: {what} → {rule.action}{extra}: {terminal(rule.reason)}")


@policy_app.command("explain")
def policy_explain(
    request: Annotated[Path, typer.Argument(help="a request file (JSON)")],
    policy: PolicyOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Say which rule decides a request, and why the others do not."""
    from broker import intake

    cfg, registry, pol = assemble(config, state, policy)

    def explain() -> tuple[Any, list[str], bool]:
        data = Path(request).read_bytes()
        doc = intake.parse_json(data, cfg.limits.max_depth)
        if not isinstance(doc, dict) or not isinstance(doc.get("effect"), str):
            raise BrokerError(f"{request}: not a request (no 'effect')")
        params: dict[str, Any] = doc["params"] if isinstance(doc.get("params"), dict) else {}
        effect = doc["effect"]
        reversible = registry.get(effect).reversible if effect in registry else False
        verdict, lines = pol.explain(effect, params, reversible)
        return verdict, lines, reversible

    try:
        verdict, lines, _ = guarded(explain)
    except BrokerError as exc:  # Rejected from intake
        fail(str(exc))
    if json_out:
        out.print_json(json.dumps({"verdict": verdict.to_json(), "trace": lines}))
        return
    out.print(f"policy: {terminal(pol.source)}")
    for line in lines:
        out.print(f"  {terminal(line)}")
    out.print(f"→ [bold]{verdict.action}[/] by {verdict.rule}: {terminal(verdict.reason)}")


def _audit_path(config: Path | None, state: Path | None) -> tuple[Path, Config]:
    cfg = guarded(lambda: load_config(config, state_dir=state))
    return cfg.audit_path, cfg


@audit_app.command("verify")
def audit_verify(config: ConfigOpt = None, state: StateOpt = None) -> None:
    """Check the hash chain of the whole audit log; name the first broken line."""
    from broker.ledger import Ledger

    path, cfg = _audit_path(config, state)
    head = None
    if cfg.ledger_path.exists():
        ledger = guarded(lambda: Ledger(cfg.ledger_path))
        head = ledger.audit_head()
        ledger.close()
    count, fault = audit_mod.verify(path, head)
    if fault is not None:
        fail(f"{path}: line {fault.line}: {fault.problem}", code=1)
    out.print(f"{path}: ok, {count} event(s), chain intact")


def _print_events(events: list[dict[str, Any]], json_out: bool) -> None:
    for event in events:
        if json_out:
            sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")
            continue
        detail = " ".join(
            f"{k}={v}"
            for k, v in event.items()
            if k not in ("at", "event", "sandbox", "id", "effect", "prev", "hash", "seq", "sha256")
        )
        out.print(
            f"{event.get('at', '?')} {terminal(str(event.get('event')))} "
            f"{terminal(str(event.get('sandbox')))}/{terminal(str(event.get('id')))} "
            f"{terminal(str(event.get('effect') or '-'))} {terminal(detail)}"
        )


@audit_app.command("tail")
def audit_tail(
    lines: Annotated[int, typer.Option("-n", "--lines", help="how many events")] = 20,
    config: ConfigOpt = None,
    state: StateOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show the last events of the audit log."""
    path, _ = _audit_path(config, state)
    events = [e for _, e, _ in audit_mod.read_events(path) if e is not None]
    _print_events(events[-lines:] if lines > 0 else [], json_out)


@audit_app.command("export")
def audit_export(
    since: Annotated[
        str | None, typer.Option(help="ISO time or duration ago (e.g. 2026-11-01, 24h)")
    ] = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Write the audit events (JSON lines, with their hashes) since a time to stdout."""
    from datetime import timedelta

    from broker.models import iso, now
    from broker.policy import parse_duration

    path, _ = _audit_path(config, state)
    cutoff = None
    if since:
        try:
            cutoff = iso(now() - timedelta(seconds=parse_duration(since)))
        except ValueError:
            from datetime import datetime

            try:
                moment = datetime.fromisoformat(since.replace("Z", "+00:00"))
            except ValueError:
                fail(f"--since {since!r}: expected an ISO date/time or a duration like 24h")
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            cutoff = iso(moment)
    for _, event, _raw in audit_mod.read_events(path):
        if event is not None and (cutoff is None or str(event.get("at", "")) >= cutoff):
            sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
