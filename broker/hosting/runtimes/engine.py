"""The Docker Engine API over its Unix socket: the few calls a sandbox needs.

Why not docker-py here: a sandbox's life is six HTTP calls (create, inspect, start,
logs, wait, delete) and docker-py costs a `broker run` more to import (requests,
urllib3, its models: ~40 ms, a fifth of `docker run`'s whole start) than the calls
take. The calls themselves are the engine's documented API
(https://docs.docker.com/reference/api/engine/), JSON over HTTP/1.1, which the
standard library's http.client speaks; only the socket is ours. Image builds stay on
docker-py (broker.hosting.images), where they are rare and slow anyway.

One connection per call: calls are few, a Unix connect costs microseconds, and no
state is shared between the threads that stream logs and the one that waits.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import struct
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["EngineClient", "EngineContainer", "EngineError", "engine_socket"]

DEFAULT_SOCKET = "/var/run/docker.sock"
_FRAME = struct.Struct(">BxxxL")  # the log stream's frame: stream (1 out, 2 err), size


class EngineError(Exception):
    """The engine answered with an error, or did not answer; `status` is 0 for the latter."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def engine_socket() -> str:
    """The engine's socket, from DOCKER_HOST (unix:// only) or the default path."""
    where = os.environ.get("DOCKER_HOST", f"unix://{DEFAULT_SOCKET}")
    if not where.startswith("unix://"):
        raise EngineError(0, f"DOCKER_HOST={where}: only a unix:// socket is supported")
    return where.removeprefix("unix://")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("docker", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


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
        timeout: float | None = None,
    ) -> Any:
        """One call; its JSON answer (None when it has no body)."""
        conn, response = self._open(method, path, body, query, timeout)
        try:
            data = response.read()
        except OSError as exc:
            raise EngineError(0, f"the engine at {self.path} stopped answering: {exc}") from exc
        finally:
            conn.close()
        return json.loads(data) if data else None

    def frames(
        self, path: str, query: Mapping[str, Any], timeout: float | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """A multiplexed stream (logs, non-TTY) as (stream, payload) frames, to its end."""
        conn, response = self._open("GET", path, None, query, timeout)
        try:
            while header := response.read(_FRAME.size):
                if len(header) < _FRAME.size:
                    return
                stream, size = _FRAME.unpack(header)
                yield stream, response.read(size)
        except OSError as exc:
            raise EngineError(0, f"the engine's stream ended: {exc}") from exc
        finally:
            conn.close()

    def _open(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None,
        query: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> tuple[_UnixConnection, http.client.HTTPResponse]:
        target = path + (f"?{urlencode(query)}" if query else "")
        conn = _UnixConnection(self.path, self.timeout if timeout is None else timeout)
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        try:
            conn.request(method, target, body=payload, headers=headers)
            response = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise EngineError(0, f"the engine at {self.path} does not answer ({exc})") from exc
        if response.status >= 400:
            try:
                text = response.read().decode("utf-8", "replace")
            finally:
                conn.close()
            raise EngineError(response.status, _message(text) or response.reason)
        return conn, response


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
        """Until it exits: {"StatusCode": its exit code}."""
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
