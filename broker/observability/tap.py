"""Observers of a serving broker: the request log, metrics and traces.

    tap = Tap.on(broker)              # before broker.serve()
    tap.observers.append(ServeLog(broker.store.sqlite))

After each wake-up's commit and I/O, every observer is handed, in this order, the
audit events the broker appended (its own transitions: received, decided, pending,
applying, applied…) and the results it wrote (pending and terminal, as Records;
outcomes decided by other processes, a person's denial from the CLI, arrive only as
results). Observers run on the loop's thread and must be quick; a failing one is
logged and counted, never fatal, and the request is unaffected. A broker with no tap
does none of this: the hooks are empty lists.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from broker.models import Record

if TYPE_CHECKING:
    from broker.loop.pipeline import Broker

log = logging.getLogger("broker")

Event = Mapping[str, Any]
"""One audit event, as broker.audit.log.event builds it (already redacted)."""


class Observer(Protocol):
    """What a tap calls; `name` labels its failures."""

    name: str

    def events(self, events: Sequence[Event]) -> None:
        """The audit events one flush appended, in ledger order."""

    def results(self, records: Sequence[Record]) -> None:
        """The results written since the previous flush, in the order written."""


class Tap:
    """Collects results as they are written and hands them, with the audit events of
    the same wake-up, to each observer."""

    def __init__(self) -> None:
        self.observers: list[Observer] = []
        self.failures: Counter[str] = Counter()
        self._written: list[Record] = []

    @classmethod
    def on(cls, broker: Broker) -> Tap:
        """A tap on `broker`'s results and audit flushes (attach before it serves)."""
        tap = cls()
        broker.on_change.append(tap.written)
        broker.audit.observers.append(tap.deliver)
        return tap

    def written(self, record: Record) -> None:
        self._written.append(record)

    def deliver(self, events: Sequence[Event]) -> None:
        written, self._written = self._written, []
        if not (events or written):
            return
        for observer in self.observers:
            try:
                observer.events(events)
                observer.results(written)
            except Exception:
                self.failures[observer.name] += 1
                log.exception("the %s observer failed; the requests are unaffected", observer.name)
