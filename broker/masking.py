"""Secrets masked in every form a service can echo them in.

A service that echoes a credential rarely echoes it byte for byte: it may base64 it
(a Basic `user:secret` header, a whole JSON document base64-encoded at any offset),
URL-encode it, escape it in JSON, or cut the output in the middle of it. `Masker`
knows, for each secret, every such form:

- the raw text, its JSON-escaped and URL-encoded (quote, quote_plus) spellings, its hex;
- its base64 and URL-safe base64 at each of the three byte offsets it can sit at in a
  longer encoded blob (so `base64("x-access-token:" + token)` is caught too);
- any prefix of any of those (at least four characters) that ends the text, which is
  what a cut at a size limit leaves;
- any run of eight characters or more of any of those forms, in any letter case (a
  piece of the secret split over two headers, base64 wrapped in short lines, the hex
  or the secret upper-cased), in the text as it is and after decoding its `%XX`,
  `\\uXXXX` and `&#NN;`/`&#xHH;` escapes (each character spelt so).

Longer forms are masked first. Nothing else is: a service can always echo a secret in
an encoding this does not know (base32, gzip, rot13, reversed, spaced), which is why
what returns to a sandbox is allow-listed (`response = ...`) and masking is the second
line. `broker.masking.Redactor` uses it for everything the
broker writes (ledger, results, audit), the network handlers for what they return,
and `mask_logs` for every log record the process emits.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "•••"
MIN_TAIL = 4  # a shorter tail could be anything; it tells nothing of a long secret
MIN_RUN = 8  # a run of a secret this long is masked wherever it sits, in any case
_GRAM = MIN_RUN // 2  # sampling every _GRAM characters meets every run of MIN_RUN
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ESCAPE = re.compile(
    r"%([0-9A-Fa-f]{2})|\\u([0-9A-Fa-f]{4})|&#[xX]([0-9A-Fa-f]{1,6});|&#([0-9]{1,7});"
)

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
        self._runs = _Runs(f.translate(_LOWER) for f in self._forms)
        self._bruns = _Runs(b.decode("latin-1").translate(_LOWER) for b in self._bytes)

    def __bool__(self) -> bool:
        return bool(self._forms)

    def text(self, value: str) -> str:
        """`value` with every form masked, and a tail that starts one."""
        if not self._forms:
            return value
        for form in self._forms:
            if form in value:
                value = value.replace(form, MASK)
        value = _cut(value, self._runs.spans(value), MASK)
        value = _cut(value, self._runs.escaped(value), MASK)
        return self._tail(value)

    def bytes(self, data: bytes) -> bytes:
        """The same for bytes (UTF-8 forms)."""
        if not self._bytes:
            return data
        mask = MASK.encode("utf-8")
        for form in self._bytes:
            if form in data:
                data = data.replace(form, mask)
        # one character per byte, so spans are byte offsets
        data = _cut_bytes(data, self._bruns.spans(data.decode("latin-1")), mask)
        data = _cut_bytes(data, self._bruns.escaped(data.decode("latin-1")), mask)
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


class _Runs:
    """Finds every run of MIN_RUN characters or more that some form holds, letter case
    aside: each _GRAM-th character of the text starts a lookup, and a hit is grown
    both ways along the form it came from."""

    def __init__(self, forms: Iterable[str]) -> None:
        self._forms = [f for f in dict.fromkeys(forms) if len(f) >= MIN_RUN]
        self._at: dict[str, list[tuple[int, int]]] = {}
        for n, form in enumerate(self._forms):
            for offset in range(len(form) - _GRAM + 1):
                self._at.setdefault(form[offset : offset + _GRAM], []).append((n, offset))

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The (start, end) of every run in `text`, merged, in order."""
        if not self._forms or len(text) < MIN_RUN:
            return []
        low, found = text.translate(_LOWER), []
        for p in range(0, len(low) - _GRAM + 1, _GRAM):
            for n, offset in self._at.get(low[p : p + _GRAM], ()):
                form = self._forms[n]
                start, j = p, offset
                while start > 0 and j > 0 and low[start - 1] == form[j - 1]:
                    start, j = start - 1, j - 1
                end, k = p + _GRAM, offset + _GRAM
                while end < len(low) and k < len(form) and low[end] == form[k]:
                    end, k = end + 1, k + 1
                if end - start >= MIN_RUN:
                    found.append((start, end))
        return _merged(found)

    def escaped(self, text: str) -> list[tuple[int, int]]:
        """The runs spelt with `%XX`, `\\uXXXX` or `&#..;` escapes, as spans of `text`."""
        if not self._forms or not _ESCAPE.search(text):
            return []
        chars: list[str] = []
        where: list[tuple[int, int]] = []  # each decoded character's span in `text`
        last = 0
        for match in _ESCAPE.finditer(text):
            for i in range(last, match.start()):
                chars.append(text[i])
                where.append((i, i + 1))
            digits = next(g for g in match.groups() if g is not None)
            decimal = match.group(4) is not None
            code = int(digits, 10 if decimal else 16)
            chars.append(chr(code) if code < 0x110000 else "?")
            where.append(match.span())
            last = match.end()
        for i in range(last, len(text)):
            chars.append(text[i])
            where.append((i, i + 1))
        return _merged([(where[a][0], where[b - 1][1]) for a, b in self.spans("".join(chars))])


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _cut(text: str, spans: list[tuple[int, int]], mask: str) -> str:
    for start, end in reversed(spans):
        text = text[:start] + mask + text[end:]
    return text


def _cut_bytes(data: bytes, spans: list[tuple[int, int]], mask: bytes) -> bytes:
    for start, end in reversed(spans):
        data = data[:start] + mask + data[end:]
    return data


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
        new = {s for s in secrets if s} - _log_secrets
        if new:  # a Masker costs time in all the secrets: made again only for a new one
            _log_secrets.update(new)
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
