"""The data path, one request at a time, with group commit per wake-up.

    claim → read → parse → validate → record (+ audit) → classify → apply → answer

A stage ends a request by raising an Outcome (Rejected, Denied, …); the ledger row is
committed before anything observable follows it (a file removed, a result written,
an audit line appended, a handler called). Everything one wake-up brings shares one
commit. Handlers run on a small pool; their outcomes come back through the queue.
"""

from __future__ import annotations

import heapq
import logging
import os
import queue
import shutil
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from broker import attachments, catalogue, intake, results, serving
from broker.audit import AuditLog
from broker.audit import event as audit_event
from broker.config import Config
from broker.errors import EffectFailed, Outcome, Rejected
from broker.faults import fault
from broker.intake import Kind
from broker.ledger import Ledger, Record
from broker.marks import StartMarks
from broker.models import Request, iso, now, parse_iso, sha256_hex
from broker.notify import Notifier
from broker.outbox import Outbox, Watcher, discover, from_layout
from broker.policy import Policy
from broker.registry import Registry
from broker.validation import Validator
from effects.base import Context

log = logging.getLogger("broker")
REDACTED = "•••"
AUDIT_SYNC_S = 1.0  # the audit log is fsynced at most this often; the ledger holds the rest
MAX_BATCH = 64  # files taken per wake-up: a neighbour waits for one batch at most
PURGE_BUDGET_S = 0.01  # time spent removing consumed files per idle moment


@dataclass
class _Batch:
    """What one wake-up must do once its transaction has committed."""

    remove: list[tuple[Outbox, str, bool]] = field(default_factory=list)  # (box, name, claimed)
    answer: list[Record] = field(default_factory=list)
    apply: list[Record] = field(default_factory=list)
    deadlines: list[Record] = field(default_factory=list)
    settled: list[Record] = field(default_factory=list)  # done applying: drop start marks
    urgent: set[str] = field(default_factory=set)  # claimed names to remove at once


class Broker:
    """Serves a set of outboxes until stopped. Owns the ledger connection."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        policy: Policy,
        *,
        ledger: Ledger | None = None,
        workers: int = 4,
    ) -> None:
        self.config = config
        self.registry = registry
        self.policy = policy
        self.validator = Validator(registry.schemas())
        self.ledger = ledger or Ledger(config.ledger_path)
        self.audit = AuditLog(config.audit_path)
        self.outboxes: dict[str, Outbox] = {}
        self._by_dir: dict[str, Outbox] = {}
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="broker-apply")
        self._in_flight: set[tuple[str, str]] = set()
        self._deadlines: list[tuple[str, str, str]] = []
        self._synced: list[tuple[str, str, str]] = []
        self._audit_done: tuple[int, str] | None = None
        self._audit_appended = 0  # the last event appended to the log (maybe not fsynced)
        self._audit_synced = 0
        self._audit_synced_at = 0.0
        self._secrets = sorted(config.secret_values(), key=len, reverse=True)
        self._watcher: Watcher | None = None
        self._roots: list[Path] = []
        self._claim_counter = 0
        self._bad_names: set[tuple[str, str]] = set()
        self.started = StartMarks(config.state_dir / "started")
        self._consumed: deque[tuple[Outbox, str]] = deque()
        self._backlog: dict[str, deque[str]] = {}  # outbox dir -> names to read, in order
        self._queued: set[tuple[str, str]] = set()
        self.on_change: list[Callable[[Record], None]] = []
        self.notifier: Notifier | None = None
        self.catalogue = catalogue.render(registry, policy)  # published into each results dir

    def notify_with(self, notifier: Notifier) -> None:
        """Tell people through `notifier` whenever a request starts waiting."""
        from broker.approval import card

        self.notifier = notifier

        def on_pending(record: Record) -> None:
            if record.state == "pending":
                notifier.pending(card(self.ledger, record, self.registry))

        self.on_change.append(on_pending)

    # -- what is served ---------------------------------------------------------

    def add(self, box: Outbox) -> None:
        self.outboxes[box.sandbox] = box
        self._by_dir[str(box.outbox)] = box
        catalogue.publish(box.results_fd, self.catalogue, box.sandbox)
        self._rewatch()

    def serve_root(self, sandboxes_dir: Path) -> None:
        """Serve every sandbox under <state>/sandboxes/, including ones created later."""
        sandboxes_dir.mkdir(parents=True, exist_ok=True)
        self._roots.append(sandboxes_dir)
        self._discover()

    def _discover(self) -> list[Outbox]:
        added = []
        for root in self._roots:
            for sandbox in discover(root):
                if sandbox not in self.outboxes:
                    box = from_layout(root, sandbox)
                    self.outboxes[sandbox] = box
                    self._by_dir[str(box.outbox)] = box
                    catalogue.publish(box.results_fd, self.catalogue, sandbox)
                    added.append(box)
        if added:
            self._rewatch()
        return added

    def _rewatch(self) -> None:
        if self._watcher is not None:
            self._watcher.sync([b.outbox for b in self.outboxes.values()], self._parents())

    def _parents(self) -> list[Path]:
        control = self.config.state_dir / "control"
        control.mkdir(parents=True, exist_ok=True)
        return [*self._roots, control]

    # -- the loop ---------------------------------------------------------------

    def serve(
        self,
        stop: threading.Event,
        *,
        ready: Callable[[], None] | None = None,
        drain: bool = False,
    ) -> None:
        """Recover, scan, then process events until `stop` is set (then drain, if asked)."""
        with serving.holding(self.config.state_dir):
            self._serve(stop, ready, drain)

    def _serve(self, stop: threading.Event, ready: Callable[[], None] | None, drain: bool) -> None:
        self.recover()
        self._watcher = Watcher(self.events)
        self._rewatch()
        # now that every watch is in place: read what is there and reload decisions
        # taken while we started (their nudges may have come before the watches)
        self.events.put(("rescan",))
        if ready:
            ready()
        next_rescan = time.monotonic() + self.config.rescan_interval_s
        try:
            while not stop.is_set():
                timeout = min(
                    0.05 if self._consumed else 0.5,  # idle moments purge consumed files
                    max(0.0, next_rescan - time.monotonic()),
                    self._until_deadline(),
                )
                items = self._take(timeout)
                if self._watcher is not None and not self._watcher.alive():
                    items.append(self._replace_watcher())
                if not items:
                    self._sync_audit()  # idle: make the audit log durable now
                    self._purge(PURGE_BUDGET_S)
                if time.monotonic() >= next_rescan:
                    items.append(("rescan",))
                    next_rescan = time.monotonic() + self.config.rescan_interval_s
                self.step(items)
            if drain:
                self.drain()
        finally:
            self.close()

    def _replace_watcher(self) -> tuple[str]:
        """The watcher died: start a new one and rescan what it may have missed."""
        log.warning("restarting the outbox watcher and rescanning")
        old = self._watcher
        self._watcher = Watcher(self.events)
        self._rewatch()
        if old is not None:
            try:
                old.stop()
            except OSError:
                pass
        return ("rescan",)

    def drain(self, timeout: float = 30.0) -> None:
        """Process what is in the outboxes and wait for applies in flight."""
        end = time.monotonic() + timeout
        self.rescan()
        while time.monotonic() < end:
            items = self._take(0.05)
            self.step(items)
            if (
                not self._in_flight
                and self.events.empty()
                and not self._backlog
                and not self._pending_files()
            ):
                break
        self._purge()

    def _pending_files(self) -> bool:
        for box in self.outboxes.values():
            if any(intake.classify(n)[0] is Kind.REQUEST for n in box.names()):
                return True
        return False

    def wake(self) -> None:
        """Make the loop look at its stop event now rather than at its next timeout."""
        self.events.put(("wake",))

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        self._pool.shutdown(wait=True)
        # applies that finished during shutdown are recorded before we go
        while items := self._take(0):
            self.step(items)
        self._purge()
        self._sync_audit()
        self.step([])  # the ledger learns what is durable in the log and results
        for box in self.outboxes.values():
            box.close()
        if self.notifier is not None:
            self.notifier.close()
        self.ledger.close()

    def _take(self, timeout: float) -> list[tuple[Any, ...]]:
        """What one wake-up handles: every control event, and up to MAX_BATCH files
        taken round-robin across outboxes, so that a flooding sandbox cannot make the
        others wait behind its backlog."""
        items: list[tuple[Any, ...]] = []
        if self._backlog:
            timeout = 0
        try:
            first = self.events.get(timeout=timeout) if timeout > 0 else self.events.get_nowait()
        except queue.Empty:
            first = None
        while first is not None:
            if first[0] == "file":
                key = (first[1], first[2])
                if key not in self._queued:
                    self._queued.add(key)
                    self._backlog.setdefault(first[1], deque()).append(first[2])
            else:
                items.append(first)
            try:
                first = self.events.get_nowait()
            except queue.Empty:
                first = None
        taken = 0
        while self._backlog and taken < MAX_BATCH:
            for folder in list(self._backlog):
                names = self._backlog[folder]
                name = names.popleft()
                self._queued.discard((folder, name))
                items.append(("file", folder, name))
                taken += 1
                if not names:
                    del self._backlog[folder]
                if taken >= MAX_BATCH:
                    break
        return items

    def _until_deadline(self) -> float:
        if not self._deadlines:
            return 3600.0
        due = parse_iso(self._deadlines[0][0])
        assert due is not None
        return max(0.0, (due - now()).total_seconds())

    # -- one wake-up ------------------------------------------------------------

    def rescan(self) -> None:
        """Converge on the outboxes' real contents; events are only a hint."""
        self._discover()
        for box in list(self.outboxes.values()):
            names = box.names()
            for name in names:
                self.events.put(("file", str(box.outbox), name))
            self._drop_orphans(box, names)

    def _drop_orphans(self, box: Outbox, names: list[str]) -> None:
        """Remove attachments whose request did not come within the grace period."""
        requests = {n.removesuffix(".json") for n in names if n.endswith(".json")}
        cutoff = time.time() - self.config.limits.attachment_grace_s
        for name in names:
            kind, stem, _ = intake.classify(name)
            if kind is not Kind.ATTACHMENT or stem in requests:
                continue
            try:
                st = os.stat(name, dir_fd=box.outbox_fd, follow_symlinks=False)
                if st.st_mtime < cutoff:
                    os.unlink(name, dir_fd=box.outbox_fd)
                    log.warning(
                        "sandbox %s: removed attachment %r: no request listed it within %ds",
                        box.sandbox,
                        name,
                        self.config.limits.attachment_grace_s,
                    )
            except OSError:
                continue

    def step(self, items: Iterable[tuple[Any, ...]]) -> None:
        files: dict[tuple[str, str], Outbox] = {}
        done: list[tuple[Any, ...]] = []
        reload = False
        for item in items:
            kind = item[0]
            if kind == "file":
                box = self._by_dir.get(item[1])
                if box is not None:
                    files.setdefault((box.sandbox, item[2]), box)
            elif kind == "done":
                done.append(item)
            elif kind == "dirs":
                self._discover()
                reload = True
            elif kind == "rescan":
                self.rescan()
                reload = True
        due = self._due()
        if not (files or done or due or reload or self._synced or self._audit_done):
            return
        batch = _Batch()
        claimed = [(box, name, self._claim(box, name)) for (_, name), box in files.items()]
        with self.ledger.transaction():
            self._mark_synced()
            for box, name, where in claimed:
                if where is not None:
                    self._intake_guarded(box, name, where, batch)
            for item in done:
                self._finish(item, batch)
            for sandbox, request_id in due:
                self._expire(sandbox, request_id, batch)
            if reload:
                self._reload(batch)
            fault("before_commit")
        fault("after_commit")
        self._after_commit(batch)

    def _after_commit(self, batch: _Batch) -> None:
        for box, name, is_claim in batch.remove:
            if is_claim and name not in batch.urgent:
                self._consumed.append((box, name))  # removed when idle: unlinks are slow
            else:
                self._remove(box, name, is_claim)
        fault("before_results")
        for record in batch.answer:
            self._answer(record)
        fault("before_audit")
        self._flush_audit()
        fault("after_audit")
        for record in batch.settled:
            self.started.clear(record)
        for record in batch.deadlines:
            if record.expires_at:
                heapq.heappush(self._deadlines, (record.expires_at, record.sandbox, record.id))
        for record in batch.apply:
            self._submit(record)

    # -- intake -----------------------------------------------------------------

    def _claim(self, box: Outbox, name: str, kind: Kind = Kind.REQUEST) -> str | None:
        """Move `name` out of the sandbox's reach; return where to read it, or None."""
        found, _, _ = intake.classify(name)
        if found is not kind:
            if found is Kind.BAD and (box.sandbox, name) not in self._bad_names:
                if len(self._bad_names) < 10_000:  # log each bad name once, within reason
                    self._bad_names.add((box.sandbox, name))
                log.warning("sandbox %s: ignoring %r: not a request name", box.sandbox, name)
            return None
        if intake.being_written(box.outbox_fd, name):
            return None  # its writer's close (IN_CLOSE_WRITE) brings it back
        if box.claim_fd < 0:
            return name if intake.exists(box.outbox_fd, name) else None
        self._claim_counter += 1
        target = f"{name}~{os.getpid()}-{self._claim_counter}"
        try:
            os.rename(name, target, src_dir_fd=box.outbox_fd, dst_dir_fd=box.claim_fd)
        except FileNotFoundError:
            return None  # already taken (an event and a rescan for the same file)
        return target

    def _intake_guarded(self, box: Outbox, name: str, where: str, batch: _Batch) -> None:
        """A bug met by one request must not stop the others: it waits in the claim dir."""
        mark = len(batch.remove), len(batch.answer), len(batch.apply), len(batch.deadlines)
        try:
            with self.ledger.savepoint():
                self._intake(box, name, where, batch)
        except Exception:
            log.exception(
                "sandbox %s: could not process %r; kept for the next start", box.sandbox, name
            )
            del batch.remove[mark[0] :], batch.answer[mark[1] :], batch.apply[mark[2] :]
            del batch.deadlines[mark[3] :]

    def _intake(self, box: Outbox, name: str, where: str, batch: _Batch) -> None:
        is_claim = box.claim_fd >= 0
        stem = name.removesuffix(".json")
        received = iso(now())
        assert received is not None
        batch.remove.append((box, where, is_claim))
        doc: Any = None
        raw = b""
        try:
            raw = intake.read_file(
                box.claim_fd if is_claim else box.outbox_fd,
                where,
                self.config.limits.max_request_bytes,
            )
            fault("after_read")
            doc = intake.parse_json(raw, self.config.limits.max_depth)
            self.validator.envelope(doc)
            request = Request(
                sandbox=box.sandbox,
                id=doc.get("id", stem),
                name=stem,
                effect=doc["effect"],
                params=doc["params"],
                reason=doc.get("reason"),
                idempotency_key=doc.get("idempotency_key"),
                attachments=self._attachments(box, stem, doc.get("attachments") or [], batch),
            )
        except FileNotFoundError:
            batch.remove.pop()
            return
        except Rejected as exc:
            batch.urgent.add(where)  # a hostile file (a hard link…) goes at once
            rid = doc.get("id") if isinstance(doc, dict) else None
            if not isinstance(rid, str) or not intake.REQUEST_ID.fullmatch(rid):
                rid = stem
            self._record_invalid(box, rid, stem, raw, doc, exc, received, batch)
            return
        existing = self.ledger.get(box.sandbox, request.id)
        if existing is not None:
            self._duplicate(existing, request, batch)
            return
        record = Record(
            sandbox=box.sandbox,
            id=request.id,
            name=stem,
            state="received",
            received_at=received,
            effect=request.effect,
            payload=request.payload.decode("utf-8"),
            sha256=request.sha256,
            idempotency_key=request.idempotency_key,
        )
        self._audit("received", record, name=stem)
        try:
            self.validator.params(request.effect, request.params)
            handler = self.registry.get(request.effect)
            ctx = self._context(record)
            handler.check(request.params, ctx)
            reversible = handler.reversible_for(request.params, ctx)
            record = record.evolve(reversible=reversible)
            if self._replay(record, request, batch):
                return
            self._classify(record, request, handler, ctx, batch)
        except Outcome as exc:
            self._conclude_new(record, exc, batch)

    def _attachments(
        self, box: Outbox, stem: str, names: list[str], batch: _Batch
    ) -> dict[str, str]:
        """Take each listed attachment out of the outbox into the content-addressed store."""
        digests: dict[str, str] = {}
        for i, att in enumerate(names):
            file_name = f"{stem}.{att}.bin"
            where = self._claim_attachment(box, file_name)
            if where is None:
                raise Rejected(
                    f"invalid: attachment {att!r} is missing; write {file_name} into the "
                    "outbox (by rename) before the request that lists it",
                    [_issue(f"/attachments/{i}", "missing_attachment", f"no file {file_name}")],
                )
            is_claim = box.claim_fd >= 0
            batch.remove.append((box, where, is_claim))
            try:
                data = intake.read_file(
                    box.claim_fd if is_claim else box.outbox_fd,
                    where,
                    self.config.limits.max_attachment_bytes,
                )
            except Rejected as exc:
                first = exc.issues[0] if exc.issues else None
                message = f"attachment {att!r}: {first.message if first else exc.reason}"
                raise Rejected(
                    f"invalid: {message}",
                    [
                        _issue(
                            f"/attachments/{i}", first.code if first else "bad_attachment", message
                        )
                    ],
                ) from exc
            digests[att] = attachments.store(self.config.state_dir, data)
        return digests

    def _claim_attachment(self, box: Outbox, file_name: str) -> str | None:
        claimed = self._claim(box, file_name, kind=Kind.ATTACHMENT)
        if claimed is not None:
            return claimed
        # after a crash, it may already be in the claim dir
        for leftover in box.claimed():
            if leftover.split("~", 1)[0] == file_name:
                return leftover
        return None

    def _record_invalid(
        self,
        box: Outbox,
        rid: str,
        stem: str,
        raw: bytes,
        doc: Any,
        exc: Rejected,
        received: str,
        batch: _Batch,
    ) -> None:
        existing = self.ledger.get(box.sandbox, rid)
        if existing is not None and existing.sha256 == (sha256_hex(raw) if raw else None):
            return  # the same bytes again: a consumed file read once more after a restart
        if existing is not None:
            log.warning(
                "sandbox %s: %s reused id %r; the first request's result stands",
                box.sandbox,
                stem,
                rid,
            )
            self._audit("duplicate_id", existing, name=stem, sha256=sha256_hex(raw))
            return
        record = Record(
            sandbox=box.sandbox,
            id=rid,
            name=stem,
            state="received",
            received_at=received,
            effect=doc.get("effect")
            if isinstance(doc, dict) and isinstance(doc.get("effect"), str)
            else None,
            sha256=sha256_hex(raw) if raw else None,
        )
        self._audit("received", record, name=stem)
        self._conclude_new(record, exc, batch)

    def _duplicate(self, existing: Record, request: Request, batch: _Batch) -> None:
        if existing.sha256 == request.sha256:
            return  # the same bytes again (a retry, or a file read before a crash)
        log.warning(
            "sandbox %s: request id %r was used again with other content; the first "
            "request's result stands",
            existing.sandbox,
            existing.id,
        )
        self._audit("duplicate_id", existing, sha256=request.sha256, name=request.name)

    def _replay(self, record: Record, request: Request, batch: _Batch) -> bool:
        key = request.idempotency_key
        if key is None:
            return False
        first = self.ledger.by_idempotency_key(request.sandbox, key)
        if first is None:
            return False
        same = first.effect == request.effect and first.envelope.get("params") == request.params
        if not same:
            raise Rejected(
                f"invalid: idempotency_key {key!r} was used by request {first.id} for a "
                "different effect or params; use a new key for a new request",
                [
                    _issue(
                        "/idempotency_key",
                        "idempotency_conflict",
                        "the key was used for another payload",
                    )
                ],
            )
        record = record.evolve(replay_of=first.id)
        if first.terminal:
            record = self._copy_outcome(record, first)
            batch.answer.append(record)
        self.ledger.insert(record)
        self._audit("replayed", record, of=first.id, status=record.state)
        return True

    def _copy_outcome(self, record: Record, first: Record) -> Record:
        """The first request's outcome, on the replay's own clock."""
        stamp = iso(now())
        return record.evolve(
            state=first.state,
            reason=first.reason,
            output=first.output,
            errors=first.errors,
            decided_by=first.decided_by,
            decided_at=stamp,
            completed_at=stamp,
        )

    def _classify(
        self, record: Record, request: Request, handler: Any, ctx: Context, batch: _Batch
    ) -> None:
        verdict = self.policy.classify(request.effect, request.params, bool(record.reversible))
        stamp = iso(now())
        record = record.evolve(verdict=verdict.to_json())
        if verdict.action == "deny":
            raise _Denied(f"denied by policy ({verdict.rule}): {verdict.reason}", verdict.rule)
        if verdict.action == "auto":
            record = self.ledger.insert(
                record.evolve(
                    state="applying",
                    decided_by="policy",
                    decided_at=stamp,
                    reason=f"applied automatically ({verdict.rule}): {verdict.reason}",
                )
            )
            self._audit("decided", record, action="auto", rule=verdict.rule, by="policy")
            self._audit("applying", record)
            if getattr(handler, "inline", False) and _idempotent(handler, record, self.config):
                # fast and safe to repeat: applied in this request's own commit (a crash
                # before it commits reads the claimed file again and applies it again)
                self._in_flight.add(record.key)
                self._finish(("done", record.key, *self._call(record)), batch)
            else:
                batch.apply.append(record)
            return
        if self.ledger.count_waiting(record.sandbox) >= self.config.limits.max_pending_per_sandbox:
            raise _Denied(
                f"denied: {self.config.limits.max_pending_per_sandbox} requests from this sandbox "
                "already wait for a person; wait for their results before sending more",
                "pending_cap",
            )
        try:
            preview = handler.preview(request.params, ctx).to_json()
        except EffectFailed as exc:
            preview = {
                "title": "the preview could not be computed",
                "target": request.effect,
                "body": exc.reason,
                "body_kind": "text",
                "facts": [],
            }
        except Exception:
            log.exception("preview of %s/%s failed", record.sandbox, record.id)
            preview = {
                "title": "the preview could not be computed",
                "target": request.effect,
                "body": "the handler failed while computing its preview; see the broker's log",
                "body_kind": "text",
                "facts": [],
            }
        on_timeout = verdict.on_timeout
        if on_timeout == "approve" and not record.reversible:
            on_timeout = "deny"  # fail closed: this request cannot be undone
        expires = now() + timedelta(seconds=verdict.timeout_s)
        record = self.ledger.insert(
            record.evolve(
                state="pending",
                preview=self._redact(preview),
                expires_at=iso(expires),
                on_timeout=on_timeout,
                reason=f"waiting for {verdict.approvals} approval(s): {verdict.reason}",
            )
        )
        self._audit(
            "pending",
            record,
            rule=verdict.rule,
            expires_at=record.expires_at,
            on_timeout=on_timeout,
        )
        batch.answer.append(record)
        batch.deadlines.append(record)

    def _conclude_new(self, record: Record, exc: Outcome, batch: _Batch) -> None:
        stamp = iso(now())
        issues = [i.to_json() for i in getattr(exc, "issues", ())]
        by = "policy" if isinstance(exc, _Denied) else None
        record = self.ledger.insert(
            record.evolve(
                state=exc.status,
                reason=self._redact(exc.reason),
                errors=self._redact(issues),
                decided_by=by,
                decided_at=stamp if by else None,
                completed_at=stamp,
            )
        )
        extra: dict[str, Any] = {"reason": record.reason}
        if isinstance(exc, _Denied):
            extra["rule"] = exc.rule
        if issues:
            extra["errors"] = [f"{i['path']}: {i['code']}" for i in issues][:20]
        self._audit(exc.status, record, **extra)
        batch.answer.append(record)

    # -- applying ---------------------------------------------------------------

    def _context(self, record: Record) -> Context:
        return context_for(self.config, record)

    def _submit(self, record: Record) -> None:
        if record.key in self._in_flight:
            return
        self._in_flight.add(record.key)
        self._pool.submit(self._run_handler, record)

    def _run_handler(self, record: Record) -> None:
        """On a worker: call the handler; the outcome goes back through the queue."""
        self.events.put(("done", record.key, *self._call(record)))

    def _call(self, record: Record) -> tuple[str, str | None, Any, list[dict[str, str]]]:
        """Apply one request: (status, reason, output, issues); never raises."""
        try:
            handler = self.registry.get(record.effect or "")
            params = record.envelope["params"]
            ctx = self._context(record)
            if not _idempotent(handler, record, self.config):
                self.started.mark(record)
            fault("before_apply")
            output = handler.apply(params, ctx)
            fault("after_apply")
            if not isinstance(output, dict):
                raise TypeError(
                    f"{handler.name}.apply returned {type(output).__name__}, not a dict"
                )
            return "applied", None, output, []
        except Outcome as exc:
            return exc.status, exc.reason, None, [i.to_json() for i in getattr(exc, "issues", ())]
        except Exception:
            log.exception("handler for %s/%s raised", record.sandbox, record.id)
            return (
                "failed",
                f"failed: the {record.effect} handler broke on the host; the effect may "
                "not have happened; ask the operator to check the broker's log",
                None,
                [],
            )

    def _finish(self, item: tuple[Any, ...], batch: _Batch) -> None:
        _, key, status, reason, output, issues = item
        self._in_flight.discard(key)
        record = self.ledger.get(*key)
        if record is None or record.state != "applying":
            return
        batch.settled.append(record)
        if status == "applied" and reason is None:
            reason = record.reason or "applied"
        record = self.ledger.update(
            record,
            state=status,
            reason=self._redact(reason),
            output=self._redact(output),
            errors=self._redact(issues) or None,
            completed_at=iso(now()),
        )
        self._audit(status, record, reason=record.reason)
        batch.answer.append(record)
        self._settle_replays(record, batch)

    def _settle_replays(self, record: Record, batch: _Batch) -> None:
        if not record.terminal or record.idempotency_key is None:
            return  # only a request with a key can have replays waiting on it
        for replay in self.ledger.replays_of(record):
            replay = self.ledger.update(
                replay, **_outcome_fields(self._copy_outcome(replay, record))
            )
            self._audit("replayed", replay, of=record.id, status=replay.state)
            batch.answer.append(replay)

    # -- deadlines --------------------------------------------------------------

    def _due(self) -> list[tuple[str, str]]:
        due = []
        stamp = iso(now())
        assert stamp is not None
        while self._deadlines and self._deadlines[0][0] <= stamp:
            _, sandbox, request_id = heapq.heappop(self._deadlines)
            due.append((sandbox, request_id))
        return due

    def _expire(self, sandbox: str, request_id: str, batch: _Batch) -> None:
        record = self.ledger.get(sandbox, request_id)
        if record is None or record.state != "pending":
            return
        stamp = iso(now())
        deadline = (record.verdict or {}).get("timeout_s", 0)
        if record.on_timeout == "approve" and record.reversible:
            record = self.ledger.update(
                record,
                state="applying",
                decided_by="policy (on_timeout)",
                decided_at=stamp,
                reason=(
                    f"applied by policy: nobody decided within {_human(deadline)}, and this "
                    "reversible effect is approved when its deadline passes"
                ),
            )
            self._audit("decided", record, action="approve", by="policy (on_timeout)")
            self._audit("applying", record)
            batch.apply.append(record)
            return
        record = self.ledger.update(
            record,
            state="expired",
            decided_by="policy (on_timeout)",
            decided_at=stamp,
            completed_at=stamp,
            reason=(
                f"expired: nobody decided within {_human(deadline)}, so it was not applied; "
                "ask a person to review it, or send a reversible alternative"
            ),
        )
        self._audit("expired", record, reason=record.reason)
        batch.answer.append(record)
        self._settle_replays(record, batch)

    # -- recovery and reloads ----------------------------------------------------

    def recover(self) -> None:
        """Resume from the ledger: claimed files, results, audit, deadlines, applies."""
        batch = _Batch()
        with self.ledger.transaction():
            for box in self.outboxes.values():
                for where in box.claimed():
                    stem_name = where.split("~", 1)[0]
                    if intake.classify(stem_name)[0] is Kind.REQUEST:
                        self._intake_guarded(box, stem_name, where, batch)
                    else:
                        batch.remove.append((box, where, True))
            for record in self.ledger.in_states(["applying", "approved"]):
                handler = (
                    self.registry.get(record.effect or "")
                    if record.effect in self.registry
                    else None
                )
                if record.state == "approved" or (
                    handler is not None
                    and (
                        _idempotent(handler, record, self.config)
                        or not self.started.seen(record)  # its handler was never called
                    )
                ):
                    if record.state == "approved":
                        record = self.ledger.update(record, state="applying")
                        self._audit("applying", record)
                    batch.apply.append(record)
                    continue
                record = self.ledger.update(
                    record,
                    state="unknown",
                    completed_at=iso(now()),
                    reason=(
                        "unknown: the broker stopped while applying this effect, which is not "
                        "safe to repeat; a person must check whether it happened "
                        "(broker reconcile) before you retry"
                    ),
                )
                self._audit("unknown", record, reason=record.reason)
                batch.answer.append(record)
                batch.settled.append(record)
            self._reload(batch)
            self._missing_results(batch)
            for record in self.ledger.in_states(["pending"]):
                batch.deadlines.append(record)
        self._after_commit(batch)

    def _missing_results(self, batch: _Batch) -> None:
        """Result files lost since they were written (no fsync: a power cut) come back."""
        for box in self.outboxes.values():
            present = set(os.listdir(box.results_fd))
            for request_id in self.ledger.answered_ids(box.sandbox):
                if f"{request_id}.json" not in present:
                    record = self.ledger.get(box.sandbox, request_id)
                    if record is not None:
                        batch.answer.append(record)

    def _reload(self, batch: _Batch) -> None:
        """Pick up what other processes changed: decisions, results to (re)write."""
        for record in self.ledger.unsynced():
            if record.state == "approved":
                record = self.ledger.update(record, state="applying")
                self._audit("applying", record)
                batch.apply.append(record)
            elif record.replay_of and not record.terminal:
                first = self.ledger.get(record.sandbox, record.replay_of)
                if first is not None and first.terminal:
                    self._settle_replays(first, batch)
            else:
                batch.answer.append(record)

    # -- after the commit --------------------------------------------------------

    def _purge(self, budget_s: float | None = None) -> None:
        """Remove consumed request files from the claim dirs: all of them, or as many as
        fit in `budget_s` (unlinks can be slow, and the loop must stay responsive)."""
        end = None if budget_s is None else time.monotonic() + budget_s
        while self._consumed and (end is None or time.monotonic() < end):
            box, name = self._consumed.popleft()
            if box.claim_fd >= 0:
                self._remove(box, name, True)

    def _remove(self, box: Outbox, name: str, is_claim: bool) -> None:
        fault("before_remove")
        dir_fd = box.claim_fd if is_claim else box.outbox_fd
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if is_claim:
                    shutil.rmtree(name, dir_fd=dir_fd)
                else:
                    os.rmdir(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("sandbox %s: cannot remove %r: %s", box.sandbox, name, exc.strerror)
        fault("after_remove")

    def _answer(self, record: Record) -> None:
        result = record.result()
        box = self.outboxes.get(record.sandbox)
        if result is None or box is None:
            return
        try:
            results.write(box.results_fd, result)
        except OSError as exc:
            log.error("sandbox %s: cannot write result %s: %s", record.sandbox, record.id, exc)
            return
        fault("after_result")
        self._synced.append((record.sandbox, record.id, record.state))
        for notify in self.on_change:
            try:
                notify(record)
            except Exception:
                log.exception("an observer failed; the request is unaffected")

    def _mark_synced(self) -> None:
        if self._synced:
            self.ledger.mark_synced(self._synced)
            self._synced = []
        if self._audit_done:
            self.ledger.drop_audit(*self._audit_done)
            self._audit_done = None

    def _flush_audit(self) -> None:
        """Append new events now; fsync (and let the ledger forget them) once a second.

        Events stay queued in the ledger until the log holding them is fsynced, so a
        crash before the sync loses none: they are appended again at start.
        """
        backlog = self.ledger.audit_backlog(after=self._audit_appended)
        if backlog:
            self._audit_appended = self.audit.append(backlog, sync=False)
        if time.monotonic() - self._audit_synced_at >= AUDIT_SYNC_S:
            self._sync_audit()

    def _sync_audit(self) -> None:
        if self._audit_appended > self._audit_synced:
            self.audit.sync()
            self._audit_synced = self._audit_appended
            self._audit_done = (self._audit_appended, self.audit.head)
        self._audit_synced_at = time.monotonic()

    def _audit(self, kind: str, record: Record, **extra: Any) -> None:
        self.ledger.queue_audit(self._redact(audit_event(kind, record, **extra)))

    def _redact(self, value: Any) -> Any:
        if not self._secrets or value is None:
            return value
        if isinstance(value, str):
            for secret in self._secrets:
                value = value.replace(secret, REDACTED)
            return value
        if isinstance(value, dict):
            return {self._redact(k): self._redact(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._redact(v) for v in value]
        return value


def context_for(config: Config, record: Record) -> Context:
    """What a handler gets besides params, for one recorded request."""
    integration = (record.effect or "").split(".", 1)[0]

    def secret(key: str) -> str | None:
        return config.secret(integration, key)

    def attachment(name: str) -> Path:
        digest = (record.envelope.get("attachments") or {}).get(name)
        if not digest:
            raise EffectFailed(f"failed: no attachment named {name!r} came with the request")
        return attachments.path(config.state_dir, str(digest))

    return Context(
        sandbox=record.sandbox,
        request_id=record.id,
        request_sha256=record.sha256 or "",
        settings=config.integration(integration),
        state_dir=config.state_dir,
        secret=secret,
        attachment=attachment,
    )


class _Denied(Outcome):
    status = "denied"

    def __init__(self, reason: str, rule: str) -> None:
        super().__init__(reason)
        self.rule = rule


def _issue(path: str, code: str, message: str) -> Any:
    from broker.errors import Issue

    return Issue(path, code, message)


def _outcome_fields(record: Record) -> dict[str, Any]:
    return {
        "state": record.state,
        "reason": record.reason,
        "output": record.output,
        "errors": record.errors,
        "decided_by": record.decided_by,
        "decided_at": record.decided_at,
        "completed_at": record.completed_at,
    }


def _idempotent(handler: Any, record: Record, config: Config) -> bool:
    """Whether this request may be applied again (the handler's per-request answer)."""
    per_request = getattr(handler, "idempotent_for", None)
    if not callable(per_request):
        return bool(handler.idempotent)
    try:
        return bool(per_request(record.envelope.get("params", {}), context_for(config, record)))
    except Exception:  # when in doubt, a person reconciles
        log.exception("idempotent_for of %s/%s failed", record.sandbox, record.id)
        return False


def _human(seconds: float) -> str:
    seconds = float(seconds)
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"
