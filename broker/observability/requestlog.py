"""`broker serve`'s request log: one line per request event, on the `broker.requests`
logger, every string from a sandbox or a person neutralised (broker.untrusted).

    received default/3f6c… files.write (file notes.json)
    pending  default/3f6c… files.write: waits for a person until 2026-11-29T19:00:00.000Z,
             then deny (rules[1])
    decided  default/3f6c… files.write: approved by alice via cli: checked it
    applied  default/3f6c… files.write
    applied  default/9a01… http.request: applied, but the service answered HTTP 501 (WARNING)

Outcomes the broker itself reached come from its audit events; outcomes decided in
other processes (a person's denial at the CLI or in the inbox) from the results the
broker writes for them. `applying` is logged at DEBUG (`--verbose`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from broker.models import TERMINAL, Record
from broker.observability.logformat import trace_id_for
from broker.observability.tap import Event
from broker.outcomes import service_warning
from broker.store.base import Store
from broker.untrusted import neutralize

log = logging.getLogger("broker.requests")
WARN = frozenset({"failed", "unknown", "duplicate_id"})
TIMEOUT = "policy (on_timeout)"
MAX_TRACKED = 100_000  # decisions awaiting their apply; bounded against a flood


def _s(value: Any) -> str:
    return neutralize(str(value))


class ServeLog:
    """An observer (broker.observability.tap) that logs each request's events."""

    name = "request log"

    def __init__(self, ledger: Store) -> None:
        self.ledger = ledger  # the loop's connection: who approved, when it learns of it
        self._decided: set[tuple[str, str]] = set()  # a decided event seen, apply to come
        self._told: set[tuple[str, str]] = set()  # outcomes logged from this flush's events

    def events(self, events: Sequence[Event]) -> None:
        self._told.clear()
        for event in events:
            line = self._line(event)
            if line is not None:
                kind = str(event.get("event"))
                level = logging.WARNING if kind in WARN or event.get("warning") else logging.INFO
                if kind == "applying":
                    level = logging.DEBUG
                key = (str(event.get("sandbox")), str(event.get("id")))
                log.log(level, "%s", line, extra=_fields(kind, key, event.get("effect")))

    def results(self, records: Sequence[Record]) -> None:
        for record in records:
            if record.terminal and record.key not in self._told:
                # decided elsewhere (or rewritten at start): the broker's stream has no event
                ref = f"{_s(record.sandbox)}/{_s(record.id)}"
                warning = service_warning(record.state, record.output)
                level = logging.WARNING if record.state in WARN or warning else logging.INFO
                log.log(
                    level,
                    "%-8s %s %s: %s",
                    record.state,
                    ref,
                    _s(record.effect or "-"),
                    _s(warning or record.reason or ""),
                    extra=_fields(record.state, record.key, record.effect),
                )

    def _line(self, event: Event) -> str | None:
        kind = str(event.get("event"))
        key = (str(event.get("sandbox")), str(event.get("id")))
        head = f"{_s(kind):<8} {_s(key[0])}/{_s(key[1])} {_s(event.get('effect') or '-')}"
        if kind in TERMINAL:
            self._told.add(key)
            self._decided.discard(key)
        if kind == "replayed" and event.get("status") in TERMINAL:
            self._told.add(key)
        if kind == "decided" and len(self._decided) < MAX_TRACKED:
            self._decided.add(key)
        if kind == "applying":
            if key not in self._decided:  # approved by people, in another process
                log.info(
                    "%s",
                    self._person(key, event),
                    extra=_fields("decided", key, event.get("effect")),
                )
            self._decided.discard(key)
        if kind == "decided" and event.get("action") == "approve" and event.get("by") != TIMEOUT:
            return self._person(key, event)  # one wording for a person's approval
        return head + _detail(kind, event)

    def _person(self, key: tuple[str, str], event: Event) -> str:
        """`decided … approved by alice via cli: checked it`, from the ledger's decisions."""
        said = [
            f"{_s(d.approver)} via {_s(d.surface)}" + (f": {_s(d.reason)}" if d.reason else "")
            for d in self.ledger.decisions(*key)
            if d.verdict == "approve"
        ]
        who = "; ".join(said) or "a person"
        ref = f"{_s(key[0])}/{_s(key[1])}"
        return f"{'decided':<8} {ref} {_s(event.get('effect') or '-')}: approved by {who}"


def _fields(kind: str, key: tuple[str, str], effect: Any) -> dict[str, Any]:
    """What a structured log line carries beside its message (broker.observability.logformat)."""
    return {
        "event": kind,
        "ref": f"{_s(key[0])}/{_s(key[1])}",
        "effect": _s(effect) if effect else None,
        "trace_id": trace_id_for(*key),
    }


def _verb(verdict: Any) -> str:
    return {"approve": "approved", "deny": "denied"}.get(str(verdict), _s(verdict))


def _detail(kind: str, event: Event) -> str:
    """What follows the request's name on its line, by kind of event."""
    get = event.get
    if kind == "received":
        name = get("name")
        return f" (file {_s(name)}.json)" if name and name != get("id") else ""
    if kind == "decided":
        if get("action") == "auto":
            return f": applied automatically ({_s(get('rule'))})"
        return f": {_verb(get('action'))} by {_s(get('by'))}"
    if kind == "decision":
        said = f": {_s(get('reason'))}" if get("reason") else ""
        return f": {_verb(get('verdict'))} by {_s(get('by'))} via {_s(get('surface'))}{said}"
    if kind == "pending":
        return (
            f": waits for a person until {_s(get('expires_at'))}, then "
            f"{_s(get('on_timeout'))} ({_s(get('rule'))})"
        )
    if kind == "replayed":
        return f": the same idempotency key as {_s(get('of'))}, so {_s(get('status'))}"
    if kind == "duplicate_id":
        return f": reused by other content (file {_s(get('name'))}.json); the first result stands"
    if kind == "applied" and get("warning"):
        return f": {_s(get('warning'))}"
    if kind in TERMINAL - {"applied"} and get("reason"):
        return f": {_s(get('reason'))}"
    return ""
