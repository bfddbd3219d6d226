"""The stages one wake-up's transaction runs, each filling the batch for after the
commit: a claimed file read and admitted, an outcome back from a worker, an
assessment back from off the loop, a deadline come due, a withdrawal by the agent.

A bug met by one request must not stop the others: its part of the transaction runs
in a savepoint, rolled back alone, and the request waits for the next start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from broker.events import (
    Applied,
    Assessed,
    Control,
    DirsChanged,
    Event,
    FileSeen,
    Reload,
    Rescan,
)
from broker.faults import fault
from broker.intake.claims import Claims
from broker.intake.outbox import Outbox
from broker.lifecycle import withdrawals
from broker.lifecycle.admission import Admission
from broker.lifecycle.batch import Batch
from broker.lifecycle.transitions import Lifecycle
from broker.lifecycle.withdrawals import Withdrawals
from broker.loop import recovery
from broker.loop.aftercommit import AfterCommit
from broker.loop.outage import Kept
from broker.models import Record
from broker.store.base import Store

log = logging.getLogger("broker")


@dataclass
class Sorted:
    """One wake-up's events by what they ask of the loop: the work for its transaction,
    the files to claim (a request's; an agent's withdrawal apart), and whether to reload,
    discover, rescan or obey a control."""

    work: Kept = field(default_factory=Kept)
    files: dict[tuple[str, str], Outbox] = field(default_factory=dict)
    reload: bool = False
    discover: bool = False
    rescan: bool = False
    controls: list[Control] = field(default_factory=list)
    withdrawn: list[tuple[Outbox, str]] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        items: Iterable[Event],
        by_dir: Mapping[str, Outbox],
        accept: Callable[[Assessed], bool],
    ) -> Sorted:
        """`accept` says whether an assessment is still wanted (else it was given up on
        at its deadline)."""
        told = cls()
        for item in items:
            if isinstance(item, FileSeen):
                box = by_dir.get(item.folder)
                if box is not None and item.name.endswith(withdrawals.SUFFIX):
                    told.withdrawn.append((box, item.name))
                elif box is not None:
                    told.files.setdefault((box.sandbox, item.name), box)
            elif isinstance(item, Applied):
                told.work.done.append(item)
            elif isinstance(item, Assessed):
                if accept(item):
                    told.work.assessed.append(item)
            elif isinstance(item, DirsChanged):
                told.discover = told.reload = True
            elif isinstance(item, Rescan):
                told.rescan = told.reload = True
            elif isinstance(item, Reload):
                told.reload = True
            elif isinstance(item, Control):
                told.controls.append(item)
        return told


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
        self.withdrawals = Withdrawals(claims.limits, claims.clock)

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
            if self.withdrawals:  # after intake: a request and its withdrawal may come at once
                self.withdrawals.settle(self.ledger, self.lifecycle, batch)
            if reload:
                recovery.reload(self.ledger, self.lifecycle, batch, self.admission.controls)
                self.recount(after, batch)
            fault("before_commit")

    def recount(self, after: AfterCommit, batch: Batch) -> None:
        """Pending results that show approvals (version 2) are written again when one
        came in short of the quorum."""
        for key in after.answers.recount():
            record = self.ledger.get(*key)
            if record is not None and record.state == "pending":
                batch.answer.append(record)

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
