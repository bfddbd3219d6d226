"""Finding 6: a GET changes nothing and sends nothing out unasked. A body on GET, HEAD
or OPTIONS is refused; a GET to a URL from the request (which could carry data out in
its path or query) waits for a person; one to a destination the host names does not."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from broker.testing import BrokerHarness
from tests.support import checked


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """A server on 127.0.0.1 recording each request line."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        do_HEAD = do_OPTIONS = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{http.server_address[1]}", seen
    http.shutdown()
    http.server_close()


@pytest.fixture
def broker(tmp_path: Path, server: tuple[str, list[str]]) -> Iterator[BrokerHarness]:
    """http.request allowed to reach loopback, a destination `api` there; no rules."""
    settings = {
        "allow_networks": ["127.0.0.0/8"],
        "destinations": {"api": {"base_url": server[0]}},
    }
    with BrokerHarness(tmp_path / "h", integrations={"http": settings}) as h:
        yield h


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
@pytest.mark.parametrize("body", [{"json": {"stolen": "data"}}, {"body": "stolen data"}])
def test_a_safe_method_with_a_body_is_invalid(
    broker: BrokerHarness, server: tuple[str, list[str]], method: str, body: dict[str, Any]
) -> None:
    """GET/HEAD/OPTIONS with json or body: `invalid`, nothing sent."""
    params = {"method": method, "destination": "api", "path": "/x", **body}
    result = checked(broker.submit(broker.request("http.request", params)))
    assert result["status"] == "invalid"
    assert "carries no body" in result["reason"]
    assert server[1] == []


def test_a_get_to_a_raw_url_waits_for_a_person(
    broker: BrokerHarness, server: tuple[str, list[str]]
) -> None:
    """With no rule, a GET to a URL the request names is pending, and not sent."""
    url = f"{server[0]}/collect?secret=the-agents-findings"
    result = checked(
        broker.submit(broker.request("http.request", {"method": "GET", "url": url}), terminal=False)
    )
    assert result["status"] == "pending"
    assert server[1] == []


def test_a_get_to_a_named_destination_applies_at_once(
    broker: BrokerHarness, server: tuple[str, list[str]]
) -> None:
    """With no rule, a GET to a destination the host names is reversible: applied."""
    params = {"method": "GET", "destination": "api", "path": "/status"}
    result = checked(broker.submit(broker.request("http.request", params)))
    assert result["status"] == "applied", result
    assert server[1] == ["GET /status"]
