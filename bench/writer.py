"""The agent's side of a benchmark: write requests, time until their results appear.

Standard library only, so the same file runs on the host (imported) and inside a
sandbox container (copied into /workspace and run as a script). A request is written
as an agent must (temp file, then rename); the clock starts just before the rename
and stops when inotify reports the result's rename into the results dir.

As a script: python3 writer.py OUTBOX RESULTS SEQ_N BURST_N EFFECT OUT_JSON
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import select
import struct
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

IN_MOVED_TO = 0x00000080
IN_Q_OVERFLOW = 0x00004000
_HEADER = struct.Struct("iIII")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)

Doc = Callable[[str], dict[str, Any]]


class ResultWatch:
    """inotify on one or more results dirs; yields (dir, name, time seen) of renames in."""

    def __init__(self, dirs: Sequence[str]) -> None:
        self.fd = _libc.inotify_init1(os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.dirs: dict[int, str] = {}
        for d in dirs:
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(d), IN_MOVED_TO)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {d}")
            self.dirs[wd] = d
        self.overflowed = False

    def read(self, timeout: float) -> list[tuple[str, str, float]]:
        """Events available within `timeout` seconds, each stamped when read."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        data = os.read(self.fd, 1 << 20)
        seen = time.perf_counter()
        out = []
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size : offset + _HEADER.size + length].rstrip(b"\0")
            offset += _HEADER.size + length
            if mask & IN_Q_OVERFLOW:
                self.overflowed = True
                continue
            out.append((self.dirs.get(wd, ""), os.fsdecode(name), seen))
        return out

    def close(self) -> None:
        os.close(self.fd)


def _put(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def sequential(
    boxes: Sequence[tuple[str, str]],
    n: int,
    doc: Doc,
    prefix: str,
    timeout: float = 30.0,
    budget: float = float("inf"),
) -> list[float]:
    """n requests one after another, round-robin over (outbox, results) pairs; seconds each.

    Stops early, with fewer samples, once `budget` seconds have passed.
    """
    watch = ResultWatch(sorted({r for _, r in boxes}))
    latencies: list[float] = []
    stop_at = time.perf_counter() + budget
    try:
        for i in range(n):
            if latencies and time.perf_counter() > stop_at:
                break
            outbox, results = boxes[i % len(boxes)]
            rid = f"{prefix}{i}"
            name = f"{rid}.json"
            tmp = os.path.join(outbox, f".{name}.tmp")
            _put(tmp, json.dumps(doc(rid)).encode())
            start = time.perf_counter()
            os.rename(tmp, os.path.join(outbox, name))
            end = start + timeout
            done = None
            while done is None:
                left = end - time.perf_counter()
                if left <= 0:
                    raise TimeoutError(f"no result for {rid} in {results} within {timeout}s")
                for folder, got, seen in watch.read(left):
                    if got == name and folder == results:
                        done = seen
            latencies.append(done - start)
    finally:
        watch.close()
    return latencies


def burst(
    boxes: Sequence[tuple[str, str]],
    n: int,
    doc: Doc,
    prefix: str,
    staging: str | None,
    timeout: float = 300.0,
    settle: float = 0.3,
) -> dict[str, float]:
    """Write n requests, rename them all into place, wait for every result.

    The files are written before the clock starts, into `staging` (a dir on the same
    file system, unwatched) or, when None, as temp names in the outbox itself (inside
    a container, where the outbox is its own mount); the renames and the server's
    work are timed, up to the last result seen.
    """
    if staging is not None:
        os.makedirs(staging, exist_ok=True)
    plan = []
    for i in range(n):
        outbox = boxes[i % len(boxes)][0]
        rid = f"{prefix}{i}"
        src = os.path.join(staging or outbox, f"{rid}.json" if staging else f".{rid}.json.tmp")
        _put(src, json.dumps(doc(rid)).encode())
        plan.append((src, os.path.join(outbox, f"{rid}.json")))
    watch = ResultWatch(sorted({r for _, r in boxes}))
    expected = {(boxes[i % len(boxes)][1], f"{prefix}{i}.json") for i in range(n)}
    time.sleep(settle)
    try:
        start = time.perf_counter()
        for src, dst in plan:
            os.rename(src, dst)
        renamed = time.perf_counter()
        last = renamed
        deadline = start + timeout
        while expected and not watch.overflowed:
            left = deadline - time.perf_counter()
            if left <= 0:
                break  # capped: the rate counts the results seen so far
            for folder, got, seen in watch.read(min(left, 1.0)):
                if (folder, got) in expected:
                    expected.discard((folder, got))
                    last = seen
        while expected and watch.overflowed:  # the event queue overflowed: count files
            if time.perf_counter() > deadline:
                break
            expected = {(f, g) for f, g in expected if not os.path.exists(os.path.join(f, g))}
            last = time.perf_counter()
            if expected:
                time.sleep(0.001)
    finally:
        watch.close()
    done = n - len(expected)
    return {
        "n": n,
        "done": done,
        "capped": float(bool(expected)),
        "seconds": last - start,
        "rate": done / (last - start),
        "rename_seconds": renamed - start,
        "overflowed": float(watch.overflowed),
    }


def _effect_doc(effect: str) -> Doc:
    def doc(rid: str) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if effect == "files.write":
            params = {"path": f"bench/{rid}.txt", "content": "hello from the bench\n"}
        return {"version": 1, "id": rid, "effect": effect, "params": params}

    return doc


def main(argv: Sequence[str]) -> int:
    outbox, results, seq_n, burst_n, effect, out = argv
    doc = _effect_doc(effect)
    boxes = [(outbox, results)]
    tag = f"c{os.getpid()}x"
    sequential(boxes, 20, doc, f"{tag}w")
    report: dict[str, Any] = {
        "sequential": sequential(boxes, int(seq_n), doc, f"{tag}s", budget=20)
    }
    if int(burst_n):
        report["burst"] = burst(boxes, int(burst_n), doc, f"{tag}b", None, 60, settle=1.0)
    with open(out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
