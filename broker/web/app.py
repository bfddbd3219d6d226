"""The FastAPI application: /api/v1, the inbox pages and their static files, and
Slack's callback (/slack/actions) when [notify.slack] is configured.

It runs in the broker's process but reads and writes the ledger through its own
connections; a decision is flushed to the audit log and nudges the serving broker,
exactly as `broker approve` does.

    [web]
    session_ttl = "12h"          # how long a browser stays signed in
    tls_certfile = "cert.pem"    # serve HTTPS (both, relative to broker.toml)
    tls_keyfile = "key.pem"
    secure_cookie = true         # default: true with TLS; set it behind a TLS proxy

    [web.oidc]                   # sign in with the identity provider (broker.web.oidc)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker import __version__
from broker.clock import parse_duration
from broker.config import Config
from broker.errors import ConfigError
from broker.people import People
from broker.registry import Registry
from broker.settings import only_keys
from broker.slack.settings import slack_settings
from broker.store.base import Store
from broker.store.factory import open_store
from broker.web import api, github_hook, history, pages, replay, signin, undo, waiting
from broker.web import slack_actions as slack
from broker.web.auth import Gate, Sessions, load_approvers
from broker.web.inbox import Inbox
from broker.web.oidc import Provider, oidc_settings

if TYPE_CHECKING:
    from broker.integrations.github_decisions import PrDecider
    from broker.observability.metrics import Metrics

STATIC = Path(__file__).parent / "static"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
MAX_BODY = 64 * 1024  # a decision is a verdict, a reason and a hash
WEB_KEYS = {"session_ttl", "tls_certfile", "tls_keyfile", "secure_cookie", "listen", "oidc"}
_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}


@dataclass(frozen=True)
class WebSettings:
    """[web] in broker.toml, checked."""

    session_ttl_s: float = 12 * 3600.0
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    secure_cookie: bool = False
    listen: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_certfile is not None


def web_settings(config: Config) -> WebSettings:
    """Read [web]; a mistake names its key."""
    table: Mapping[str, Any] = config.web
    only_keys("web", table, WEB_KEYS)
    try:
        ttl = parse_duration(table.get("session_ttl", "12h"))
    except ValueError as exc:
        raise ConfigError(f"web.session_ttl: {exc}") from exc
    base = config.base_dir or Path.cwd()
    files = {}
    for key in ("tls_certfile", "tls_keyfile"):
        value = table.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"web.{key}: expected a path")
        files[key] = (base / value) if value else None
    if (files["tls_certfile"] is None) != (files["tls_keyfile"] is None):
        raise ConfigError("web.tls_certfile and web.tls_keyfile go together")
    secure = table.get("secure_cookie", files["tls_certfile"] is not None)
    if not isinstance(secure, bool):
        raise ConfigError("web.secure_cookie: expected true or false")
    listen = table.get("listen")
    if listen is not None and not isinstance(listen, str):
        raise ConfigError('web.listen: expected "HOST:PORT"')
    return WebSettings(ttl, files["tls_certfile"], files["tls_keyfile"], secure, listen)


def _route(app: FastAPI, metrics: Metrics | None) -> None:
    """Every surface's routes, /metrics when asked for, and the static files."""
    app.include_router(api.router, prefix="/api/v1")
    app.include_router(replay.api, prefix="/api/v1")
    app.include_router(slack.router)
    app.include_router(github_hook.router)
    app.include_router(pages.router)
    app.include_router(history.router)
    app.include_router(signin.router)
    app.include_router(replay.router)  # before waiting's /requests/…: no overlap, by order
    app.include_router(waiting.router)
    app.include_router(undo.router)
    if metrics is not None:
        app.add_api_route(
            "/metrics", _metrics_page(metrics), methods=["GET"], include_in_schema=False
        )
    app.mount("/static", StaticFiles(directory=STATIC), name="static")


def create_app(
    config: Config,
    registry: Registry,
    *,
    ledger_factory: Callable[[], Store] | None = None,
    metrics: Metrics | None = None,
) -> FastAPI:
    """The web surface over `config`'s ledger (and `metrics` at /metrics, when given);
    raises ConfigError for a bad [web]/[approvers]."""
    settings = web_settings(config)
    people = People.of(config.approvers)
    gate = Gate(load_approvers(config.approvers), Sessions(settings.session_ttl_s), people)
    oidc = oidc_settings(config)
    sign_in = signin.SignIn(oidc, Provider(oidc)) if oidc is not None else None
    inbox = Inbox(config, registry, ledger_factory or (lambda: open_store(config)))
    chat = slack_settings(config)
    callback = slack.SlackCallback(chat, inbox) if chat is not None else None
    github = _github(config, inbox)

    held = (inbox, callback, github and github.threads, sign_in and sign_in.provider)
    closes = [service.close for service in held if service]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        for close in closes:
            close()

    app = FastAPI(
        title="Sandbox-outbox broker",
        version=__version__,
        description="Approve or deny what agents ask to do; the same rules as the CLI.",
        openapi_url="/api/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    renderer = _pages(config, inbox, gate, settings.secure_cookie, sign_in is not None)
    app.state.inbox = inbox
    app.state.sign_in = sign_in
    app.state.gate = gate
    app.state.pages = renderer
    app.state.slack = callback
    app.state.github = github
    _route(app, metrics)
    _handle_errors(app, renderer)
    app.add_middleware(SecurityHeaders)
    return app


def _pages(config: Config, inbox: Inbox, gate: Gate, secure: bool, oidc: bool) -> pages.Pages:
    inbox_url = config.notify.get("inbox_url")
    inbox_url = inbox_url.rstrip("/") if isinstance(inbox_url, str) else None
    return pages.Pages(inbox, gate, secure_cookie=secure, oidc=oidc, inbox_url=inbox_url)


def _github(config: Config, inbox: Inbox) -> PrDecider | None:
    """The pull request decision path, when [integrations.github] approve_in_pr is on."""
    from broker.integrations.github_decisions import PrDecider
    from broker.integrations.github_threads import GitHubThreads

    threads = GitHubThreads.of(config)
    return None if threads is None else PrDecider(threads, inbox.decide, inbox.card)


def _metrics_page(metrics: Metrics) -> Callable[[], Response]:
    """Prometheus' text format, unauthenticated as scrapers expect: only counts and
    timings by registered effect names, nothing from a sandbox."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    def page() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return page


def _is_api(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _json_error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return JSONResponse(api.error_body(code, message), status_code=status, headers=headers)


def _handle_errors(app: FastAPI, renderer: pages.Pages) -> None:
    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, api.ApiError)
        return _json_error(exc.status, exc.code, exc.message, exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = _CODES.get(exc.status_code, "error")
        message = str(exc.detail)
        if _is_api(request):
            return _json_error(exc.status_code, code, message, exc.headers)
        title = "Not here" if exc.status_code == 404 else "Not accepted"
        return await run_in_threadpool(renderer.error, request, exc.status_code, title, message)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = []
        for error in exc.errors()[:5]:
            where = ".".join(str(p) for p in error.get("loc", ()))
            problems.append(f"{where}: {error.get('msg', 'invalid')}")
        message = "; ".join(problems) or "the request is not valid"
        if _is_api(request):
            return _json_error(422, "invalid_request", message)
        return await run_in_threadpool(renderer.error, request, 400, "Not understood", message)

    async def broken(request: Request, exc: Exception) -> Response:
        response = _json_error(500, "internal", "the broker's web surface failed; see its log")
        response.headers.update(SECURITY_HEADERS)
        return response

    app.add_exception_handler(api.ApiError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Exception, broken)


class SecurityHeaders:
    """Adds the CSP (no inline scripts) and its companions to every response, and
    refuses request bodies over MAX_BODY (bodies are read before anyone is identified)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", [])).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > MAX_BODY:
            response = _json_error(413, "too_large", f"request bodies are at most {MAX_BODY} bytes")
            response.headers.update(SECURITY_HEADERS)
            await response(scope, receive, send)
            return
        seen = 0

        async def receive_limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > MAX_BODY:
                raise HTTPException(413, f"request bodies are at most {MAX_BODY} bytes")
            return message

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.decode("latin-1").lower() not in SECURITY_HEADERS
                ]
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive_limited, send_with_headers)
