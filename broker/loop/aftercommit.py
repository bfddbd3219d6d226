"""What a wake-up does once its transaction has committed, in this order: consumed files
queued for removal, result files, audit lines, start marks cleared, deadlines watched,
applies handed to the fair worker pool, assessments handed to theirs. Nothing observable
happens before the state it follows from is committed (broker.lifecycle.batch).

The loop (broker.loop.pipeline) fills a Batch inside the transaction and hands it here
after the COMMIT; applies come back to it as `Applied` events on its queue.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from broker.config import Config
from broker.events import Applied, Event
from broker.faults import fault
from broker.intake import claims as intake
from broker.lifecycle import withdrawals
from broker.lifecycle.apply import Workers, call
from broker.lifecycle.assessing import Assessments
from broker.lifecycle.batch import Batch
from broker.lifecycle.marks import StartMarks
from broker.lifecycle.results import Answers
from broker.loop.deadlines import Deadlines
from broker.models import Record
from broker.registry import Registry
from broker.store.base import AuditSink, Store


@dataclass
class AfterCommit:
    """The after-commit I/O of one broker, and the applies it has in flight."""

    config: Config
    registry: Registry
    ledger: Store
    answers: Answers
    audit: AuditSink
    started: StartMarks
    deadlines: Deadlines
    consumed: intake.Consumed
    workers: Workers
    assessments: Assessments
    events: queue.Queue[Event]
    in_flight: set[tuple[str, str]] = field(default_factory=set)
    closing: bool = False  # once set, what is still to apply or assess waits for a restart

    def run(self, batch: Batch) -> None:
        """Do what the committed wake-up brought, in data-flow order."""
        for box, name in batch.remove:
            if name in batch.urgent:
                intake.remove(box, name)
            else:
                self.consumed.add(box, name)
        for box, name in batch.withdrawn:
            withdrawals.consume(box, name)
        fault("before_results")
        for record in batch.answer:
            self.answers.write(record)
        fault("before_audit")
        self.audit.flush()
        fault("after_audit")
        for record in batch.settled:
            self.started.clear(record)
        for record in batch.deadlines:
            self.deadlines.watch(record)
        for record in batch.apply:
            self.submit(record)
        for record in batch.assess:
            if not self.closing:
                self.assessments.submit(record)

    def mark_synced(self) -> list[tuple[str, str, str]]:
        """Tell the ledger (inside the next transaction) which results and audit lines
        are durable now; the results written since the last time."""
        written = self.answers.take_written()
        if written:
            self.ledger.mark_synced(written)
        durable = self.audit.take_durable()
        if durable:
            self.ledger.drop_audit(*durable)
        return written

    def apply(self, record: Record) -> Applied:
        """The one call into a handler (inline, or on a worker)."""
        return call(self.registry.effect(record.effect or ""), record, self.config, self.started)

    def submit(self, record: Record) -> None:
        """Hand an approved request to the worker pool, once."""
        if record.key in self.in_flight or self.closing:
            return
        self.in_flight.add(record.key)
        self.registry.effect(record.effect or "")  # an unknown effect fails here, not there
        self.workers.submit(record.sandbox, lambda: self.events.put(self.apply(record)))

    def busy(self, sandbox: str) -> bool:
        """Whether an apply of this sandbox is in flight."""
        return any(key[0] == sandbox for key in self.in_flight)
