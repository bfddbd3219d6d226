"""One request as the broker will send it (`Call`), built from params and the host's
settings; InvalidParams says what to fix."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx

from broker.errors import InvalidParams
from broker.typing import Params
from effects.http.settings import METHODS, Destination, HttpSettings
from effects.netguard import IPNetwork, parse_url, same_origin
from effects.netguard.urls import ENCODED_SEPARATORS

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
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


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


def _target_url(params: Params, settings: HttpSettings) -> tuple[httpx.URL, Destination | None]:
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


def bound_by(url: httpx.URL, settings: HttpSettings, dest: Destination | None) -> list[Destination]:
    """The destinations whose `methods` bind a request to `url`: `dest` itself at its own
    origin (where its credentials go); elsewhere every destination at that origin."""
    if dest is not None and same_origin(url, dest.base):
        return [dest]
    return [d for d in settings.destinations.values() if same_origin(url, d.base)]


def method_refusal(
    method: str, url: httpx.URL, settings: HttpSettings, dest: Destination | None
) -> str | None:
    """Why `method` may not be sent to `url`, or None. A request through a destination
    takes its methods; a URL at a destination's origin (a raw URL, a redirect hop) takes
    what the destinations there allow between them, so GET-only stays GET-only."""
    bound = bound_by(url, settings, dest)
    if not bound or any(d.allows(method) for d in bound):
        return None
    allowed = ", ".join(m for m in METHODS if any(d.allows(m) for d in bound))
    if dest is not None and bound == [dest]:
        return (
            f"destination {dest.name} allows {allowed}; {method} is not allowed: use one "
            "of them or ask for another destination"
        )
    names = ", ".join(d.name for d in bound)
    origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
    return (
        f"{origin} is the host's destination {names}, which allows {allowed}; {method} is "
        "not allowed there: use one of them or ask for another destination"
    )


def build_call(params: Params, settings: HttpSettings) -> Call:
    """Check params against the host's settings; InvalidParams says what to fix."""
    url, dest = _target_url(params, settings)
    refused = method_refusal(params["method"], url, settings, dest)
    if refused is not None:
        raise InvalidParams("/params/method", refused, "method_not_allowed")
    if params.get("query"):
        url = url.copy_merge_params(params["query"])
    headers = _request_headers(params, dest)
    if "json" in params and "body" in params:
        raise InvalidParams("/params/body", "send json or body, not both", "json_or_body")
    if params["method"] in SAFE_METHODS and ("json" in params or "body" in params):
        raise InvalidParams(
            "/params/json" if "json" in params else "/params/body",
            f"a {params['method']} request carries no body (it must change nothing and send "
            "nothing out); use POST, PUT or PATCH to send data",
            "body_on_safe_method",
        )
    content = _content(params, headers)
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


def _request_headers(params: Params, dest: Destination | None) -> list[tuple[str, str]]:
    """The request's own headers; none the broker frames or the destination sets."""
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
    return headers


def _content(params: Params, headers: list[tuple[str, str]]) -> bytes | None:
    """The body as bytes (json or text), adding its Content-Type unless one is given."""
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
    return content
