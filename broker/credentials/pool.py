"""One HTTP connection pool for the providers that mint over HTTP (GitHub App, OpenBao):
a client costs ~40 ms to make, more than a mint's own round trip. Closed when the
process exits, so its kept-alive connections end cleanly."""

from __future__ import annotations

import atexit
import threading

import httpx

__all__ = ["client"]

_lock = threading.Lock()
_made: list[httpx.Client] = []


def client() -> httpx.Client:
    with _lock:
        if not _made:
            _made.append(httpx.Client())
            atexit.register(_made[0].close)
        return _made[0]
