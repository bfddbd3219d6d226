"""Linux inotify through ctypes: the outbox watcher with no polling and no debounce.

A watch is in place when `add` returns, so a scan made after it misses nothing.
The reading thread blocks in poll(2) and costs nothing while outboxes are idle;
a queue overflow is reported so the caller rescans.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

FILE_EVENTS = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
log = logging.getLogger("broker.intake.inotify")
_HEADER = struct.Struct("iIII")
_libc: ctypes.CDLL | None = None


def available() -> bool:
    return _load() is not None


def _load() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        # The process's own symbols first (libc's, on Linux): find_library runs
        # `ldconfig -p` in a subprocess, which every `broker run` would pay for.
        for name in (None, "c"):
            try:
                lib = ctypes.CDLL(name if name is None else _find(name), use_errno=True)
                lib.inotify_init1  # noqa: B018  (raises AttributeError where there is none)
            except (OSError, AttributeError, TypeError):
                continue
            _libc = lib
            break
    return _libc


# (directory, entry name or "", mask); an empty directory means "rescan everything"
Sink = Callable[[str, str, int], None]


class Inotify:
    """One inotify instance, one reading thread, any number of watched directories."""

    def __init__(self, sink: Sink) -> None:
        lib = _load()
        if lib is None:
            raise OSError(errno.ENOSYS, "inotify is not available")
        self._lib = lib
        self._fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._sink = sink
        self._paths: dict[int, str] = {}
        self._wds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="broker-inotify", daemon=True)
        self._thread.start()

    def add(self, path: Path, mask: int = FILE_EVENTS) -> None:
        key = str(path)
        with self._lock:
            if key in self._wds:
                return
            wd = self._lib.inotify_add_watch(
                self._fd, os.fsencode(key), mask | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK
            )
            if wd < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"cannot watch {key}: {os.strerror(err)}")
            self._wds[key] = wd
            self._paths[wd] = key

    def remove(self, path: Path) -> None:
        with self._lock:
            wd = self._wds.pop(str(path), None)
            if wd is not None:
                self._paths.pop(wd, None)
                self._lib.inotify_rm_watch(self._fd, wd)

    def watched(self) -> set[str]:
        with self._lock:
            return set(self._wds)

    def close(self) -> None:
        self._stopped = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        os.close(self._fd)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the broker sees a dead watcher and replaces it
            if not self._stopped:
                log.warning("the inotify watcher failed (%s); events may be lost", exc)
                self._sink("", "", IN_Q_OVERFLOW)

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stopped:
            try:
                poller.poll()
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                if self._stopped:
                    return
                raise
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            raw = data[offset + _HEADER.size : offset + _HEADER.size + length]
            offset += _HEADER.size + length
            if mask & IN_Q_OVERFLOW:
                self._sink("", "", mask)
                continue
            with self._lock:
                folder = self._paths.get(wd)
                if mask & IN_IGNORED and folder is not None:
                    self._paths.pop(wd, None)
                    self._wds.pop(folder, None)
            if folder is None:
                continue
            name = os.fsdecode(raw.rstrip(b"\0"))
            self._sink(folder, name, mask)


def _find(name: str) -> str | None:
    import ctypes.util

    return ctypes.util.find_library(name)
