"""The broker's Prometheus metrics, kept by an observer (broker.observability.tap) of the loop.

    broker_requests_total{effect, outcome}         counter: answered (applied, denied,
                                                   expired, invalid, failed, unknown)
    broker_pending_requests{effect}                gauge: waiting for a person
    broker_approval_wait_seconds{effect, outcome}  histogram: approved, denied, expired,
                                                   timeout_approved
    broker_apply_duration_seconds{effect, outcome} histogram
    broker_handler_errors_total{effect, kind}      counter: service, crash, check,
                                                   invalid_params, unknown
    broker_applied_with_warning_total{effect, status}  counter: applied, but the service
                                                   answered an error status (4xx, 5xx)
    broker_audit_flush_lag_seconds                 histogram: appended lines' wait for fsync
    broker_audit_unsynced_seconds                  gauge: the oldest line still waiting
    broker_watcher_rescans_total                   counter (and _restarts_total)
    broker_observer_failures_total{observer}       counter
    broker_credentials_minted_total{provider}      counter: credentials minted per apply
    broker_credentials_refused_total{provider}     counter: mints refused (nothing applied)
    broker_credentials_revoke_failed_total{provider}  counter: minted, not revoked: it
                                                   lives until it expires (logged)

An `effect` label is a registered effect's name, or `(unregistered)`: a name a sandbox
made up never becomes a label (nor a new time series). Times come from the requests'
own timestamps: the approval wait runs from the moment the request started to wait to
the decision, the apply from its commit (`applying`) to the outcome, worker queue
included. Counters count from the broker's start, as Prometheus expects.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from broker import grants
from broker.clock import parse_iso
from broker.events import Key
from broker.lifecycle.apply import BROKE
from broker.models import TERMINAL, Record
from broker.observability.tap import Event
from broker.outcomes import service_status

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 86400)
APPLY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
UNREGISTERED = "(unregistered)"
TIMEOUT = "policy (on_timeout)"
REMEMBERED = 100_000  # keys remembered per table, oldest forgotten first
V = TypeVar("V")


class Metrics:
    """The metrics of one serving broker, in their own registry (`registry`)."""

    name = "metrics"

    def __init__(self, effects: Iterable[str]) -> None:
        self.registry = CollectorRegistry()
        self.effects = frozenset(effects)
        r = self.registry
        self.requests = Counter(
            "broker_requests", "Requests answered, by outcome", ["effect", "outcome"], registry=r
        )
        self.pending = Gauge(
            "broker_pending_requests", "Requests waiting for a person", ["effect"], registry=r
        )
        self.approval_wait = Histogram(
            "broker_approval_wait_seconds",
            "From a request's start of waiting for people to their decision (or its expiry)",
            ["effect", "outcome"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.apply_duration = Histogram(
            "broker_apply_duration_seconds",
            "From an apply's commit to its outcome (the worker queue and the handler)",
            ["effect", "outcome"],
            buckets=APPLY_BUCKETS,
            registry=r,
        )
        self.handler_errors = Counter(
            "broker_handler_errors", "Handler failures, by kind", ["effect", "kind"], registry=r
        )
        self.service_status = Counter(
            "broker_applied_with_warning",
            "Applied effects whose service answered an error status, by its class (4xx, 5xx)",
            ["effect", "status"],
            registry=r,
        )
        self._declare_audit_and_watcher(r)
        r.register(_Credentials())
        self._pending: OrderedDict[Key, str] = OrderedDict()  # key → its effect label
        self._applying: OrderedDict[Key, str] = OrderedDict()  # key → when it began applying
        self._counted: OrderedDict[Key, bool] = OrderedDict()  # outcomes already counted

    def _declare_audit_and_watcher(self, r: CollectorRegistry) -> None:
        self.audit_lag = Histogram(
            "broker_audit_flush_lag_seconds",
            "How long appended audit lines waited for the fsync that made them durable",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.audit_unsynced = Gauge(
            "broker_audit_unsynced_seconds",
            "Age of the oldest audit line appended but not yet fsynced (0: none)",
            registry=r,
        )
        self.rescans = Counter(
            "broker_watcher_rescans",
            "Rescans of the outboxes (periodic, at start, or after a lost event)",
            registry=r,
        )
        self.restarts = Counter("broker_watcher_restarts", "Outbox watchers restarted", registry=r)

    def label(self, effect: object) -> str:
        return effect if isinstance(effect, str) and effect in self.effects else UNREGISTERED

    # -- what the loop says -------------------------------------------------------

    def waiting(self, records: Iterable[Record]) -> None:
        """Requests already pending when the broker starts."""
        for record in records:
            self._wait(record.key, self.label(record.effect))

    def rescanned(self, what: str) -> None:
        (self.restarts if what == "restart" else self.rescans).inc()

    def synced(self, lag_s: float) -> None:
        self.audit_lag.observe(lag_s)

    def events(self, events: Sequence[Event]) -> None:
        for event in events:
            kind = event.get("event")
            key = (str(event.get("sandbox")), str(event.get("id")))
            if kind == "pending":
                self._wait(key, self.label(event.get("effect")))
            elif kind == "applying":
                self._leave(key)
                _remember(self._applying, key, str(event.get("at")))
            elif kind in TERMINAL or event.get("status") in TERMINAL:
                self._leave(key)

    def results(self, records: Sequence[Record]) -> None:
        for record in records:
            if record.state == "pending":
                self._wait(record.key, self.label(record.effect))
            elif record.terminal:
                self._leave(record.key)
                if record.key not in self._counted:
                    _remember(self._counted, record.key, True)
                    self._outcome(record)

    # -- bookkeeping --------------------------------------------------------------

    def _wait(self, key: Key, effect: str) -> None:
        if key not in self._pending:
            _remember(self._pending, key, effect, on_forget=lambda e: self.pending.labels(e).dec())
            self.pending.labels(effect).inc()

    def _leave(self, key: Key) -> None:
        effect = self._pending.pop(key, None)
        if effect is not None:
            self.pending.labels(effect).dec()

    def _outcome(self, record: Record) -> None:
        effect = self.label(record.effect)
        self.requests.labels(effect, record.state).inc()
        if record.replay_of is not None:
            return  # the first request's outcome, copied: nothing was decided or applied
        waited = _waited(record)
        if waited is not None:
            self.approval_wait.labels(effect, _verdict(record)).observe(waited)
        started = self._applying.pop(record.key, None)
        applied = started is not None or (
            record.decided_at is not None and record.state in ("applied", "failed", "unknown")
        )
        if applied:
            took = _seconds(started or record.decided_at, record.completed_at)
            if took is not None:
                self.apply_duration.labels(effect, record.state).observe(took)
        kind = _error_kind(record, applied)
        if kind is not None:
            self.handler_errors.labels(effect, kind).inc()
        status = service_status(record.state, record.output)
        if status is not None:
            self.service_status.labels(effect, f"{status // 100}xx").inc()

    def observe_failures(self, failures: Callable[[], dict[str, int]]) -> None:
        """Count the tap's failing observers (broker_observer_failures_total)."""
        self.registry.register(_Failures(failures))

    def audit_age(self, age: Callable[[], float]) -> None:
        self.audit_unsynced.set_function(age)


def _remember(
    table: OrderedDict[Key, V], key: Key, value: V, on_forget: Callable[[V], None] | None = None
) -> None:
    """Add to a bounded table; the oldest entries go first (and are told to `on_forget`)."""
    table[key] = value
    while len(table) > REMEMBERED:
        _, old = table.popitem(last=False)
        if on_forget is not None:
            on_forget(old)


def _seconds(start: str | None, end: str | None) -> float | None:
    begun, ended = parse_iso(start), parse_iso(end)
    if begun is None or ended is None:
        return None
    return max(0.0, (ended - begun).total_seconds())


def _waited(record: Record) -> float | None:
    """Seconds between starting to wait for people and their decision; None if it never
    waited. The wait began at expires_at minus the rule's timeout (lifecycle.park)."""
    verdict = record.verdict or {}
    expires = parse_iso(record.expires_at)
    if verdict.get("action") != "approve" or expires is None or record.decided_at is None:
        return None
    began = expires - timedelta(seconds=float(verdict.get("timeout_s", 0)))
    decided = parse_iso(record.decided_at)
    return None if decided is None else max(0.0, (decided - began).total_seconds())


def _verdict(record: Record) -> str:
    if record.state == "expired":
        return "expired"
    if record.state == "denied":
        return "denied"
    return "timeout_approved" if record.decided_by == TIMEOUT else "approved"


def _error_kind(record: Record, applied: bool) -> str | None:
    """service: the service refused or broke; crash: the handler raised (a bug); check:
    its check or assessment refused before any apply; invalid_params: it refused the
    params at apply; unknown: the broker stopped mid-apply."""
    if record.state == "unknown":
        return "unknown"
    if record.state == "invalid":
        return "invalid_params" if applied else None
    if record.state != "failed":
        return None
    if not applied:
        return "check"
    return "crash" if BROKE in (record.reason or "") else "service"


class _Failures(Collector):
    def __init__(self, failures: Callable[[], dict[str, int]]) -> None:
        self._failures = failures

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "broker_observer_failures",
            "Observers (log, metrics, traces) that raised",
            labels=["observer"],
        )
        for name, count in sorted(self._failures().items()):
            family.add_metric([name], count)
        yield family


CREDENTIAL_COUNTERS = {
    "minted": ("broker_credentials_minted", "Credentials minted for one apply, by provider"),
    "refused": ("broker_credentials_refused", "Mints a provider refused: nothing was applied"),
    "unrevoked": (
        "broker_credentials_revoke_failed",
        "Minted credentials that could not be revoked: each lives until it expires",
    ),
}


class _Credentials(Collector):
    """The credential providers' counts (broker.grants), read when scraped: the seam
    counts for every caller of a handler (apply, undo, an assessment's preview)."""

    def collect(self) -> Iterator[Metric]:
        counted = grants.counted()
        for what, (name, text) in CREDENTIAL_COUNTERS.items():
            family = CounterMetricFamily(name, text, labels=["provider"])
            for (provider, kind), count in sorted(counted.items()):
                if kind == what:
                    family.add_metric([provider], count)
            yield family
