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
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from broker import audit as audit_mod
from broker.config import Config, load_config
from broker.errors import BrokerError
from broker.policy import Policy, load_policy
from broker.registry import Registry, default_registry

if TYPE_CHECKING:
    from broker.ledger import Ledger, Record
from broker.render import neutralize, terminal
from broker.web.cli import app as web_app  # light: no fastapi/uvicorn import

app = typer.Typer(
    help="Sandbox-outbox effect broker: agents ask, policy and people decide, the host acts.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
image_app = typer.Typer(help="Build the sandbox image.", no_args_is_help=True)
sandbox_app = typer.Typer(help="List and remove sandbox containers.", no_args_is_help=True)
policy_app = typer.Typer(help="Check and explain policy files.", no_args_is_help=True)
audit_app = typer.Typer(help="Read and verify the audit log.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")
app.add_typer(image_app, name="image")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(web_app, name="web")
app.add_typer(audit_app, name="audit")
# no emoji codes: an agent's ":white_check_mark: approved" must print as written
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config", help="broker.toml (default: $BROKER_CONFIG, else <state>/broker.toml)"
    ),
]
StateOpt = Annotated[Path | None, typer.Option("--state", help="the state dir (ledger, audit log)")]
PolicyOpt = Annotated[Path | None, typer.Option("--policy", help="the policy file (TOML)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
ListenOpt = Annotated[
    str | None,
    typer.Option(help="also serve the web inbox and /api/v1 on HOST:PORT (e.g. 127.0.0.1:8700)"),
]
InsecureOpt = Annotated[
    bool, typer.Option("--insecure-listen", help="allow --listen beyond loopback without TLS")
]

T = TypeVar("T")


def print_json(data: Any) -> None:
    """JSON for scripts: ASCII only, so no control or bidi character reaches a terminal."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


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
        registry.check_config(cfg.integrations, cfg.base_dir)
        return cfg, registry, load_policy(cfg.policy_path, registry.reversibility())

    return guarded(build)


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("watchfiles").setLevel(logging.WARNING)


def _stop_on_signals(*on_stop: Callable[[], None]) -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()
        for hook in on_stop:
            hook()

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
    listen: ListenOpt = None,
    insecure_listen: InsecureOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Watch outboxes and answer every request until stopped (Ctrl-C)."""
    from broker.notify import Notifier, webhooks_from
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
        hooks = webhooks_from(cfg.notify)
        if hooks:
            broker.notify_with(Notifier(hooks, inbox_url=cfg.notify.get("inbox_url")))
        return broker

    from broker.web.server import start_web

    broker = guarded(start)
    web = guarded(lambda: start_web(cfg, registry, listen, insecure=insecure_listen))
    stop = _stop_on_signals(broker.wake)
    served = ", ".join(sorted(broker.outboxes)) or "none yet"
    err.print(
        f"broker: serving sandboxes: {terminal(served)}; state in {cfg.state_dir}; Ctrl-C stops"
    )
    if web is not None:
        err.print(f"broker: web inbox on {web.url}")
    try:
        guarded(lambda: broker.serve(stop))
    finally:
        if web is not None:
            web.stop()


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
        print_json(rows)
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

    def explain() -> tuple[Any, list[str]]:
        data = Path(request).read_bytes()
        doc = intake.parse_json(data, cfg.limits.max_depth)
        if not isinstance(doc, dict) or not isinstance(doc.get("effect"), str):
            raise BrokerError(f"{request}: not a request (no 'effect')")
        params: dict[str, Any] = doc["params"] if isinstance(doc.get("params"), dict) else {}
        effect = doc["effect"]
        if effect not in registry:
            raise BrokerError(
                f"no effect named {effect!r} is registered: the broker answers such a "
                "request `invalid` before any rule is consulted"
            )
        return pol.explain(effect, params, registry.get(effect).reversible)

    try:
        verdict, lines = guarded(explain)
    except BrokerError as exc:  # Rejected from intake
        fail(str(exc))
    if json_out:
        print_json({"verdict": verdict.to_json(), "trace": lines})
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
    if not path.exists():
        fail(f"no audit log at {path}: is --state (or the config's state_dir) right?", code=1)
    count, fault = audit_mod.verify(path, head)
    if fault is not None:
        fail(f"{path}: line {fault.line}: {fault.problem}", code=1)
    out.print(f"{path}: ok, {count} event(s), chain intact")


def _print_events(events: list[dict[str, Any]], json_out: bool) -> None:
    for event in events:
        if json_out:
            sys.stdout.write(json.dumps(event) + "\n")  # ASCII: nothing hides in it
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

    from broker.clock import parse_duration
    from broker.models import iso, now

    path, _ = _audit_path(config, state)
    cutoff = None
    if since:
        try:
            cutoff = iso(now() - timedelta(seconds=parse_duration(since)))
        except (ValueError, OverflowError):
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
            sys.stdout.write(json.dumps(event) + "\n")


def _ledger(cfg: Config) -> Ledger:
    from broker.ledger import Ledger

    if not cfg.ledger_path.exists():
        fail(f"no ledger at {cfg.ledger_path}: has a broker run with this state dir?")
    return guarded(lambda: Ledger(cfg.ledger_path))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


@app.command()
def pending(json_out: JsonOpt = False, config: ConfigOpt = None, state: StateOpt = None) -> None:
    """What waits for a person, oldest first."""
    from broker.approval import card
    from broker.models import now, parse_iso

    cfg = guarded(lambda: load_config(config, state_dir=state))
    ledger = _ledger(cfg)
    rows = []
    for record in ledger.in_states(["pending"]):
        c = card(ledger, record)
        received = parse_iso(record.received_at)
        c["age_s"] = round((now() - received).total_seconds(), 1) if received else None
        rows.append(c)
    if json_out:
        print_json(rows)
        return
    if not rows:
        out.print("nothing waits for a decision")
        return
    table = Table("effect", "what", "age", "time left", "then", "approvals")
    # the ref is what people copy into `broker approve`: never cut it
    table.add_column("ref", no_wrap=True, min_width=max(len(c["ref"]) for c in rows))
    table.columns.insert(0, table.columns.pop())
    for c in rows:
        left = c["if_nobody_answers"]["seconds_left"]
        table.add_row(
            terminal(c["ref"]),
            terminal(c["effect"] or "-"),
            terminal(c["what"]["title"])[:80],
            _age(c["age_s"]),
            _age(left),
            c["if_nobody_answers"]["on_timeout"] or "-",
            f"{len(c['approvals']['have'])}/{c['approvals']['needed']}",
        )
    out.print(table)


def print_card(c: dict[str, Any]) -> None:
    """The approval card, readable in five seconds; every untrusted string neutralised."""
    from rich.panel import Panel
    from rich.syntax import Syntax

    what = c["what"]
    status = terminal(f"[{c['status']}]")
    out.rule(f"[bold]{terminal(c['ref'])}[/]  {terminal(c['effect'] or '')}  {status}")
    out.print(f"[bold]WHAT[/]   {terminal(what['title'])}")
    out.print(f"[bold]WHERE[/]  {terminal(c['where'] or '')}")
    for key, value in what["facts"]:
        out.print(f"         {terminal(str(key))}: {terminal(str(value))}")
    body = neutralize(what["body"] or "", keep_newlines=True)
    if body:
        lexer = {"diff": "diff", "json": "json"}.get(what["body_kind"], "text")
        out.print(
            Panel(Syntax(body, lexer, word_wrap=True, theme="ansi_dark"), title="exact content")
        )
    why = c["why"]
    out.print(
        f"[bold]WHY IT STOPPED[/]  {terminal(str(why['rule']))}: {terminal(str(why['reason']))}"
    )
    t = c["if_nobody_answers"]
    then = {"deny": "it is denied (fails closed)", "approve": "it is applied"}.get(
        t["on_timeout"] or "", "-"
    )
    if c["status"] == "pending":
        left = _age(t["seconds_left"])
        out.print(f"[bold]IF NOBODY ANSWERS[/]  by {t['expires_at']} (in {left}), {then}")
    if c["agent_reason"]:
        said = terminal(c["agent_reason"])
        out.print(f"[bold]THE AGENT SAYS[/] [dim](its words, not verified)[/]: {said}")
    flags = f"reversible: {_yn(c['reversible'])}, idempotent: {_yn(c['idempotent'])}"
    out.print(f"[bold]FLAGS[/]  {flags}; undo: {terminal(c['undo'] or '-')}")
    ap = c["approvals"]
    have = ", ".join(ap["have"]) or "none yet"
    out.print(f"[bold]APPROVALS[/]  {len(ap['have'])} of {ap['needed']} ({terminal(have)})")
    if c["status"] != "pending":
        out.print(f"[bold]OUTCOME[/]  {terminal(c['reason'] or '')}")
    for d in c["decisions"]:
        said = f": {terminal(d['reason'])}" if d["reason"] else ""
        out.print(
            f"[bold]DECISION[/]  {d['at']} {terminal(d['approver'])} {d['verdict']} "
            f"via {d['surface']}{said}"
        )
    out.print(f"[dim]request sha256 {c['request_sha256']}[/]")


def _yn(flag: bool | None) -> str:
    return "?" if flag is None else ("yes" if flag else "no")


RefArg = Annotated[str, typer.Argument(help="the request's id, or SANDBOX/ID")]


@app.command()
def show(
    ref: RefArg, json_out: JsonOpt = False, config: ConfigOpt = None, state: StateOpt = None
) -> None:
    """The approval card of one request: what, where, why it stopped, what happens next."""
    from broker.approval import card

    cfg = guarded(lambda: load_config(config, state_dir=state))
    ledger = _ledger(cfg)
    record = guarded(lambda: ledger.find(ref))
    registry = guarded(default_registry)
    c = card(ledger, record, registry)
    if json_out:
        print_json(c)
        return
    print_card(c)


def _identity(as_: str | None, cfg: Config) -> str:
    import getpass

    if as_ is not None:
        if not cfg.allow_as:
            fail("--as is not allowed on this host (set allow_as = true under [broker])")
        return as_
    return getpass.getuser()


def _decide(
    ref: str,
    verdict: str,
    reason: str | None,
    as_: str | None,
    sha256: str | None,
    config: Path | None,
    state: Path | None,
) -> None:
    from broker.approval import decide_and_wake

    cfg = guarded(lambda: load_config(config, state_dir=state))
    ledger = _ledger(cfg)
    who = _identity(as_, cfg)
    result = guarded(
        lambda: decide_and_wake(
            cfg, ledger, ref, verdict, approver=who, reason=reason, surface="cli", sha256=sha256
        )
    )
    ref_text = terminal(f"{result.record.sandbox}/{result.record.id}")
    if not result.settled:
        out.print(
            f"{ref_text}: approval {result.approvals} of {result.needed} recorded; waiting for more"
        )
    elif verdict == "approve":
        by = terminal(str(result.record.decided_by))
        out.print(f"{ref_text}: approved by {by}; the broker applies it")
    else:
        out.print(f"{ref_text}: denied; the agent reads: {terminal(str(result.record.reason))}")


ShaOpt = Annotated[
    str | None, typer.Option("--sha256", help="the request sha256 you saw (at least 12 hex digits)")
]
AsOpt = Annotated[str | None, typer.Option("--as", help="decide as this name (if allow_as)")]


@app.command()
def approve(
    ref: RefArg,
    reason: Annotated[str | None, typer.Option(help="why; shown to the agent")] = None,
    as_: AsOpt = None,
    sha256: ShaOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Approve a pending request (one of its approvals, under a quorum rule)."""
    _decide(ref, "approve", reason, as_, sha256, config, state)


@app.command()
def deny(
    ref: RefArg,
    reason: Annotated[str, typer.Option(help="why, and what to do instead: the agent reads it")],
    as_: AsOpt = None,
    sha256: ShaOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Deny a pending request; the reason goes back to the agent."""
    _decide(ref, "deny", reason, as_, sha256, config, state)


@app.command()
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

    cfg = guarded(lambda: load_config(config, state_dir=state))
    cutoff = None
    if since:
        try:
            cutoff = now() - timedelta(seconds=parse_duration(since))
        except ValueError:
            fail(f"--since {since!r}: expected a duration like 24h or 7d")
    ledger = _ledger(cfg)
    summary = summarize(ledger.all(), cutoff)
    if json_out:
        print_json(summary)
        return
    table = Table(
        "effect",
        "auto",
        "approved",
        "denied",
        "expired",
        "invalid",
        "failed",
        "approval rate",
        "median wait",
        "p90 wait",
    )
    for name, row in [*summary["effects"].items(), ("(all)", summary["overall"])]:
        n = row["counts"]
        rate = row["approval_rate"]
        table.add_row(
            terminal(name),
            *(str(n[k]) for k in ("auto", "approved", "denied", "expired", "invalid", "failed")),
            "-" if rate is None else f"{rate:.0%}",
            _age(row["median_time_to_decision_s"]),
            _age(row["p90_time_to_decision_s"]),
        )
    out.print(table)
    for name, row in summary["effects"].items():
        if row["rubber_stamp"]:
            out.print(f"[yellow]⚠ {terminal(name)}[/]: {row['advice']}")


@app.command()
def undo(
    ref: RefArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    as_: AsOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Reverse an applied effect, when its handler can; shows what it will do first."""
    from broker import undo as undo_mod
    from broker.audit import AuditLog, flush

    cfg, registry, _ = assemble(config, state, None)
    ledger = _ledger(cfg)
    chosen = guarded(lambda: undo_mod.plan(ledger, registry, cfg, ref))
    preview = chosen.preview
    out.print(f"[bold]UNDO[/] {terminal(preview.title)}")
    out.print(f"[bold]WHERE[/] {terminal(preview.target)}")
    for key, value in preview.facts:
        out.print(f"      {terminal(key)}: {terminal(value)}")
    if preview.body:
        out.print(neutralize(preview.body, keep_newlines=True), markup=False)
    if not yes:
        if not sys.stdin.isatty():
            fail("confirm with --yes when not at a terminal")
        if not typer.confirm("apply this undo?", default=False):
            fail("not undone", code=1)
    who = _identity(as_, cfg)
    record = guarded(lambda: undo_mod.execute(ledger, cfg, chosen, who))
    guarded(lambda: flush(ledger, AuditLog(cfg.audit_path)))
    if record.state != "applied":
        fail(f"undo failed: {record.reason}", code=1)
    out.print(f"undone: {terminal(ref)} (recorded as {record.sandbox}/{terminal(record.id)})")


@app.command()
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
    from broker import undo as undo_mod
    from broker.audit import AuditLog, flush

    if applied is None:
        fail("say what you found: --applied or --not-applied")
    cfg = guarded(lambda: load_config(config, state_dir=state))
    ledger = _ledger(cfg)
    who = _identity(as_, cfg)
    record = guarded(lambda: undo_mod.reconcile(ledger, ref, bool(applied), who, reason))
    guarded(lambda: flush(ledger, AuditLog(cfg.audit_path)))
    found = "applied" if applied else "not applied"
    out.print(f"{terminal(record.sandbox)}/{terminal(record.id)}: recorded as {found} by {who}")


class Prompt:
    """Asks the person at the terminal about each gated request, one at a time, on its
    own thread: the broker keeps serving meanwhile; unanswered requests wait for other
    surfaces (`broker approve`, the inbox) or their deadline."""

    def __init__(self, cfg: Config, registry: Registry) -> None:
        import queue

        self.cfg = cfg
        self.registry = registry
        self.queue: queue.Queue[Record] = queue.Queue()
        threading.Thread(target=self._run, name="broker-prompt", daemon=True).start()

    def __call__(self, record: Record) -> None:
        self.queue.put(record)

    def _run(self) -> None:
        from broker.approval import card, decide_and_wake
        from broker.ledger import Ledger

        ledger = Ledger(self.cfg.ledger_path)
        asked: set[tuple[str, str]] = set()
        while True:
            record = self.queue.get()
            if record.key in asked:
                continue
            asked.add(record.key)
            current = ledger.get(*record.key)
            if current is None or current.state != "pending":
                continue
            print_card(card(ledger, current, self.registry))
            try:
                answer = input("approve? [a]pprove, [d]eny, [s]kip (decide elsewhere): ")
            except EOFError:
                return
            verdict = {"a": "approve", "d": "deny"}.get(answer.strip().lower()[:1])
            if verdict is None:
                out.print("skipped: it waits for `broker approve`/`broker deny` or its deadline")
                continue
            reason = input("reason (the agent reads it): ").strip() or None
            try:
                decide_and_wake(
                    self.cfg,
                    ledger,
                    f"{current.sandbox}/{current.id}",
                    verdict,
                    approver=_identity(None, self.cfg),
                    reason=reason,
                    surface="prompt",
                    sha256=current.sha256,
                )
                out.print(f"{verdict}d" if verdict == "approve" else "denied")
            except BrokerError as exc:
                out.print(f"[red]not recorded:[/] {terminal(str(exc))}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    image: Annotated[str | None, typer.Option(help="the agent image (default: built-in)")] = None,
    name: Annotated[str | None, typer.Option(help="the sandbox id (default: random)")] = None,
    workspace: Annotated[
        Path | None, typer.Option(help="a directory mounted read-write at /workspace")
    ] = None,
    detach: Annotated[bool, typer.Option(help="start and leave it to `broker serve`")] = False,
    config: ConfigOpt = None,
    state: StateOpt = None,
    policy: PolicyOpt = None,
    listen: ListenOpt = None,
    insecure_listen: InsecureOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run CMD in a new sandbox and serve its outbox until it exits: broker run -- CMD ARGS."""
    from broker.runner import RunOptions
    from broker.runner import run as run_sandbox

    command = list(ctx.args)
    if not command:
        fail("give the command to run after --, e.g. broker run -- python3 agent.py")
    _logging(verbose)
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.WARNING)
    cfg, registry, pol = assemble(config, state, policy)
    if workspace is not None and not workspace.is_dir():
        fail(f"--workspace {workspace}: not a directory")
    prompt = Prompt(cfg, registry) if sys.stdin.isatty() and not detach else None
    options = RunOptions(
        command=command,
        image=image,
        name=name,
        workspace=workspace.absolute() if workspace else None,
        detach=detach,
        on_pending=prompt,
        say=lambda text: err.print(terminal(text), highlight=False),
    )
    stop_requested = threading.Event()

    def interrupted(signum: int, frame: Any) -> None:
        stop_requested.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    from broker.web.server import start_web

    web = guarded(lambda: start_web(cfg, registry, listen, insecure=insecure_listen))
    if web is not None:
        err.print(f"broker: web inbox on {web.url}")
    try:
        code = guarded(lambda: run_sandbox(cfg, registry, pol, options))
    except KeyboardInterrupt:
        err.print("interrupted: the sandbox was removed")
        raise typer.Exit(130) from None
    finally:
        if web is not None:
            web.stop()
    raise typer.Exit(code)


@image_app.command("build")
def image_build(
    tag: Annotated[str | None, typer.Option(help="the image tag")] = None,
    force: Annotated[bool, typer.Option(help="rebuild even if it is current")] = False,
) -> None:
    """Build the agent image (from python:3.12-slim, or from Debian packages offline)."""
    from broker import sandbox

    def build() -> str:
        return sandbox.ensure_image(
            sandbox.engine(), tag or sandbox.DEFAULT_IMAGE, force=force, log=err.print
        )

    out.print(f"image ready: {guarded(build)}")


@sandbox_app.command("ls")
def sandbox_ls(json_out: JsonOpt = False) -> None:
    """Sandbox containers on this engine (left behind by a crash, or detached)."""
    from broker import sandbox

    def listing() -> list[dict[str, str]]:
        return [
            {
                "sandbox": c.labels.get(sandbox.LABEL, "?"),
                "container": c.short_id,
                "name": str(c.name),
                "status": c.status,
            }
            for c in sandbox.leftovers(sandbox.engine())
        ]

    rows = guarded(listing)
    if json_out:
        print_json(rows)
        return
    if not rows:
        out.print("no sandbox containers")
        return
    table = Table("sandbox", "container", "name", "status")
    for row in rows:
        table.add_row(*(terminal(row[k]) for k in ("sandbox", "container", "name", "status")))
    out.print(table)


@sandbox_app.command("rm")
def sandbox_rm(
    ids: Annotated[list[str] | None, typer.Argument(help="sandbox ids (default: none)")] = None,
    all_: Annotated[bool, typer.Option("--all", help="remove every sandbox container")] = False,
) -> None:
    """Remove sandbox containers (their ledger history and results are kept)."""
    from broker import sandbox

    if not ids and not all_:
        fail("name the sandbox ids to remove, or --all")

    def remove() -> int:
        count = 0
        for c in sandbox.leftovers(sandbox.engine()):
            if all_ or c.labels.get(sandbox.LABEL) in (ids or []):
                sandbox.remove(c)
                count += 1
        return count

    out.print(f"removed {guarded(remove)} container(s)")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
