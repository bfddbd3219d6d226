"""``outbox mcp``: the broker's effects as MCP tools, over stdio, inside the sandbox.

An MCP client (an agent's framework) starts ``outbox mcp`` and talks JSON-RPC 2.0 to
it, one message per line on stdin and stdout (the MCP stdio transport). Every effect
in the broker's catalogue (``/results/.effects.json``) is a tool: its ``inputSchema``
is the effect's params schema, its description says whether it can be undone and what
approval it may need. A ``tools/call`` becomes one outbox request; the server waits for
the terminal result (sending ``notifications/progress`` while it is pending, when the
call asked for progress) and returns it: ``isError`` for anything but ``applied``,
with the broker's reason (a ``staged`` result, from a host in staged mode, is not
applied either: its reason says so and what the policy would have done).

Standard library only, like outbox.py: the sandbox has no network to install the SDK
from, and the few methods a tools-only server needs (``initialize``, ``ping``,
``tools/list``, ``tools/call``, ``logging/setLevel``, cancellation) are small enough to
write out. It agrees only to revisions whose rules it keeps (PROTOCOL_VERSIONS):
2025-03-26, which requires JSON-RPC batches, is not among them. A client that probes
``server/discover`` (the stateless 2026 revision) gets "method not found" and falls
back to ``initialize``, as the protocol asks of it. No input ends it: a line over
MAX_LINE bytes, nested deeper than MAX_DEPTH or not JSON is answered with a JSON-RPC
error and the session goes on.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from typing import Any, BinaryIO

import outbox
from outbox_mcp_tools import (
    call_result,
    effect_name,
    error_result,
    pending_text,
    still_pending,
    tool,
)

__all__ = ["PROTOCOL_VERSIONS", "Server", "call_result", "serve", "tool"]

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2024-11-05")
"""The revisions this server speaks, newest first. 2025-03-26 is left out: it requires
receiving JSON-RPC batches, which this server (like 2025-06-18 on) refuses."""
PLAIN_VERSIONS = frozenset({"2024-11-05"})
"""Revisions without tool titles, annotations, output schemas, structured content or a
progress message: those fields are left out of what such a session is sent."""
MAX_LINE = 16 * 1024 * 1024  # bytes of one JSON-RPC message; a longer line is refused
MAX_DEPTH = 64  # nesting of one message; deeper is refused before it is parsed
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')  # a JSON string, escapes included
_BRACKET = re.compile(rb"[\[\]{}]")
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
SERVER_INFO = {"name": "outbox", "title": "Sandbox outbox", "version": str(outbox.VERSION)}
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
CANCELLED = "the MCP client cancelled the call"
HEARTBEAT_S = 15.0  # progress is re-sent this often while a request waits for a person
CATALOGUE_WAIT_S = 10.0
INSTRUCTIONS = (
    "Each tool is an effect the host's broker applies for you; this sandbox has no "
    "network and no credentials. Some effects wait for a person: a call then returns "
    "only once it is decided. A denied, invalid, failed or expired call says why in its "
    "result: read the reason and try something narrower."
)


class _Reply(Exception):
    """Stop handling a message and answer with this JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Server:
    """One MCP session over a pair of binary streams (stdin and stdout by default)."""

    def __init__(
        self,
        reader: BinaryIO,
        writer: BinaryIO,
        *,
        timeout: float | None = None,
        portable: bool = False,
    ) -> None:
        self._portable = portable  # tool names of [A-Za-z0-9_-]{1,64} (portable_name)
        self._reader = reader
        self._writer = writer
        self._timeout = timeout
        self._lock = threading.Lock()
        self._calls: dict[Any, threading.Event] = {}  # request id -> cancelled
        self._cancelled: set[Any] = set()  # ids the client cancelled (not ended by EOF)
        self._closed = threading.Event()
        self._version = PROTOCOL_VERSIONS[0]
        self._log_level: int | None = None  # None: the client asked for no log messages

    def run(self) -> int:
        """Answer messages until stdin closes; returns the exit status (0)."""
        try:
            while True:
                line = self._reader.readline(MAX_LINE + 1)
                if not line:
                    break
                if len(line) > MAX_LINE and not line.endswith(b"\n"):
                    self._skip_rest()
                    self._error(None, INVALID_REQUEST, f"Invalid Request: over {MAX_LINE} bytes")
                elif line.strip():
                    self._handle(line)
        finally:
            self._closed.set()
            for cancelled in list(self._calls.values()):
                cancelled.set()
        return 0

    def _skip_rest(self) -> None:
        while True:
            chunk = self._reader.readline(MAX_LINE)
            if not chunk or chunk.endswith(b"\n"):
                return

    # -- one message -------------------------------------------------------------

    def _handle(self, line: bytes) -> None:
        if _depth(line) > MAX_DEPTH:
            self._error(None, INVALID_REQUEST, f"Invalid Request: nested over {MAX_DEPTH} deep")
            return
        try:
            message = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            self._error(None, PARSE_ERROR, f"Parse error: not a JSON message ({exc})")
            return
        if isinstance(message, list):
            self._error(None, INVALID_REQUEST, "Invalid Request: batches are not accepted")
            return
        if not isinstance(message, dict):
            self._error(None, INVALID_REQUEST, "Invalid Request: send one JSON object per line")
            return
        rid = message.get("id")
        has_id = "id" in message
        if has_id and (isinstance(rid, bool) or not isinstance(rid, (str, int))):
            self._error(None, INVALID_REQUEST, "Invalid Request: id must be a string or a number")
            return
        method = message.get("method")
        if message.get("jsonrpc") != "2.0" or (method is None and not has_id):
            self._error(rid, INVALID_REQUEST, 'Invalid Request: expected "jsonrpc": "2.0"')
            return
        if method is None:
            if "result" in message or "error" in message:
                return  # a response: this server sends no requests, so nothing to match
            self._error(rid, INVALID_REQUEST, "Invalid Request: a request needs a method")
            return
        if not isinstance(method, str):
            self._error(rid, INVALID_REQUEST, "Invalid Request: method must be a string")
            return
        params = message.get("params", {})
        if not has_id:
            self._notification(method, params)
            return
        try:
            if not isinstance(params, dict):
                raise _Reply(INVALID_PARAMS, "Invalid params: params must be an object")
            if method == "tools/call":
                self._start_call(rid, params)
                return
            self._send({"jsonrpc": "2.0", "id": rid, "result": self._answer(method, params)})
        except _Reply as reply:
            self._error(rid, reply.code, reply.message)
        except Exception as exc:  # a bug here must not end the session
            self._error(rid, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")

    def _answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            asked = params.get("protocolVersion")
            self._version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
            return {
                "protocolVersion": self._version,
                "capabilities": {"tools": {"listChanged": False}, "logging": {}},
                "serverInfo": SERVER_INFO,
                "instructions": INSTRUCTIONS,
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            plain = self._version in PLAIN_VERSIONS
            return {"tools": [tool(e, plain=plain, portable=self._portable) for e in _effects()]}
        if method == "logging/setLevel":
            level = params.get("level")
            if level not in LOG_LEVELS:
                raise _Reply(INVALID_PARAMS, f"Invalid params: level must be one of {LOG_LEVELS}")
            self._log_level = LOG_LEVELS.index(level)
            return {}
        raise _Reply(METHOD_NOT_FOUND, f"Method not found: {method}")

    def _notification(self, method: str, params: Any) -> None:
        if method == "notifications/cancelled" and isinstance(params, dict):
            cancelled = self._calls.get(params.get("requestId"))
            if cancelled is not None:
                self._cancelled.add(params.get("requestId"))
                cancelled.set()
        # notifications/initialized and anything else: nothing to do, nothing to answer

    # -- tools/call ----------------------------------------------------------------

    def _start_call(self, rid: Any, params: dict[str, Any]) -> None:
        name = params.get("name")
        arguments = params.get("arguments", {})
        if not isinstance(name, str) or not name:
            raise _Reply(INVALID_PARAMS, "Invalid params: name must be the tool's name")
        if not isinstance(arguments, dict):
            raise _Reply(INVALID_PARAMS, "Invalid params: arguments must be an object")
        effect = effect_name(name, [str(e.get("name")) for e in _effects()])
        if effect is None:
            raise _Reply(INVALID_PARAMS, f"Unknown tool: {name}; tools/list names them")
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if rid in self._calls:
            raise _Reply(INVALID_REQUEST, f"Invalid Request: id {rid!r} is already in use")
        cancelled = threading.Event()
        self._calls[rid] = cancelled
        thread = threading.Thread(
            target=self._call, args=(rid, effect, arguments, token, cancelled), daemon=True
        )
        thread.start()

    def _call(
        self,
        rid: Any,
        name: str,
        arguments: dict[str, Any],
        token: Any,
        cancelled: threading.Event,
    ) -> None:
        try:
            version = 2 if outbox.speaks(2) else 1  # 2: pending results count approvals
            written = outbox.request(name, arguments, wait=False, version=version)
            request_id = str(written["id"])
            self._log("info", f"{name}: filed as request {request_id}")
            answer = self._wait(request_id, token, cancelled)
            if answer is None:  # cancelled, and a cancelled call gets no reply
                self._log("notice", _withdraw(request_id, asked=rid in self._cancelled))
                return
            self._log("info", f"{name}: request {request_id} {answer.get('status')}")
            plain = self._version in PLAIN_VERSIONS
            self._send({"jsonrpc": "2.0", "id": rid, "result": call_result(answer, plain=plain)})
        except (outbox.OutboxError, ValueError) as exc:
            self._send({"jsonrpc": "2.0", "id": rid, "result": error_result(str(exc))})
        except Exception as exc:
            self._error(rid, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")
        finally:
            self._calls.pop(rid, None)
            self._cancelled.discard(rid)

    def _wait(
        self, request_id: str, token: Any, cancelled: threading.Event
    ) -> dict[str, Any] | None:
        """The terminal result, or None if the call was cancelled (or stdin closed)."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        watcher = outbox._Watcher(outbox._results_dir())
        last_said: str | None = None
        said_at = 0.0
        progress = 0
        try:
            while not cancelled.is_set():
                current = outbox.result(request_id)
                status = current.get("status") if current else None
                if current is not None and status in outbox.TERMINAL:
                    return current
                if current is not None and status not in (None, "pending"):
                    return current  # a status this client does not know: terminal, not applied
                if current is not None and token is not None:
                    text = pending_text(current)
                    if text != last_said or time.monotonic() - said_at >= HEARTBEAT_S:
                        progress += 1
                        self._progress(token, progress, text)
                        last_said, said_at = text, time.monotonic()
                if deadline is not None and time.monotonic() >= deadline:
                    return still_pending(request_id, self._timeout or 0.0, current)
                watcher.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            return None
        finally:
            watcher.close()

    def _progress(self, token: Any, progress: int, message: str) -> None:
        params: dict[str, Any] = {"progressToken": token, "progress": progress}
        if self._version not in PLAIN_VERSIONS:
            params["message"] = message
        self._send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

    def _log(self, level: str, text: str) -> None:
        """A notifications/message, when the client asked for this level or a lower one."""
        if self._log_level is None or LOG_LEVELS.index(level) < self._log_level:
            return
        params = {"level": level, "logger": "outbox", "data": text}
        self._send({"jsonrpc": "2.0", "method": "notifications/message", "params": params})

    # -- output --------------------------------------------------------------------

    def _error(self, rid: Any, code: int, message: str) -> None:
        self._send({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, ensure_ascii=True, allow_nan=False).encode() + b"\n"
        with self._lock:
            try:
                self._writer.write(data)
                self._writer.flush()
            except (BrokenPipeError, ValueError, OSError):
                self._closed.set()


def _effects() -> list[dict[str, Any]]:
    try:
        return list(outbox.catalogue(timeout=CATALOGUE_WAIT_S)["effects"])
    except outbox.OutboxError as exc:
        raise _Reply(INTERNAL_ERROR, str(exc)) from exc


def _withdraw(request_id: str, *, asked: bool) -> str:
    """Take a cancelled call's request back (outbox.withdraw); say what became of it. A
    call ended by the session's end (`asked` False) is only taken back if no broker has
    read it yet: its result can still be read later (outbox result)."""
    if not asked:
        try:
            os.unlink(os.path.join(outbox._outbox_dir(), f"{request_id}.json"))
            done = "unfiled"
        except OSError:
            done = "kept"
    else:
        try:
            done = outbox.withdraw(request_id, CANCELLED)
        except (outbox.OutboxError, ValueError) as exc:
            return f"cancelled: request {request_id} could not be withdrawn ({exc})"
    if done == "unfiled":
        return f"cancelled: request {request_id} withdrawn before the broker read it"
    if done == "asked":
        return (
            f"cancelled: asked the broker to withdraw request {request_id}; it is denied if "
            f"it still waits for a person (see: outbox result {request_id})"
        )
    why = "the session ended" if done == "kept" else "the broker predates withdrawals"
    return (
        f"cancelled: request {request_id} stays with the broker, which decides it ({why}; "
        f"see: outbox result {request_id})"
    )


def _depth(line: bytes) -> int:
    """How deeply the brackets of a JSON text nest (strings skipped), without recursion."""
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return 0  # too few brackets to nest too deep: the common case, at C speed
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub(b"", line)):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def serve(timeout: float | None = None, *, portable: bool = False) -> int:
    """Run the server on this process's stdin and stdout (``outbox mcp``;
    ``--portable-names``: `portable`)."""
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed by mistake must not corrupt the stream
    return Server(sys.stdin.buffer, stdout, timeout=timeout, portable=portable).run()
