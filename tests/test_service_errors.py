"""One outcome on every surface: an apply whose service answered HTTP 501 (a real loopback
server) is `applied` with a warning in `broker show` and its JSON, the serve log (at
WARNING), the metrics, the trace (ERROR, http.response.status_code) and Slack's final
message, with the link to what came back."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from typer.testing import CliRunner

from broker.approval.card import extend
from broker.approval.decisions import card
from broker.cli import app
from broker.config import Config
from broker.observability.logformat import trace_id_for
from broker.observability.metrics import Metrics
from broker.observability.telemetry import Telemetry
from broker.slack.messages import message
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness
from tests.support import eventually
from tests.test_metrics import _samples
from tests.test_tracing import Collector, attrs
from tests.test_tracing import collector as collector  # the loopback OTLP endpoint

POLICY = '[[rules]]\neffect = "http.request"\naction = "auto"\nreason = "test"\n'
WARNING = "applied, but the service answered HTTP 501 NOT IMPLEMENTED"


def test_a_5xx_apply_is_applied_with_a_warning_everywhere(
    tmp_path: Path, httpserver: HTTPServer, collector: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    """Every surface says the same: applied, the service answered 501, and where."""
    httpserver.expect_request("/items/7", method="PUT").respond_with_data(
        "not here", status=501, content_type="text/plain"
    )
    url = f"http://127.0.0.1:{httpserver.port}/items/7"
    cfg = Config(state_dir=tmp_path, metrics={}, tracing={"otlp_endpoint": collector.url})
    telemetry = Telemetry.from_config(cfg, BrokerHarness(tmp_path / "r").registry)
    h = BrokerHarness(
        tmp_path / "h",
        policy=POLICY,
        integrations={"http": {"allow_networks": ["127.0.0.0/8"]}},
        prepare=telemetry.attach,
    )
    caplog.set_level(logging.INFO, logger="broker.requests")
    with h:
        result = h.submit(h.request("http.request", {"method": "PUT", "url": url, "body": "x"}))
        assert (result["status"], result["output"]["status"]) == ("applied", 501)
        rid = result["id"]
        metrics = telemetry.metrics
        assert isinstance(metrics, Metrics)
        eventually(lambda: bool(_samples(metrics, "broker_applied_with_warning_total")))
        assert _samples(metrics, "broker_applied_with_warning_total") == {
            ("http.request", "5xx"): 1.0
        }
        assert _samples(metrics, "broker_requests_total") == {("http.request", "applied"): 1.0}
    telemetry.close()  # exports what is buffered

    (line,) = [r for r in caplog.records if r.getMessage().startswith("applied")]
    assert line.levelno == logging.WARNING and WARNING in line.getMessage()
    assert line.trace_id == trace_id_for("default", rid)  # type: ignore[attr-defined]

    (root,) = [s for _, s in collector.spans if not s.parent_span_id]
    assert root.trace_id.hex() == trace_id_for("default", rid)  # the log line finds it
    assert attrs(root)["http.response.status_code"] == 501
    assert attrs(root)["error.type"] == "501"
    assert root.status.code == root.status.STATUS_CODE_ERROR and WARNING in root.status.message
    (apply,) = [s for _, s in collector.spans if s.name == "apply"]
    assert attrs(apply)["http.response.status_code"] == 501

    runner = CliRunner()
    args = ["show", rid[:8], "--state", str(h.state)]
    shown = json.loads(runner.invoke(app, [*args, "--json"], catch_exceptions=False).stdout)
    assert (shown["status"], shown["warning"], shown["output"]["status"]) == (
        "applied",
        WARNING,
        501,
    )
    assert shown["links"] == [{"key": "url", "url": url}]
    assert [s["step"] for s in shown["timeline"]] == ["received", "decided", "applying", "applied"]
    text = runner.invoke(app, args, catch_exceptions=False, env={"COLUMNS": "200"}).stdout
    assert f"WARNING  {WARNING}" in text and f"LINK  url: {url}" in text
    assert '"status": 501' in text

    ledger = Ledger(h.config.ledger_path)
    try:
        record = ledger.find(rid)
        slack = message(extend(card(ledger, record, h.registry), record.output), None)
    finally:
        ledger.close()
    final = json.dumps(slack["blocks"][-1])
    assert slack["text"].startswith("Applied, with a warning")
    assert WARNING in final and f"<{url}|url>" in final
