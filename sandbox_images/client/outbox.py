#!/usr/bin/env python3
"""The in-sandbox client of the outbox protocol (versions 1 and 2).

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

While a request waits for a person the client says so on stderr: once when it starts
waiting (until when, and what happens if nobody decides), then every minute
(``OUTBOX_PROGRESS_SECONDS``); ``progress=False`` or ``--quiet`` silences it.

Retrying: a request you may send again needs an id of its own choosing,
``request_id=`` (``--id``), or an ``idempotency_key`` (its id is then derived from the
key). Calling :func:`request` again with the same id and the same effect, params,
reason, key and attachments is a *retry*: nothing new is filed. If the broker has
answered, you get that answer (waiting while it is pending); if the request still
sits in the outbox, the call waits for it; if neither (the broker has taken it and not
answered yet) the same bytes are written again under the same id, which the broker
knows for the request it already has. The same id for a different request is an
error (``OutboxError``); a call with neither an id nor a key is always a new request.

Standard library only, Python 3.8 or newer, so it runs in any image. The command
line is ``outbox_cli.py`` beside this file, ``outbox mcp`` also ``outbox_mcp.py``.
"""

from __future__ import annotations

import hashlib
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
    "speaks",
    "wait_for",
    "withdraw",
]

VERSION = 1
"""The version requests are written in: version 2 changed nothing in a request, so a
broker that speaks only version 1 reads them too."""
WITHDRAW_VERSION = 2
"""Withdrawals (``<id>.withdraw``) came with version 2; a broker lists the versions it
speaks in its catalogue (``protocol_versions``)."""
TERMINAL = frozenset({"applied", "denied", "expired", "invalid", "failed", "unknown", "staged"})

CATALOGUE = ".effects.json"
"""The effect catalogue the broker publishes into ``$RESULTS_DIR`` (read-only here)."""
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_ATTACHMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_POLL_SECONDS = 0.02
# Even with inotify, look again now and then: a missed event must not hang an agent.
_RECHECK_SECONDS = 1.0
_PROGRESS_SECONDS = 60.0  # how often a wait says it still waits ($OUTBOX_PROGRESS_SECONDS)


class OutboxError(Exception):
    """A request could not be written or its result could not be read."""


class OutboxTimeout(OutboxError):
    """No terminal result arrived within the timeout; the request may still be decided."""

    def __init__(self, request_id: str, timeout: float, last: dict[str, Any] | None) -> None:
        status = last.get("status") if last else None
        state = f"its last status is {status!r}" if status else "no result has been written yet"
        super().__init__(
            f"no terminal result for request {request_id} within {timeout:g}s ({state}); "
            f"check later with: outbox result {request_id} (or retry the same request with "
            f"--id {request_id}: it files nothing new)"
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
    request_id: str | None = None,
    progress: bool | Callable[[str], None] | None = True,
    version: int = VERSION,
) -> dict[str, Any]:
    """Ask the broker for ``effect`` with ``params`` and return its answer.

    With ``wait`` (the default) this blocks until the result is terminal (``applied``,
    ``denied``, ``expired``, ``invalid``, ``failed``, ``unknown``, or ``staged`` from a
    host in staged mode: nothing was applied, ``output`` holds the verdict that would
    have applied and the preview) and returns it;
    a ``pending`` result keeps it waiting, saying so on stderr (``progress``).
    ``timeout`` is in seconds (None: forever); past it, :class:`OutboxTimeout` is
    raised and the request stays in the broker's hands. With ``wait=False`` it returns
    the request as written; its ``id`` is what :func:`result` and :func:`wait_for` take.

    ``request_id`` (``[A-Za-z0-9_-]{1,64}``) makes the call retryable: the same call
    with the same id files nothing new (see the module's docs); without it, an
    ``idempotency_key`` gives the id. ``attachments`` maps names
    (``[A-Za-z0-9][A-Za-z0-9_-]{0,63}``) to bytes; each is written before the
    request, and params refer to them by name. ``version`` 2 (for a broker whose
    catalogue lists it, :func:`speaks`) gets pending results that also say how many
    approvals are in (``approvals``: ``given``, ``needed``).
    """
    if version not in (1, 2):
        raise ValueError(f"version must be 1 or 2, not {version!r}")
    if not isinstance(effect, str) or not effect:
        raise ValueError("effect must be a non-empty string such as 'files.write'")
    if request_id is not None and not (isinstance(request_id, str) and _ID.match(request_id)):
        raise ValueError(f"request id {request_id!r} must match [A-Za-z0-9_-]{{1,64}}")
    attachments = dict(attachments or {})
    for name, data in attachments.items():
        if not isinstance(name, str) or not _ATTACHMENT.match(name):
            raise ValueError(
                f"attachment name {name!r} must match [A-Za-z0-9][A-Za-z0-9_-]{{0,63}}"
            )
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"attachment {name!r} must be bytes, not {type(data).__name__}")

    derived = request_id is None and idempotency_key is not None
    if request_id is None:
        request_id = _key_id(idempotency_key) if idempotency_key is not None else _new_id()
    body = _envelope(request_id, effect, params, reason, idempotency_key, attachments)
    body["version"] = version
    filed = _filed(body, attachments)
    if filed == "other" and not derived:
        raise OutboxError(
            f"request id {request_id} is already used by another request in this sandbox; "
            "a retry must ask for exactly the same thing, else use a new id"
        )
    if filed == "other":  # the key was used for another request: the broker says so
        body["id"] = _new_id()  # (an invalid result, idempotency_conflict)
    if filed != "same":
        _write_request(body, attachments)
    if not wait:
        return body
    answer = wait_for(body["id"], timeout=timeout, progress=progress)
    seen = answer.get("request_sha256")
    if isinstance(seen, str) and seen and seen not in _shas(body, attachments):
        raise OutboxError(  # another request took the id while the broker held it
            f"request id {body['id']} was used by another request in this sandbox meanwhile "
            "(its result stands); send this one again with a new id"
        )
    return answer


def _new_id() -> str:
    return uuid.uuid4().hex


def _key_id(key: str) -> str:
    """The id a request with this idempotency key gets, the same on every retry."""
    return "k" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


def _envelope(
    request_id: str,
    effect: str,
    params: Mapping[str, Any] | None,
    reason: str | None,
    idempotency_key: str | None,
    attachments: Mapping[str, bytes],
) -> dict[str, Any]:
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
    _payload(body)  # plain JSON, or a ValueError now
    return body


def _payload(body: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"params must be plain JSON (no NaN, no sets or objects): {exc}") from exc


def _shas(body: Mapping[str, Any], attachments: Mapping[str, bytes]) -> set[str]:
    """The sha256 the broker records for this request: of its canonical form (the
    attachments by digest), or of the bytes written when it could not be read as one."""
    canonical = dict(body)
    if attachments:
        canonical["attachments"] = {
            name: hashlib.sha256(bytes(data)).hexdigest() for name, data in attachments.items()
        }
    text = json.dumps(
        canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return {
        hashlib.sha256(text.encode("utf-8")).hexdigest(),
        hashlib.sha256(_payload(body)).hexdigest(),
    }


def _filed(body: Mapping[str, Any], attachments: Mapping[str, bytes]) -> str:
    """ "same": this exact request is with the broker already (answered, or still in the
    outbox), so a retry files nothing; "other": its id is another request's; "free":
    neither (never written, or taken by the broker and not yet answered)."""
    request_id = str(body["id"])
    answered = result(request_id)
    if answered is not None:
        same = answered.get("request_sha256") in _shas(body, attachments)
        return "same" if same else "other"
    try:
        with open(os.path.join(_outbox_dir(), f"{request_id}.json"), "rb") as f:
            return "same" if f.read() == _payload(body) else "other"
    except FileNotFoundError:
        return "free"
    except OSError as exc:
        raise OutboxError(f"cannot read the outbox: {exc.strerror or exc}") from exc


def _write_request(body: Mapping[str, Any], attachments: Mapping[str, bytes]) -> None:
    outbox = _outbox_dir()
    request_id = body["id"]
    for name, data in attachments.items():
        _write_atomically(outbox, f"{request_id}.{name}.bin", bytes(data))
    _write_atomically(outbox, f"{request_id}.json", _payload(body))


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


def wait_for(
    request_id: str,
    timeout: float | None = None,
    progress: bool | Callable[[str], None] | None = True,
) -> dict[str, Any]:
    """Block until ``request_id`` has a terminal result and return it. While it waits
    for a person it says so through ``progress``: True, lines on stderr; False or None,
    nothing; a callable, each line to it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: dict[str, Any] | None = None
    told = _Told(request_id, timeout, _say(progress))
    # Watch before the first look, so a result written in between is not missed.
    watcher = _Watcher(_results_dir())
    try:
        while True:
            current = result(request_id)
            if current is not None:
                last = current
                if current.get("status") in TERMINAL:
                    return current
            told.now(current)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise OutboxTimeout(request_id, timeout or 0.0, last)
            limit = told.seconds_left()
            watcher.wait(limit if remaining is None else min(remaining, limit))
    finally:
        watcher.close()


def _say(progress: bool | Callable[[str], None] | None) -> Callable[[str], None] | None:
    if progress is True:
        return lambda line: print(line, file=sys.stderr, flush=True)
    if progress is False or progress is None:
        return None
    return progress


def _progress_seconds() -> float:
    try:
        value = float(os.environ.get("OUTBOX_PROGRESS_SECONDS", _PROGRESS_SECONDS))
    except ValueError:
        return _PROGRESS_SECONDS
    return value if value > 0 else _PROGRESS_SECONDS


class _Told:
    """What a wait has said: once when the request starts waiting for a person (until
    when, and what then), then every `every` seconds that it still waits; and, when no
    answer comes at all for that long, that no broker seems to serve this sandbox."""

    def __init__(self, request_id: str, timeout: float | None, say: Callable[[str], None] | None):
        self.request_id = request_id
        self.timeout = timeout
        self.say = say
        self.every = _progress_seconds()
        self.started = time.monotonic()
        self.next = self.started + self.every
        self.pending = False

    def seconds_left(self) -> float:
        """Until the next line is due (an hour when nothing is ever said)."""
        return 3600.0 if self.say is None else max(0.0, self.next - time.monotonic())

    def now(self, current: dict[str, Any] | None) -> None:
        if self.say is None:
            return
        status = current.get("status") if current else None
        now = time.monotonic()
        if status == "pending" and not self.pending:
            self.pending = True
            self.next = now + self.every
            self.say(self._waits(current or {}))
        elif now >= self.next:
            self.next = now + self.every
            self.say(self._still(current, now - self.started))

    def _waits(self, current: dict[str, Any]) -> str:
        then = {"deny": "it is denied", "approve": "it is applied"}.get(
            str(current.get("on_timeout")), "it is not applied"
        )
        line = (
            f"outbox: request {self.request_id} ({current.get('effect')}) waits for a "
            f"person's decision until {current.get('expires_at')}; if nobody decides, {then}"
        )
        if self.timeout is not None:
            line += f"; this call gives up after {self.timeout:g}s"
        return line

    def _still(self, current: dict[str, Any] | None, waited: float) -> str:
        if current is None:
            return (
                f"outbox: no answer yet for request {self.request_id} after {_human(waited)}: "
                "is a broker serving this sandbox?"
            )
        return (
            f"outbox: still waiting for a decision on request {self.request_id} "
            f"({_human(waited)} so far; it expires at {current.get('expires_at')})"
        )


def _human(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def speaks(version: int) -> bool:
    """Whether the broker serving this sandbox speaks protocol ``version`` (its catalogue
    lists ``protocol_versions``; a catalogue without it, or none, speaks version 1)."""
    try:
        listed = catalogue().get("protocol_versions") or [1]
    except OutboxError:
        listed = [1]
    return version in listed


def withdraw(request_id: str, reason: str | None = None) -> str:
    """Take back a request: "unfiled" if no broker had read it yet (its file is removed
    from the outbox), "asked" if a withdrawal was written (the broker denies the request
    if it still waits for a person, "withdrawn by the agent", and leaves one already
    approved or decided as it is; read its result to know which), "unsupported" if the
    broker serving this sandbox predates withdrawals (protocol version 2)."""
    if not _ID.match(request_id):
        raise ValueError(f"request id {request_id!r} must match [A-Za-z0-9_-]{{1,64}}")
    try:
        os.unlink(os.path.join(_outbox_dir(), f"{request_id}.json"))
        return "unfiled"
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OutboxError(f"cannot withdraw {request_id}: {exc.strerror or exc}") from exc
    if not speaks(WITHDRAW_VERSION):
        return "unsupported"
    body: dict[str, Any] = {"version": WITHDRAW_VERSION, "id": request_id}
    if reason is not None:
        body["reason"] = str(reason)[:2000]
    _write_atomically(_outbox_dir(), f"{request_id}.withdraw", _payload(body))
    return "asked"


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


def main(argv: list[str] | None = None) -> int:
    """Run the ``outbox`` command (``outbox_cli.py`` beside this file); its exit status."""
    import outbox_cli

    return outbox_cli.main(argv)


if __name__ == "__main__":
    sys.modules.setdefault("outbox", sys.modules[__name__])  # one module, run or imported
    sys.exit(main())
