"""Withdrawals (protocol version 2): an agent takes back a request it no longer wants.

A sandbox writes `/outbox/<request id>.withdraw` (atomically, like a request), holding
`{"version": 2, "id": "<request id>", "reason": "optional, shown in the audit log"}`.
A request that still waits for a person is denied, "withdrawn by the agent", and gets
its one terminal result; one already approved, applying or decided stays as it is
(the audit log says the withdrawal came too late). A withdrawal whose request is not
recorded yet, or is still being assessed, waits for it up to the attachments' grace
period, then is dropped. The file is read in place (it speaks only for its own
sandbox's request) and claimed and removed once what it did is committed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from broker.clock import REAL, Clock
from broker.config import Limits
from broker.errors import Rejected
from broker.intake import claims
from broker.intake.outbox import Outbox
from broker.intake.strict_json import parse_json
from broker.lifecycle.batch import Batch
from broker.lifecycle.transitions import Lifecycle
from broker.models import Record
from broker.names import Kind, classify
from broker.store.base import Store
from broker.validation import Compiled, load_schema

__all__ = ["MAX_BYTES", "SUFFIX", "Withdrawals", "consume", "read"]

SUFFIX = ".withdraw"
MAX_BYTES = 4096
log = logging.getLogger("broker.lifecycle.withdrawals")


@dataclass(frozen=True)
class _Waiting:
    box: Outbox
    name: str
    since: float


def read(box: Outbox, name: str, schema: Compiled) -> str | None:
    """The reason a withdrawal file gives (None: it gives none); raises Rejected for a
    file that is not a valid withdrawal of the request its name says."""
    data = claims.read_file(box.outbox_fd, name, MAX_BYTES)
    doc = parse_json(data, 8)
    issues = schema.issues(doc, ())
    if issues:
        raise Rejected(f"invalid withdrawal: {issues[0].path}: {issues[0].message}", issues)
    if doc["id"] != name.removesuffix(SUFFIX):
        raise Rejected("invalid withdrawal: its id is not the one its file name says", [])
    reason = doc.get("reason")
    return reason if isinstance(reason, str) and reason.strip() else None


def consume(box: Outbox, name: str) -> None:
    """Claim the file (rename out of the sandbox's reach), then remove what was claimed."""
    target = f"{name}~withdrawn-{os.getpid()}"
    try:
        os.rename(name, target, src_dir_fd=box.outbox_fd, dst_dir_fd=box.claim_fd)
    except FileNotFoundError:
        return
    claims.remove(box, target)


class Withdrawals:
    """The withdrawals the loop has seen and not yet settled, across wake-ups."""

    def __init__(self, limits: Limits, clock: Clock = REAL) -> None:
        self.clock = clock
        self.grace_s = float(limits.attachment_grace_s)
        self.schema = Compiled(load_schema("withdraw"), "schemas/withdraw.json")
        self._waiting: dict[tuple[str, str], _Waiting] = {}

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def see(self, box: Outbox, name: str) -> None:
        kind, request_id, _ = classify(name)
        if kind is Kind.WITHDRAWAL and (box.sandbox, request_id) not in self._waiting:
            self._waiting[(box.sandbox, request_id)] = _Waiting(box, name, self.clock.monotonic())

    def settle(self, ledger: Store, lifecycle: Lifecycle, batch: Batch) -> None:
        """Inside the wake-up's transaction: deny each waiting request a withdrawal names;
        the files go to `batch.withdrawn`, consumed after the commit. A bug met by one
        rolls back its savepoint alone (the next rescan sees its file again)."""
        for key, seen in list(self._waiting.items()):
            record = ledger.get(*key)
            waits = record is None or (record.state == "received" and record.replay_of is None)
            if waits and self.clock.monotonic() - seen.since < self.grace_s:
                continue  # its request may be on its way, or being assessed
            del self._waiting[key]
            mark = batch.mark()
            try:
                with ledger.savepoint():
                    if record is None or waits:
                        log.warning(
                            "sandbox %s: dropped withdrawal %r: no request %s waited for a "
                            "decision within %gs",
                            *(key[0], seen.name, key[1], self.grace_s),
                        )
                    else:
                        self._decide(lifecycle, batch, seen, record)
                    batch.withdrawn.append((seen.box, seen.name))
            except Exception:
                log.exception("sandbox %s: could not process %r", key[0], seen.name)
                batch.rollback(mark)

    def _decide(self, lifecycle: Lifecycle, batch: Batch, seen: _Waiting, record: Record) -> None:
        try:
            reason = read(seen.box, seen.name, self.schema)
        except (Rejected, OSError) as exc:
            why = exc.reason if isinstance(exc, Rejected) else str(exc)
            log.warning("sandbox %s: ignored %r: %s", record.sandbox, seen.name, why)
            return
        if record.state != "pending":  # approved, applying or decided: too late
            lifecycle.audit("withdraw_refused", record, state=record.state, said=reason)
            return
        record = lifecycle.withdraw(record, reason)
        batch.answer.append(record)
        batch.answer.extend(lifecycle.settle_replays(record))
