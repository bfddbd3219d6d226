"""`/metrics` as an operator's Prometheus scrapes it, after real requests through a real
`broker serve`: on its own loopback port ([metrics] listen) and on the web inbox."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.config import Config
from broker.errors import EffectFailed
from broker.observability.metrics import Metrics
from broker.observability.telemetry import Telemetry
from broker.registry import Registry
from broker.testing import BrokerHarness, FakeHandler
from broker.typing import JSON, Params
from effects.base import Context
from tests.support import TLS, ServeSite, Serving, eventually, run_broker

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of a Prometheus text page, by (name, labels)."""
    response = httpx.get(url, timeout=10, verify=TLS)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def site(tmp_path: Path, home: Path) -> ServeSite:
    return ServeSite(tmp_path / "site", home, '[metrics]\nlisten = "127.0.0.1:0"\n')


@pytest.fixture
def serving(site: ServeSite) -> Iterator[tuple[Serving, str, str]]:
    """serve with the web inbox and the metrics port; (process, metrics URL, inbox URL)."""
    s = site.serve("--listen", "127.0.0.1:0")
    inbox = s.line_with("web inbox on").split()[-1]
    metrics = s.line_with("metrics on").split()[-1]
    yield s, metrics, inbox
    s.close()


def test_requests_outcomes_waits_and_errors_are_scraped(
    site: ServeSite, serving: tuple[Serving, str, str]
) -> None:
    """Applied, approved, denied, failed, invalid and still-pending requests show up as a
    user would query them: counts by effect and outcome, the pending gauge, approval-wait
    and apply-duration histograms, handler errors by kind; the same page on the inbox."""
    _, metrics_url, inbox = serving
    for n in range(2):
        site.request("files.write", path=f"auto{n}.txt", content="hi")
    approved = site.request("files.write", path="gate/a.txt", content="hi")
    denied = site.request("files.write", path="gate/b.txt", content="hi")
    site.request("files.write", path="gate/c.txt", content="hi")  # left waiting
    site.result(approved, "pending")
    site.result(denied, "pending")
    site.cli("approve", f"sb1/{approved}", "--yes")
    site.cli("deny", f"sb1/{denied}", "--reason", "not there")
    (site.exports / "sb1").mkdir(exist_ok=True)  # files.write writes below root/<sandbox>/
    (site.exports / "sb1" / "taken.txt").write_text("old")
    site.request("files.write", path="taken.txt", content="new")
    site.request("files.writ", path="x")  # unknown: never a label of its own

    def answered() -> bool:
        """Six requests are answered in the metrics."""
        got = scrape(metrics_url)
        return sum(v for (n, _), v in got.items() if n == "broker_requests_total") >= 6

    eventually(answered, timeout=30)
    got = scrape(metrics_url)
    total = "broker_requests_total"
    assert value(got, total, effect="files.write", outcome="applied") == 3
    assert value(got, total, effect="files.write", outcome="denied") == 1
    assert value(got, total, effect="files.write", outcome="failed") == 1
    assert value(got, total, effect="(unregistered)", outcome="invalid") == 1
    assert value(got, "broker_pending_requests", effect="files.write") == 1
    wait = "broker_approval_wait_seconds_count"
    assert value(got, wait, effect="files.write", outcome="approved") == 1
    assert value(got, wait, effect="files.write", outcome="denied") == 1
    assert value(got, "broker_approval_wait_seconds_sum", effect="files.write", outcome="approved")
    took = "broker_apply_duration_seconds_count"
    assert value(got, took, effect="files.write", outcome="applied") == 3
    assert value(got, took, effect="files.write", outcome="failed") == 1
    assert value(got, "broker_handler_errors_total", effect="files.write", kind="service") == 1
    assert value(got, "broker_watcher_rescans_total") >= 1
    assert not any('files.writ"' in str(labels) for _, labels in got)

    def synced() -> bool:
        """The audit log has been fsynced at least once."""
        return value(scrape(metrics_url), "broker_audit_flush_lag_seconds_count") >= 1

    eventually(synced, timeout=30)
    on_inbox = scrape(f"{inbox}/metrics")
    assert value(on_inbox, total, effect="files.write", outcome="applied") == 3


def test_no_metrics_unless_configured(tmp_path: Path, home: Path) -> None:
    """Without [metrics] nothing listens for scrapes and the inbox has no /metrics."""
    site = ServeSite(tmp_path / "site", home)
    s = site.serve("--listen", "127.0.0.1:0")
    try:
        inbox = s.line_with("web inbox on").split()[-1]
        assert httpx.get(f"{inbox}/metrics", timeout=10, verify=TLS).status_code == 404
        s.stop(signal.SIGINT)
        assert not any("metrics on" in seen for seen in s.seen)
    finally:
        s.close()


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ('[metrics]\nlisten = "0.0.0.0:9108"\n', ["metrics.listen", "not a loopback address"]),
        ('[metrics]\nlisten = "9108"\n', ["metrics.listen", "expected HOST:PORT"]),
        ("[metrics]\nport = 9108\n", ["metrics.port: unknown key"]),
        ('[tracing]\notlp_endpoint = "collector:4318"\n', ["tracing.otlp_endpoint"]),
    ],
)
def test_a_bad_metrics_or_tracing_table_is_one_line(
    tmp_path: Path, home: Path, toml: str, words: list[str]
) -> None:
    """A mistake in [metrics] or [tracing] stops serve before it serves, naming the key."""
    site = ServeSite(tmp_path / "site", home, toml)
    done = run_broker("serve", "--config", str(site.config), home=home)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [message] = done.stderr.strip().splitlines()
    assert all(w in message for w in words), message


class Crashing(FakeHandler):
    """A fake whose apply raises what no handler should: a bug, not a service's answer."""

    def apply(self, params: Params, ctx: Context) -> JSON:
        if params.get("value") == "bug":
            raise KeyError("oops")
        if params.get("value") == "refused":
            raise EffectFailed("failed: the service said no")
        return super().apply(params, ctx)


def test_handler_errors_are_told_apart_by_kind(tmp_path: Path) -> None:
    """A handler that raises unexpectedly counts as `crash`, one the service refused as
    `service`; both are failed requests; successes are no error."""
    telemetry = Telemetry.from_config(Config(state_dir=tmp_path, metrics={}), Registry())
    h = BrokerHarness(
        tmp_path / "h", handlers=[Crashing("test.crash")], builtins=False, prepare=telemetry.attach
    )
    with h:
        for v in ("bug", "refused", "fine"):
            h.submit(h.request("test.crash", {"value": v}))
        metrics = telemetry.metrics
        assert isinstance(metrics, Metrics)

        def counted() -> bool:
            """All three outcomes are counted."""
            return _total(metrics, "broker_requests_total") >= 3

        eventually(counted)
        errors = _samples(metrics, "broker_handler_errors_total")
        assert errors == {("test.crash", "crash"): 1.0, ("test.crash", "service"): 1.0}
        requests = _samples(metrics, "broker_requests_total")
        assert requests == {("test.crash", "failed"): 2.0, ("test.crash", "applied"): 1.0}
    telemetry.close()


def _samples(metrics: Metrics, name: str) -> dict[tuple[str, ...], float]:
    from prometheus_client import generate_latest

    found = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            if s.name == name:
                found[tuple(s.labels.values())] = s.value
    return found


def _total(metrics: Metrics, name: str) -> float:
    return sum(_samples(metrics, name).values())
