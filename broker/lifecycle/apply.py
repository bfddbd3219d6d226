"""Applying effects off the loop: a worker pool that is fair across sandboxes, and the
one call into a handler's apply, which never raises.

A sandbox runs at most `per_sandbox` jobs at once; its other jobs wait while other
sandboxes' go ahead, so one sandbox's slow or hung service delays no other sandbox.
A job given a deadline that overruns it is abandoned: its slot is freed and a new
thread takes its place (the hung thread ends when its call returns). Threads start
when jobs need them, up to `threads`, and `shutdown` joins them.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from broker.clock import REAL, Clock
from broker.config import Config
from broker.context import context_for
from broker.errors import Outcome
from broker.events import Applied
from broker.faults import fault
from broker.lifecycle.marks import StartMarks
from broker.masking import Masker
from broker.models import Record
from broker.registry import Effect
from effects.base import Context

log = logging.getLogger("broker")
MAX_ABANDONED = 32  # hung threads tolerated before overdue jobs keep their slot
BROKE = "handler broke on the host"  # in the reason of an apply that raised unexpectedly


@dataclass(eq=False)
class Job:
    sandbox: str
    run: Callable[[], None]
    deadline: float | None = None  # seconds it may run (on the pool's clock)
    started: float | None = None
    abandoned: bool = field(default=False)
    thread: threading.Thread | None = None


class Workers:
    """Threads that run jobs, round-robin across sandboxes, `per_sandbox` at a time."""

    def __init__(
        self,
        threads: int = 4,
        per_sandbox: int = 2,
        name: str = "broker-apply",
        clock: Clock = REAL,
    ) -> None:
        self._target = threads
        self.clock = clock
        self._per_sandbox = per_sandbox
        self._name = name
        self._lock = threading.Condition()
        self._queues: dict[str, deque[Job]] = {}
        self._order: deque[str] = deque()  # sandboxes with queued jobs, in turn
        self._running: dict[str, int] = {}
        self._active: set[Job] = set()
        self._threads = 0
        self._abandoned = 0
        self._queued = 0  # jobs waiting for a thread
        self._idle = 0  # threads waiting for a job
        self._closing = False
        self._all: list[threading.Thread] = []
        self._hung: set[threading.Thread] = set()  # abandoned: not waited for

    def submit(self, sandbox: str, run: Callable[[], None], deadline_s: float | None = None) -> Job:
        job = Job(sandbox, run, deadline_s)
        with self._lock:
            if self._closing:
                raise RuntimeError("the workers are shutting down")
            queue = self._queues.setdefault(sandbox, deque())
            if not queue:
                self._order.append(sandbox)
            queue.append(job)
            self._queued += 1
            self._grow()
            self._lock.notify()
        return job

    def overdue(self) -> list[Job]:
        """Give up on running jobs past their deadline; return them."""
        now = self.clock.monotonic()
        late: list[Job] = []
        with self._lock:
            for job in list(self._active):
                if (
                    job.deadline is not None
                    and job.started is not None
                    and now - job.started >= job.deadline
                    and self._abandoned < MAX_ABANDONED
                ):
                    self._abandon(job)
                    late.append(job)
            if late:
                self._grow()
                self._lock.notify_all()
        return late

    def next_deadline(self) -> float:
        """Seconds until the earliest running job's deadline (an hour if none is near;
        none at all once no more jobs can be abandoned)."""
        with self._lock:
            if self._abandoned >= MAX_ABANDONED:
                return 3600.0
            due = [
                j.started + j.deadline - self.clock.monotonic()
                for j in self._active
                if j.deadline is not None and j.started is not None
            ]
        return max(0.0, min(due)) if due else 3600.0

    def shutdown(self, wait: bool = True, cancel: bool = False) -> None:
        """Run what is queued (or, with `cancel`, drop it and give up on running jobs
        that have a deadline), then stop the threads and join them; abandoned ones are
        not waited for: they end when their call returns."""
        with self._lock:
            self._closing = True
            if cancel:
                self._queues.clear()
                self._order.clear()
                self._queued = 0
                for job in list(self._active):
                    if job.deadline is not None:
                        self._abandon(job)
            self._lock.notify_all()
            threads = [t for t in self._all if t not in self._hung]
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    # -- the threads ------------------------------------------------------------------

    def _abandon(self, job: Job) -> None:
        """Free a running job's slot; its thread ends when its call returns (lock held)."""
        job.abandoned = True
        self._active.discard(job)
        self._running[job.sandbox] -= 1
        self._abandoned += 1
        if job.thread is not None:
            self._hung.add(job.thread)

    def _grow(self) -> None:
        """Start a thread if a queued job has none to take it (lock held)."""
        if self._queued > self._idle and self._threads - self._abandoned < self._target:
            self._spawn()

    def _spawn(self) -> None:
        self._threads += 1
        thread = threading.Thread(target=self._work, name=self._name, daemon=True)
        self._all.append(thread)
        thread.start()

    def _take(self) -> Job | None:
        """The next job whose sandbox has a free slot (lock held), or None to stop."""
        while True:
            for _ in range(len(self._order)):
                sandbox = self._order[0]
                self._order.rotate(-1)
                if self._running.get(sandbox, 0) < self._per_sandbox:
                    queue = self._queues[sandbox]
                    job = queue.popleft()
                    if not queue:
                        del self._queues[sandbox]
                        self._order.remove(sandbox)
                    self._running[sandbox] = self._running.get(sandbox, 0) + 1
                    self._queued -= 1
                    job.started = self.clock.monotonic()
                    job.thread = threading.current_thread()
                    self._active.add(job)
                    return job
            if self._closing and not self._order:
                return None
            self._idle += 1
            try:
                self._lock.wait()
            finally:
                self._idle -= 1

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                job = self._take()
                if job is None:
                    self._threads -= 1
                    return
            try:
                job.run()
            except Exception:  # a job reports its own outcome; this is a bug in one
                log.exception("a worker job failed")
            with self._lock:
                if job.abandoned:
                    self._abandoned -= 1
                    self._hung.discard(me)
                    self._all.remove(me)  # a replacement took its place: this one ends
                    self._threads -= 1
                    return
                self._active.discard(job)
                self._running[job.sandbox] -= 1
                self._lock.notify_all()


def call(effect: Effect, record: Record, config: Config, marks: StartMarks) -> Applied:
    """Apply one request with its handler; the outcome as an event, never an exception."""
    ctx = context_for(config, record)
    applied = _call(effect, record, config, marks, ctx)
    assert ctx.grants is not None
    minted, used = ctx.grants.secrets(), ctx.grants.close()
    if not used:
        return applied
    # the credential's scope is recorded with the outcome; the credential itself never
    mask = Masker(minted)
    # a failed apply's row keeps them too (`broker show`, the card): what it held
    output = {**(mask(applied.output) if applied.output is not None else {}), "credential": used}
    reason = mask.text(applied.reason) if applied.reason is not None else None
    issues = mask(applied.issues)
    return replace(applied, output=output, reason=reason, issues=issues, credential=used)


def _call(
    effect: Effect, record: Record, config: Config, marks: StartMarks, ctx: Context
) -> Applied:
    try:
        params = record.envelope["params"]
        if not idempotent(effect, record, config, ctx):
            marks.mark(record)
        fault("before_apply")
        output = effect.apply(params, ctx)
        fault("after_apply")
        if not isinstance(output, dict):
            raise TypeError(f"{effect.name}.apply returned {type(output).__name__}, not a dict")
        return Applied(record.key, "applied", None, output)
    except Outcome as exc:
        issues = [i.to_json() for i in exc.issues]
        return Applied(record.key, exc.status, exc.reason, None, issues)
    except Exception:
        log.exception("handler for %s/%s raised", record.sandbox, record.id)
        return Applied(
            record.key,
            "failed",
            f"failed: the {record.effect} {BROKE}; the effect may "
            "not have happened; ask the operator to check the broker's log",
        )


def idempotent(effect: Effect, record: Record, config: Config, ctx: Context | None = None) -> bool:
    """Whether this request may be applied again (the handler's per-request answer)."""
    try:
        ctx = ctx if ctx is not None else context_for(config, record)
        return effect.idempotent_for(record.envelope.get("params", {}), ctx)
    except Exception:  # when in doubt, a person reconciles
        log.exception("idempotent_for of %s/%s failed", record.sandbox, record.id)
        return False
