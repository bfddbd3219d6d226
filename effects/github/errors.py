"""The edge: PyGithub's and requests' exceptions become EffectFailed, in words an agent
can act on. `github_reasons()` maps every exception class PyGithub defines (the tests
check it is complete); `network_reasons()` every requests exception, most specific first.

PyGithub and requests are imported when a GitHub call's exception is translated, not
with this module: listing effects, loading a policy or starting a broker never pays
for them (a third of a second).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING

from broker.errors import EffectFailed
from effects.github.text import CONTROL

if TYPE_CHECKING:
    import requests
    from github import GithubException

Reason = Callable[["GithubException", str], str]


def _said(exc: GithubException) -> str:
    """GitHub's own words from an error answer, one line, bounded."""
    data = exc.data if isinstance(exc.data, Mapping) else {}
    words = [str(data.get("message") or exc.message or "")]
    for err in data.get("errors") or []:
        if isinstance(err, Mapping):
            words.append(
                str(err.get("message") or " ".join(str(err.get(k, "")) for k in ("field", "code")))
            )
        else:
            words.append(str(err))
    text = CONTROL.sub(" ", "; ".join(w.strip() for w in words if w and w.strip()))
    return text[:300] or "no message"


def _reset_time(exc: GithubException) -> str:
    headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
    if headers.get("retry-after", "").isdigit():
        return f"in {headers['retry-after']} s"
    reset = headers.get("x-ratelimit-reset", "")
    if reset.isdigit():
        return "at " + datetime.fromtimestamp(int(reset), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return "in a few minutes"


def _by_status(exc: GithubException, doing: str) -> str:
    status = exc.status
    said = _said(exc)
    if status == 401:
        return _bad_credentials(exc, doing)
    if status == 403 or status == 429:
        if status == 429 or "rate limit" in said.lower():
            return _rate_limited(exc, doing)
        return (
            f"failed: GitHub refused {doing} (403: {said}); the host's credentials lack the "
            "permission, or the repository forbids it; ask the operator, or ask for less"
        )
    if status == 404:
        return _not_found(exc, doing)
    if status == 409:
        return f"failed: GitHub reports a conflict {doing} (409: {said}); check the repo's state"
    if status == 410:
        return f"failed: GitHub says this is gone or disabled {doing} (410: {said})"
    if status == 422:
        return f"failed: GitHub refused the request {doing} as invalid (422: {said})"
    if status >= 500:
        return (
            f"failed: GitHub broke {doing} ({status}: {said}); it may or may not have "
            "happened: check before sending the request again"
        )
    return f"failed: GitHub answered {status} {doing}: {said}"


def _bad_credentials(exc: GithubException, doing: str) -> str:
    return (
        f"failed: GitHub refused the host's credentials {doing} ({exc.status}: {_said(exc)}); "
        "the agent cannot fix this: ask the operator to renew the token or the App's key"
    )


def _rate_limited(exc: GithubException, doing: str) -> str:
    return (
        f"failed: GitHub's rate limit stopped {doing} ({exc.status}: {_said(exc)}); it resets "
        f"{_reset_time(exc)}: send the request again after that"
    )


def _not_found(exc: GithubException, doing: str) -> str:
    return (
        f"failed: GitHub answered 404 {doing}: the repository, or the number or branch the "
        "request names, does not exist, or the host's credentials cannot see it; check them"
    )


@cache
def github_reasons() -> dict[type[GithubException], Reason]:
    """Every exception class PyGithub defines, by exact class (the tests check it is
    complete)."""
    from github import GithubException
    from github.GithubException import (
        BadCredentialsException,
        BadUserAgentException,
        IncompletableObject,
        RateLimitExceededExceedsMaxWait,
        RateLimitExceededException,
        TwoFactorException,
        UnknownObjectException,
    )

    return {
        GithubException: _by_status,
        BadCredentialsException: _bad_credentials,
        UnknownObjectException: _not_found,
        RateLimitExceededException: _rate_limited,
        RateLimitExceededExceedsMaxWait: _rate_limited,
        BadUserAgentException: lambda exc, doing: (
            f"failed: GitHub refused the broker's User-Agent {doing} ({_said(exc)}); "
            "ask the operator"
        ),
        TwoFactorException: lambda exc, doing: (
            f"failed: GitHub asks for a one-time password {doing}: the host is configured with a "
            "password, not a token or an App; ask the operator"
        ),
        IncompletableObject: lambda exc, doing: (
            f"failed: GitHub's answer {doing} lacked the URL needed to go on ({_said(exc)})"
        ),
    }


@cache
def network_reasons() -> tuple[tuple[type[requests.RequestException], str], ...]:
    """requests' exceptions, most specific first; the last one catches the rest."""
    import requests

    return (
        (requests.exceptions.SSLError, "the TLS handshake with {url} failed; ask the operator"),
        (
            requests.exceptions.ConnectTimeout,
            "{url} did not accept a connection in time; try again later",
        ),
        (
            requests.exceptions.ReadTimeout,
            "{url} did not answer in time; it may or may not have happened: check before "
            "sending the request again",
        ),
        (
            requests.exceptions.ProxyError,
            "the host's proxy refused the connection to {url}; ask the operator",
        ),
        (
            requests.exceptions.ConnectionError,
            "cannot connect to {url} from the host; try again later",
        ),
        (
            requests.exceptions.RetryError,
            "{url} kept failing after retries; try again later",
        ),
        (
            requests.exceptions.ChunkedEncodingError,
            "the connection to {url} broke mid-answer; it may or may not have happened: "
            "check before sending the request again",
        ),
        (
            requests.exceptions.ContentDecodingError,
            "the answer from {url} could not be decoded; try again later",
        ),
        (
            requests.exceptions.TooManyRedirects,
            "{url} redirected too many times; ask the operator to check base_url",
        ),
        (
            requests.exceptions.InvalidJSONError,
            "the answer from {url} was not JSON; ask the operator to check base_url",
        ),
        (
            requests.exceptions.RequestException,
            "the HTTP request to {url} failed ({kind}); ask the operator",
        ),
    )


def translate(exc: BaseException, doing: str, base_url: str) -> EffectFailed:
    """The EffectFailed an agent reads for an exception of PyGithub or requests."""
    import requests
    from github.GithubException import BadAttributeException, GithubException

    if isinstance(exc, GithubException):
        for cls in type(exc).__mro__:
            reason = github_reasons().get(cls)
            if reason is not None:
                return EffectFailed(reason(exc, doing))
    if isinstance(exc, BadAttributeException):
        return EffectFailed(f"failed: GitHub's answer {doing} had a field of an unexpected type")
    if isinstance(exc, requests.RequestException):
        for cls, text in network_reasons():
            if isinstance(exc, cls):
                said = text.format(url=base_url, kind=type(exc).__name__)
                return EffectFailed(f"failed: {doing}: {said}")
    return EffectFailed(f"failed: {doing}: {type(exc).__name__}")


@contextmanager
def edge(doing: str, base_url: str) -> Iterator[None]:
    """Translate PyGithub's and requests' exceptions raised inside into EffectFailed."""
    import requests
    from github.GithubException import BadAttributeException, GithubException

    try:
        yield
    except EffectFailed:
        raise
    except (GithubException, BadAttributeException, requests.RequestException) as exc:
        raise translate(exc, doing, base_url) from exc
