"""The approval card on a terminal (`broker show`), and the prompt `broker run` puts to
the person at its terminal for each gated request."""

from __future__ import annotations

import queue
import sys
import threading
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len, chop_cells

from broker.cli.common import age, identity, out
from broker.config import Config
from broker.errors import BrokerError
from broker.registry import Registry
from broker.untrusted import neutralize, terminal

if TYPE_CHECKING:
    from broker.models import Record
    from broker.store.base import Store

QUESTION = (
    "approve? [a]pprove, [p] approve and propose a rule for requests like it, [d]eny, "
    "[s]kip (decide elsewhere): "
)
VERDICTS = {"a": "approve", "p": "approve", "d": "deny"}
ASK_REASON = "reason (the agent reads it): "
AGAIN = "answer a, p, d or s (s leaves it to another surface or its deadline)"
NEEDS_REASON = "a denial needs a reason: say what the agent should do instead"


def later(ref: str) -> str:
    """The exact commands that answer a request the prompt leaves open."""
    shown = terminal(ref)
    return (
        f"it waits for its deadline, or `broker approve {shown}` or "
        f'`broker deny {shown} --reason "what to do instead"`'
    )


def say(markup: str) -> None:
    """A line of prose: at a terminal wrapped at word boundaries (a word longer than a
    line is folded, never cropped); piped, one line as written, for grep."""
    if out.is_terminal:
        out.print(markup, soft_wrap=False, overflow="fold")
    else:
        out.print(markup)


def print_card(c: dict[str, Any]) -> None:
    """The approval card, readable in five seconds; every untrusted string neutralised,
    and every character of it shown: lines wrap to the terminal, nothing is cropped."""
    what = c["what"]
    status = terminal(f"[{c['status']}]")
    # the header in full (a rule's title would crop the ref people copy), then a rule
    say(f"[bold]{terminal(c['ref'])}[/]  {terminal(c['effect'] or '')}  {status}")
    out.rule()
    say(f"[bold]WHAT[/]   {terminal(what['title'])}")
    say(f"[bold]WHERE[/]  {terminal(c['where'] or '')}")
    for key, value in what["facts"]:
        say(f"         {terminal(str(key))}: {terminal(str(value))}")
    _print_body(what)
    why = c["why"]
    say(f"[bold]WHY IT STOPPED[/]  {terminal(str(why['rule']))}: {terminal(str(why['reason']))}")
    t = c["if_nobody_answers"]
    then = {"deny": "it is denied (fails closed)", "approve": "it is applied"}.get(
        t["on_timeout"] or "", "-"
    )
    if c["status"] == "pending":
        left = age(t["seconds_left"])
        say(f"[bold]IF NOBODY ANSWERS[/]  by {t['expires_at']} (in {left}), {then}")
    if c["agent_reason"]:
        said = terminal(c["agent_reason"])
        say(f"[bold]THE AGENT SAYS[/] [dim](its words, not verified)[/]: {said}")
    _print_decisions(c)


def _print_outcome(c: dict[str, Any]) -> None:
    """What came back: the warning first, the links, the output, when and how long."""
    say(f"[bold]OUTCOME[/]  {terminal(c['reason'] or '')}")
    if c.get("warning"):
        say(f"[bold yellow]WARNING[/]  {terminal(c['warning'])}")
    for link in c.get("links") or []:
        say(f"[bold]LINK[/]  {terminal(link['key'])}: {terminal(link['url'])}")
    for line in c.get("credential") or []:
        say(f"[bold]CREDENTIAL[/]  {terminal(line)}")
    if c.get("output") is not None:
        from broker.approval.card import output_text

        say("[bold]WHAT CAME BACK[/]")
        for gutter, piece, _ in body_rows(output_text(c["output"]), "json", out.width):
            out.print(f"[dim]{gutter}[/]{terminal(piece)}", soft_wrap=False, crop=False)
    spans = c.get("durations") or {}
    took = ", ".join(
        f"{label} {age(spans[key])}"
        for key, label in (("waited_s", "waited"), ("apply_s", "applied in"), ("total_s", "total"))
        if spans.get(key) is not None
    )
    if c.get("completed_at"):
        say(f"[bold]COMPLETED[/]  {c['completed_at']}" + (f" ({took})" if took else ""))
    steps = [
        f"{s['step']}"
        + (f" {s['at']}" if s["at"] else "")
        + (f" by {terminal(s['by'])}" if s["by"] else "")
        for s in c.get("timeline") or []
    ]
    if steps:
        say(f"[bold]TIMELINE[/]  {' → '.join(steps)}")


FIRST, MORE = "│ ", "┆ "  # a line of the content; the same line, continued
TAB = "→   "  # a tab, shown (four cells)
_STYLES = {"+": "green", "-": "red", "@": "cyan"}


def body_rows(body: str, kind: str, width: int) -> list[tuple[str, str, str]]:
    """The exact content as (gutter, text, style) rows no wider than `width` cells: each
    line neutralised, tabs shown, cut into as many rows as it needs (never cropped)."""
    shown = neutralize(body, keep_newlines=True)
    lines = shown.split("\n")
    if len(lines) > 1 and shown.endswith("\n"):
        lines.pop()
    room = max(8, width - cell_len(FIRST))
    rows = []
    for line in lines:
        style = (
            _STYLES.get(line[:1], "")
            if kind == "diff" and not line.startswith(("+++", "---"))
            else ""
        )
        for i, piece in enumerate(chop_cells(line.replace("\t", TAB), room) or [""]):
            rows.append((FIRST if i == 0 else MORE, piece, style))
    return rows


def _print_body(what: dict[str, Any]) -> None:
    """The exact content (diff, JSON, text), every character of it, wrapped to fit."""
    from rich.text import Text

    if not what["body"]:
        return
    out.print(
        f"[bold]EXACT CONTENT[/] [dim]({MORE.strip()} continues a line; {TAB.strip()} is a tab)[/]"
    )
    for gutter, piece, style in body_rows(what["body"], what["body_kind"], out.width):
        row = Text(gutter, style="dim")
        row.append(piece, style=style)
        out.print(row, soft_wrap=False, no_wrap=True, crop=False, overflow="ignore")


def _print_decisions(c: dict[str, Any]) -> None:
    """Flags, approvals so far, the outcome and each decision; then the sha256 to quote."""
    flags = f"reversible: {_yn(c['reversible'])}, idempotent: {_yn(c['idempotent'])}"
    say(f"[bold]FLAGS[/]  {flags}; undo: {terminal(c['undo'] or '-')}")
    ap = c["approvals"]
    have = ", ".join(ap["have"]) or "none yet"
    say(f"[bold]APPROVALS[/]  {len(ap['have'])} of {ap['needed']} ({terminal(have)})")
    for d in c["decisions"]:
        said = f": {terminal(d['reason'])}" if d["reason"] else ""
        say(
            f"[bold]DECISION[/]  {d['at']} {terminal(d['approver'])} {d['verdict']} "
            f"via {d['surface']}{said}"
        )
    if c["status"] != "pending":
        _print_outcome(c)
    say(f"[dim]request sha256 {c['request_sha256']}[/]")


def _yn(flag: bool | None) -> str:
    return "?" if flag is None else ("yes" if flag else "no")


class Prompt:
    """Asks the person at the terminal about each gated request, one at a time, on its
    own thread: the broker keeps serving meanwhile; unanswered requests wait for other
    surfaces (`broker approve`, the inbox) or their deadline."""

    def __init__(self, cfg: Config, registry: Registry) -> None:
        self.cfg = cfg
        self.registry = registry
        self.queue: queue.Queue[Record] = queue.Queue()
        self.open: str | None = None  # the request a question is open about
        threading.Thread(target=self._run, name="broker-prompt", daemon=True).start()

    def __call__(self, record: Record) -> None:
        """Called by the broker when a request starts waiting; never blocks it."""
        self.queue.put(record)

    def _run(self) -> None:
        from broker.store.factory import open_store

        ledger = open_store(self.cfg)
        asked: set[tuple[str, str]] = set()
        while True:
            record = self.queue.get()
            if record.key in asked:
                continue
            asked.add(record.key)
            current = ledger.get(*record.key)
            if current is None or current.state != "pending":
                continue
            try:
                self._ask(ledger, current)
            except EOFError:  # the terminal is gone: the rest wait for other surfaces
                return

    def _ask(self, ledger: Store, current: Record) -> None:
        """Show the card, read a verdict and a reason, and record them; a key it does not
        know, or a denial without a reason, is asked again, never taken as an answer."""
        from broker.approval.decisions import Ballot, card, decide_and_wake

        ref = f"{current.sandbox}/{current.id}"
        print_card(card(ledger, current, self.registry))
        self.open = ref
        try:
            key = self._key()
            if key == "s":
                out.print(f"skipped: {later(ref)}")
                return
            verdict = VERDICTS[key]
            reason = self._reason(verdict)
        except EOFError:
            out.print(f"\nnot answered: {later(ref)}")
            raise
        finally:
            self.open = None
        who = identity(None, self.cfg)
        try:
            decide_and_wake(
                self.cfg, ledger, Ballot(ref, verdict, who, reason, "prompt", current.sha256)
            )
            out.print(f"{verdict}d" if verdict == "approve" else "denied")
        except BrokerError as exc:
            out.print(f"[red]not recorded:[/] {terminal(str(exc))}")
            return
        if key == "p":
            self._propose(ledger, current, who)

    @staticmethod
    def _key() -> str:
        while True:
            key = input(QUESTION).strip().lower()[:1]
            if key in VERDICTS or key == "s":
                return key
            out.print(AGAIN)

    @staticmethod
    def _reason(verdict: str) -> str | None:
        while True:
            reason = input(ASK_REASON).strip() or None
            if reason is not None or verdict != "deny":
                return reason
            out.print(NEEDS_REASON)

    def close(self) -> None:
        """The run ended: a question still open is named with the commands that answer it,
        and what the person typed for it is dropped, not handed to the shell."""
        ref = self.open
        if ref is None:
            return
        out.print(f"\nthe run ended before an answer: {later(ref)}")
        try:
            import termios

            termios.tcflush(sys.stdin.fileno(), termios.TCIFLUSH)
        except (ImportError, OSError, ValueError):
            pass

    def _propose(self, ledger: Store, record: Record, who: str) -> None:
        """The narrowest rule for an approved request, as a proposal someone accepts."""
        from broker.approval.decisions import wake
        from broker.cli.rules import print_proposal
        from broker.policy.ruleset import load_policy
        from broker.review.proposals import propose

        try:
            policy = load_policy(
                self.cfg.policy_path, self.registry.reversibility(), self.registry.schemas()
            )
            number, value, _ = propose(ledger, policy, ledger.get(*record.key) or record, who)
        except BrokerError as exc:
            out.print(f"no rule proposed: {terminal(str(exc))}")
            return
        wake(self.cfg, ledger, "proposal")
        out.print(
            f"proposed as rule {number} ({value.get('state')}); `broker policy accept {number}`"
        )
        print_proposal({"number": number, **value})
