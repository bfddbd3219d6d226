"""Serving the web app with uvicorn on a thread of the broker's process.

    web = start_web(cfg, registry, "127.0.0.1:8700", insecure=False)   # serve / run
    ...
    web.stop()

Loopback only, unless TLS is configured ([web] tls_certfile/tls_keyfile) or the
operator says `--insecure-listen`: approver tokens and session cookies must not cross
a network in clear text.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING

import uvicorn
from starlette.types import ASGIApp

from broker.addresses import check_listen, parse_listen
from broker.clock import REAL
from broker.config import Config
from broker.errors import ConfigError
from broker.registry import Registry
from broker.web.app import WebSettings, create_app, web_settings

if TYPE_CHECKING:
    from broker.observability.metrics import Metrics

log = logging.getLogger("broker.web")


class WebServer:
    """uvicorn in a daemon thread: start(host, port) returns once it accepts connections."""

    def __init__(self, app: ASGIApp, settings: WebSettings | None = None) -> None:
        self.app = app
        self.settings = settings or WebSettings()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.host = ""
        self.port = 0

    @property
    def url(self) -> str:
        scheme = "https" if self.settings.tls else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def start(self, host: str = "127.0.0.1", port: int = 0) -> WebServer:
        """Bind (port 0: any free port) and serve; a bind failure raises ConfigError."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"--listen {host}:{port}: cannot listen: {exc.strerror}") from exc
        sock.listen(128)
        self.host, self.port = host, sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            ssl_certfile=self.settings.tls_certfile,
            ssl_keyfile=self.settings.tls_keyfile,
            timeout_graceful_shutdown=2,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="broker-web", daemon=True
        )
        self._thread.start()
        deadline = REAL.monotonic() + 10
        while not server.started and self._thread.is_alive() and REAL.monotonic() < deadline:
            REAL.sleep(0.01)
        if not server.started:
            self.stop()
            raise ConfigError(f"the web inbox did not start on {host}:{self.port}; see the log")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self._server = None


def start_web(
    config: Config,
    registry: Registry,
    listen: str | None,
    *,
    insecure: bool = False,
    metrics: Metrics | None = None,
) -> WebServer | None:
    """Serve the inbox on `listen` (else [web] listen), and `metrics` at /metrics; None
    when neither listen address is given."""
    settings = web_settings(config)
    listen = listen or settings.listen
    if not listen:
        return None
    host, port = parse_listen(listen)
    check_listen(host, tls=settings.tls, insecure=insecure)
    app = create_app(config, registry, metrics=metrics)
    server = WebServer(app, settings).start(host, port)
    log.debug("web inbox on %s", server.url)
    return server
