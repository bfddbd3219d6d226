"""OpenTelemetry traces from a real `broker serve`, received on a loopback OTLP/HTTP
endpoint that decodes the protobuf export as a collector would: one trace per request,
child spans for validation, policy, the approval wait and apply, GenAI tool-execution
attributes; nothing is sent unless [tracing] asks."""

from __future__ import annotations

import gzip
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.support import ServeSite


@dataclass
class Collector:
    """What the loopback endpoint received: every span, with its service name."""

    url: str
    paths: list[str] = field(default_factory=list)
    spans: list[tuple[str, Span]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def by_name(self) -> dict[str, list[Span]]:
        found: dict[str, list[Span]] = {}
        with self.lock:
            for _, span in self.spans:
                found.setdefault(span.name, []).append(span)
        return found


@pytest.fixture
def collector() -> Iterator[Collector]:
    """An OTLP/HTTP traces endpoint on loopback, decoding each export."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    got = Collector(f"http://127.0.0.1:{server.server_address[1]}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            export = ExportTraceServiceRequest()
            export.ParseFromString(body)
            with got.lock:
                got.paths.append(self.path)
                for resource_spans in export.resource_spans:
                    service = _attributes(resource_spans.resource.attributes)["service.name"]
                    for scope in resource_spans.scope_spans:
                        got.spans.extend((service, span) for span in scope.spans)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield got
    server.shutdown()
    server.server_close()


def _attributes(values: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in values:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


def attrs(span: Span) -> dict[str, Any]:
    return _attributes(span.attributes)


def test_each_request_is_a_trace_of_its_stages(
    tmp_path: Path, home: Path, collector: Collector
) -> None:
    """An automatic write, an approved one, a denied one, a failed one and an invalid one:
    each is its own trace whose root is `execute_tool files.write` with its children."""
    toml = f'[tracing]\notlp_endpoint = "{collector.url}"\nservice_name = "broker-under-test"\n'
    site = ServeSite(tmp_path / "site", home, toml)
    s = site.serve()
    try:
        assert f"traces to {collector.url}/v1/traces" in s.line_with("traces to")
        auto = site.request("files.write", path="auto.txt", content="hi")
        approved = site.request("files.write", path="gate/a.txt", content="hi")
        denied = site.request("files.write", path="gate/b.txt", content="hi")
        site.result(approved, "pending")
        site.result(denied, "pending")
        site.cli("approve", f"sb1/{approved}", "--yes", "--reason", "fine")
        site.cli("deny", f"sb1/{denied}", "--reason", "not there")
        (site.exports / "sb1").mkdir(exist_ok=True)  # files.write writes below root/<sandbox>/
        (site.exports / "sb1" / "taken.txt").write_text("old")
        failed = site.request("files.write", path="taken.txt", content="new")
        invalid = site.request("files.write", path="x")  # no content: schema says no
        for rid in (auto, approved, denied, failed, invalid):
            site.result(rid, timeout=30) if rid != approved else site.result(rid, "applied")
        site.result(denied, "denied")
    finally:
        assert s.stop(signal.SIGINT) == 0  # stopping flushes what is buffered
        s.close()

    assert set(collector.paths) == {"/v1/traces"}
    assert {service for service, _ in collector.spans} == {"broker-under-test"}
    spans = [span for _, span in collector.spans]
    roots = {attrs(sp)["gen_ai.tool.call.id"]: sp for sp in spans if not sp.parent_span_id}
    assert set(roots) == {auto, approved, denied, failed, invalid}
    children: dict[str, dict[str, Span]] = {
        rid: {c.name: c for c in spans if c.parent_span_id == root.span_id}
        for rid, root in roots.items()
    }
    for rid, root in roots.items():
        a = attrs(root)
        assert root.name == "execute_tool files.write"
        assert root.kind == Span.SpanKind.SPAN_KIND_INTERNAL
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["gen_ai.tool.name"] == "files.write"
        assert a["gen_ai.tool.type"] == "function"
        assert a["broker.hosting.sandbox"] == "sb1"
        assert "gen_ai.tool.description" in a
        assert all(c.trace_id == root.trace_id for c in children[rid].values())
        for child in children[rid].values():
            assert root.start_time_unix_nano <= child.start_time_unix_nano
            assert child.end_time_unix_nano <= root.end_time_unix_nano
    assert len({root.trace_id for root in roots.values()}) == 5

    assert set(children[auto]) == {"validation", "policy", "apply"}
    assert "error.type" not in attrs(roots[auto])
    assert attrs(roots[auto])["broker.decided_by"] == "policy"

    gated = children[approved]
    assert set(gated) == {"validation", "policy", "approval", "apply"}
    assert attrs(gated["approval"])["broker.approval.decisions.outcome"] == "approved"
    assert gated["policy"].end_time_unix_nano <= gated["approval"].start_time_unix_nano
    assert gated["approval"].end_time_unix_nano <= gated["apply"].start_time_unix_nano
    assert attrs(roots[approved])["broker.policy.ruleset.rule"] == "rules[0]"

    assert set(children[denied]) == {"validation", "policy", "approval"}
    assert attrs(roots[denied])["error.type"] == "denied"
    assert attrs(children[denied]["approval"])["broker.approval.decisions.outcome"] == "denied"

    assert set(children[failed]) == {"validation", "policy", "apply"}
    assert roots[failed].status.code == Status.StatusCode.STATUS_CODE_ERROR
    assert "exists" in roots[failed].status.message
    assert attrs(children[failed]["apply"])["error.type"] == "failed"

    assert children[invalid] == {}
    assert attrs(roots[invalid])["error.type"] == "invalid"
    assert roots[invalid].status.code != Status.StatusCode.STATUS_CODE_ERROR


def test_nothing_is_sent_unless_tracing_is_configured(
    tmp_path: Path, home: Path, collector: Collector
) -> None:
    """A broker without [tracing] answers requests and exports no span anywhere."""
    site = ServeSite(tmp_path / "site", home)
    s = site.serve()
    try:
        site.result(site.request("files.write", path="a.txt", content="hi"), "applied")
        assert s.stop(signal.SIGINT) == 0
    finally:
        s.close()
    assert not any("traces to" in line for line in s.seen)
    assert collector.paths == []
