"""Work off the loop for held requests (a handler's reversibility check, a preview):
one job per request on its own fair pool, each with a deadline. Past it the job is
given up on and the request goes on without it (treated as irreversible, its card
saying why there is no preview); a late answer is then ignored. `assess` is the job:
what the handler says of the request, and its preview when people will see it."""

from __future__ import annotations

import logging
import queue
from typing import Any

from broker.clock import REAL, Clock
from broker.config import Config
from broker.context import Memo, context_for, masked_failure
from broker.errors import EffectFailed
from broker.events import Assessed, Event, Key
from broker.grants import kind_of_credential
from broker.lifecycle.apply import Job, Workers
from broker.masking import Masker
from broker.models import Record
from broker.policy.controls import LiveControls
from broker.policy.ruleset import Policy
from broker.policy.verdict import decide
from broker.registry import Effect, Registry
from broker.store.base import Store
from broker.typing import Params
from effects.base import Context

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
        clock: Clock = REAL,
    ) -> None:
        self.config = config
        self.registry = registry
        self.policy = policy
        self.controls = controls  # read from the pool's threads: replaced whole, never edited
        self.events = events
        self._pool = Workers(threads=threads, name="broker-assess", clock=clock)
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
        """Drop what is queued and join the idle threads: held requests are assessed
        again at start, and a job still running is given up on (not waited for)."""
        self._pool.shutdown(wait=True, cancel=True)


def assess(
    effect: Effect,
    record: Record,
    policy: Policy,
    config: Config,
    controls: LiveControls | None = None,
) -> Assessed:
    """Off the loop: a held request's reversibility (if unknown) and, when people must
    decide, its preview. Never raises: what went wrong travels in the event.

    A request held with its reversibility known was held for a preview: it gets one. Else
    the verdict without the sandbox's history (the loop reads that) says whether."""
    memo = Memo(record.seen)
    ctx = context_for(config, record, memo)
    params = record.envelope["params"]
    reversible = record.reversible
    try:
        if reversible is None:
            reversible = effect.reversible_for(params, ctx)
            protected = effect.protected_for(params, ctx)
            verdict, _ = decide(
                policy, controls, effect.name, params, reversible=reversible, protected=protected
            )
            wanted = verdict.action == "approve" or config.staged.covers(effect.name)
        else:
            protected, wanted = effect.protected_for(params, ctx), True
        preview = preview_of(effect, params, ctx, record) if wanted else None
        if preview is not None:
            minted = ctx.grants.secrets() if ctx.grants is not None else []
            preview = _with_credential(
                Masker(minted)(preview) if minted else preview, config, effect.name
            )
    except EffectFailed as exc:  # its reason may echo what the assessment minted
        minted = ctx.grants.secrets() if ctx.grants is not None else []
        return Assessed(record.key, record.sha256 or "", refused=masked_failure(exc, minted))
    except Exception:
        log.exception("assessing %s/%s failed", record.sandbox, record.id)
        return Assessed(
            record.key,
            record.sha256 or "",
            broken="the handler failed while assessing this request; see the broker's log",
        )
    finally:
        if ctx.grants is not None:
            ctx.grants.close()  # what a preview minted (read-only) ends with it
    return Assessed(record.key, record.sha256 or "", reversible, preview, memo.recall(), protected)


def preview_of(effect: Effect, params: Params, ctx: Context, record: Record) -> dict[str, Any]:
    """The handler's preview, or a card saying why there is none (never a reason to apply)."""
    try:
        return effect.preview(params, ctx).to_json()
    except EffectFailed as exc:
        return no_preview(effect.name, exc.reason)
    except Exception:
        log.exception("preview of %s/%s failed", record.sandbox, record.id)
        return no_preview(
            effect.name, "the handler failed while computing its preview; see the broker's log"
        )


def _with_credential(preview: dict[str, Any], config: Config, effect: str) -> dict[str, Any]:
    """The card says what the apply will hold: a credential minted for it, or a standing one."""
    held = kind_of_credential(config.integration(effect.split(".", 1)[0]), config.credentials)
    if held == "none":
        return preview
    return {**preview, "facts": [*preview.get("facts", []), ["credential", held]]}


def no_preview(effect: str, why: str) -> dict[str, Any]:
    return {
        "title": "the preview could not be computed",
        "target": effect,
        "body": why,
        "body_kind": "text",
        "facts": [],
    }
