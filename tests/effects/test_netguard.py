"""The address guard shared by http.request and webhook.post: what it refuses, that a
refusal never reaches the network, and that httpx's errors all become reasons.

Every refusal test runs with a resolver and a connection recorder the tests control,
and asserts that no connection was even attempted."""

from __future__ import annotations

import inspect
import ipaddress
import socket
from typing import Any

import httpx
import pytest

from broker.errors import ConfigError, EffectFailed, InvalidParams
from effects import netguard
from effects.http import HttpRequest
from effects.netguard import NetGuard, http_failure, parse_networks, parse_url, refusal
from tests.effects.netfixtures import (  # noqa: F401  (fixtures, used by their names)
    PUBLIC,
    FakeResolver,
    MakeContext,
    RecordingBackend,
    fixture_loopback_only,
    fixture_make_ctx,
    fixture_recorder,
    fixture_resolver,
    run,
)


def refused(
    url: str,
    resolver: FakeResolver,
    recorder: RecordingBackend,
    make_ctx: MakeContext,
    settings: dict[str, Any] | None = None,
) -> str:
    """Send GET `url` through http.request; return the refusal's reason."""
    handler = HttpRequest(resolver=resolver, backend=recorder)
    with pytest.raises(EffectFailed) as caught:
        run(handler, {"method": "GET", "url": url}, make_ctx(settings or {}, section="http"))
    assert recorder.attempts == [], f"a connection was attempted: {recorder.attempts}"
    return caught.value.reason


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1/", "loopback"),
        ("http://127.0.0.1:8080/admin", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.1/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::ffff:169.254.169.254]/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[2002:7f00:1::]/", "loopback"),
    ],
)
def test_forbidden_addresses_are_refused_without_a_connection(
    url: str,
    why: str,
    resolver: FakeResolver,
    recorder: RecordingBackend,
    make_ctx: MakeContext,
) -> None:
    """Non-public addresses are refused, naming the kind; nothing is resolved or connected."""
    reason = refused(url, resolver, recorder, make_ctx)
    assert why in reason
    assert "allow_networks" in reason
    assert resolver.calls == []


@pytest.mark.parametrize(
    ("host", "means"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0xa9fea9fe", "169.254.169.254"),
    ],
)
def test_numeric_host_spellings_are_refused(
    host: str,
    means: str,
    resolver: FakeResolver,
    recorder: RecordingBackend,
    make_ctx: MakeContext,
) -> None:
    """Decimal, hex, octal and short IPv4 spellings are refused, naming what they mean."""
    reason = refused(f"http://{host}/", resolver, recorder, make_ctx)
    assert "non-standard form" in reason and means in reason
    assert resolver.calls == []


@pytest.mark.parametrize(
    ("name", "address", "why"),
    [
        ("internal.test", "127.0.0.1", "loopback"),
        ("metadata.test", "169.254.169.254", "link-local"),
        ("intranet.test", "10.0.0.1", "private"),
        ("mapped.test", "::ffff:127.0.0.1", "loopback"),
        ("mixed.test", "10.0.0.1", "private"),
    ],
)
def test_names_resolving_to_forbidden_addresses_are_refused(
    name: str,
    address: str,
    why: str,
    resolver: FakeResolver,
    recorder: RecordingBackend,
    make_ctx: MakeContext,
) -> None:
    """A name whose answer holds any forbidden address is refused, naming name and address."""
    reason = refused(f"https://{name}/x", resolver, recorder, make_ctx)
    assert name in reason and address in reason and why in reason
    assert resolver.calls == [name]


def test_unresolvable_name_is_refused(
    resolver: FakeResolver, recorder: RecordingBackend, make_ctx: MakeContext
) -> None:
    """A name that does not resolve fails with 'cannot resolve', and nothing connects."""
    reason = refused("https://nowhere.test/", resolver, recorder, make_ctx)
    assert "cannot resolve nowhere.test" in reason


def test_public_name_is_connected_to_by_its_resolved_address(
    resolver: FakeResolver, recorder: RecordingBackend, make_ctx: MakeContext
) -> None:
    """The one connection attempt goes to the address the guard checked, not the name."""
    handler = HttpRequest(resolver=resolver, backend=recorder)
    ctx = make_ctx({}, section="http")
    with pytest.raises(EffectFailed, match=r"could not connect to public\.test"):
        run(handler, {"method": "GET", "url": "https://public.test/path"}, ctx)
    assert recorder.attempts == [(PUBLIC, 443)]
    assert resolver.calls == ["public.test"]


def test_every_checked_address_is_tried_in_order(
    recorder: RecordingBackend, make_ctx: MakeContext
) -> None:
    """A name with two public addresses is tried at each in turn, and at nothing else."""
    resolver = FakeResolver({"two.test": [PUBLIC, "93.184.216.35"]})
    with pytest.raises(EffectFailed, match="could not connect"):
        run(
            HttpRequest(resolver=resolver, backend=recorder),
            {"method": "GET", "url": "https://two.test/"},
            make_ctx({}),
        )
    assert recorder.attempts == [(PUBLIC, 443), ("93.184.216.35", 443)]


def test_dns_rebinding_gets_no_second_answer(
    recorder: RecordingBackend, make_ctx: MakeContext
) -> None:
    """A name that turns to loopback after its check is not asked again: the public IP is used."""
    answers = iter([[PUBLIC], ["127.0.0.1"], ["127.0.0.1"]])
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers)

    handler = HttpRequest(resolver=rebinding, backend=recorder)
    with pytest.raises(EffectFailed, match="could not connect"):
        run(
            handler,
            {"method": "GET", "url": "http://rebind.test/"},
            make_ctx({}, section="http"),
        )
    assert calls == ["rebind.test"]
    assert recorder.attempts == [(PUBLIC, 80)]


def test_allow_networks_opens_exactly_that_network(
    resolver: FakeResolver, recorder: RecordingBackend, make_ctx: MakeContext
) -> None:
    """allow_networks = ["127.0.0.0/8"] lets loopback through, and still refuses 10.0.0.1."""
    settings = {"allow_networks": ["127.0.0.0/8"]}
    handler = HttpRequest(resolver=resolver, backend=recorder)
    with pytest.raises(EffectFailed, match="could not connect"):
        run(handler, {"method": "GET", "url": "http://127.0.0.1:9/"}, make_ctx(settings))
    assert recorder.attempts == [("127.0.0.1", 9)]
    recorder.attempts.clear()
    reason = refused("http://10.0.0.1/", resolver, recorder, make_ctx, settings)
    assert "private" in reason


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/file",
        "file:///etc/passwd",
        "gopher://example.com/",
        "http://user:pass@example.com/",
        "http://example.com\\@127.0.0.1/",
        "http://exa mple.com/",
    ],
)
def test_urls_the_guard_cannot_reason_about_are_invalid(url: str) -> None:
    """Other schemes, user-info, backslashes and spaces are refused before anything happens."""
    with pytest.raises(InvalidParams) as caught:
        parse_url(url)
    assert caught.value.status == "invalid"


def test_unix_sockets_are_refused() -> None:
    """No effect can reach a local socket through the guarded backend."""
    backend = NetGuard().backend(RecordingBackend())
    with pytest.raises(EffectFailed, match="local sockets"):
        backend.connect_unix_socket("/var/run/docker.sock")


@pytest.mark.parametrize(
    ("address", "category"),
    [
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("100.64.0.1", "reserved, non-public"),
        ("198.18.0.1", "private"),
        ("255.255.255.255", "private"),
        ("::", "unspecified"),
        ("fc00::1", "private"),
        ("ff02::1", "multicast"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("::ffff:10.0.0.1", "private"),
    ],
)
def test_refusal_categories(address: str, category: str | None) -> None:
    """Public addresses pass; every other kind is named in the refusal."""
    why = refusal(ipaddress.ip_address(address))
    assert (why is None) if category is None else (why is not None and category in why)


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        (["0.0.0.0/0"], "switch the address guard off"),
        (["::/0"], "switch the address guard off"),
        (["127.0.0.1/8"], "not an exact network"),
        (["localhost"], "not an exact network"),
        ("127.0.0.0/8", "list of networks"),
    ],
)
def test_allow_networks_must_be_exact_networks(value: Any, complaint: str) -> None:
    """A broken or all-opening allow_networks stops the start, naming the key."""
    with pytest.raises(ConfigError, match=complaint) as caught:
        parse_networks(value, "integrations.http.allow_networks")
    assert "integrations.http.allow_networks" in str(caught.value)


def _httpx_exceptions() -> list[type[Exception]]:
    return [
        obj
        for _, obj in inspect.getmembers(httpx, inspect.isclass)
        if issubclass(obj, Exception) and obj.__module__.startswith("httpx")
    ]


@pytest.mark.parametrize("exc_type", _httpx_exceptions(), ids=lambda t: t.__name__)
def test_every_httpx_exception_has_its_own_reason(exc_type: type[Exception]) -> None:
    """Each exception httpx exports has its own reason, naming the destination, secrets masked."""
    assert exc_type in netguard._HTTPX_REASONS, f"no reason for httpx.{exc_type.__name__}"
    assert issubclass(exc_type, netguard.HTTPX_ERRORS)
    exc = exc_type.__new__(exc_type)
    Exception.__init__(exc, "boom with s3cr3t-token inside")
    failure = http_failure(exc, "crm", ["s3cr3t-token"])
    assert isinstance(failure, EffectFailed) and failure.status == "failed"
    assert failure.reason.startswith("failed: ") and "crm" in failure.reason
    assert "s3cr3t-token" not in failure.reason


def test_translation_picks_the_most_specific_reason() -> None:
    """A connect timeout reads as one, not as a generic transport failure."""
    reason = http_failure(httpx.ConnectTimeout("timed out"), "crm").reason
    assert "did not accept a connection in time" in reason


def test_the_tests_themselves_cannot_leave_loopback(loopback_only: list[str]) -> None:
    """The suite's safety net: a connection or lookup past loopback is refused and recorded."""
    with socket.socket() as sock, pytest.raises(PermissionError):
        sock.connect(("10.0.0.1", 80))
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("example.com", 443)
    assert loopback_only == ["connect ('10.0.0.1', 80)", "resolve 'example.com'"]
    loopback_only.clear()  # recorded on purpose: let the fixture's final check pass
