"""What a restart resumes, and what other processes left for the broker to act on.

On start, inside one transaction: requests claimed but not recorded are read again;
approved requests are applied; requests found `applying` are applied again if their
handler never started or is safe to repeat, else they become `unknown` for a person;
result files lost since they were written are written again; pending deadlines are
watched again. On every rescan, decisions taken by other processes (the CLI, the web)
are picked up from the ledger.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from broker.config import Config
from broker.intake.outbox import Outbox
from broker.lifecycle.admission import Admission
from broker.lifecycle.apply import idempotent
from broker.lifecycle.batch import Batch
from broker.lifecycle.marks import StartMarks
from broker.lifecycle.transitions import Lifecycle
from broker.names import Kind, classify
from broker.policy.controls import LiveControls
from broker.registry import Registry
from broker.store.base import Store

Intake = Callable[[Outbox, str, str, Batch], None]
"""Read and record one claimed file: (box, its request name, its claimed name, batch)."""


def claimed(boxes: list[Outbox], intake: Intake, batch: Batch) -> None:
    """Files moved into a claim dir before a crash: requests are read, the rest removed."""
    for box in boxes:
        for where in box.claimed():
            name = where.split("~", 1)[0]
            if classify(name)[0] is Kind.REQUEST:
                intake(box, name, where, batch)
            else:
                batch.remove.append((box, where))


def applies(
    ledger: Store,
    lifecycle: Lifecycle,
    registry: Registry,
    config: Config,
    marks: StartMarks,
    batch: Batch,
) -> None:
    """Approved requests are applied; ones caught mid-apply are applied again only if that
    is safe (their handler never started, or it is idempotent), else they are `unknown`."""
    for record in ledger.in_states(["applying", "approved"]):
        effect = registry.effect(record.effect or "") if record.effect in registry else None
        safe = effect is not None and (
            not marks.seen(record)  # its handler was never called
            or idempotent(effect, record, config)
        )
        if record.state == "approved":
            batch.apply.append(lifecycle.start(record))
        elif safe:
            batch.apply.append(record)
        else:
            record = lifecycle.lose(record)
            batch.answer.append(record)
            batch.settled.append(record)


def reload(
    ledger: Store, lifecycle: Lifecycle, batch: Batch, controls: LiveControls | None = None
) -> None:
    """Pick up what other processes changed: decisions, results to (re)write. An
    approved request whose effect was switched off since is denied, not applied."""
    for record in ledger.unsynced():
        switch = controls.disabled(record.effect or "") if controls else None
        if record.state == "approved" and switch is not None:
            batch.answer.append(lifecycle.halt(record, switch.denial(record.effect or "")))
        elif record.state == "approved":
            batch.apply.append(lifecycle.start(record))
        elif record.replay_of and not record.terminal:
            first = ledger.get(record.sandbox, record.replay_of)
            if first is not None and first.terminal:
                batch.answer.extend(lifecycle.settle_replays(first))
        else:
            batch.answer.append(record)


def missing_results(ledger: Store, boxes: list[Outbox], batch: Batch) -> None:
    """Result files lost since they were written (no fsync: a power cut) come back."""
    for box in boxes:
        present = set(os.listdir(box.results_fd))
        for request_id in ledger.answered_ids(box.sandbox):
            if f"{request_id}.json" not in present:
                record = ledger.get(box.sandbox, request_id)
                if record is not None:
                    batch.answer.append(record)


def held(ledger: Store, admission: Admission, batch: Batch) -> None:
    """Requests held for work off the loop (an assessment, a preview) get it again."""
    for record in ledger.in_states(["received"]):
        if record.replay_of is None:
            admission.hold(record, batch)


def deadlines(ledger: Store, batch: Batch) -> None:
    """Every pending request's deadline is watched again."""
    batch.deadlines.extend(ledger.in_states(["pending"]))


def resume(
    ledger: Store,
    boxes: list[Outbox],
    intake: Intake,
    lifecycle: Lifecycle,
    registry: Registry,
    config: Config,
    started: StartMarks,
    admission: Admission,
) -> Batch:
    """Everything a start resumes, in one transaction: claimed files read again,
    approved and interrupted applies, decisions taken meanwhile, lost result files,
    deadlines, held requests. The Batch is for the loop to do after the commit."""
    batch = Batch()
    with ledger.transaction():
        claimed(boxes, intake, batch)
        applies(ledger, lifecycle, registry, config, started, batch)
        reload(ledger, lifecycle, batch)
        missing_results(ledger, boxes, batch)
        deadlines(ledger, batch)
        held(ledger, admission, batch)
    return batch
