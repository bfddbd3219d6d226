"""From a read request to its first committed state: schema, the handler's checks,
replays, the policy's verdict, then applying, waiting for people, or an answer.

Runs inside the wake-up's transaction. A stage ends a request by raising an Outcome
(Rejected, PolicyDenied…): that is its answer, recorded by `broker.lifecycle.transitions`.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from broker import clock
from broker.config import Config
from broker.context import Memo, context_for
from broker.errors import Issue, Outcome, PolicyDenied, Rejected
from broker.events import Assessed
from broker.intake.canonical import canonical_request
from broker.intake.claims import Read
from broker.lifecycle.assessing import no_preview
from broker.lifecycle.batch import Batch
from broker.lifecycle.timings import StageTimes
from broker.lifecycle.transitions import Lifecycle
from broker.models import Record, Request, Verdict, sha256_hex
from broker.names import REQUEST_ID
from broker.policy.controls import LiveControls
from broker.policy.ruleset import Policy
from broker.policy.verdict import decide, ledger_history
from broker.registry import Effect, Registry
from broker.store.base import Store
from broker.validation import Validator

log = logging.getLogger("broker")
UNKNOWN_PROTECTED = "(not known: the assessment did not finish)"


class Admission:
    """Decides what becomes of each request read from an outbox."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        policy: Policy,
        validator: Validator,
        lifecycle: Lifecycle,
    ) -> None:
        self.config = config
        self.registry = registry
        self.policy = policy
        self.validator = validator
        self.lifecycle = lifecycle
        self.ledger: Store = lifecycle.ledger
        self.controls = LiveControls(self.ledger)  # kill switch, remembered rules
        self.stages: StageTimes | None = (
            None  # stage times for traces (broker.observability.tracing); None: off
        )
        self.held: Counter[str] = Counter()  # per sandbox: held for a preview
        self._counted: set[tuple[str, str]] = set()
        self.bad_reuse = Reuses()

    def admit(self, read: Read, batch: Batch) -> None:
        """Record `read` and route it; its claimed files go once this commits."""
        box = read.box
        batch.remove.extend((box, name) for name in read.claimed)
        received = clock.iso(self.lifecycle.clock.now())
        assert received is not None
        if read.rejected is not None:
            if read.hostile:
                batch.urgent.add(read.where)  # a hostile file (a hard link…) goes at once
            self._invalid(read, read.rejected, received, batch)
            return
        request = read.request
        assert request is not None
        request, refused = self._canonical(request)
        existing = self.ledger.get(box.sandbox, request.id)
        if existing is not None:
            self._duplicate(existing, read, request.sha256, received, batch)
            return
        record = Record(
            sandbox=box.sandbox,
            id=request.id,
            name=read.stem,
            state="received",
            received_at=received,
            effect=request.effect,
            payload=request.payload.decode("utf-8"),
            sha256=request.sha256,
            idempotency_key=request.idempotency_key,
        )
        self.lifecycle.receive(record)
        try:
            if refused is not None:
                raise refused
            self._route(record, request, batch)
        except Outcome as exc:
            batch.answer.append(self.lifecycle.reject(record, exc))

    def _canonical(self, request: Request) -> tuple[Request, Outcome | None]:
        """The params schema, then the handler's canonical form: what is recorded,
        hashed, matched, shown and applied (broker.intake.canonical)."""
        try:
            return canonical_request(request, self.registry, self.validator, self.config), None
        except Outcome as exc:
            return request, exc

    def _route(self, record: Record, request: Request, batch: Batch) -> None:
        began = self.stages.start() if self.stages else 0
        effect = self.registry.effect(request.effect)
        memo = Memo()
        ctx = context_for(self.config, record, memo)
        effect.check(request.params, ctx)
        if self.stages:
            self.stages.done(record.key, "validation", began)
        if self._replay(record, request, batch):
            return
        if not effect.assess_inline:  # it may ask a service: never under the write lock
            self.hold(self.lifecycle.hold(record), batch)
            return
        reversible = effect.reversible_for(request.params, ctx)
        protected = effect.protected_for(request.params, ctx)
        record = record.evolve(reversible=reversible, seen=memo.recall())
        self.classify(record, batch, protected=protected)

    def classify(
        self,
        record: Record,
        batch: Batch,
        preview: dict[str, Any] | None = None,
        protected: tuple[str, ...] = (),
    ) -> None:
        """Apply, park or deny a request whose reversibility (and protected paths) are
        known; a request people must decide is held until its preview comes back."""
        params = record.envelope["params"]
        effect = self.registry.effect(record.effect or "")
        record = record.evolve(facts=request_facts(protected))  # recorded with the verdict
        began = self.stages.start() if self.stages else 0
        verdict, _ = decide(
            self.policy,
            self.controls,
            effect.name,
            params,
            reversible=bool(record.reversible),
            protected=protected,
            history=ledger_history(
                self.ledger, record.sandbox, record.id, batch.inline, self.lifecycle.clock
            ),
        )
        if self.stages:
            self.stages.done(record.key, "policy", began)
        if self.config.staged.covers(effect.name):
            self._stage(record, verdict, preview, batch)
            return
        if verdict.action == "deny":
            raise PolicyDenied(_denial(verdict), verdict.rule, verdict, record.facts)
        if verdict.action == "auto":
            inline = effect.inline and _safe_to_repeat(effect, record, self.config)
            record = self.lifecycle.auto(record, verdict, write=not inline)
            (batch.inline if inline else batch.apply).append(record)
            return
        self._check_cap(record, verdict)
        if preview is None:
            self.hold(record if record.seq is not None else self.lifecycle.hold(record), batch)
            return
        record = self.lifecycle.park(record, verdict, preview)
        batch.answer.append(record)
        batch.deadlines.append(record)

    def _stage(
        self, record: Record, verdict: Verdict, preview: dict[str, Any] | None, batch: Batch
    ) -> None:
        """Staged mode: answered `staged` with the verdict and its preview, which is
        computed off the loop first (for every verdict); never applied, never parked."""
        if preview is None:
            self.hold(record if record.seq is not None else self.lifecycle.hold(record), batch)
            return
        record = self.lifecycle.stage(record, verdict, preview)
        batch.answer.append(record)
        batch.answer.extend(self.lifecycle.settle_replays(record))

    def _check_cap(self, record: Record, verdict: Verdict) -> None:
        cap = self.config.limits.max_pending_per_sandbox
        waiting = self.ledger.count_waiting(record.sandbox) + self.held[record.sandbox]
        if waiting >= cap:
            raise PolicyDenied(
                f"denied: {cap} requests from this sandbox already wait for a person; "
                "wait for their results before sending more",
                "pending_cap",
                verdict,  # what the policy said: a person, had there been room
                record.facts,
            )

    def hold(self, record: Record, batch: Batch) -> None:
        """Queue work off the loop for a held request. One held for its preview is known
        to wait for people, so it counts against the sandbox's pending cap already."""
        staged = self.config.staged.covers(record.effect)  # never waits for people
        if record.reversible is not None and record.key not in self._counted and not staged:
            self._counted.add(record.key)
            self.held[record.sandbox] += 1
        batch.assess.append(record)

    def resume(self, record: Record, done: Assessed, batch: Batch) -> None:
        """The work off the loop came back for a held request: carry on from there."""
        if record.key in self._counted:
            self._counted.discard(record.key)
            self.held[record.sandbox] -= 1
        try:
            if done.refused is not None:
                raise done.refused
            preview = done.preview
            if done.broken is not None:
                preview = no_preview(record.effect or "", done.broken)
            reversible = record.reversible
            if reversible is None:
                reversible = bool(done.reversible) and done.broken is None  # fail closed
            record = record.evolve(reversible=reversible, seen=done.seen or record.seen)
            protected = done.protected
            if done.broken is not None and self.registry.effect(record.effect or "").protects:
                protected = (UNKNOWN_PROTECTED,)  # fail closed: a person looks at it
            self.classify(record, batch, preview, protected)
        except Outcome as exc:
            record = self.lifecycle.reject(record, exc)
            batch.answer.append(record)
            batch.answer.extend(self.lifecycle.settle_replays(record))

    def _replay(self, record: Record, request: Request, batch: Batch) -> bool:
        key = request.idempotency_key
        if key is None:
            return False
        first = self.ledger.by_idempotency_key(request.sandbox, key)
        if first is None or (
            first.state == "staged" and not self.config.staged.covers(first.effect)
        ):
            return False  # a staged request applied nothing: its key binds only staged ones
        same = first.effect == request.effect and first.envelope.get("params") == request.params
        if not same:
            raise Rejected(
                f"invalid: idempotency_key {key!r} was used by request {first.id} for a "
                "different effect or params; use a new key for a new request",
                [
                    Issue(
                        "/idempotency_key",
                        "idempotency_conflict",
                        "the key was used for another payload",
                    )
                ],
            )
        replay = self.lifecycle.replay(record, first)
        if replay.terminal:
            batch.answer.append(replay)
        return True

    # -- what is not a new request ------------------------------------------------------

    def _invalid(self, read: Read, exc: Rejected, received: str, batch: Batch) -> None:
        doc, raw = read.doc, read.raw
        rid = doc.get("id") if isinstance(doc, dict) else None
        if not isinstance(rid, str) or not REQUEST_ID.fullmatch(rid):
            rid = read.stem
        sha = sha256_hex(raw) if raw else None
        existing = self.ledger.get(read.box.sandbox, rid)
        if existing is not None:
            if existing.sha256 != sha:  # else: the same bytes again, read after a restart
                self._duplicate(existing, read, sha256_hex(raw), received, batch)
            return
        effect = doc.get("effect") if isinstance(doc, dict) else None
        record = Record(
            sandbox=read.box.sandbox,
            id=rid,
            name=read.stem,
            state="received",
            received_at=received,
            effect=effect if isinstance(effect, str) else None,
            sha256=sha,
        )
        self.lifecycle.receive(record)
        batch.answer.append(self.lifecycle.reject(record, exc))

    def _duplicate(
        self, existing: Record, read: Read, sha: str | None, received: str, batch: Batch
    ) -> None:
        """An id used again with other content. The first request's row stands; the new
        file gets an `invalid` result of its own under its file's name, never another
        request's result: when that name is the id of a request another file made, the
        refusal is written there (the ledger keeps that request). The same file name
        used again keeps its first result (the audit log records the new bytes)."""
        if existing.sha256 == sha:
            return  # the same bytes again (a retry, or a file read before a crash)
        self.lifecycle.audit("duplicate_id", existing, sha256=sha, name=read.stem)
        taken = self.ledger.get(existing.sandbox, read.stem)
        if taken is not None and taken.name == read.stem:
            self.bad_reuse.note(existing.sandbox, existing.id, read.stem)
            return
        message = (
            f"the id {existing.id!r} is already used by another request in this sandbox "
            f"(from {existing.name}.json); this file was not applied: give every request "
            "an id of its own"
        )
        record = Record(
            sandbox=existing.sandbox,
            id=read.stem,
            name=read.stem,
            state="received",
            received_at=received,
            effect=existing.effect,
            sha256=sha,
        )
        exc = Rejected(f"invalid: {message}", [Issue("/id", "duplicate_id", message)])
        if taken is None:
            batch.answer.append(self.lifecycle.reject(record, exc))
            return
        self.bad_reuse.note(existing.sandbox, existing.id, read.stem)
        batch.answer.append(  # a result file only: the ledger's row is the other request's
            record.evolve(
                state="invalid",
                reason=self.lifecycle.redact(exc.reason),
                errors=tuple(i.to_json() for i in exc.issues),
                completed_at=received,
            )
        )


class Reuses:
    """Logs a reused id once per (sandbox, id), not once per version a hostile agent
    renames over it."""

    def __init__(self) -> None:
        self._told: set[tuple[str, str]] = set()

    def note(self, sandbox: str, rid: str, stem: str) -> None:
        if (sandbox, rid) not in self._told and len(self._told) < 10_000:
            self._told.add((sandbox, rid))
            log.warning(
                "sandbox %s: %s reused request id %r with other content; the first "
                "request's result stands",
                sandbox,
                stem,
                rid,
            )


def request_facts(protected: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """What the policy is told about a request beside its params and reversibility,
    as recorded with its verdict: enough to classify it again without live services."""
    return {"protected": list(protected)}


def _denial(verdict: Verdict) -> str:
    if verdict.rule.startswith("disabled:"):  # the kill switch's own sentence
        return verdict.reason
    return f"denied by policy ({verdict.rule}): {verdict.reason}"


def _safe_to_repeat(effect: Effect, record: Record, config: Config) -> bool:
    from broker.lifecycle.apply import idempotent

    return idempotent(effect, record, config)
