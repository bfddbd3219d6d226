"""Fixtures for the network effects (http, webhook, email): real servers on 127.0.0.1,
a resolver and a connection recorder the tests control, and `loopback_only`, which
fails any test whose code tries to reach past loopback, even if the code under test
is wrong. Test modules import the fixtures they use from here: each is defined as `fixture_<name>`
and used under its plain name."""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpcore
import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP as SMTPServer
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session
from jsonschema import Draft202012Validator
from pytest_httpserver import HTTPServer

from broker.testing import make_context
from broker.typing import JSON, Params
from effects.base import Context

PUBLIC = "93.184.216.34"  # never contacted: only ever handed to the recording backend


def _loopback(host: Any) -> bool:
    if host is None or host in ("localhost", b"localhost", ""):
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


@pytest.fixture(name="loopback_only", autouse=True)
def fixture_loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Refuse and record any connection or name lookup beyond loopback; fail the test."""
    escapes: list[str] = []
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_sendto = socket.socket.sendto
    real_getaddrinfo = socket.getaddrinfo

    def outside(address: Any) -> bool:
        return isinstance(address, tuple) and not _loopback(address[0])

    def connect(self: socket.socket, address: Any) -> None:
        if outside(address):
            escapes.append(f"connect {address}")
            raise PermissionError("the tests never leave loopback")
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if outside(address):
            escapes.append(f"connect_ex {address}")
            raise PermissionError("the tests never leave loopback")
        return real_connect_ex(self, address)

    def sendto(self: socket.socket, data: Any, *args: Any) -> int:
        if outside(args[-1]):
            escapes.append(f"sendto {args[-1]}")
            raise PermissionError("the tests never leave loopback")
        return real_sendto(self, data, *args)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _loopback(host):
            escapes.append(f"resolve {host!r}")
            raise socket.gaierror(socket.EAI_NONAME, "the tests never resolve outside names")
        return real_getaddrinfo(host, *args, **kwargs)

    def lookup(name: str) -> Callable[..., Any]:
        def refuse(host: Any, *args: Any) -> Any:
            escapes.append(f"{name} {host!r}")
            raise socket.herror(1, "the tests never resolve names")

        return refuse

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket.socket, "sendto", sendto)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for name in ("gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
        monkeypatch.setattr(socket, name, lookup(name))
    yield escapes
    assert not escapes, f"a test tried to reach past loopback: {escapes}"


class FakeResolver:
    """Name resolution the tests control: a table, and a record of every lookup."""

    def __init__(self, table: Mapping[str, Sequence[str]] | None = None) -> None:
        self.table: dict[str, list[str]] = {k: list(v) for k, v in (table or {}).items()}
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.table[host])


class RecordingBackend(httpcore.NetworkBackend):
    """Records every connection attempt instead of making it; with `loopback=True` it
    connects for real, but to loopback addresses only."""

    def __init__(self, *, loopback: bool = False) -> None:
        self.attempts: list[tuple[str, int]] = []
        self.loopback = loopback
        self.real = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        self.attempts.append((host, port))
        if self.loopback and _loopback(host):
            return self.real.connect_tcp(host, port, timeout, local_address, socket_options)
        raise httpcore.ConnectError(f"recorded, not connected: {host}:{port}")


@pytest.fixture(name="resolver")
def fixture_resolver() -> FakeResolver:
    """A resolver with .test names: loopback, metadata, private, public and mixed answers."""
    return FakeResolver(
        {
            "api.test": ["127.0.0.1"],
            "other.test": ["127.0.0.1"],
            "internal.test": ["127.0.0.1"],
            "metadata.test": ["169.254.169.254"],
            "intranet.test": ["10.0.0.1"],
            "mapped.test": ["::ffff:127.0.0.1"],
            "public.test": [PUBLIC],
            "mixed.test": [PUBLIC, "10.0.0.1"],
        }
    )


@pytest.fixture(name="recorder")
def fixture_recorder() -> RecordingBackend:
    """A backend that records connection attempts and makes none."""
    return RecordingBackend()


MakeContext = Callable[..., Context]


@pytest.fixture(name="make_ctx")
def fixture_make_ctx(tmp_path: Path) -> MakeContext:
    """Build a handler Context for `settings`, as the pipeline would."""

    def make(
        settings: Mapping[str, Any],
        *,
        section: str = "test",
        request_id: str = "req-1",
        sandbox: str = "sandbox-1",
        sha256: str = "ab" * 32,
    ) -> Context:
        return make_context(
            settings,
            integration=section,
            sandbox=sandbox,
            request_id=request_id,
            request_sha256=sha256,
            state_dir=tmp_path,
            attachments={},  # network effects take no attachments
        )

    return make


def run(handler: Any, params: Params, ctx: Context) -> JSON:
    """What the pipeline does with a request: schema, check, then apply."""
    Draft202012Validator(handler.schema).validate(dict(params))
    handler.check(params, ctx)
    output: JSON = handler.apply(params, ctx)
    return output


# -- servers ------------------------------------------------------------------------


@pytest.fixture(name="ca", scope="session")
def fixture_ca() -> trustme.CA:
    """A throw-away certificate authority."""
    return trustme.CA()


@pytest.fixture(name="ca_file", scope="session")
def fixture_ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The CA's certificate as a PEM file, for ca_file settings."""
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture(name="web_server", scope="session")
def fixture_web_server() -> Iterator[HTTPServer]:
    """One HTTP server on 127.0.0.1 for the session."""
    server = HTTPServer(host="127.0.0.1", port=0)
    server.start()
    yield server
    server.clear()
    server.stop()


@pytest.fixture(name="web")
def fixture_web(web_server: HTTPServer) -> Iterator[HTTPServer]:
    """A real HTTP server on 127.0.0.1, emptied for each test."""
    web_server.clear()
    yield web_server
    web_server.clear()


@pytest.fixture(name="tls_web_server", scope="session")
def fixture_tls_web_server(ca: trustme.CA) -> Iterator[HTTPServer]:
    """One HTTPS server on 127.0.0.1 for the session; its certificate names api.test."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("api.test").configure_cert(context)
    server = HTTPServer(host="127.0.0.1", port=0, ssl_context=context)
    server.start()
    yield server
    server.clear()
    server.stop()


@pytest.fixture(name="tls_web")
def fixture_tls_web(tls_web_server: HTTPServer) -> Iterator[HTTPServer]:
    """A real HTTPS server on 127.0.0.1 whose certificate names only api.test."""
    tls_web_server.clear()
    yield tls_web_server
    tls_web_server.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Inbox:
    """An aiosmtpd handler that keeps what it receives; refuses nobody@… recipients."""

    def __init__(self) -> None:
        self.messages: list[Envelope] = []
        self.logins: list[tuple[str, str]] = []

    async def handle_RCPT(
        self,
        server: SMTPServer,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        if address.startswith("nobody@"):
            return "550 5.1.1 no such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTPServer, session: Session, envelope: Envelope) -> str:
        self.messages.append(envelope)
        return "250 Message accepted for delivery"

    def authenticate(
        self, server: SMTPServer, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        login, password = data.login.decode(), data.password.decode()
        self.logins.append((login, password))
        ok = (login, password) == ("agent", SMTP_PASSWORD)
        return AuthResult(success=ok, handled=ok)


SMTP_PASSWORD = "smtp-pass-123"
SMTP = tuple[Controller, Inbox]


def _smtp(**kwargs: Any) -> Iterator[SMTP]:
    inbox = Inbox()
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=free_port(),
        server_hostname="smtp.test",
        authenticator=inbox.authenticate,
        **kwargs,
    )
    controller.start()
    yield controller, inbox
    controller.stop()


@pytest.fixture(name="smtp_plain")
def fixture_smtp_plain() -> Iterator[SMTP]:
    """A real SMTP server on 127.0.0.1 without TLS or login."""
    yield from _smtp()


@pytest.fixture(name="smtp_starttls")
def fixture_smtp_starttls(ca: trustme.CA) -> Iterator[SMTP]:
    """A real SMTP server on 127.0.0.1 that requires STARTTLS and a login."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    yield from _smtp(tls_context=context, require_starttls=True, auth_required=True)


@pytest.fixture(name="smtp_ssl")
def fixture_smtp_ssl(ca: trustme.CA) -> Iterator[SMTP]:
    """A real SMTP server on 127.0.0.1 speaking TLS from the first byte, offering a login."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    # TLS from the first byte, which aiosmtpd's auth_require_tls cannot see: offer AUTH
    yield from _smtp(ssl_context=context, auth_require_tls=False)
