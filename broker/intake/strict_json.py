"""Strict JSON for what a sandbox wrote: UTF-8 only, unique keys, finite numbers,
valid strings (no lone surrogates), bounded depth. Every refusal is a Rejected with
an Issue the agent can act on."""

from __future__ import annotations

import json
import math
from typing import Any

from broker.errors import Issue, Rejected


def _reject(code: str, message: str, path: str = "") -> Rejected:
    return Rejected(f"invalid: {message}", [Issue(path, code, message)])


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _reject("duplicate_key", f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise _reject("non_finite_number", f"{name} is not a JSON number")


# what json.loads(text, object_pairs_hook=..., parse_constant=...) builds per call,
# built once: the decoder keeps nothing between calls but a cache of key strings
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant)


def parse_json(data: bytes, max_depth: int) -> Any:
    """Strict JSON: UTF-8, unique keys, finite numbers, valid strings, bounded depth."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _reject("bad_utf8", f"the file is not UTF-8 (byte {exc.start})") from exc
    if text.startswith("\ufeff"):
        raise _reject("bad_json", "the file starts with a byte order mark")
    try:
        value = _DECODER.decode(text)
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
