"""What the canary tests share (tests/security/test_canary*.py): a hostile HTTP
stand-in echoing what it was sent, and the operator's log at DEBUG."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Echo:
    """An HTTP server on 127.0.0.1 answering each path with what `answer` says."""

    answer: Callable[[BaseHTTPRequestHandler, bytes], tuple[int, str, bytes]]
    seen: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def echo() -> Iterator[Callable[..., Echo]]:
    servers: list[ThreadingHTTPServer] = []

    def make(answer: Callable[[BaseHTTPRequestHandler, bytes], tuple[int, str, bytes]]) -> Echo:
        state = Echo(answer)

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                state.seen.append({"path": self.path, "headers": dict(self.headers)})
                status, kind, data = state.answer(self, body)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_HEAD = _any

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        state.url = f"http://127.0.0.1:{server.server_address[1]}"
        return state

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def verbose(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every log record at DEBUG, formatted with tracebacks, as an operator's log is."""
    caplog.set_level(logging.DEBUG)
    return caplog
