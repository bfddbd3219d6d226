"""Secrets masked in every form a service can echo them in.

A service that echoes a credential rarely echoes it byte for byte: it may base64 it
(a Basic `user:secret` header, a whole JSON document base64-encoded at any offset),
URL-encode it, escape it in JSON, or cut the output in the middle of it. `Masker`
knows, for each secret, every such form:

- the raw text, its JSON-escaped and URL-encoded (quote, quote_plus) spellings, its hex;
- its base64 and URL-safe base64 at each of the three byte offsets it can sit at in a
  longer encoded blob (so `base64("x-access-token:" + token)` is caught too);
- any prefix of any of those (at least four characters) that ends the text, which is
  what a cut at a size limit leaves.

Longer forms are masked first. `broker.masking.Redactor` uses it for everything the
broker writes (ledger, results, audit), the network handlers for what they return,
and `mask_logs` for every log record the process emits.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "•••"
MIN_TAIL = 4  # a shorter tail could be anything; it tells nothing of a long secret

__all__ = ["MASK", "Masker", "Redactor", "mask_logs"]


def _b64_cores(data: bytes) -> set[str]:
    """The base64 characters that depend only on `data`, at each offset in a blob."""
    found = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + data).decode("ascii").rstrip("=")
        start = -(-8 * offset // 6)  # the first character made of `data`'s bits alone
        end = (8 * (offset + len(data))) // 6
        core = encoded[start:end]
        if len(core) >= MIN_TAIL:
            found.add(core)
            found.add(core.replace("+", "-").replace("/", "_"))
    return found


def forms(secret: str) -> set[str]:
    """Every spelling of `secret` a service may echo (see the module docstring)."""
    raw = secret.encode("utf-8")
    found = {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        quote(secret, safe=""),
        quote_plus(secret),
        binascii.hexlify(raw).decode("ascii"),
        binascii.hexlify(raw).decode("ascii").upper(),
        *_b64_cores(raw),
    }
    return {f for f in found if len(f) >= MIN_TAIL}


class Masker:
    """Masks a fixed set of secrets, in all their forms, in text and bytes."""

    def __init__(self, secrets: Iterable[str]) -> None:
        every: set[str] = set()
        for secret in secrets:
            if secret and len(secret) >= MIN_TAIL:
                every |= forms(secret)
        self._forms = sorted(every, key=len, reverse=True)
        self._bytes = [f.encode("utf-8") for f in self._forms]
        self.longest = max((len(b) for b in self._bytes), default=0)
        # the last MIN_TAIL characters of each prefix → the prefixes ending so: a text's
        # own last characters find the few prefixes worth comparing (the hot path)
        self._tails: dict[str, list[str]] = {}
        self._btails: dict[bytes, list[bytes]] = {}
        for form, raw in zip(self._forms, self._bytes, strict=True):
            for size in range(MIN_TAIL, len(form) + 1):
                self._tails.setdefault(form[size - MIN_TAIL : size], []).append(form[:size])
            for size in range(MIN_TAIL, len(raw) + 1):
                self._btails.setdefault(raw[size - MIN_TAIL : size], []).append(raw[:size])

    def __bool__(self) -> bool:
        return bool(self._forms)

    def text(self, value: str) -> str:
        """`value` with every form masked, and a tail that starts one."""
        if not self._forms:
            return value
        for form in self._forms:
            if form in value:
                value = value.replace(form, MASK)
        return self._tail(value)

    def bytes(self, data: bytes) -> bytes:
        """The same for bytes (UTF-8 forms)."""
        if not self._bytes:
            return data
        mask = MASK.encode("utf-8")
        for form in self._bytes:
            if form in data:
                data = data.replace(form, mask)
        ends = [p for p in self._btails.get(data[-MIN_TAIL:], ()) if data.endswith(p)]
        return data[: -max(map(len, ends))] + mask if ends else data

    def _tail(self, value: str) -> str:
        ends = [p for p in self._tails.get(value[-MIN_TAIL:], ()) if value.endswith(p)]
        return value[: -max(map(len, ends))] + MASK if ends else value

    def __call__(self, value: Any) -> Any:
        """Any JSON-like value, keys and strings masked."""
        if not self._forms or value is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self(k): self(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self(v) for v in value]
        return value


# -- the process's log records --------------------------------------------------------

_lock = threading.Lock()
_log_secrets: set[str] = set()
_log_masker = Masker(())
_installed = False


def mask_logs(secrets: Iterable[str]) -> None:
    """Mask `secrets` (with those given before) in every log record made from now on,
    message, arguments and traceback, whichever handler writes it; and keep the HTTP
    libraries' own request lines (which name whole URLs) out of the log."""
    global _log_masker, _installed
    quiet_http_libraries()
    with _lock:
        _log_secrets.update(s for s in secrets if s)
        _log_masker = Masker(_log_secrets)
        if _installed:
            return
        _installed = True
        make = logging.getLogRecordFactory()

        def masked(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = make(*args, **kwargs)
            masker = _log_masker
            if masker:
                record.msg, record.args = masker.text(record.getMessage()), None
                if record.exc_info and not record.exc_text:
                    record.exc_text = masker.text(
                        logging.Formatter().formatException(record.exc_info)
                    )
            return record

        logging.setLogRecordFactory(masked)


def quiet_http_libraries() -> None:
    """httpx logs every request's URL at INFO, httpcore every byte at DEBUG."""
    for name in ("httpx", "httpcore", "hpack", "urllib3", "botocore", "github"):
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


class Redactor:
    """Masks a fixed set of secret values in any JSON-like value."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = frozenset(s for s in secrets if s)
        self._masker = Masker(self.secrets)

    def __call__(self, value: Any) -> Any:
        return self._masker(value)

    def text(self, value: str) -> str:
        return self._masker.text(value)
