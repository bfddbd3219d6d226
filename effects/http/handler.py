"""`HttpRequest`: check, preview and send one request through the address guard,
following redirects only when asked, each hop checked again."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import httpcore
import httpx

from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.masking import Masker
from broker.models import Preview
from broker.typing import JSON, Params
from effects import kv
from effects.base import Context, Handler, Settings
from effects.http.calls import SAFE_METHODS, Call, bound_by, build_call, method_refusal
from effects.http.responses import output
from effects.http.settings import METHODS, HttpSettings, settings_from
from effects.netguard import (
    HTTPX_ERRORS,
    MASK,
    Allowed,
    DestinationRefused,
    NetGuard,
    Resolver,
    check_literal,
    client,
    default_port,
    http_failure,
    parse_url,
    read_capped,
    same_origin,
    system_resolver,
)
from effects.netguard.urls import canonical_path, canonical_url


class HttpRequest(Handler):
    """Send one HTTP request through the address guard, with host-held credentials."""

    name = "http.request"
    identifying = ("method", "destination", "path", "url", "query")
    reversible = False
    idempotent = False
    assess_inline = True  # reversible_for reads the method and the destination
    undo = (
        "the broker cannot take back a request that changed something; GET, HEAD and "
        "OPTIONS to a destination the host names change nothing and need no undo"
    )
    config_keys: ClassVar[frozenset[str]] = frozenset(
        {
            "allow_networks",
            "destinations",
            "max_response_bytes",
            "max_response_time",
            "max_redirects",
            "ca_file",
            "credential",
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

    def returns(self, settings: Mapping[str, Any]) -> Mapping[str, str]:
        """Per destination, what of its answer comes back (a URL: the whole body)."""
        parsed = settings_from(settings)
        found = {
            f"destination {d.name}": d.response.describe() for d in parsed.destinations.values()
        }
        return {**found, "a url": Allowed().describe()}

    @staticmethod
    def _settings(ctx: Context, destination: str | None = None) -> HttpSettings:
        """The checked settings; the KV secrets of `destination` alone are read (at
        apply), every other one stands for itself (effects/kv.py)."""
        mine = None  # no destination, or an unknown one (refused below): nothing is read
        if destination and '"' not in destination:
            mine = f"{Settings.key('destinations', destination)}."

        def fetch(key: str) -> bool:
            return mine is not None and key.startswith(mine)

        try:
            return settings_from(ctx.settings, kv.reader(ctx, "integrations.http", fetch))
        except ConfigError as exc:
            raise EffectFailed(
                f"failed: http.request is misconfigured on this host ({exc}); tell the operator"
            ) from exc

    def check(self, params: Params, ctx: Context) -> None:
        settings = self._settings(ctx)
        call = build_call(params, settings)
        check_literal(call.url, settings.allow + call.allow)

    def canonical(self, params: Params, ctx: Context) -> Params:
        """The URL (or the destination's path) in its one form, as rules match it."""
        out = dict(params)
        if isinstance(params.get("url"), str):
            out["url"] = canonical_url(params["url"])
        if isinstance(params.get("path"), str):
            out["path"] = canonical_path(params["path"], "/params/path")
        return out

    def reversible_for(self, params: Params, ctx: Context) -> bool:
        """A safe method to a destination the host names changes nothing; a URL from
        the request could carry data out in its path or query, so people see it."""
        return params.get("method") in SAFE_METHODS and "destination" in params

    def _guard(self, settings: HttpSettings, call: Call) -> NetGuard:
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
        facts = _facts(call, settings, address)
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
        settings = self._settings(ctx, params.get("destination"))
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

    def _exchange(self, http: httpx.Client, call: Call, settings: HttpSettings) -> JSON:
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
            refused = method_refusal(method, url, settings, call.destination)
            if refused is not None:  # a 307/308 keeps the method, wherever it points
                where = Masker(call.secrets).text(location)
                raise DestinationRefused(
                    f"failed: refused to follow the redirect to {where}: {refused}"
                )
            hops.append(str(url))
        masker = Masker(call.secrets)
        # read past the cap by the longest secret form: mask first, then cut
        reply = read_capped(response, settings.max_bytes + masker.longest, deadline)
        allowed = call.destination.response if call.destination else None
        return output(reply, url, hops, masker, settings.max_bytes, allowed)


def _facts(call: Call, settings: HttpSettings, address: str) -> list[tuple[str, str]]:
    """What the card says of the call beside its wire form."""
    return [
        ("method", call.method),
        ("url", str(call.url)),
        (
            "destination",
            f"{call.destination.name} (credentials added by the host: "
            f"{', '.join(call.destination.headers.secret) or 'none'})"
            if call.destination
            else "none: a URL from the request, no credentials added",
        ),
        ("methods", _methods_fact(settings, call)),
        (
            "response",
            (call.destination.response if call.destination else Allowed()).describe()
            + " returns to the agent",
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


def _methods_fact(settings: HttpSettings, call: Call) -> str:
    """What the host lets this request's target take, as a reviewer should read it."""
    bound = bound_by(call.url, settings, call.destination)
    if not bound:
        return "any: a URL from the request, at no destination's origin"
    open_ = [d.name for d in bound if d.methods is None]
    if open_:
        return f"any: destination {', '.join(open_)} lists no methods"
    allowed = [m for m in METHODS if any(d.allows(m) for d in bound)]
    names = ", ".join(d.name for d in bound)
    return f"{', '.join(allowed)} only (destination {names}); no other is sent there"
