"""The Docker Engine API over its Unix socket: the few calls a sandbox needs.

Why not docker-py here: a sandbox's life is six HTTP calls (create, inspect, start,
logs, wait, delete) and docker-py costs a `broker run` more to import (requests,
urllib3, its models: ~40 ms, a fifth of `docker run`'s whole start) than the calls
take. The calls themselves are the engine's documented API
(https://docs.docker.com/reference/api/engine/), JSON over HTTP/1.1. Image builds stay
on docker-py (broker.hosting.images), where they are rare and slow anyway.

Why not http.client either: importing it imports the email package (to parse
headers) and ssl, 12–16 ms of every cold `broker run` before its first engine call.
What this client needs of HTTP/1.1 is small and fixed, since it talks to one known
server over a local socket: a request with `Connection: close`, then a status line,
headers, and a body by Content-Length, by chunks, or to the close (_Response; a
response it cannot read is an EngineError, never a guess).

One connection per call: calls are few, a Unix connect costs microseconds, and no
state is shared between the threads that stream logs and the one that waits.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from broker.errors import SandboxError

__all__ = ["EngineClient", "EngineContainer", "EngineError", "engine_socket"]

DEFAULT_SOCKET = "/var/run/docker.sock"
OWN = -1.0
"""A call's timeout when not given: the client's own (None is no timeout at all: a wait
for a container's end, a followed log stream, which take as long as the agent does)."""
_FRAME = struct.Struct(">BxxxL")  # the log stream's frame: stream (1 out, 2 err), size


class EngineError(SandboxError):
    """The engine answered with an error, or did not answer; `status` is 0 for the latter.
    A SandboxError, so that one the runtime does not word for itself is still the CLI's
    one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def engine_socket() -> str:
    """The engine's socket, from DOCKER_HOST (unix:// only) or the default path."""
    where = os.environ.get("DOCKER_HOST", f"unix://{DEFAULT_SOCKET}")
    if not where.startswith("unix://"):
        raise EngineError(0, f"DOCKER_HOST={where}: only a unix:// socket is supported")
    return where.removeprefix("unix://")


MAX_HEAD = 64 * 1024  # a status line and headers longer than this are not the engine's


class _Response:
    """One HTTP/1.1 response read off a socket: its status and reason, then its body
    (read(n) for a stream, read() for the whole), by Content-Length, chunks, or to the
    close. A malformed response raises EngineError."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._file = sock.makefile("rb")
        self.status = 0
        self.reason = ""
        self._left: int | None = None  # bytes left of the body or of the current chunk
        self._chunked = False
        self._done = False
        self._buffer = b""

    def begin(self) -> None:
        """Read the status line and the headers."""
        status = self._line()
        while status.startswith(b"HTTP/1.1 1"):  # 100 Continue and the like: skip
            while self._line():
                pass
            status = self._line()
        parts = status.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise EngineError(0, f"the engine sent {status[:80]!r} as its status line")
        self.status = int(parts[1])
        self.reason = parts[2].decode("latin-1").strip() if len(parts) > 2 else ""
        headers: dict[str, str] = {}
        size = len(status)
        while line := self._line():
            size += len(line)
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep or size > MAX_HEAD:
                raise EngineError(
                    0, f"the engine sent a header it cannot have meant: {line[:80]!r}"
                )
            headers[name.strip().lower()] = value.strip()
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._done = self.status in (204, 304)
        if not self._chunked and not self._done and "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise EngineError(0, f"the engine sent Content-Length: {length[:40]!r}")
            self._left = int(length)

    def _line(self) -> bytes:
        line = self._file.readline(MAX_HEAD)
        if not line.endswith(b"\n"):
            raise EngineError(0, "the engine's answer ended before its headers did")
        return line.rstrip(b"\r\n")

    def _piece(self) -> bytes:
        """The body's next bytes as they come (b"" at its end)."""
        if self._done:
            return b""
        if self._chunked:
            if not self._left:
                if self._left == 0 and self._file.readline(3) != b"\r\n":
                    raise EngineError(0, "the engine sent a chunk longer than its size")
                size = self._line().split(b";", 1)[0].strip()
                try:
                    self._left = int(size, 16)
                except ValueError:
                    raise EngineError(0, f"the engine sent {size[:20]!r} as a chunk size") from None
                if self._left == 0:
                    while self._line():  # trailers, then the end
                        pass
                    self._done = True
                    return b""
            data = self._file.read1(self._left)
            if not data:
                raise EngineError(0, "the engine's answer ended inside a chunk")
            self._left -= len(data)
            return data
        if self._left is None:  # to the close
            data = self._file.read1(65536)
            self._done = not data
            return data
        if self._left == 0:
            self._done = True
            return b""
        data = self._file.read1(min(self._left, 65536))
        if not data:
            raise EngineError(0, "the engine's answer ended before its Content-Length")
        self._left -= len(data)
        return data

    def read(self, size: int = -1) -> bytes:
        """`size` bytes of the body (fewer only at its end); all of the rest if -1."""
        while size < 0 or len(self._buffer) < size:
            piece = self._piece()
            if not piece:
                break
            self._buffer += piece
        if size < 0:
            size = len(self._buffer)
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def close(self) -> None:
        self._file.close()
        self._sock.close()


class EngineClient:
    """Calls to one engine; every method raises EngineError, never an OSError."""

    def __init__(self, path: str | None = None, timeout: float = 60) -> None:
        self.path = path if path is not None else engine_socket()
        self.timeout = timeout

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        query: Mapping[str, Any] | None = None,
        timeout: float | None = OWN,
    ) -> Any:
        """One call; its JSON answer (None when it has no body)."""
        response = self._open(method, path, body, query, timeout)
        try:
            data = response.read()
        except OSError as exc:
            raise EngineError(0, f"the engine at {self.path} stopped answering: {exc}") from exc
        finally:
            response.close()
        try:
            return json.loads(data) if data else None
        except ValueError as exc:
            raise EngineError(0, f"the engine's answer to {method} {path} is not JSON") from exc

    def frames(
        self, path: str, query: Mapping[str, Any], timeout: float | None = OWN
    ) -> Iterator[tuple[int, bytes]]:
        """A multiplexed stream (logs, non-TTY) as (stream, payload) frames, to its end."""
        response = self._open("GET", path, None, query, timeout)
        try:
            while header := response.read(_FRAME.size):
                if len(header) < _FRAME.size:
                    return
                stream, size = _FRAME.unpack(header)
                yield stream, response.read(size)
        except OSError as exc:
            raise EngineError(0, f"the engine's stream ended: {exc}") from exc
        finally:
            response.close()

    def _open(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None,
        query: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> _Response:
        target = path + (f"?{urlencode(query)}" if query else "")
        payload = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {target} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n"
        if body is not None or method in ("POST", "PUT"):
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        response = _Response(sock)
        try:
            sock.settimeout(self.timeout if timeout == OWN else timeout)
            sock.connect(self.path)
            sock.sendall(head.encode() + b"\r\n" + payload)
            response.begin()
        except OSError as exc:
            response.close()
            raise EngineError(0, f"the engine at {self.path} does not answer ({exc})") from exc
        except EngineError:
            response.close()
            raise
        if response.status >= 400:
            try:
                text = response.read().decode("utf-8", "replace")
            except (OSError, EngineError):
                text = ""
            finally:
                response.close()
            raise EngineError(response.status, _message(text) or response.reason)
        return response


def _message(text: str) -> str:
    try:
        return str(json.loads(text).get("message", text)).strip()
    except (ValueError, AttributeError):
        return text.strip()


class EngineContainer:
    """One container as the runner uses it (broker.hosting.runtimes.base.Handle)."""

    def __init__(self, client: EngineClient, attrs: Mapping[str, Any]) -> None:
        self.client = client
        self.attrs = attrs
        self.id: str = attrs["Id"]

    @property
    def short_id(self) -> str:
        return self.id[:12]

    @property
    def name(self) -> str | None:
        names = self.attrs.get("Names")  # a listing says Names, an inspect Name
        found = names[0] if names else self.attrs.get("Name")
        return str(found).lstrip("/") if found else None

    @property
    def labels(self) -> dict[str, str]:
        labels = self.attrs.get("Labels") or (self.attrs.get("Config") or {}).get("Labels")
        return dict(labels or {})

    @property
    def status(self) -> str:
        state = self.attrs.get("State")
        return str(state.get("Status", "?") if isinstance(state, dict) else state or "?")

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Until it exits, however long that is (or `timeout` seconds: EngineError):
        {"StatusCode": its exit code}."""
        path = f"/containers/{quote(self.id)}/wait"
        found: dict[str, Any] = self.client.call("POST", path, timeout=timeout)
        return found

    def logs(
        self,
        *,
        stdout: bool = True,
        stderr: bool = True,
        stream: bool = False,
        follow: bool = False,
    ) -> Any:
        """Its output as bytes, or (stream=True) an iterator of chunks as they come."""
        query = {"stdout": int(stdout), "stderr": int(stderr), "follow": int(follow)}
        frames = self.client.frames(f"/containers/{quote(self.id)}/logs", query, timeout=None)
        chunks = (payload for _, payload in frames)
        return chunks if stream else b"".join(chunks)
