"""The baseline: the least a server can do per request, on raw inotify.

One thread blocks in read(2) on an inotify fd watching the outbox for IN_MOVED_TO;
for each request it reads the file, parses it, and writes a result by temp file and
rename (with --fsync: fsync of the result and of its directory, for reference).
No validation, no ledger, no claim, no removal.

    python -m bench.raw OUTBOX RESULTS [--fsync]
"""

from __future__ import annotations

import json
import os
import sys

from bench.writer import _HEADER, IN_MOVED_TO, _libc


def serve(outbox: str, results: str, fsync: bool) -> None:
    fd = _libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0 or _libc.inotify_add_watch(fd, os.fsencode(outbox), IN_MOVED_TO) < 0:
        raise OSError("inotify")
    in_fd = os.open(outbox, os.O_RDONLY | os.O_DIRECTORY)
    out_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    print("ready", flush=True)
    while True:
        data = os.read(fd, 1 << 16)
        offset = 0
        while offset + _HEADER.size <= len(data):
            _wd, _mask, _cookie, length = _HEADER.unpack_from(data, offset)
            raw = data[offset + _HEADER.size : offset + _HEADER.size + length]
            offset += _HEADER.size + length
            name = os.fsdecode(raw.rstrip(b"\0"))
            if name.startswith(".") or not name.endswith(".json"):
                continue
            handle(in_fd, out_fd, name, fsync)


def handle(in_fd: int, out_fd: int, name: str, fsync: bool) -> None:
    f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=in_fd)
    try:
        doc = json.loads(os.read(f, 1 << 20))
    finally:
        os.close(f)
    body = json.dumps({"id": doc["id"], "status": "applied", "output": {}}).encode()
    tmp = f".{name}.tmp"
    f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644, dir_fd=out_fd)
    try:
        os.write(f, body)
        if fsync:
            os.fsync(f)
    finally:
        os.close(f)
    os.rename(tmp, name, src_dir_fd=out_fd, dst_dir_fd=out_fd)
    if fsync:
        os.fsync(out_fd)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], "--fsync" in sys.argv[3:])
