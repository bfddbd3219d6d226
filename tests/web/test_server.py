"""Where the inbox listens: loopback by default, elsewhere only with TLS or when told."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from broker.addresses import check_listen, parse_listen
from broker.config import Config
from broker.errors import ConfigError
from broker.registry import Registry
from broker.web.server import start_web
from tests.support import TLS


def config(tmp_path: Path, **web: object) -> Config:
    return Config(state_dir=tmp_path / "state", web=web)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8700", ("127.0.0.1", 8700)),
        ("[::1]:8700", ("::1", 8700)),
        ("localhost:0", ("127.0.0.1", 0)),
    ],
)
def test_listen_addresses_parse(text: str, expected: tuple[str, int]) -> None:
    """--listen takes HOST:PORT, with IPv6 hosts in brackets; localhost is 127.0.0.1."""
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["8700", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000"])
def test_bad_listen_addresses_are_refused(text: str) -> None:
    """A --listen that is not HOST:PORT is refused with an example of the right form."""
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse_listen(text)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "inbox.example.com"])
def test_non_loopback_without_tls_is_refused(host: str) -> None:
    """Listening beyond loopback in clear text needs --insecure-listen; the error says so."""
    with pytest.raises(ConfigError, match="--insecure-listen"):
        check_listen(host, tls=False, insecure=False)


def test_non_loopback_is_allowed_with_tls_or_when_told() -> None:
    """TLS settings, or --insecure-listen, allow a non-loopback address."""
    check_listen("0.0.0.0", tls=True, insecure=False)
    check_listen("0.0.0.0", tls=False, insecure=True)
    check_listen("127.0.0.2", tls=False, insecure=False)


def test_start_web_refuses_before_binding(tmp_path: Path) -> None:
    """`serve --listen 0.0.0.0:…` without TLS stops with the reason, binding nothing."""
    with pytest.raises(ConfigError, match="not a loopback address"):
        start_web(config(tmp_path), Registry(), "0.0.0.0:0")


def test_start_web_serves_on_loopback_and_stops(tmp_path: Path) -> None:
    """`--listen 127.0.0.1:0` serves the inbox until stopped; then the port is closed."""
    server = start_web(config(tmp_path), Registry(), "127.0.0.1:0")
    assert server is not None
    url = server.url
    try:
        assert httpx.get(f"{url}/api/v1/health", verify=TLS).json() == {"status": "ok"}
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/api/v1/health", verify=TLS)


def test_start_web_reads_listen_from_the_config(tmp_path: Path) -> None:
    """[web] listen is used when --listen is absent; with neither, nothing is served."""
    assert start_web(config(tmp_path), Registry(), None) is None
    server = start_web(config(tmp_path, listen="127.0.0.1:0"), Registry(), None)
    assert server is not None
    server.stop()


def test_start_web_names_a_port_in_use(tmp_path: Path) -> None:
    """A port already taken is one clear error, not a traceback from a thread."""
    first = start_web(config(tmp_path), Registry(), "127.0.0.1:0")
    assert first is not None
    try:
        with pytest.raises(ConfigError, match="cannot listen"):
            start_web(config(tmp_path), Registry(), f"127.0.0.1:{first.port}")
    finally:
        first.stop()


def test_bad_web_settings_name_their_key(tmp_path: Path) -> None:
    """A mistake under [web] stops the start with the key named."""
    with pytest.raises(ConfigError, match=r"web\.colour: unknown key"):
        start_web(config(tmp_path, colour="blue"), Registry(), "127.0.0.1:0")
    with pytest.raises(ConfigError, match="go together"):
        start_web(config(tmp_path, tls_certfile="c.pem"), Registry(), "127.0.0.1:0")
