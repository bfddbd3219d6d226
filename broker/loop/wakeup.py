"""The stages one wake-up's transaction runs, each filling the batch for after the
commit: a claimed file read and admitted, an outcome back from a worker, an
assessment back from off the loop, a deadline come due.

A bug met by one request must not stop the others: its part of the transaction runs
in a savepoint, rolled back alone, and the request waits for the next start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.events import Applied, Assessed
from broker.faults import fault
from broker.intake.claims import Claims
from broker.intake.outbox import Outbox
from broker.lifecycle.admission import Admission
from broker.lifecycle.batch import Batch
from broker.lifecycle.transitions import Lifecycle
from broker.loop import recovery
from broker.loop.aftercommit import AfterCommit
from broker.loop.outage import Kept
from broker.models import Record
from broker.store.base import Store

log = logging.getLogger("broker")


class Stages:
    """Runs inside the caller's transaction, over the broker's store."""

    def __init__(
        self,
        ledger: Store,
        lifecycle: Lifecycle,
        claims: Claims,
        admission: Admission,
        apply: Callable[[Record], Applied],
    ) -> None:
        self.ledger = ledger
        self.lifecycle = lifecycle
        self.claims = claims
        self.admission = admission
        self.apply = apply  # the one call into a handler, for inline applies

    def run(self, work: Kept, reload: bool, batch: Batch, after: AfterCommit) -> None:
        """The wake-up's one transaction (group commit): every item it brought, each
        stage filling `batch` for `after` to do once it has committed."""
        with self.ledger.transaction():
            # a kill switch or an accepted rule holds from this request on; a deadline
            # is judged on the switches committed, not on whether their nudge came yet
            if reload or work.due:
                self.admission.controls.refresh()
            work.written = after.mark_synced()
            self.ledger.prefetch(  # the rows this wake-up reads, at once (a shared store)
                [(b.sandbox, n.removesuffix(".json")) for b, n, w in work.claimed if w]
                + [d.key for d in work.done]
                + [a.key for a in work.assessed]
                + work.due
            )
            for box, name, where in work.claimed:
                if where is not None:
                    self.intake(box, name, where, batch)
            for item in work.done:
                after.in_flight.discard(item.key)
                self.finish(item, batch)
            for back in work.assessed:
                self.resume(back, batch)
            for sandbox, request_id in work.due:
                self.expire(sandbox, request_id, batch)
            if reload:
                recovery.reload(self.ledger, self.lifecycle, batch, self.admission.controls)
            fault("before_commit")

    def intake(self, box: Outbox, name: str, where: str, batch: Batch) -> None:
        """Read and admit one claimed file; a bug leaves it in the claim dir."""
        mark = batch.mark()
        try:
            with self.ledger.savepoint():
                read = self.claims.read(box, name.removesuffix(".json"), where)
                if read is not None:
                    self.admission.admit(read, batch)
                    self.apply_inline(batch)
        except Exception:
            log.exception(
                "sandbox %s: could not process %r; kept for the next start", box.sandbox, name
            )
            batch.rollback(mark)

    def resume(self, done: Assessed, batch: Batch) -> None:
        """Work off the loop came back for a held request: carry on with it."""
        record = self.ledger.get(*done.key)
        if record is None or record.state != "received" or record.sha256 != done.sha256:
            return
        mark = batch.mark()
        try:
            with self.ledger.savepoint():
                self.admission.resume(record, done, batch)
                self.apply_inline(batch)
        except Exception:
            log.exception("sandbox %s: could not go on with %s", record.sandbox, record.id)
            batch.rollback(mark)

    def apply_inline(self, batch: Batch) -> None:
        """Fast handlers, safe to repeat, applied in their request's own commit (a crash
        before it commits reads the claimed file again and applies it again)."""
        for record in batch.inline:
            self.finished(record, self.apply(record), batch)
        batch.inline.clear()

    def finish(self, done: Applied, batch: Batch) -> None:
        """A worker's outcome, for a request still `applying`."""
        record = self.ledger.get(*done.key)
        if record is None or record.state != "applying":
            return
        batch.settled.append(record)
        self.finished(record, done, batch)

    def finished(self, record: Record, done: Applied, batch: Batch) -> None:
        record = self.lifecycle.finish(
            record, done.status, done.reason, done.output, done.issues, done.credential
        )
        batch.answer.append(record)
        batch.answer.extend(self.lifecycle.settle_replays(record))

    def expire(self, sandbox: str, request_id: str, batch: Batch) -> None:
        """A pending request's deadline passed (a decision may have come first)."""
        record = self.ledger.get(sandbox, request_id)
        if record is None or record.state != "pending":
            return
        switch = self.admission.controls.disabled(record.effect or "")
        if switch is not None and record.on_timeout == "approve" and record.reversible:
            record = self.lifecycle.halt(record, switch.denial(record.effect or ""))
        else:
            record = self.lifecycle.expire(record)
        if record.state == "applying":
            batch.apply.append(record)
            return
        batch.answer.append(record)
        batch.answer.extend(self.lifecycle.settle_replays(record))
