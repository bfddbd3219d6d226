"""Work off the loop for held requests (a handler's reversibility check, a preview):
one job per request on its own fair pool, each with a deadline. Past it the job is
given up on and the request goes on without it (treated as irreversible, its card
saying why there is no preview); a late answer is then ignored."""

from __future__ import annotations

import logging
import queue

from broker.admission import assess
from broker.apply import Job, Workers
from broker.config import Config
from broker.controls import LiveControls
from broker.events import Assessed, Event, Key
from broker.models import Record
from broker.policy import Policy
from broker.registry import Registry
from broker.store.base import Store

log = logging.getLogger("broker")


class Assessments:
    """The jobs in flight, by request; their results come back on the loop's queue."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        policy: Policy,
        events: queue.Queue[Event],
        threads: int,
        controls: LiveControls | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.policy = policy
        self.controls = controls  # read from the pool's threads: replaced whole, never edited
        self.events = events
        self._pool = Workers(threads=threads, name="broker-assess")
        self._jobs: dict[Key, Job] = {}

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def busy(self, sandbox: str) -> bool:
        return any(key[0] == sandbox for key in self._jobs)

    def submit(self, record: Record) -> None:
        if record.key in self._jobs:
            return
        effect = self.registry.effect(record.effect or "")

        def run() -> None:
            self.events.put(assess(effect, record, self.policy, self.config, self.controls))

        self._jobs[record.key] = self._pool.submit(
            record.sandbox, run, self.config.preview_timeout_s
        )

    def accept(self, done: Assessed) -> bool:
        """Whether this result is the one that counts (not a late one given up on)."""
        return self._jobs.pop(done.key, None) is not None

    def seconds_left(self) -> float:
        return self._pool.next_deadline()

    def overdue(self, ledger: Store) -> list[Assessed]:
        """The results of the jobs that ran out of time: the request goes on without."""
        late = self._pool.overdue()
        back = []
        for key, job in list(self._jobs.items()):
            if job not in late:
                continue
            record = ledger.get(*key)
            if record is None:
                self._jobs.pop(key)
                continue
            limit = self.config.preview_timeout_s
            log.warning(
                "sandbox %s: the %s handler did not answer within %gs; %s waits for a "
                "person without a preview",
                key[0],
                record.effect,
                limit,
                key[1],
            )
            why = f"the handler did not answer within {limit:g}s (the service may be slow or down)"
            back.append(Assessed(key, record.sha256 or "", broken=why))
        return back

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)  # held requests are assessed again at start
