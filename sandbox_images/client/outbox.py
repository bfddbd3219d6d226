#!/usr/bin/env python3
"""The in-sandbox client of the outbox protocol (version 1).

An agent asks the host for an effect by writing a request into ``$OUTBOX_DIR``
(default ``/outbox``) and reads the broker's answer from ``$RESULTS_DIR`` (default
``/results``)::

    import outbox
    result = outbox.request("files.write", {"path": "notes.txt", "content": "hi"},
                            reason="save the summary for the user")
    if result["status"] != "applied":
        print(result["reason"])

or from a shell::

    outbox request files.write --param path=notes.txt --param content=hi
    outbox effects            # what the broker offers this sandbox, and what needs approval
    outbox mcp                # the same effects as MCP tools, over stdio (outbox_mcp.py)

Standard library only, Python 3.8 or newer, so it runs in any image; ``outbox mcp``
also needs ``outbox_mcp.py`` beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "CATALOGUE",
    "TERMINAL",
    "OutboxError",
    "OutboxTimeout",
    "catalogue",
    "main",
    "request",
    "result",
    "wait_for",
]

VERSION = 1
TERMINAL = frozenset({"applied", "denied", "expired", "invalid", "failed", "unknown"})

CATALOGUE = ".effects.json"
"""The effect catalogue the broker publishes into ``$RESULTS_DIR`` (read-only here)."""
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_ATTACHMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_POLL_SECONDS = 0.02
# Even with inotify, look again now and then: a missed event must not hang an agent.
_RECHECK_SECONDS = 1.0


class OutboxError(Exception):
    """A request could not be written or its result could not be read."""


class OutboxTimeout(OutboxError):
    """No terminal result arrived within the timeout; the request may still be decided."""

    def __init__(self, request_id: str, timeout: float, last: dict[str, Any] | None) -> None:
        status = last.get("status") if last else None
        state = f"its last status is {status!r}" if status else "no result has been written yet"
        super().__init__(
            f"no terminal result for request {request_id} within {timeout:g}s ({state}); "
            f"check later with: outbox result {request_id}"
        )
        self.request_id = request_id
        self.timeout = timeout
        self.last = last


def _outbox_dir() -> str:
    return os.environ.get("OUTBOX_DIR", "/outbox")


def _results_dir() -> str:
    return os.environ.get("RESULTS_DIR", "/results")


def _write_atomically(directory: str, name: str, data: bytes) -> None:
    """Write ``directory/name`` so that the final name only ever shows complete bytes."""
    final = os.path.join(directory, name)
    temp = os.path.join(directory, f".{name}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(temp, final)
    except OSError as exc:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise OutboxError(f"cannot write {final}: {exc.strerror or exc}") from exc


def request(
    effect: str,
    params: Mapping[str, Any] | None = None,
    *,
    reason: str | None = None,
    idempotency_key: str | None = None,
    attachments: Mapping[str, bytes] | None = None,
    wait: bool = True,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Ask the broker for ``effect`` with ``params`` and return its answer.

    With ``wait`` (the default) this blocks until the result is terminal (``applied``,
    ``denied``, ``expired``, ``invalid``, ``failed`` or ``unknown``) and returns it;
    a ``pending`` result keeps it waiting. ``timeout`` is in seconds (None: forever);
    past it, :class:`OutboxTimeout` is raised and the request stays in the broker's
    hands. With ``wait=False`` it returns the request as written; its ``id`` is
    what :func:`result` and :func:`wait_for` take.

    ``attachments`` maps names (``[A-Za-z0-9][A-Za-z0-9_-]{0,63}``) to bytes; each is
    written before the request, and params refer to them by name.
    """
    if not isinstance(effect, str) or not effect:
        raise ValueError("effect must be a non-empty string such as 'files.write'")
    attachments = dict(attachments or {})
    for name, data in attachments.items():
        if not isinstance(name, str) or not _ATTACHMENT.match(name):
            raise ValueError(
                f"attachment name {name!r} must match [A-Za-z0-9][A-Za-z0-9_-]{{0,63}}"
            )
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"attachment {name!r} must be bytes, not {type(data).__name__}")

    request_id = uuid.uuid4().hex
    body: dict[str, Any] = {
        "version": VERSION,
        "id": request_id,
        "effect": effect,
        "params": dict(params or {}),
    }
    if reason is not None:
        body["reason"] = reason
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    if attachments:
        body["attachments"] = sorted(attachments)
    try:
        payload = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"params must be plain JSON (no NaN, no sets or objects): {exc}") from exc

    outbox = _outbox_dir()
    for name, data in attachments.items():
        _write_atomically(outbox, f"{request_id}.{name}.bin", bytes(data))
    _write_atomically(outbox, f"{request_id}.json", payload)

    if not wait:
        return body
    return wait_for(request_id, timeout=timeout)


def result(request_id: str) -> dict[str, Any] | None:
    """Return the current result for ``request_id`` (pending or terminal), or None."""
    if not _ID.match(request_id):
        raise ValueError(f"request id {request_id!r} must match [A-Za-z0-9_-]{{1,64}}")
    path = os.path.join(_results_dir(), f"{request_id}.json")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise OutboxError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise OutboxError(f"{path} does not hold a JSON object")
    return data


def wait_for(request_id: str, timeout: float | None = None) -> dict[str, Any]:
    """Block until ``request_id`` has a terminal result and return it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: dict[str, Any] | None = None
    # Watch before the first look, so a result written in between is not missed.
    watcher = _Watcher(_results_dir())
    try:
        while True:
            current = result(request_id)
            if current is not None:
                last = current
                if current.get("status") in TERMINAL:
                    return current
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise OutboxTimeout(request_id, timeout or 0.0, last)
            watcher.wait(remaining)
    finally:
        watcher.close()


def catalogue(timeout: float = 0.0) -> dict[str, Any]:
    """The effects the broker offers this sandbox: ``{"version": 1, "effects": [...]}``.

    Each effect has ``name``, ``description``, ``params_schema``, ``reversible``,
    ``idempotent``, ``undo`` and ``approval`` (``summary`` and the policy ``rules``
    that may decide it). Waits up to ``timeout`` seconds for the broker to publish it.
    """
    path = os.path.join(_results_dir(), CATALOGUE)
    deadline = time.monotonic() + timeout
    watcher = _Watcher(_results_dir()) if timeout > 0 else None
    try:
        while True:
            try:
                with open(path, "rb") as f:
                    data = json.loads(f.read().decode("utf-8"))
                break
            except FileNotFoundError:
                remaining = deadline - time.monotonic()
                if watcher is None or remaining <= 0:
                    raise OutboxError(
                        f"no effect catalogue at {path}: no broker serves this sandbox yet "
                        "(or it is older than the catalogue)"
                    ) from None
                watcher.wait(remaining)
            except (OSError, ValueError) as exc:
                raise OutboxError(f"cannot read {path}: {exc}") from exc
    finally:
        if watcher is not None:
            watcher.close()
    if not isinstance(data, dict) or not isinstance(data.get("effects"), list):
        raise OutboxError(f"{path} is not an effect catalogue")
    return data


class _Watcher:
    """Sleeps until something lands in a directory: inotify where Linux has it, else polls."""

    _IN_CLOSE_WRITE = 0x00000008
    _IN_MOVED_TO = 0x00000080
    _IN_NONBLOCK = 0o4000
    _IN_CLOEXEC = 0o2000000

    def __init__(self, directory: str) -> None:
        self._fd = -1
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            init: Callable[[int], int] = libc.inotify_init1
            add_watch = libc.inotify_add_watch
        except (ImportError, OSError, AttributeError):
            return
        fd = init(self._IN_NONBLOCK | self._IN_CLOEXEC)
        if fd < 0:
            return
        mask = self._IN_CLOSE_WRITE | self._IN_MOVED_TO
        if add_watch(fd, os.fsencode(directory), mask) < 0:
            os.close(fd)
            return
        self._fd = fd

    def wait(self, remaining: float | None) -> None:
        if self._fd < 0:
            time.sleep(_POLL_SECONDS if remaining is None else min(_POLL_SECONDS, remaining))
            return
        limit = _RECHECK_SECONDS if remaining is None else min(_RECHECK_SECONDS, remaining)
        ready, _, _ = select.select([self._fd], [], [], limit)
        if ready:
            try:
                while os.read(self._fd, 65536):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# --- command line -------------------------------------------------------------


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, as promised in --help
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outbox",
        description="Ask the host for an effect through the outbox, and read its results.",
        epilog="Exit status: 0 if the result is 'applied', 1 for any other result, "
        "2 for a usage error, a timeout or an outbox that cannot be used.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    req = commands.add_parser("request", help="write a request and print its result")
    req.add_argument("effect", metavar="EFFECT", help="e.g. files.write")
    req.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a string parameter (repeatable)",
    )
    req.add_argument(
        "--param-json",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a parameter given as JSON: a number, true, a list, an object",
    )
    req.add_argument(
        "--param-file",
        action="append",
        default=[],
        metavar="KEY=PATH",
        help="a string parameter read from a UTF-8 file ('-' for stdin)",
    )
    req.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="send a file's bytes as an attachment named NAME",
    )
    req.add_argument("--reason", help="why you want this; shown to the people who decide")
    req.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="repeat a request safely: the same key gets the first result",
    )
    req.add_argument(
        "--wait",
        dest="wait",
        action="store_true",
        default=True,
        help="wait for a terminal result (the default)",
    )
    req.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="print the request as written and exit 0",
    )
    req.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="give up waiting after this long (default: wait forever)",
    )

    res = commands.add_parser("result", help="print the current result of a request")
    res.add_argument("id", metavar="ID")
    res.add_argument("--wait", action="store_true", help="wait until it is terminal")
    res.add_argument("--timeout", type=_seconds, metavar="SECONDS")

    eff = commands.add_parser("effects", help="list the effects the broker offers here")
    eff.add_argument("name", nargs="?", metavar="EFFECT", help="show one effect in full")
    eff.add_argument("--json", action="store_true", help="print the catalogue as JSON")

    mcp = commands.add_parser("mcp", help="serve the effects as MCP tools over stdio")
    mcp.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="give up waiting for a tool call's result after this long (default: never)",
    )
    return parser


def _effects(args: argparse.Namespace) -> int:
    effects = catalogue(timeout=5.0)["effects"]
    if args.name is not None:
        found = [e for e in effects if e.get("name") == args.name]
        if not found:
            raise _UsageError(f"no effect named {args.name!r}; `outbox effects` lists them")
        effects = found
    if args.json or args.name is not None:
        print(json.dumps(effects if args.name is None else effects[0], indent=2))
        return 0
    for e in effects:
        flags = "reversible" if e.get("reversible") else "irreversible"
        if e.get("idempotent"):
            flags += ", idempotent"
        print(f"{e.get('name')}  ({flags})")
        print(f"    {e.get('description', '')}")
        print(f"    approval: {e.get('approval', {}).get('summary', '?')}")
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"timeout must be >= 0, not {text}")
    return value


def _split(option: str, item: str) -> list[str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise _UsageError(f"{option} expects KEY=VALUE, got {item!r}")
    return [key, value]


def _read_file(option: str, path: str) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise _UsageError(f"{option}: cannot read {path}: {exc.strerror or exc}") from exc


def _params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}

    def put(option: str, key: str, value: Any) -> None:
        if key in params:
            raise _UsageError(f"parameter {key!r} is given twice")
        params[key] = value

    for item in args.param:
        key, value = _split("--param", item)
        put("--param", key, value)
    for item in args.param_json:
        key, text = _split("--param-json", item)
        try:
            put("--param-json", key, json.loads(text))
        except ValueError as exc:
            raise _UsageError(f"--param-json {key}: not valid JSON: {exc}") from None
    for item in args.param_file:
        key, path = _split("--param-file", item)
        try:
            put("--param-file", key, _read_file("--param-file", path).decode("utf-8"))
        except UnicodeDecodeError:
            raise _UsageError(
                f"--param-file {key}: {path} is not UTF-8 text; use --attach"
            ) from None
    return params


def _run(args: argparse.Namespace) -> int:
    if args.command == "effects":
        return _effects(args)
    if args.command == "mcp":
        import outbox_mcp

        return outbox_mcp.serve(timeout=args.timeout)
    if args.command == "result":
        if args.wait:
            answer = wait_for(args.id, timeout=args.timeout)
        else:
            found = result(args.id)
            if found is None:
                raise _UsageError(f"no result for request {args.id} yet")
            answer = found
    else:
        attachments = {}
        for item in args.attach:
            name, path = _split("--attach", item)
            attachments[name] = _read_file("--attach", path)
        answer = request(
            args.effect,
            _params(args),
            reason=args.reason,
            idempotency_key=args.idempotency_key,
            attachments=attachments,
            wait=args.wait,
            timeout=args.timeout,
        )
        if not args.wait:
            print(json.dumps(answer, indent=2, ensure_ascii=False))
            return 0
    print(json.dumps(answer, indent=2, ensure_ascii=False))
    return 0 if answer.get("status") == "applied" else 1


def main(argv: list[str] | None = None) -> int:
    """Run the ``outbox`` command; returns its exit status."""
    try:
        return _run(_parser().parse_args(argv))
    except (_UsageError, ValueError, OutboxError) as exc:
        print(f"outbox: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
