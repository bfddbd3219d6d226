"""The guard's refusal, and httpx's exceptions translated into sentences an agent can
act on (`http_failure`), with every secret masked."""

from __future__ import annotations

from collections.abc import Iterable

import httpx

from broker.errors import EffectFailed
from effects.netguard.headers import scrub


class DestinationRefused(EffectFailed):
    """The broker will not connect there: wrong scheme, odd address form, or an
    address the host does not allow."""


_HTTPX_REASONS: dict[type[Exception], str] = {
    httpx.ConnectTimeout: "{what} did not accept a connection in time; try again later",
    httpx.ConnectError: "could not connect to {what} ({detail}); check the address, or try "
    "again later",
    httpx.ReadTimeout: "{what} did not answer in time; it may have received the request: check "
    "before sending it again, or allow a longer timeout",
    httpx.WriteTimeout: "sending to {what} timed out; try again later",
    httpx.PoolTimeout: "no connection to {what} became free in time; try again later",
    httpx.TimeoutException: "{what} timed out; try again later",
    httpx.ReadError: "the connection to {what} broke while reading the answer ({detail}); it "
    "may have received the request",
    httpx.WriteError: "the connection to {what} broke while sending ({detail}); try again",
    httpx.CloseError: "closing the connection to {what} failed ({detail})",
    httpx.NetworkError: "the network failed talking to {what} ({detail}); try again later",
    httpx.ProxyError: "a proxy refused the request to {what} ({detail})",
    httpx.UnsupportedProtocol: "{what} needs a protocol the broker does not speak; use an "
    "http:// or https:// URL",
    httpx.RemoteProtocolError: "{what} broke the HTTP protocol ({detail})",
    httpx.LocalProtocolError: "the request to {what} could not be sent as valid HTTP ({detail}); "
    "check header names and values",
    httpx.ProtocolError: "an HTTP protocol error with {what} ({detail})",
    httpx.TransportError: "the request to {what} failed in transport ({detail})",
    httpx.DecodingError: "the answer from {what} could not be decoded ({detail})",
    httpx.TooManyRedirects: "{what} redirected too many times",
    httpx.RequestError: "the request to {what} failed ({detail})",
    httpx.HTTPStatusError: "{what} answered with an error status ({detail})",
    httpx.HTTPError: "the request to {what} failed ({detail})",
    httpx.InvalidURL: "the URL for {what} is not valid ({detail}); fix it and send a new request",
    httpx.CookieConflict: "the answer from {what} set conflicting cookies ({detail})",
    httpx.StreamConsumed: "the broker mishandled the request stream to {what}; tell the operator",
    httpx.StreamClosed: "the broker mishandled the response from {what}; tell the operator",
    httpx.ResponseNotRead: "the broker mishandled the response from {what}; tell the operator",
    httpx.RequestNotRead: "the broker mishandled the request to {what}; tell the operator",
    httpx.StreamError: "the broker mishandled a stream to {what}; tell the operator",
    OSError: "a local error on the host while talking to {what} ({detail}); tell the operator",
}
HTTPX_ERRORS = (httpx.HTTPError, httpx.InvalidURL, httpx.CookieConflict, httpx.StreamError)


def http_failure(exc: Exception, what: str, secrets: Iterable[str] = ()) -> EffectFailed:
    """The EffectFailed for an httpx exception: a sentence the agent can act on."""
    template = next(
        (_HTTPX_REASONS[k] for k in type(exc).__mro__ if k in _HTTPX_REASONS),
        "the request to {what} failed ({detail})",
    )
    detail = scrub(str(exc) or type(exc).__name__, secrets)[:300]
    return EffectFailed("failed: " + template.format(what=what, detail=detail))
