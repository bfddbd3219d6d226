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
``tools/list``, ``tools/call``, cancellation) are small enough to write out. It speaks
the initialize-handshake revisions of the protocol, newest first; a client that probes
``server/discover`` (the stateless 2026 revision) gets "method not found" and falls
back to ``initialize``, as the protocol asks of it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, BinaryIO

import outbox

__all__ = ["PROTOCOL_VERSIONS", "Server", "serve"]

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""The revisions this server speaks, newest first (the mcp SDK's handshake revisions)."""
SERVER_INFO = {"name": "outbox", "title": "Sandbox outbox", "version": str(outbox.VERSION)}
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
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

    def __init__(self, reader: BinaryIO, writer: BinaryIO, *, timeout: float | None = None) -> None:
        self._reader = reader
        self._writer = writer
        self._timeout = timeout
        self._lock = threading.Lock()
        self._calls: dict[Any, threading.Event] = {}  # request id -> cancelled
        self._closed = threading.Event()

    def run(self) -> int:
        """Answer messages until stdin closes; returns the exit status (0)."""
        try:
            for line in self._reader:
                if line.strip():
                    self._handle(line)
        finally:
            self._closed.set()
            for cancelled in list(self._calls.values()):
                cancelled.set()
        return 0

    # -- one message -------------------------------------------------------------

    def _handle(self, line: bytes) -> None:
        try:
            message = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as exc:
            self._error(None, PARSE_ERROR, f"Parse error: not a JSON message ({exc})")
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
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
            return {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": SERVER_INFO,
                "instructions": INSTRUCTIONS,
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": [tool(e) for e in _effects()]}
        raise _Reply(METHOD_NOT_FOUND, f"Method not found: {method}")

    def _notification(self, method: str, params: Any) -> None:
        if method == "notifications/cancelled" and isinstance(params, dict):
            cancelled = self._calls.get(params.get("requestId"))
            if cancelled is not None:
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
        if name not in {e.get("name") for e in _effects()}:
            raise _Reply(INVALID_PARAMS, f"Unknown tool: {name}; tools/list names them")
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if rid in self._calls:
            raise _Reply(INVALID_REQUEST, f"Invalid Request: id {rid!r} is already in use")
        cancelled = threading.Event()
        self._calls[rid] = cancelled
        thread = threading.Thread(
            target=self._call, args=(rid, name, arguments, token, cancelled), daemon=True
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
            written = outbox.request(name, arguments, wait=False)
            answer = self._wait(str(written["id"]), token, cancelled)
            if answer is not None:  # None: cancelled, and a cancelled call gets no reply
                self._send({"jsonrpc": "2.0", "id": rid, "result": call_result(answer)})
        except (outbox.OutboxError, ValueError) as exc:
            self._send({"jsonrpc": "2.0", "id": rid, "result": _error_result(str(exc))})
        except Exception as exc:
            self._error(rid, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")
        finally:
            self._calls.pop(rid, None)

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
                    text = _pending_text(current)
                    if text != last_said or time.monotonic() - said_at >= HEARTBEAT_S:
                        progress += 1
                        self._progress(token, progress, text)
                        last_said, said_at = text, time.monotonic()
                if deadline is not None and time.monotonic() >= deadline:
                    return _still_pending(request_id, self._timeout or 0.0, current)
                watcher.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            return None
        finally:
            watcher.close()

    def _progress(self, token: Any, progress: int, message: str) -> None:
        self._send(
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": progress, "message": message},
            }
        )

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


def tool(effect: dict[str, Any]) -> dict[str, Any]:
    """One catalogue entry as an MCP tool."""
    reversible = bool(effect.get("reversible"))
    idempotent = bool(effect.get("idempotent"))
    approval = (effect.get("approval") or {}).get("summary") or "as the host's policy says"
    undo = effect.get("undo") or ""
    description = (
        f"{effect.get('description') or effect.get('name')}. "
        f"{'Reversible' if reversible else 'Irreversible'}: {undo}. "
        f"Approval: {approval}."
    )
    schema = effect.get("params_schema")
    return {
        "name": effect.get("name"),
        "title": effect.get("name"),
        "description": description,
        "inputSchema": schema if isinstance(schema, dict) else {"type": "object"},
        "annotations": {
            "readOnlyHint": False,
            "destructiveHint": not reversible,
            "idempotentHint": idempotent,
            "openWorldHint": True,
        },
    }


def call_result(result: dict[str, Any]) -> dict[str, Any]:
    """A terminal outbox result as an MCP tools/call result."""
    status = str(result.get("status"))
    lines = [f"{status}: {result.get('reason') or status}"]
    for issue in result.get("errors") or []:
        if isinstance(issue, dict):
            lines.append(f"- {issue.get('path')}: {issue.get('message')} ({issue.get('code')})")
    content = [{"type": "text", "text": "\n".join(lines)}]
    content.append({"type": "text", "text": json.dumps(result, indent=2, ensure_ascii=False)})
    return {"content": content, "structuredContent": result, "isError": status != "applied"}


def _error_result(reason: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": f"failed: {reason}"}], "isError": True}


def _still_pending(request_id: str, timeout: float, last: dict[str, Any] | None) -> dict[str, Any]:
    where = _pending_text(last) if last else "no result yet"
    return {
        "version": outbox.VERSION,
        "id": request_id,
        "status": "pending",
        "reason": (
            f"still pending after {timeout:g}s ({where}); "
            f"check later with: outbox result {request_id}"
        ),
    }


def _pending_text(result: dict[str, Any]) -> str:
    text = f"pending: {result.get('reason') or 'waiting for a decision'}"
    if result.get("expires_at"):
        text += f" (decided by {result['expires_at']} at the latest)"
    return text


def _effects() -> list[dict[str, Any]]:
    try:
        return list(outbox.catalogue(timeout=CATALOGUE_WAIT_S)["effects"])
    except outbox.OutboxError as exc:
        raise _Reply(INTERNAL_ERROR, str(exc)) from exc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def serve(timeout: float | None = None) -> int:
    """Run the server on this process's stdin and stdout (``outbox mcp``)."""
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed by mistake must not corrupt the stream
    return Server(sys.stdin.buffer, stdout, timeout=timeout).run()
