"""Prism serving GitHub's OpenAPI description, and a recording proxy in front of it.

Helpers for the tests under tests/effects/github/ (started by its conftest.py).

Prism (`scripts/prism-up.sh` installs it into .tools/prism/) validates every request
against GitHub's official description and answers with the description's examples. It
loads the whole description (811 paths, 13 MB) in about 31 s; serving only the operations
the handlers send (`subset_spec`: those paths, byte for byte, with every component they
reference) takes about 7 s. `PRISM_FULL_SPEC=1` serves the whole description instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[3]
PRISM_DIR = Path(os.environ.get("PRISM_DIR") or ROOT / ".tools" / "prism")
PRISM_BIN = PRISM_DIR / "node_modules" / ".bin" / "prism"
GITHUB_SPEC = PRISM_DIR / "node_modules" / "@octokit" / "openapi" / "generated"
GITHUB_SPEC_FILE = GITHUB_SPEC / "api.github.com.json"
START_TIMEOUT_S = 90.0
PRISM_SAYS = b"stoplight.io/prism"  # in its answer to a path the description lacks
PREVIEW_MEDIA_TYPE = re.compile(r"application/vnd\.github\.[a-z-]+-preview\+json")


def installed() -> bool:
    return PRISM_BIN.exists() and GITHUB_SPEC_FILE.exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def subset_spec(full: Path, operations: Iterable[tuple[str, str]], out: Path) -> Path:
    """GitHub's description cut to the paths of `operations`, with what they reference."""
    spec = json.loads(full.read_text(encoding="utf-8"))
    wanted = sorted({path for _, path in operations})
    missing = [p for p in wanted if p not in spec["paths"]]
    if missing:
        raise AssertionError(f"not in GitHub's description: {missing}")
    cut: dict[str, Any] = {
        k: v for k, v in spec.items() if k not in ("paths", "components", "x-webhooks")
    }
    cut["paths"] = {p: spec["paths"][p] for p in wanted}
    components: dict[str, dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/"):
                _, _, kind, name = ref.split("/", 3)
                table = components.setdefault(kind, {})
                if name not in table:
                    table[name] = spec["components"][kind][name]
                    walk(table[name])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(cut["paths"])
    cut["components"] = components
    out.write_text(json.dumps(cut), encoding="utf-8")
    return out


SHARED_ENV = "BROKER_TESTS_SHARED"
"""A directory every worker of one pytest run shares (tests/conftest.py makes it)."""


@dataclass(frozen=True)
class Prism:
    """`prism mock` on 127.0.0.1, one per test run: the first worker that asks starts it
    in the background, the others find it (`shared`), and the run's end stops it
    (`stop_shared`). Loading GitHub's description is the longest start in the suite,
    so four workers each loading it on two busy cores was what made it miss its start."""

    port: int
    pid: int
    log: Path
    started: float  # wall clock: the workers share it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def shared(cls, spec: Callable[[Path], Path]) -> Prism:
        """The run's Prism, started here (serving `spec(folder)`) when no worker has yet."""
        folder = Path(os.environ[SHARED_ENV])
        with (folder / "prism.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            record = folder / "prism.json"
            if record.exists():
                return cls(**{**json.loads(record.read_text()), "log": folder / "prism.log"})
            port, log = _quiet_port(), folder / "prism.log"
            args = [str(PRISM_BIN), "mock", str(spec(folder)), "-p", str(port), "-h", "127.0.0.1"]
            # in the background of a shell that exits at once: no worker's child, so the
            # worker that started it can end before the others and leave it running
            quoted = " ".join(shlex.quote(a) for a in args)
            shell = f"{quoted} </dev/null >{shlex.quote(str(log))} 2>&1 & echo $!"
            out = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True)
            prism = cls(port, int(out.stdout), log, time.time())
            record.write_text(
                json.dumps({"port": port, "pid": prism.pid, "started": prism.started})
            )
            return prism

    def running(self) -> bool:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")

    def wait(self, timeout: float = START_TIMEOUT_S) -> None:
        """Return once Prism answers HTTP (any status), or raise with its log's tail."""
        end = self.started + timeout  # from its launch: a worker may come to it late
        while True:
            if not self.running():
                raise RuntimeError(f"prism exited:\n{self.tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/__broker_probe__")
                said = conn.getresponse().read()
                conn.close()
                if PRISM_SAYS in said:  # Prism, not whoever else holds the port
                    return
                raise OSError(f"127.0.0.1:{self.port} answers, but not as Prism")
            except OSError:
                if time.time() > end:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"prism did not answer within {timeout:g}s:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def _quiet_port() -> int:
    """A free port below the kernel's ephemeral range. Prism binds its port seconds after
    it is chosen (Node loads first); a port from bind(0) could meanwhile be handed to a
    server another worker starts, and the proxy would then forward to that server."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(20000, min(low, 32768)), 50):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port for Prism below the ephemeral range")


def stop_shared(folder: Path) -> None:
    """End the run's Prism, if a worker started one (SIGTERM, then SIGKILL after 10 s)."""
    record = folder / "prism.json"
    if not record.exists():
        return
    prism = Prism(**{**json.loads(record.read_text()), "log": folder / "prism.log"})
    for signum, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(prism.pid, signum)
        end = time.time() + grace
        while prism.running() and time.time() < end:
            time.sleep(0.05)
        if not prism.running():
            return


@dataclass(frozen=True)
class Exchange:
    """One request through the proxy and Prism's verdict on it."""

    method: str
    path: str
    status: int
    violations: tuple[dict[str, Any], ...]

    @property
    def errors(self) -> list[str]:
        return [
            f"{'.'.join(map(str, v.get('location', [])))}: {v.get('message')}"
            for v in self.violations
            if str(v.get("severity", "")).lower() == "error"
        ]


class RecordingProxy:
    """Forwards every request to `upstream` and records status and Prism's violations."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                accept = headers.get("Accept", "")
                if PREVIEW_MEDIA_TYPE.fullmatch(accept):
                    # PyGithub asks for an old preview media type on the App token call;
                    # GitHub answers JSON, Prism knows only the description's JSON (406)
                    headers["Accept"] = "application/json"
                status, reply_headers, data = proxy.send(self.command, self.path, headers, body)
                self.send_response(status)
                for key, value in reply_headers:
                    if key.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    def send(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        assert self.upstream.hostname and self.upstream.port
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            reply = conn.getresponse()
            data = reply.read()
            found = reply.getheader("sl-violations")
            violations = tuple(json.loads(found)) if found else ()
            with self._lock:
                self.exchanges.append(
                    Exchange(method, path.split("?")[0], reply.status, violations)
                )
            return reply.status, reply.getheaders(), data
        finally:
            conn.close()

    def take(self) -> list[Exchange]:
        """The exchanges so far, forgetting them."""
        with self._lock:
            taken, self.exchanges = self.exchanges, []
        return taken

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
