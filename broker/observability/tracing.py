"""OpenTelemetry traces of answered requests, exported over OTLP/HTTP ([tracing]).

One trace per request, built after the fact by an observer (broker.observability.tap) when the
request is answered, from its record's timestamps and the stage times admission
measured (broker.loop.wakeup), so nothing is woven through the loop:

    execute_tool files.write           received → answered (GenAI tool-execution span)
    ├── validation                     schema and the handler's checks (when they passed)
    ├── policy                         the rule that classified it
    ├── approval                       waiting for people, until their decision or expiry
    └── apply                          from its commit to the handler's outcome

The root follows the GenAI semantic conventions for tool execution where they fit:
`gen_ai.operation.name = execute_tool`, `gen_ai.tool.name` (the effect),
`gen_ai.tool.call.id` (the request id), `gen_ai.tool.type = function` (the agent
supplies the arguments, the host executes), `gen_ai.tool.description`, and
`error.type` for any outcome but `applied`. A trace's id is derived from its request
(broker.observability.logformat.trace_id_for), the one the request log's lines carry.
An applied effect whose service answered an error status has
`http.response.status_code`, `error.type` set to that code and an ERROR status, on the
root and the apply span. The params and the output stay out of
traces (the conventions make them opt-in: they may hold anything). Broker-specific
attributes are under `broker.`. Every string from a sandbox is neutralised.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from broker import __version__
from broker.clock import parse_iso
from broker.events import Key
from broker.lifecycle.timings import StageTimes
from broker.models import Record
from broker.observability.logformat import trace_id_for
from broker.observability.tap import Event
from broker.outcomes import service_status, service_warning
from broker.untrusted import neutralize

REMEMBERED = 100_000
BROKEN = frozenset({"failed", "unknown"})  # the broker or the service went wrong


@dataclass(frozen=True)
class TracingSettings:
    """[tracing] in broker.toml (read by broker.observability.telemetry)."""

    endpoint: str  # the collector's OTLP/HTTP traces URL (…/v1/traces)
    service_name: str = "sandbox-outbox-broker"
    timeout_s: float = 10.0


@dataclass(frozen=True)
class Child:
    """One child span: a stage of the request."""

    name: str
    start: int
    end: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    error: bool = False


class RequestIds(RandomIdGenerator):
    """Random span ids; a root's trace id is the request's own (logformat.trace_id_for),
    so the request log's `trace_id` finds its trace."""

    def __init__(self) -> None:
        self.next: int | None = None

    def generate_trace_id(self) -> int:
        if self.next is not None:
            return self.next
        return super().generate_trace_id()


class Tracer:
    """An observer that exports one trace per answered request."""

    name = "traces"

    def __init__(self, settings: TracingSettings, descriptions: Mapping[str, str]) -> None:
        resource = Resource.create(
            {"service.name": settings.service_name, "service.version": __version__}
        )
        self.ids = RequestIds()
        self.provider = TracerProvider(resource=resource, id_generator=self.ids)
        exporter = OTLPSpanExporter(endpoint=settings.endpoint, timeout=settings.timeout_s)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("broker", __version__)
        self.descriptions = dict(descriptions)
        self.stages = StageTimes()  # Admission.stages while tracing is on
        self._applying: OrderedDict[Key, str] = OrderedDict()
        self._traced: OrderedDict[Key, bool] = OrderedDict()

    def close(self) -> None:
        """Export what is still buffered, then stop."""
        self.provider.shutdown()

    def events(self, events: Sequence[Event]) -> None:
        for event in events:
            if event.get("event") == "applying":
                key = (str(event.get("sandbox")), str(event.get("id")))
                self._applying[key] = str(event.get("at"))
                while len(self._applying) > REMEMBERED:
                    self._applying.popitem(last=False)

    def results(self, records: Sequence[Record]) -> None:
        for record in records:
            if record.terminal and record.key not in self._traced:
                self._traced[record.key] = True
                while len(self._traced) > REMEMBERED:
                    self._traced.popitem(last=False)
                self._trace(record)

    def _trace(self, record: Record) -> None:
        children = self._children(record)
        end = _ns(record.completed_at) or 0
        end = max([end, *(c.end for c in children)])  # its stamps are whole milliseconds
        start = min([_ns(record.received_at) or end, *(c.start for c in children)])
        self.ids.next = int(trace_id_for(record.sandbox, record.id), 16)
        try:
            root = self.tracer.start_span(
                f"execute_tool {_s(record.effect or '-')}",
                kind=SpanKind.INTERNAL,
                start_time=start,
                attributes=self._attributes(record),
            )
        finally:
            self.ids.next = None
        context = trace.set_span_in_context(root)
        for child in children:
            span = self.tracer.start_span(
                child.name, context=context, start_time=child.start, attributes=child.attributes
            )
            if child.error:
                said = service_warning(record.state, record.output) or record.reason or ""
                span.set_status(Status(StatusCode.ERROR, _s(said)))
            span.end(child.end)
        warning = service_warning(record.state, record.output)
        if record.state in BROKEN or warning:
            root.set_status(Status(StatusCode.ERROR, _s(warning or record.reason or "")))
        root.end(end)

    def _children(self, record: Record) -> list[Child]:
        """Admission's stages as measured, then the approval wait and the apply from the
        record's timestamps (each starting no earlier than the one before ends)."""
        children = [
            Child(name, began, ended) for name, began, ended in self.stages.take(record.key)
        ]
        applying = _ns(self._applying.pop(record.key, None))
        after = max((c.end for c in children), default=0)
        waited = _approval(record)
        if waited is not None:
            outcome: dict[str, AttributeValue] = {
                "broker.approval.decisions.outcome": _decision(record)
            }
            if record.decided_by:
                outcome["broker.decided_by"] = _s(record.decided_by)
            began = max(waited[0], after)
            after = max(began, waited[1])
            children.append(Child("approval", began, after, outcome))
        if applying is None and _was_applied(record):
            applying = _ns(record.decided_at)
        if applying is not None and record.replay_of is None:
            began = max(applying, after)
            ended = max(began, _ns(record.completed_at) or began)
            status = service_status(record.state, record.output)
            broke = record.state in BROKEN or status is not None
            failure: dict[str, AttributeValue] = {}
            if status is not None:
                failure = {"http.response.status_code": status, "error.type": str(status)}
            elif broke:
                failure = {"error.type": record.state}
            children.append(Child("apply", began, ended, failure, error=broke))
        return children

    def _attributes(self, record: Record) -> dict[str, AttributeValue]:
        effect = _s(record.effect or "-")
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": effect,
            "gen_ai.tool.call.id": _s(record.id),
            "gen_ai.tool.type": "function",
            "broker.hosting.sandbox": _s(record.sandbox),
            "broker.outcome": record.state,
        }
        if effect in self.descriptions:
            attributes["gen_ai.tool.description"] = self.descriptions[effect]
        status = service_status(record.state, record.output)
        if record.state != "applied":
            attributes["error.type"] = record.state
        elif status is not None:  # the OTel HTTP conventions: the status code as error.type
            attributes["http.response.status_code"] = status
            attributes["error.type"] = str(status)
        rule = (record.verdict or {}).get("rule")
        optional = {
            "broker.request.sha256": record.sha256,
            "broker.policy.ruleset.rule": rule,
            "broker.decided_by": record.decided_by,
            "broker.replay_of": record.replay_of,
        }
        attributes.update({k: _s(v) for k, v in optional.items() if v is not None})
        return attributes


def _s(value: object) -> str:
    return neutralize(str(value))


def _ns(stamp: str | None) -> int | None:
    moment = parse_iso(stamp)
    return None if moment is None else int(moment.timestamp() * 1_000_000) * 1000


def _approval(record: Record) -> tuple[int, int] | None:
    """When it began waiting for people (expires_at minus its timeout) and was decided."""
    verdict = record.verdict or {}
    expires = parse_iso(record.expires_at)
    decided = _ns(record.decided_at)
    if verdict.get("action") != "approve" or expires is None or decided is None:
        return None
    began = expires - timedelta(seconds=float(verdict.get("timeout_s", 0)))
    start = int(began.timestamp() * 1_000_000) * 1000
    return start, max(start, decided)


def _decision(record: Record) -> str:
    if record.state in ("expired", "denied"):
        return record.state
    return "timeout_approved" if record.decided_by == "policy (on_timeout)" else "approved"


def _was_applied(record: Record) -> bool:
    return record.decided_at is not None and record.state in ("applied", "failed", "unknown")
