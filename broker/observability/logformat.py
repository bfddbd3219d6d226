"""How `broker serve` and `broker run` write their log: `text` (one line, a UTC ISO-8601
time with a `Z`, as every other time the broker writes) or `json` (one object per line,
for a log store), chosen by `--log-format` or `[broker] log_format`.

    2026-12-02T01:02:03.456Z INFO broker.requests: applied  default/3f6c… files.write
    {"ts": "2026-12-02T01:02:03.456Z", "level": "INFO", "logger": "broker.requests",
     "message": "applied  default/3f6c… files.write", "event": "applied",
     "ref": "default/3f6c…", "effect": "files.write", "trace_id": "4bf9…"}

Request lines (broker.observability.requestlog) carry the request's ref and the trace id
its trace has (`trace_id_for`: derived from the request, so a log line and a trace are
found from each other whether or not tracing is on).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

FORMATS = ("text", "json")
FIELDS = ("event", "ref", "effect", "trace_id")  # a request line's extras, when present


def trace_id_for(sandbox: str, request_id: str) -> str:
    """The 32-hex-digit trace id of a request's trace (never all zeros)."""
    import hashlib  # here: installing the format is on `broker run`'s way to its sandbox

    digest = hashlib.sha256(f"{sandbox}/{request_id}".encode()).hexdigest()[:32]
    return digest if digest.strip("0") else "1".rjust(32, "0")


def utc(created: float) -> str:
    moment = datetime.fromtimestamp(created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class TextFormatter(logging.Formatter):
    """`<UTC time>Z LEVEL logger: message`, tracebacks after it."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{utc(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        return f"{line}\n{record.exc_text}" if record.exc_text else line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, a request's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=True)


def install(fmt: str, level: int) -> None:
    """One handler on the root logger, on stderr, in `fmt` (text | json)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
