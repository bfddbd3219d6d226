"""The broker's loop: wake, take a fair batch, run the stages, commit once, then do the
after-commit I/O.

    claim → read (intake) → admit: validate, check, classify (admission)
          → record every transition (lifecycle) → commit
          → remove consumed files → write results → append audit → hand applies to workers

The ledger row is committed before anything observable follows it (a file removed, a
result written, an audit line appended, a handler called). Everything one wake-up
brings shares one commit. Handlers run on workers; their outcomes come back as events.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from broker.approval.notify import Notifier
from broker.audit.checkpoints import audit_log, checkpoints_for
from broker.clock import REAL, Clock
from broker.config import Config
from broker.errors import LeaseLost, LedgerError, StoreUnavailable
from broker.events import Assessed, Control, Event, FileSeen, Reload, Rescan, Wake
from broker.faults import fault
from broker.intake import claims as intake
from broker.intake.outbox import Outbox
from broker.lifecycle.admission import Admission
from broker.lifecycle.apply import Workers
from broker.lifecycle.assessing import Assessments
from broker.lifecycle.batch import Batch
from broker.lifecycle.marks import StartMarks
from broker.lifecycle.results import Answers
from broker.lifecycle.transitions import Lifecycle
from broker.loop import catalogue, recovery
from broker.loop.aftercommit import AfterCommit
from broker.loop.deadlines import Deadlines
from broker.loop.fairness import Backlog
from broker.loop.handover import Handover, has_requests
from broker.loop.outage import Kept, Outage
from broker.loop.ownership import ControlServer, Runs, StateLock
from broker.loop.wakeup import Sorted, Stages
from broker.masking import Redactor, mask_logs
from broker.policy.ruleset import Policy
from broker.registry import Registry
from broker.store.base import Listener, Store
from broker.store.factory import open_store
from broker.validation import Validator

log = logging.getLogger("broker")
PURGE_BUDGET_S = 0.01  # time spent removing consumed files per idle moment


class Broker:
    """Serves a set of outboxes until stopped. Owns the ledger connection."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        policy: Policy,
        *,
        ledger: Store | None = None,
        workers: int = 4,
        clock: Clock = REAL,
    ) -> None:
        config.staged.check(registry.names())  # before anything opens: one clear error
        self.config = config
        self.clock = clock  # the loop's and every stage's (a test's FakeClock)
        self.registry = registry
        self.policy = policy
        self.ledger = ledger or open_store(config, owner=True)
        self.redact = Redactor(config.secret_values())
        mask_logs(self.redact.secrets)  # and in every log line this process writes
        self.lifecycle = Lifecycle(self.ledger, self.redact, clock)
        # each effect's compiled when first seen; every name for "did you mean"
        validator = Validator(registry.schema, names=registry.names)
        self.claims = intake.Claims(config.limits, validator, config.state_dir, clock)
        self.admission = Admission(config, registry, policy, validator, self.lifecycle)
        self.started = StartMarks(config.state_dir / "started")
        self.audit = self.ledger.audit_sink(
            audit_log(config), checkpoints_for(config, clock), clock
        )
        # what the handlers declare, published into every outbox served
        self.catalogue, self.served = catalogue.served(config, registry, policy, self.ledger.host)
        self.answers = Answers(self.served, self._approvals)
        self.events: queue.Queue[Event] = queue.Queue()
        self.backlog = Backlog()
        self.assessments = Assessments(
            config, registry, policy, self.events, workers, self.admission.controls, clock
        )
        self.deadlines = Deadlines(clock)
        self.consumed = intake.Consumed(clock)
        self.after = self._after_commit(workers)
        self.stages = Stages(
            self.ledger, self.lifecycle, self.claims, self.admission, self.after.apply
        )
        self.on_change = self.answers.observers
        self.on_rescan: list[Callable[[str], None]] = []  # "rescan", "restart": for metrics
        self._owning()
        clock.on_advance(self.wake)  # time moved on: look at the deadlines now

    def _after_commit(self, workers: int) -> AfterCommit:
        """What follows each commit: files removed, results written, audit appended,
        applies handed to `workers` threads."""
        return AfterCommit(
            config=self.config,
            registry=self.registry,
            ledger=self.ledger,
            answers=self.answers,
            audit=self.audit,
            started=self.started,
            deadlines=self.deadlines,
            consumed=self.consumed,
            workers=Workers(threads=workers, clock=self.clock),
            assessments=self.assessments,
            events=self.events,
        )

    def _owning(self) -> None:
        """The state lock (with a shared store, also this host's lease in it), the
        outage tracker and the hand-over to a later broker."""
        self.notifier: Notifier | None = None
        self.command = "broker serve"  # what the state lock says owns the state dir
        self.lock = StateLock(self.config.state_dir, self.ledger.lease(str(self.config.state_dir)))
        self.outage = Outage(self.clock.monotonic)
        self._listener: Listener | None = None
        self.handover = Handover(self.served, self.config.sandboxes_dir)
        self.on_change.append(self.handover.tell)
        self._control_server: ControlServer | None = None
        self.runs: Runs | None = None  # who runs `broker run`s for others (broker serve's)

    def _approvals(self, key: tuple[str, str]) -> int:
        """How many people have approved a pending request so far."""
        return sum(d.verdict == "approve" for d in self.ledger.decisions(*key))

    @property
    def outboxes(self) -> dict[str, Outbox]:
        return self.served.boxes

    def notify_with(self, notifier: Notifier) -> None:
        """Tell people through `notifier` whenever a request starts waiting (and update
        Slack's message when it reaches its outcome)."""
        self.notifier = notifier
        self.on_change.append(lambda record: notifier.observe(self.ledger, record, self.registry))

    # -- what is served -----------------------------------------------------------------

    def add(self, box: Outbox) -> None:
        self.served.add(box)

    def serve_root(self, sandboxes_dir: Path) -> None:
        """Serve every sandbox under <state>/sandboxes/, including ones created later."""
        self.served.add_root(sandboxes_dir)
        self._discover()

    # -- the loop -----------------------------------------------------------------------

    def serve(
        self,
        stop: threading.Event,
        *,
        ready: Callable[[], None] | None = None,
        drain: bool = False,
    ) -> None:
        """Recover, scan, then process events until `stop` is set (then drain, if asked)."""
        self._start()
        if ready:
            ready()
        next_rescan = self.clock.monotonic() + self.config.rescan_interval_s
        try:
            while not stop.is_set():
                timeout = min(
                    0.05 if self.consumed else 0.5,  # idle moments purge consumed files
                    max(0.0, next_rescan - self.clock.monotonic()),
                    self.deadlines.seconds_left(),
                    self.assessments.seconds_left(),
                )
                items = self._take(timeout)
                items.extend(self._overdue())
                self.lock.check()  # a lease lost to another broker stops this one
                if self.served.watcher_died(self.events):
                    for observer in self.on_rescan:
                        observer("restart")
                    items.append(Rescan())
                if not items:
                    self.audit.sync()  # idle: make the audit log durable now
                    self.consumed.purge(PURGE_BUDGET_S)
                if self.clock.monotonic() >= next_rescan:
                    items.append(Rescan())
                    next_rescan = self.clock.monotonic() + self.config.rescan_interval_s
                self.step(items)
                self.handover.releases(self._busy, self.clock.monotonic())
            if drain:
                self.drain()
        finally:
            self.close()

    def _start(self) -> None:
        """Take the state dir, listen, recover, watch, and queue the first scan."""
        if not self.lock.held:
            self.lock.acquire(self.command)
        # listening from the start: what other processes ask waits on the queue meanwhile
        self._control_server = ControlServer(self.config.state_dir, self.events, self.runs)
        self._control_server.start()
        # decisions others commit on this host's requests wake the loop (shared store)
        self._listener = self.ledger.listen(lambda: self.events.put(Reload()))
        # a store gone between the lock and here is waited out too; its end reloads them
        self.outage.attempt(self.admission.controls.refresh, False, Kept(recover=True))
        if not self.outage.active:
            self._recover()
        self.served.watch(self.events)
        # now that every watch is in place: read what is there and reload decisions
        # taken while we started (their nudges may have come before the watches)
        self.events.put(Rescan())

    def drain(self, timeout: float = 30.0) -> None:
        """Process what is in the outboxes and wait for applies in flight."""
        end = REAL.monotonic() + timeout  # real time: it waits for real work to end
        self.rescan()
        while REAL.monotonic() < end:
            items = self._take(0.05)
            items.extend(self._overdue())
            self.step(items)
            if (
                not self.after.in_flight
                and not self.assessments
                and self.events.empty()
                and not self.backlog
                and not self._pending_files()
            ):
                break
        self.consumed.purge()

    def _pending_files(self) -> bool:
        return any(has_requests(box.names()) for box in self.served.boxes.values())

    def wake(self) -> None:
        """Make the loop look at its stop event now rather than at its next timeout."""
        self.events.put(Wake())

    def close(self) -> None:
        """Stop in reverse data-flow order: the control socket, watcher, workers, what
        they brought back, consumed files, the audit log, the ledger, the state lock."""
        if self._control_server is not None:
            self._control_server.close()
            self._control_server = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.after.closing = True  # what is still to apply or assess waits for the next start
        self.assessments.shutdown()
        self.after.workers.shutdown(wait=True)
        while items := self._take(0):  # applies that finished during shutdown
            self.step(items)
        self.consumed.purge()
        self.audit.sync(final=True)  # and a last checkpoint exported
        self.step([])  # the ledger learns what is durable in the log and results
        self.served.close()  # its watcher too
        if self.notifier is not None:
            self.notifier.close()
        self.ledger.close()
        self.lock.release()

    def _take(self, timeout: float) -> list[Event]:
        return self.backlog.wake_up(self.events, timeout)

    # -- one wake-up --------------------------------------------------------------------

    def _discover(self) -> None:
        """Serve the sandboxes that appeared, and read what their outboxes already hold:
        an agent may write before its outbox is watched."""
        for box in self.served.discover():
            for name in box.names():
                self.events.put(FileSeen(str(box.outbox), name))

    def rescan(self) -> None:
        """Converge on the outboxes' real contents; events are only a hint."""
        for observer in self.on_rescan:
            observer("rescan")
        self.served.discover()
        for box in list(self.served.boxes.values()):
            names = box.names()
            for name in names:
                self.events.put(FileSeen(str(box.outbox), name))
            self.claims.drop_orphans(box, names)

    def step(self, items: Iterable[Event]) -> None:
        work, files, reload = self._sort(items)
        work.due = self.deadlines.due()
        if self.outage.active:
            self.outage.keep(work)  # new files wait in their outboxes meanwhile
            if not self.outage.over(self.ledger.ping):
                return
            work, files, reload = self.outage.take(), {}, True
            self.answers.written.extend(work.written)
            if work.recover and not self._recover(work):
                return
            self.events.put(Rescan())  # what came meanwhile is found again
        busy = files or work.claimed or work.done or work.assessed or work.due or reload
        busy = busy or bool(self.stages.withdrawals)
        if not (busy or self.answers.written or self.audit.durable):
            return
        work.claimed += [
            (box, name, self.claims.claim(box, name)) for (_, name), box in files.items()
        ]
        batch = Batch()
        try:
            self.stages.run(work, reload, batch, self.after)
        except StoreUnavailable as exc:  # nothing of it is observable: it is done again
            self.outage.begin(exc, work)
            return
        except LedgerError as exc:
            if isinstance(exc, LeaseLost):
                raise
            # a write sent with others failed: again, one statement at a time, so the
            # request at fault fails alone in its savepoint
            log.warning("a wake-up's commit failed (%s); trying it statement by statement", exc)
            self.answers.written.extend(work.written)
            batch = Batch()
            try:
                with self.ledger.careful():
                    self.stages.run(work, reload, batch, self.after)
            except StoreUnavailable as exc:  # the store went away meanwhile: wait it out
                self.outage.begin(exc, work)
                return
        fault("after_commit")
        self.after.run(batch)

    def _sort(self, items: Iterable[Event]) -> tuple[Kept, dict[tuple[str, str], Outbox], bool]:
        """A wake-up's events: the work for its transaction, the files to claim, and
        whether to reload what others changed."""
        told = Sorted.of(items, self.served.by_dir, self.assessments.accept)
        if told.discover:
            self._discover()
        if told.rescan:
            self.rescan()
        for item in told.controls:
            self._control(item)
        for box, name in told.withdrawn:
            self.stages.withdrawals.see(box, name)
        return told.work, told.files, told.reload

    def _overdue(self) -> list[Event]:
        """Held requests whose work off the loop ran out of time (while the store answers)."""
        if self.outage.active:
            return []
        none: list[Assessed] = []
        return list(self.outage.attempt(lambda: self.assessments.overdue(self.ledger), none))

    # -- recovery and control -----------------------------------------------------------

    def recover(self) -> None:
        """Take the state dir (one owner at a time), then resume from the ledger: claimed
        files, applies, results, audit, deadlines, held requests."""
        if not self.lock.held:
            self.lock.acquire(self.command)
        boxes = list(self.served.boxes.values())
        batch = recovery.resume(
            self.ledger,
            boxes,
            intake=self.stages.intake,
            lifecycle=self.lifecycle,
            registry=self.registry,
            config=self.config,
            started=self.started,
            admission=self.admission,
        )
        self.after.run(batch)

    def _recover(self, work: Kept | None = None) -> bool:
        """`recover`, or an outage that runs it again once the store answers."""
        try:
            self.recover()
        except StoreUnavailable as exc:
            self.outage.begin(exc, work or Kept(recover=True))
            return False
        return True

    def _control(self, item: Control) -> None:
        def rescan(sandbox: str) -> None:
            box = self.served.boxes[sandbox]
            for name in box.names():
                self.events.put(FileSeen(str(box.outbox), name))

        self.handover.control(item, self.clock.monotonic(), rescan)

    def _busy(self, sandbox: str) -> bool:
        """Whether a sandbox still has files to read or work in flight."""
        box = self.served.boxes.get(sandbox)
        if box is None:
            return False
        return (
            has_requests(box.names())
            or self.backlog.holds(str(box.outbox))
            or self.assessments.busy(sandbox)
            or self.after.busy(sandbox)
        )
