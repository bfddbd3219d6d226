"""Fixtures shared by the whole suite."""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from broker.store.base import Store
from broker.testing import BrokerHarness, FakeHandler
from tests.effects.github import prism
from tests.pgserver import PgServer
from tests.stores import BACKENDS, OpenStore, new_database, opener, start_server
from tests.support import SETTLE_S, Hook, Start

EXIT_GRACE_S = 60
"""Seconds a test process may take to exit after its tests (pytest_unconfigure)."""
THREAD_GRACE_S = 5.0
"""Seconds a non-daemon thread may take to end after its module's tests."""


def pytest_configure(config: pytest.Config) -> None:
    """The run's controller (or its one process without xdist) makes the directory its
    workers share, for the servers one run starts once (Prism)."""
    if not hasattr(config, "workerinput"):
        os.environ[prism.SHARED_ENV] = tempfile.mkdtemp(prefix="broker-tests-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and (shared := os.environ.pop(prism.SHARED_ENV, "")):
        prism.stop_shared(Path(shared))
        shutil.rmtree(shared, ignore_errors=True)
    # A process that has not exited a minute after its tests ended is held by something
    # they left behind: print every thread's stack and go, rather than hold CI to its limit.
    faulthandler.dump_traceback_later(EXIT_GRACE_S, exit=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collecting imported lives as long as the run: out of the collector's sight
    (gc.freeze), a full collection costs microseconds instead of ~0.2 s per module."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def leaks_found_in_their_module() -> Iterator[None]:
    """Collect garbage when a module's tests end: a process, file or socket it left open
    warns (an error, by filterwarnings) in that module's last teardown, instead of in
    whichever test of another module the collector happens to run in later. A thread it
    left running that is not a daemon fails there too: it would keep the worker from
    exiting, and the run from ending. One on its way out is given THREAD_GRACE_S to end
    (an executor's worker, told to stop without being waited for, ends a moment later)."""
    yield
    gc.collect()
    for thread in threading.enumerate():
        if not (thread.daemon or thread is threading.main_thread()):
            thread.join(THREAD_GRACE_S)
    left = [t.name for t in threading.enumerate() if not (t.daemon or t is threading.main_thread())]
    assert not left, f"threads this module started still run and would hold the exit: {left}"


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One user cache dir (XDG_CACHE_HOME) for every broker of the run, as one user's
    brokers share it: the effect facts are kept there once, not per test's HOME."""
    path = tmp_path_factory.getbasetemp().parent / "xdg-cache"
    path.mkdir(exist_ok=True)
    was = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(path)
    yield path
    if was is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = was


@pytest.fixture
def fake() -> FakeHandler:
    """A reversible, idempotent fake effect named test.record."""
    return FakeHandler("test.record")


@pytest.fixture
def exports(tmp_path: Path) -> Path:
    """An empty export root for files.write."""
    root = tmp_path / "exports"
    root.mkdir()
    return root


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An empty HOME, so no real state dir or config is ever read."""
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def harness(tmp_path: Path, fake: FakeHandler, exports: Path) -> Iterator[BrokerHarness]:
    """A running broker in attach mode with files.write and test.record."""
    h = BrokerHarness(
        tmp_path / "h", handlers=[fake], integrations={"files": {"root": str(exports)}}
    )
    with h:
        yield h


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start a BrokerHarness (kwargs as BrokerHarness) that is stopped after the test."""
    running: list[BrokerHarness] = []

    def make(**kwargs: Any) -> BrokerHarness:
        h = BrokerHarness(tmp_path / f"broker{len(running)}", **kwargs)
        running.append(h)
        h.start()
        time.sleep(SETTLE_S)
        return h

    yield make
    for h in running:
        h.stop()


@pytest.fixture
def hook() -> Iterator[Hook]:
    """A real HTTP server in a thread that records each POST and answers from a script."""
    state = Hook("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state.lock:
                state.received.append(
                    {
                        "path": self.path,
                        "at": time.monotonic(),
                        "type": self.headers.get("Content-Type"),
                        "body": json.loads(body),
                    }
                )
                script = state.script.get(self.path, [])
                status = script.pop(0) if script else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One real PostgreSQL for the session (initdb + pg_ctl, 127.0.0.1, a free port)."""
    yield from start_server()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A new, empty database of the session's PostgreSQL (no password in the URL)."""
    return new_database(pg_server)


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    """Opens connections to one store of this test, SQLite or PostgreSQL; each is closed
    after the test (the last one closes PostgreSQL's pool and joins its threads)."""
    make = opener(request.param, tmp_path, lambda: str(request.getfixturevalue("pg_url")))
    opened: list[Store] = []

    def tracked(*args: Any, **kwargs: Any) -> Store:
        opened.append(make(*args, **kwargs))
        return opened[-1]

    yield tracked
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: OpenStore) -> Store:
    """A store of this test, on each back end in turn (closed by `open_store`)."""
    return open_store()
