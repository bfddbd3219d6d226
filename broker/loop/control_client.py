"""The client's side of the owner's control socket (broker.loop.ownership): `broker run`
beside a running owner hands it one sandbox and follows it until released."""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.clock import REAL
from broker.errors import BrokerError, OwnerGone
from broker.loop.lockfile import served, socket_path, unix_address
from broker.loop.ownership import lines

__all__ = ["ControlClient", "connect"]

log = logging.getLogger("broker.loop.ownership")


class ControlClient:
    """Hands one sandbox to the owner of a state dir and follows it until released."""

    def __init__(
        self,
        state_dir: Path,
        on_pending: Callable[[str], None],
        on_gone: Callable[[], None] | None = None,
    ) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            with unix_address(socket_path(state_dir)) as address:
                self._sock.connect(address)
        except OSError:
            self._sock.close()
            raise
        self._on_pending = on_pending
        self._on_gone = on_gone
        self._closed = False
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="broker-run-control", daemon=True)
        self._reader.start()

    def serve(self, sandbox: str, timeout: float = 30) -> None:
        self._request({"op": "serve", "sandbox": sandbox}, timeout)

    def release(self, timeout: float = 120) -> None:
        """Wait until the owner has processed what the sandbox left in its outbox."""
        self._request({"op": "release"}, timeout)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            self._sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            raise OwnerGone("the serving broker went away") from exc
        try:
            reply = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise BrokerError(f"the serving broker did not answer within {timeout:g}s") from None
        if reply is None:
            raise OwnerGone("the serving broker went away")
        if not reply.get("ok"):
            raise BrokerError(f"the serving broker refused: {reply.get('error')}")
        return reply

    def _read(self) -> None:
        for message in lines(self._sock):
            if not isinstance(message, dict):
                continue
            if message.get("event") == "pending" and isinstance(message.get("id"), str):
                try:
                    self._on_pending(message["id"])
                except Exception:
                    log.exception("the pending-request callback failed")
            elif "ok" in message:
                self._replies.put(message)
        self._replies.put(None)
        if not self._closed and self._on_gone is not None:
            self._on_gone()


def connect(
    state_dir: Path,
    on_pending: Callable[[str], None],
    on_gone: Callable[[], None] | None = None,
    wait_s: float = 30.0,
) -> ControlClient | None:
    """A client of the state dir's owner, or None when no owner listens. `on_gone` is
    called (on the reading thread) if the owner closes the connection first. An owner
    that holds the lock but is still starting gets `wait_s` to open its socket."""
    end = REAL.monotonic() + wait_s
    while True:
        try:
            return ControlClient(state_dir, on_pending, on_gone)
        except (FileNotFoundError, ConnectionRefusedError):
            if not served(state_dir) or REAL.monotonic() >= end:
                return None
            REAL.sleep(0.02)
