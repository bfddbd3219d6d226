"""What observes a serving broker: the request log always, metrics and traces when
broker.toml asks for them. Off, they cost nothing: nothing is attached.

    [metrics]                              # on when the table is present
    listen = "127.0.0.1:9108"              # /metrics on a port of its own (loopback)
    web = true                             # and on the web inbox, when it listens (default)

    [tracing]                              # off unless configured
    otlp_endpoint = "http://127.0.0.1:4318"   # an OpenTelemetry collector, OTLP/HTTP
    service_name = "sandbox-outbox-broker"

    telemetry = Telemetry.from_config(cfg, registry)   # a bad table: ConfigError
    telemetry.attach(broker)                           # before broker.serve()
    telemetry.start(insecure=False)                    # the metrics port; what to tell
    ...
    telemetry.close()                                  # the port closes, traces flush
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from broker.config import Config
from broker.errors import ConfigError
from broker.registry import Registry
from broker.settings import only_keys

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from broker.loop.pipeline import Broker
    from broker.observability.metrics import Metrics
    from broker.observability.tracing import Tracer, TracingSettings

METRICS_KEYS = {"listen", "web"}
TRACING_KEYS = {"otlp_endpoint", "service_name", "timeout"}


@dataclass(frozen=True)
class MetricsSettings:
    """[metrics] in broker.toml."""

    listen: str | None = None
    web: bool = True


def metrics_settings(config: Config) -> MetricsSettings | None:
    table = config.metrics
    if table is None:
        return None
    _known(table, METRICS_KEYS, "metrics")
    listen = table.get("listen")
    if listen is not None and not isinstance(listen, str):
        raise ConfigError('metrics.listen: expected "HOST:PORT", e.g. "127.0.0.1:9108"')
    web = table.get("web", True)
    if not isinstance(web, bool):
        raise ConfigError("metrics.web: expected true or false")
    if listen is not None:
        from broker.addresses import parse_listen

        try:
            parse_listen(listen)
        except ConfigError as exc:
            raise ConfigError(f"metrics.listen: {exc}".replace("--listen ", "")) from None
    return MetricsSettings(listen, web)


def tracing_settings(config: Config) -> TracingSettings | None:
    table = config.tracing
    if table is None:
        return None
    from broker.clock import parse_duration
    from broker.observability.tracing import TracingSettings

    _known(table, TRACING_KEYS, "tracing")
    endpoint = table.get("otlp_endpoint")
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            "tracing.otlp_endpoint: expected the collector's OTLP/HTTP URL, e.g. "
            '"http://127.0.0.1:4318"'
        )
    assert isinstance(endpoint, str)
    path = parts.path.rstrip("/")
    url = endpoint if path.endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"
    name = table.get("service_name", TracingSettings.service_name)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("tracing.service_name: expected a name")
    try:
        timeout = parse_duration(table.get("timeout", "10s"))
    except ValueError as exc:
        raise ConfigError(f"tracing.timeout: {exc}") from exc
    return TracingSettings(url, name, timeout)


def _known(table: Mapping[str, Any], keys: set[str], where: str) -> None:
    only_keys(where, table, keys)


class Telemetry:
    """The observers of one serving broker, and what they serve."""

    def __init__(
        self,
        registry: Registry,
        metrics: MetricsSettings | None,
        tracing: TracingSettings | None,
    ) -> None:
        self.registry = registry
        self.metrics_settings = metrics
        self.tracing_settings = tracing
        self.metrics: Metrics | None = None
        self.tracer: Tracer | None = None
        self._server: WSGIServer | None = None

    @classmethod
    def from_config(cls, config: Config, registry: Registry) -> Telemetry:
        """Check [metrics] and [tracing]; a mistake is a ConfigError naming its key."""
        return cls(registry, metrics_settings(config), tracing_settings(config))

    @property
    def web_metrics(self) -> Metrics | None:
        """What the web inbox serves at /metrics (None: no /metrics there)."""
        wanted = self.metrics_settings is not None and self.metrics_settings.web
        return self.metrics if wanted else None

    def attach(self, broker: Broker) -> None:
        """Observe `broker` (before it serves): its request log, metrics and traces."""
        from broker.observability.requestlog import ServeLog
        from broker.observability.tap import Tap

        tap = Tap.on(broker)
        tap.observers.append(ServeLog(broker.ledger))
        if self.metrics_settings is not None:
            from broker.observability.metrics import Metrics

            metrics = Metrics(broker.registry.names())  # no handler loads for a label
            metrics.waiting(broker.ledger.in_states(["pending"]))
            metrics.observe_failures(lambda: dict(tap.failures))
            metrics.audit_age(broker.audit.undurable_for)
            broker.audit.on_sync.append(metrics.synced)
            broker.on_rescan.append(metrics.rescanned)
            tap.observers.append(metrics)
            self.metrics = metrics
        if self.tracing_settings is not None:
            from broker.loop.catalogue import effect_facts, facts_cache
            from broker.observability.tracing import Tracer

            facts = effect_facts(broker.registry, facts_cache())
            descriptions = {f["name"]: f["description"] for f in facts}
            self.tracer = Tracer(self.tracing_settings, descriptions)
            broker.admission.stages = self.tracer.stages
            tap.observers.append(self.tracer)

    def start(self, *, insecure: bool = False) -> list[str]:
        """Open the metrics port (loopback unless `insecure`); say what is served where."""
        told = []
        settings = self.metrics_settings
        if self.metrics is not None and settings is not None and settings.listen:
            self._server = _serve_metrics(self.metrics, settings.listen, insecure)
            host, port = str(self._server.server_name), self._server.server_port
            host = settings.listen.rpartition(":")[0] or host  # as the operator wrote it
            told.append(f"broker: metrics on http://{host}:{port}/metrics")
        if self.tracer is not None and self.tracing_settings is not None:
            told.append(f"broker: traces to {self.tracing_settings.endpoint}")
        return told

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.tracer is not None:
            self.tracer.close()
            self.tracer = None


def _serve_metrics(metrics: Metrics, listen: str, insecure: bool) -> WSGIServer:
    from prometheus_client import start_http_server

    from broker.addresses import check_listen, parse_listen

    host, port = parse_listen(listen)
    try:
        check_listen(host, tls=False, insecure=insecure)
    except ConfigError as exc:
        raise ConfigError(f"metrics.listen: {exc}".replace("--listen ", "")) from None
    try:
        server, _thread = start_http_server(port, host, registry=metrics.registry)
    except OSError as exc:
        raise ConfigError(f"metrics.listen {listen}: cannot listen: {exc.strerror}") from exc
    return server
