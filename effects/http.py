"""http.request: one HTTP request, to a URL or to a destination the host names.

Settings, `[integrations.http]` (all optional):

    allow_networks = ["127.0.0.0/8"]    # exact networks the address guard lets through
    max_response_bytes = 1048576        # the body returned to the agent, at most
    max_response_time = "30s"           # the whole exchange, at most
    max_redirects = 5                   # when a request sets follow_redirects
    ca_file = "/etc/ssl/internal.pem"   # extra CA to trust, besides the public roots

    [integrations.http.destinations.crm]
    base_url = "https://crm.example.com/api"
    headers = { Accept = "application/json" }
    secret_headers = { Authorization = { value_env = "CRM_TOKEN", prefix = "Bearer " } }
    allow_networks = ["10.1.2.0/24"]    # only for requests to this destination

The agent sends `{"method": "GET", "url": "https://..."}` or
`{"method": "GET", "destination": "crm", "path": "/v2/contacts"}`; a destination's
headers are added host-side, and its secret headers only ever go to its own origin
(never along a redirect elsewhere). Every connection passes `effects.netguard`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpcore
import httpx

from broker.clock import parse_duration
from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context, Handler
from effects.netguard import (
    HTTPX_ERRORS,
    MASK,
    DestinationRefused,
    Headers,
    IPNetwork,
    NetGuard,
    Resolver,
    check_ca_file,
    check_literal,
    client,
    default_port,
    http_failure,
    parse_headers,
    parse_networks,
    parse_url,
    read_capped,
    same_origin,
    scrub,
    scrub_bytes,
    system_resolver,
)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# the broker frames the message itself; an agent setting these could smuggle requests
FRAMING_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)
TEXTUAL = re.compile(
    r"^(text/|application/([\w.+-]*\+)?(json|xml|javascript|x-www-form-urlencoded))"
)
# a server may decode these and climb above the destination's base path
ENCODED_SEPARATORS = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)
DESTINATION_KEYS = frozenset({"base_url", "headers", "secret_headers", "allow_networks"})


@dataclass(frozen=True)
class Destination:
    """`[integrations.http.destinations.NAME]`."""

    name: str
    base: httpx.URL
    headers: Headers
    allow: tuple[IPNetwork, ...] = ()


@dataclass(frozen=True)
class Settings:
    """`[integrations.http]`, checked."""

    allow: tuple[IPNetwork, ...] = ()
    destinations: Mapping[str, Destination] = field(default_factory=dict)
    max_bytes: int = 1024 * 1024
    max_time: float = 30.0
    max_redirects: int = 5
    ca_file: str | None = None


def _positive(table: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where}.{key}: expected a whole number >= 0, got {value!r}")
    return value


def settings_from(table: Mapping[str, Any]) -> Settings:
    """Parse and check `[integrations.http]`; a fault names the key."""
    where = "integrations.http"
    try:
        max_time = parse_duration(table.get("max_response_time", "30s"))
    except ValueError as exc:
        raise ConfigError(f"{where}.max_response_time: {exc}") from exc
    ca_file = check_ca_file(table.get("ca_file"), f"{where}.ca_file")
    raw = table.get("destinations", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.destinations: expected tables [{where}.destinations.NAME]")
    destinations = {name: _destination(name, spec) for name, spec in raw.items()}
    return Settings(
        allow=parse_networks(table.get("allow_networks"), f"{where}.allow_networks"),
        destinations=destinations,
        max_bytes=_positive(table, "max_response_bytes", 1024 * 1024, where),
        max_time=max_time,
        max_redirects=_positive(table, "max_redirects", 5, where),
        ca_file=ca_file,
    )


def _destination(name: str, spec: Any) -> Destination:
    where = f"integrations.http.destinations.{name}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", name):
        raise ConfigError(f"{where}: a destination name is letters, digits, '-' and '_'")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table")
    unknown = set(spec) - DESTINATION_KEYS
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key")
    base = spec.get("base_url")
    if not isinstance(base, str):
        raise ConfigError(f"{where}.base_url: required, an http(s) URL")
    try:
        url = parse_url(base)
    except InvalidParams as exc:
        raise ConfigError(f"{where}.base_url: {exc.issues[0].message}") from exc
    if url.query or url.fragment:
        raise ConfigError(f"{where}.base_url: no query or fragment; requests add their own")
    return Destination(
        name=name,
        base=url,
        headers=parse_headers(spec, where),
        allow=parse_networks(spec.get("allow_networks"), f"{where}.allow_networks"),
    )


@dataclass(frozen=True)
class Call:
    """One request as the broker will send it, before any redirect."""

    method: str
    url: httpx.URL
    destination: Destination | None
    headers: tuple[tuple[str, str], ...]
    content: bytes | None
    timeout: float
    follow: bool

    @property
    def allow(self) -> tuple[IPNetwork, ...]:
        return self.destination.allow if self.destination else ()

    @property
    def secrets(self) -> list[str]:
        return self.destination.headers.values() if self.destination else []


def _target_url(params: Params, settings: Settings) -> tuple[httpx.URL, Destination | None]:
    if ("url" in params) == ("destination" in params) or ("path" in params) != (
        "destination" in params
    ):
        raise InvalidParams(
            "/params",
            "give either url, or destination and path (a destination the host names)",
            "url_or_destination",
        )
    if "url" in params:
        return parse_url(params["url"]), None
    name = params["destination"]
    dest = settings.destinations.get(name)
    if dest is None:
        known = ", ".join(sorted(settings.destinations)) or "none are configured"
        raise InvalidParams(
            "/params/destination",
            f"no destination named {name!r} (known: {known}); use one of them or a url",
            "unknown_destination",
        )
    path: str = params["path"]
    if (
        ".." in path.split("/")
        or ENCODED_SEPARATORS.search(path)
        or any(c in path for c in "?#\\")
        or any(ord(c) < 33 for c in path)
    ):
        raise InvalidParams(
            "/params/path",
            "the path must be a plain path below the destination: no '..', no encoded '.', '/' "
            "or '\\', no '?', '#' or spaces; put query parameters in query",
            "bad_path",
        )
    url = parse_url(str(dest.base).rstrip("/") + path, "/params/path")
    if not same_origin(url, dest.base):
        raise InvalidParams("/params/path", "the path leaves the destination's host", "bad_path")
    return url, dest


def build_call(params: Params, settings: Settings) -> Call:
    """Check params against the host's settings; InvalidParams says what to fix."""
    url, dest = _target_url(params, settings)
    if params.get("query"):
        url = url.copy_merge_params(params["query"])
    reserved = dest.headers.names if dest else frozenset()
    headers: list[tuple[str, str]] = []
    for name, value in params.get("headers", {}).items():
        low = name.lower()
        if low in FRAMING_HEADERS:
            raise InvalidParams(
                f"/params/headers/{name}", f"{name} is set by the broker, not the request"
            )
        if low in reserved:
            raise InvalidParams(
                f"/params/headers/{name}",
                f"{name} is set by the host for destination {dest.name if dest else ''}; "
                "leave it out",
            )
        headers.append((name, value))
    if "json" in params and "body" in params:
        raise InvalidParams("/params/body", "send json or body, not both", "json_or_body")
    given = {name.lower() for name, _ in headers}
    content: bytes | None = None
    if "json" in params:
        content = json.dumps(
            params["json"], ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode("utf-8")
        if "content-type" not in given:
            headers.append(("Content-Type", "application/json"))
    elif "body" in params:
        content = params["body"].encode("utf-8")
        if "content-type" not in given:
            headers.append(("Content-Type", "text/plain; charset=utf-8"))
    timeout = min(float(params.get("timeout", settings.max_time)), settings.max_time)
    return Call(
        method=params["method"],
        url=url,
        destination=dest,
        headers=tuple(headers),
        content=content,
        timeout=timeout,
        follow=bool(params.get("follow_redirects", False)),
    )


class HttpRequest(Handler):
    """Send one HTTP request through the address guard, with host-held credentials."""

    name = "http.request"
    reversible = False
    idempotent = False
    undo = (
        "the broker cannot take back a request that changed something; GET, HEAD and "
        "OPTIONS change nothing and need no undo"
    )
    config_keys: ClassVar[frozenset[str]] = frozenset(
        {
            "allow_networks",
            "destinations",
            "max_response_bytes",
            "max_response_time",
            "max_redirects",
            "ca_file",
        }
    )

    def __init__(
        self,
        resolver: Resolver | None = None,
        backend: httpcore.NetworkBackend | None = None,
    ) -> None:
        self.resolver = resolver or system_resolver
        self.backend = backend

    def check_config(self, settings: Mapping[str, Any]) -> None:
        super().check_config(settings)
        settings_from(settings)

    @staticmethod
    def _settings(ctx: Context) -> Settings:
        try:
            return settings_from(ctx.settings)
        except ConfigError as exc:
            raise EffectFailed(
                f"failed: http.request is misconfigured on this host ({exc}); tell the operator"
            ) from exc

    def check(self, params: Params, ctx: Context) -> None:
        settings = self._settings(ctx)
        call = build_call(params, settings)
        check_literal(call.url, settings.allow + call.allow)

    def reversible_for(self, params: Params, ctx: Context) -> bool:
        return params.get("method") in SAFE_METHODS

    def _guard(self, settings: Settings, call: Call) -> NetGuard:
        return NetGuard(settings.allow + call.allow, self.resolver)

    def _request(
        self, http: httpx.Client, call: Call, url: httpx.URL, method: str, timeout: float
    ) -> httpx.Request:
        content = call.content if method == call.method else None
        headers = [
            (k, v) for k, v in call.headers if content is not None or k.lower() != "content-type"
        ]
        dest = call.destination
        if dest is not None and same_origin(url, dest.base):
            headers += [*dest.headers.plain.items(), *dest.headers.secret.items()]
        return http.build_request(
            method, url, headers=headers, content=content, timeout=httpx.Timeout(timeout)
        )

    def preview(self, params: Params, ctx: Context) -> Preview:
        settings = self._settings(ctx)
        call = build_call(params, settings)
        guard = self._guard(settings, call)
        try:
            address = ", ".join(guard.addresses(call.url.host, default_port(call.url)))
        except DestinationRefused as exc:
            address = exc.reason.removeprefix("failed: ")
        # the request as it will be sent; the mock transport guarantees nothing leaves
        with client(httpx.MockTransport(lambda r: httpx.Response(500))) as http:
            request = self._request(http, call, call.url, call.method, call.timeout)
        hidden = {k.lower() for k in call.destination.headers.secret} if call.destination else set()
        lines = [f"{request.method} {request.url.raw_path.decode('ascii')} HTTP/1.1"]
        for raw_name, raw_value in request.headers.raw:
            name = raw_name.decode("latin-1")
            value = MASK if name.lower() in hidden else raw_value.decode("latin-1")
            lines.append(f"{name}: {value}")
        body = call.content.decode("utf-8") if call.content else ""
        text = "\n".join(lines) + "\n\n" + body
        facts = [
            ("method", call.method),
            ("url", str(call.url)),
            (
                "destination",
                f"{call.destination.name} (credentials added by the host: "
                f"{', '.join(call.destination.headers.secret) or 'none'})"
                if call.destination
                else "none: a URL from the request, no credentials added",
            ),
            ("address", address),
            (
                "redirects",
                f"followed, at most {settings.max_redirects}, each hop checked again"
                if call.follow
                else "not followed",
            ),
            ("timeout", f"{call.timeout:g}s"),
            ("response cap", f"{settings.max_bytes} bytes"),
        ]
        if call.content is not None:
            digest = hashlib.sha256(call.content).hexdigest()
            facts.append(("body", f"{len(call.content)} bytes, sha256 {digest}"))
        return Preview(
            title=f"{call.method} {call.url}",
            target=f"http: {call.destination.name if call.destination else call.url.host}",
            body=text,
            body_kind="text",
            facts=tuple(facts),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        settings = self._settings(ctx)
        call = build_call(params, settings)
        check_literal(call.url, settings.allow + call.allow)
        what = call.destination.name if call.destination else call.url.host
        transport = self._guard(settings, call).transport(
            ca_file=settings.ca_file, inner=self.backend
        )
        try:
            with client(transport) as http:
                return self._exchange(http, call, settings)
        except (*HTTPX_ERRORS, OSError) as exc:
            raise http_failure(exc, what, call.secrets) from exc

    def _exchange(self, http: httpx.Client, call: Call, settings: Settings) -> JSON:
        deadline = time.monotonic() + call.timeout
        url, method = call.url, call.method
        hops: list[str] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EffectFailed(
                    f"failed: no answer within {call.timeout:g}s; allow a longer timeout"
                )
            response = http.send(self._request(http, call, url, method, remaining), stream=True)
            if not (call.follow and response.has_redirect_location):
                break
            response.close()
            if len(hops) >= settings.max_redirects:
                raise EffectFailed(
                    f"failed: more than {settings.max_redirects} redirects; request the final "
                    "URL directly"
                )
            location = response.headers["Location"]
            try:
                url = parse_url(str(url.join(location)))
            except InvalidParams as exc:
                raise DestinationRefused(
                    f"failed: refused to follow the redirect to {location}: {exc.issues[0].message}"
                ) from exc
            if response.status_code == 303 or (
                response.status_code in (301, 302) and method == "POST"
            ):
                method = "GET"
            hops.append(str(url))
        reply = read_capped(response, settings.max_bytes, deadline)
        return {
            "status": reply.status,
            "status_text": reply.reason,
            "url": str(url),
            "redirects": hops,
            "headers": _headers_out(reply.headers, call.secrets),
            **_body_out(reply.body, reply.encoding, _header(reply.headers, "content-type"), call),
            "bytes": len(reply.body),
            "truncated": reply.truncated is not None,
            "truncated_by": reply.truncated,
        }


def _header(headers: list[tuple[str, str]], name: str) -> str:
    return next((v for k, v in headers if k.lower() == name), "")


def _headers_out(headers: list[tuple[str, str]], secrets: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers:
        key = k.lower()
        out[key] = f"{out[key]}, {v}" if key in out else v
    return {k: scrub(v, secrets) for k, v in out.items()}


def _body_out(data: bytes, encoding: str | None, content_type: str, call: Call) -> JSON:
    data = scrub_bytes(data, call.secrets)
    if TEXTUAL.match(content_type.lower()) or encoding:
        return {"body": data.decode(encoding or "utf-8", errors="replace"), "encoding": "text"}
    try:
        return {"body": data.decode("utf-8"), "encoding": "text"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
