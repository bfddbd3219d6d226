"""From a name in an outbox to parsed JSON, never trusting what the sandbox wrote.

Files are opened relative to a directory fd with O_NOFOLLOW|O_NONBLOCK, must be
regular files with one link, are read up to limit+1 bytes and parsed as strict JSON:
UTF-8 only, no duplicate keys, no NaN/Infinity, no lone surrogates, bounded depth.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import json
import math
import os
import re
import stat
from typing import Any

from broker.errors import Issue, Rejected

REQUEST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
ATTACHMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Kind(enum.Enum):
    REQUEST = "request"
    ATTACHMENT = "attachment"
    TEMPORARY = "temporary"
    BAD = "bad"


def classify(name: str) -> tuple[Kind, str, str]:
    """What a directory entry is by its name: (kind, request name, attachment name)."""
    if name.startswith(".") or name.endswith(".tmp"):
        return Kind.TEMPORARY, "", ""
    if name.endswith(".json"):
        stem = name[: -len(".json")]
        if REQUEST_NAME.fullmatch(stem):
            return Kind.REQUEST, stem, ""
    elif name.endswith(".bin"):
        parts = name[: -len(".bin")].split(".")
        if (
            len(parts) == 2
            and REQUEST_NAME.fullmatch(parts[0])
            and ATTACHMENT_NAME.fullmatch(parts[1])
        ):
            return Kind.ATTACHMENT, parts[0], parts[1]
    return Kind.BAD, "", ""


def _reject(code: str, message: str, path: str = "") -> Rejected:
    return Rejected(f"invalid: {message}", [Issue(path, code, message)])


def read_file(dir_fd: int, name: str, limit: int) -> bytes:
    """The bytes of a regular file `name` in `dir_fd`, at most `limit` of them.

    Raises Rejected for anything that is not a regular, singly linked, small enough
    file; never follows a link and never blocks on a FIFO or device.
    """
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise
    _check_kind(before)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (40, 31):  # ELOOP: swapped for a symlink; EMLINK
            raise _reject("not_regular_file", "the request is a symbolic link") from exc
        raise
    try:
        st = os.fstat(fd)
        _check_kind(st)
        if st.st_size > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _too_large(limit)
    return data


def _too_large(limit: int) -> Rejected:
    return _reject("too_large", f"the file is larger than the {limit}-byte limit")


def _check_kind(st: os.stat_result) -> None:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        raise _reject("not_regular_file", "the request is a symbolic link; write a regular file")
    if not stat.S_ISREG(mode):
        kind = (
            "directory"
            if stat.S_ISDIR(mode)
            else "FIFO"
            if stat.S_ISFIFO(mode)
            else "socket"
            if stat.S_ISSOCK(mode)
            else "device"
        )
        raise _reject("not_regular_file", f"the request is a {kind}; write a regular file")
    if st.st_nlink != 1:
        raise _reject("hard_link", "the request file has several hard links; write a new file")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _reject("duplicate_key", f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise _reject("non_finite_number", f"{name} is not a JSON number")


def parse_json(data: bytes, max_depth: int) -> Any:
    """Strict JSON: UTF-8, unique keys, finite numbers, valid strings, bounded depth."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _reject("bad_utf8", f"the file is not UTF-8 (byte {exc.start})") from exc
    if text.startswith("\ufeff"):
        raise _reject("bad_json", "the file starts with a byte order mark")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError as exc:
        raise _reject("too_deep", f"nesting deeper than {max_depth} levels") from exc
    except json.JSONDecodeError as exc:
        raise _reject(
            "bad_json", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except ValueError as exc:  # an integer too long to convert
        raise _reject("bad_number", "a number is too large") from exc
    _check_values(value, max_depth)
    return value


def _check_values(root: Any, max_depth: int) -> None:
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > max_depth:
                raise _reject("too_deep", f"nesting deeper than {max_depth} levels")
            for key, item in value.items():
                _check_string(key)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            if depth > max_depth:
                raise _reject("too_deep", f"nesting deeper than {max_depth} levels")
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            _check_string(value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise _reject("non_finite_number", "a number is too large to be finite")


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _reject("bad_unicode", "a string holds a lone surrogate escape") from exc


def being_written(dir_fd: int, name: str) -> bool:
    """Whether some process holds this regular file open for writing.

    A read lease cannot be taken on a file open for writing anywhere (EAGAIN), which
    tells a request still being written from one that is complete. Where leases are
    not allowed (another owner, no CAP_LEASE), we cannot tell, and read it.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError as exc:
            return exc.errno == errno.EAGAIN
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    finally:
        os.close(fd)


def exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True
