"""Fixtures for the web inbox: a real broker per test, and its web app served by one
real uvicorn on 127.0.0.1 for the whole session (each test plugs in its own app)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from broker.models import Preview
from broker.testing import BrokerHarness, FakeHandler
from broker.typing import JSON, Params
from broker.web.app import create_app
from broker.web.auth import hash_token
from broker.web.server import WebServer
from effects.base import Context
from tests.support import TLS

LOOPBACK = ["127.0.0.0/8"]
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
BROWSER_TZ = "Asia/Kolkata"  # UTC+05:30 all year: local times differ visibly from UTC
TOKENS = {"alice": "bkr_alice-token-for-tests", "bob": "bkr_bob-token-for-tests"}
RECORD_REASON = "a person looks at every record first"
FILES_REASON = "files leave the sandbox: a person reads them first"
CAREFUL_REASON = "each of these is read on its own"
HTTP_REASON = "calls to services wait for a person"
POLICY = f"""
[[rules]]
effect = "test.record"
action = "approve"
timeout = "1h"
on_timeout = "deny"
reason = "{RECORD_REASON}"

[[rules]]
effect = "test.quorum"
action = "approve"
approvals = 2
reason = "two people look at this one"

[[rules]]
effect = "files.write"
action = "approve"
timeout = "30m"
reason = "{FILES_REASON}"

[[rules]]
effect = "test.careful"
action = "approve"
batch = false
reason = "{CAREFUL_REASON}"

[[rules]]
effect = "http.request"
action = "approve"
reason = "{HTTP_REASON}"

[[rules]]
effect = "test.pull"
action = "approve"
reason = "{RECORD_REASON}"
"""


class Switch:
    """An ASGI app forwarding to the current test's app; each test closes its own."""

    def __init__(self) -> None:
        self.app: FastAPI | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        assert self.app is not None, "no app plugged in"
        await self.app(scope, receive, send)


@dataclass
class Web:
    """A broker serving one attach-mode outbox, and its web inbox on 127.0.0.1."""

    harness: BrokerHarness
    url: str
    clients: list[httpx.Client] = field(default_factory=list)

    def client(self, approver: str | None = "alice") -> httpx.Client:
        """An API client; with a bearer token unless approver is None."""
        headers = {"Authorization": f"Bearer {TOKENS[approver]}"} if approver else {}
        client = httpx.Client(base_url=self.url, headers=headers, timeout=10, verify=TLS)
        self.clients.append(client)
        return client

    def browser(self, approver: str = "alice") -> httpx.Client:
        """A client signed in through the login form, holding a session cookie."""
        client = self.client(None)
        form = client.get("/login")
        response = client.post(
            "/login",
            data={"token": TOKENS[approver], "csrf": csrf_of(form.text), "next": "/"},
        )
        assert response.status_code == 303, response.text
        return client

    def gated(self, effect: str = "test.record", **fields: Any) -> dict[str, Any]:
        """Submit a request the policy sends to people; return its pending result."""
        params = fields.pop("params", {"value": "hello"})
        doc = self.harness.request(effect, params, **fields)
        result = self.harness.submit(doc, terminal=False)
        assert result["status"] == "pending", result
        return result


def csrf_of(html: str) -> str:
    """The CSRF token in a page's first form."""
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


def app_for(h: BrokerHarness) -> FastAPI:
    """The web app over `h`'s state dir, with alice and bob as approvers."""
    config = h.config._replace(
        approvers={name: {"token_sha256": hash_token(t)} for name, t in TOKENS.items()},
    )
    return create_app(config, h.registry)


@pytest.fixture(scope="session")
def served() -> Iterator[tuple[Switch, WebServer]]:
    """One uvicorn on 127.0.0.1 for the session; tests plug their app into the switch."""
    switch = Switch()
    server = WebServer(switch).start("127.0.0.1", 0)
    yield switch, server
    server.stop()


@pytest.fixture
def exports(tmp_path: Path) -> Path:
    """An export root for files.write holding notes.txt (in the `default` sandbox's own
    directory, where its requests write)."""
    root = tmp_path / "exports"
    (root / "default").mkdir(parents=True)
    notes = root / "default" / "notes.txt"
    notes.write_text("line one\nline two\nline three\n", encoding="utf-8")
    return root


class Pull(FakeHandler):
    """A fake that "opens a pull request": its output holds the PR's URL (never fetched),
    and it can be undone (closed), as github.pull_request.create can."""

    undo = "closes the pull request"

    def apply(self, params: Params, ctx: Context) -> JSON:
        super().apply(params, ctx)
        return {"url": "https://github.com/acme/api/pull/42", "number": 42}

    def revert_preview(self, output: Params, ctx: Context) -> Preview:
        return Preview(title=f"close pull request {output.get('number')}", target="test.pull")

    def revert(self, output: Params, ctx: Context) -> JSON:
        return {"closed": output.get("number")}


def _harness(tmp_path: Path, exports: Path) -> BrokerHarness:
    return BrokerHarness(
        tmp_path / "h",
        handlers=[
            FakeHandler("test.record"),
            FakeHandler("test.quorum"),
            FakeHandler("test.careful"),
            Pull("test.pull"),
        ],
        policy=POLICY,
        integrations={"files": {"root": str(exports)}, "http": {"allow_networks": LOOPBACK}},
    )


def _plugged(h: BrokerHarness, served: tuple[Switch, WebServer]) -> Iterator[Web]:
    switch, server = served
    app = app_for(h)
    switch.app = app
    running = Web(h, server.url)
    try:
        yield running
    finally:
        for client in running.clients:
            client.close()
        switch.app = None
        app.state.inbox.close()


@pytest.fixture
def web(tmp_path: Path, exports: Path, served: tuple[Switch, WebServer]) -> Iterator[Web]:
    """A running broker with gated effects, and its web inbox."""
    with _harness(tmp_path, exports) as h:
        yield from _plugged(h, served)


@pytest.fixture
def idle(tmp_path: Path, exports: Path, served: tuple[Switch, WebServer]) -> Iterator[Web]:
    """The web inbox over a state dir no broker serves: for what needs no request."""
    yield from _plugged(_harness(tmp_path, exports), served)


# -- headless Chromium ----------------------------------------------------------------


def _missing(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI must run the browser tests (bash scripts/chromium-up.sh)")
    pytest.skip(f"{why}: run `bash scripts/chromium-up.sh` as root to run the browser tests")


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A headless Chromium with a throw-away profile, shared by one module's tests.
    Chromium resolves no name but 127.0.0.1."""
    if not CHROMIUM.exists():
        _missing(f"{CHROMIUM} is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            tmp_path_factory.mktemp("chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=BROWSER_ARGS,
            viewport={"width": 1200, "height": 900},
            timezone_id=BROWSER_TZ,
        )
        yield context
        context.close()


@pytest.fixture
def page(chromium: Any, web: Web) -> Iterator[Any]:
    """A fresh tab signed in to `web` as alice, with its script errors collected."""
    chromium.clear_cookies()
    tab = chromium.new_page()
    tab.errors = []
    tab.on("pageerror", lambda exc: tab.errors.append(str(exc)))
    tab.goto(f"{web.url}/")
    tab.fill("#token", TOKENS["alice"])
    tab.click("#sign-in")
    tab.wait_for_selector("h1:has-text('Waiting for a decision')")
    tab.wait_for_load_state()  # the page's script is running
    yield tab
    assert tab.errors == []  # no script broke on any page
    tab.close()
