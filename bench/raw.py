"""The baseline: the least a server can do per request, on raw inotify.

One thread blocks in read(2) on an inotify fd watching the outbox for IN_MOVED_TO;
for each request it reads the file, parses it, and writes a result by temp file and
rename. No validation, no ledger, no claim, no removal. Variants:

    --fsync     fsync of the result and of its directory (a reference)
    --journal   the durable floor: one fdatasync'ed journal append per request before
                its result, what the broker's ledger commit must cost at least
    --write DIR the durable floor plus files.write's own work: the request's content
                written to DIR/<path>, fsynced, and its directory fsynced

    python -m bench.raw OUTBOX RESULTS [--fsync] [--journal FILE] [--write DIR]
"""

from __future__ import annotations

import json
import os
import sys

from bench.writer import _HEADER, IN_MOVED_TO, _libc


def serve(outbox: str, results: str, fsync: bool, journal: str, write: str) -> None:
    fd = _libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0 or _libc.inotify_add_watch(fd, os.fsencode(outbox), IN_MOVED_TO) < 0:
        raise OSError("inotify")
    in_fd = os.open(outbox, os.O_RDONLY | os.O_DIRECTORY)
    out_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    log_fd = os.open(journal, flags, 0o600) if journal else -1
    export_fd = os.open(write, os.O_RDONLY | os.O_DIRECTORY) if write else -1
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
            handle(in_fd, out_fd, name, fsync, log_fd, export_fd)


def handle(
    in_fd: int, out_fd: int, name: str, fsync: bool, log_fd: int = -1, export_fd: int = -1
) -> None:
    f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=in_fd)
    try:
        raw = os.read(f, 1 << 20)
    finally:
        os.close(f)
    doc = json.loads(raw)
    if export_fd >= 0:
        _write_file(export_fd, doc["params"])
    if log_fd >= 0:
        os.write(log_fd, raw.rstrip(b"\n") + b"\n")
        os.fdatasync(log_fd)
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


def _write_file(export_fd: int, params: dict[str, str]) -> None:
    """files.write's own work: the file, written and fsynced, then its directory."""
    folder, _, leaf = params["path"].rpartition("/")
    dir_fd = export_fd
    if folder:
        try:
            os.mkdir(folder, 0o755, dir_fd=export_fd)
        except FileExistsError:
            pass
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY, dir_fd=export_fd)
    try:
        f = os.open(
            leaf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
        )
        try:
            os.write(f, params["content"].encode())
            os.fsync(f)
        finally:
            os.close(f)
        os.fsync(dir_fd)
    finally:
        if dir_fd != export_fd:
            os.close(dir_fd)


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else ""


if __name__ == "__main__":
    rest = sys.argv[3:]
    serve(
        sys.argv[1],
        sys.argv[2],
        "--fsync" in rest,
        _option(rest, "--journal"),
        _option(rest, "--write"),
    )
