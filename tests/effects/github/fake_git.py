"""git's smart HTTP for the fake GitHub's repositories, enforcing the tokens it issued:
`https://github.com/OWNER/NAME.git` as the fake serves it on 127.0.0.1.

Fetches (`git-upload-pack`) need `contents: read` on the repository, pushes
(`git-receive-pack`) `contents: write`, as GitHub asks of an installation token; the
fake's standing token reaches everything. A token is sent as git sends it to GitHub
(`Authorization: Basic base64(x-access-token:TOKEN)`). The packs themselves are made
by git (`upload-pack` / `receive-pack --stateless-rpc`) in the fake's bare repository,
so the fake's REST API sees what was pushed.
"""

from __future__ import annotations

import base64
import gzip
import re
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.effects.github.fake import GIT_ENV, FakeGitHub

_PATH = re.compile(r"/([^/]+)/([^/]+?)(?:\.git)?/(info/refs|git-upload-pack|git-receive-pack)\Z")


@dataclass
class Served:
    """One request git made: the service, the token's end, and what was answered."""

    service: str
    repo: str
    token: str
    status: int


@dataclass
class FakeGitHttp:
    """start() it beside a started FakeGitHub; `.url` is the host git talks to."""

    fake: FakeGitHub
    served: list[Served] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> FakeGitHttp:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                owner._serve(self)

            do_POST = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def pushes(self) -> list[Served]:
        return [s for s in self.served if s.service == "git-receive-pack" and s.status == 200]

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        split = urlsplit(h.path)
        found = _PATH.match(split.path)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        if found is None:
            return _answer(h, 404, "text/plain", b"not found")
        full_name = f"{found.group(1)}/{found.group(2)}".lower()
        service = found.group(3)
        if service == "info/refs":
            service = dict(p.split("=", 1) for p in split.query.split("&") if "=" in p).get(
                "service", ""
            )
        token = _token(h.headers.get("Authorization", ""))
        status = self._allowed(full_name, service, token)
        self.served.append(Served(service, full_name, token[-6:], status))
        if status != 200:
            message = b"Write access to repository not granted." if status == 403 else b"denied"
            return _answer(h, status, "text/plain", message)
        repo = self.fake.repos[full_name]
        verb = service.removeprefix("git-")
        if found.group(3) == "info/refs":
            out = subprocess.run(
                ["git", verb, "--stateless-rpc", "--advertise-refs", str(repo.git_dir)],
                capture_output=True,
                env=GIT_ENV,
                check=True,
            ).stdout
            line = f"# service={service}\n"
            head = f"{len(line) + 4:04x}{line}0000".encode()
            return _answer(h, 200, f"application/x-{service}-advertisement", head + out)
        if h.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        out = subprocess.run(
            ["git", verb, "--stateless-rpc", str(repo.git_dir)],
            input=body,
            capture_output=True,
            env=GIT_ENV,
            check=True,
        ).stdout
        return _answer(h, 200, f"application/x-{service}-result", out)

    def _allowed(self, full_name: str, service: str, token: str) -> int:
        """200, or what GitHub answers: 401 for no valid token, 403 for too narrow a one."""
        if service not in ("git-upload-pack", "git-receive-pack"):
            return 403
        with self.fake._lock:
            if full_name not in self.fake.repos:
                return 404
            if token == self.fake.token:
                return 200
            minted = self.fake.installation_tokens.get(token)
            if minted is None:
                return 401
            verb = "GET" if service == "git-upload-pack" else "POST"
            allowed = minted.allows(full_name, "/repos/{owner}/{repo}/git/refs", verb)
            return 200 if allowed else 403


def _token(header: str) -> str:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        return base64.b64decode(value).decode().partition(":")[2]
    except ValueError:
        return ""


def _answer(h: BaseHTTPRequestHandler, status: int, kind: str, data: bytes) -> None:
    h.send_response(status)
    h.send_header("Content-Type", kind)
    h.send_header("Content-Length", str(len(data)))
    h.send_header("Cache-Control", "no-cache")
    h.end_headers()
    h.wfile.write(data)
